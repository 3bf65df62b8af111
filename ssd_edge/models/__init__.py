"""Model files: catalog (the shipped catalog, ssd_edge/data/catalog.toml, and name -> path),
downloads (fetching a catalog model), derive (drafts requantized here)."""
