"""Which drafts on this machine fit a target: `ssd-edge models pair TARGET`, and the draft a Hub
target gets when none is named.

The candidates are the model files present here: the catalog's pulled models and the variants
`models derive-draft` made, and every GGUF model in the Hub cache. A candidate fits when its
vocabulary does (vocab.fit, read from both headers; nothing is loaded) and it is smaller than the
target (a draft as big as its target saves nothing). Catalog models not pulled cannot be read, so
they are named apart (`not_pulled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from . import catalog, hub, vocab


@dataclass(frozen=True)
class Candidate:
    name: str                 # a catalog name, NAME:KIND, or hf:ORG/REPO:QUANT
    path: Path
    size: int                 # bytes on disk, every shard of a split model
    fit: vocab.Fit | None = None


def present(models_dir: Path | None = None) -> list[Candidate]:
    """Every model file here, by name: the catalog's (verified copies), derived variants, Hub models."""
    out = []
    for m in catalog.load_catalog().models:
        path = catalog.model_path(m, models_dir)
        if path.exists() and path.stat().st_size == m.size:
            out.append(Candidate(m.name, path, m.size))
        for kind in catalog.DERIVED_KINDS:
            variant = catalog.derived_path(m, kind, models_dir)
            if variant.exists():
                out.append(Candidate(f"{m.name}:{kind}", variant, variant.stat().st_size))
    out += [Candidate(h.name, h.path, h.size) for h in hub.cached_models(models_dir)]
    return out


def not_pulled(models_dir: Path | None = None) -> list[str]:
    """Catalog models that are not here, whose fit cannot be read until they are pulled."""
    here = {c.name for c in present(models_dir)}
    return [m.name for m in catalog.load_catalog().models if m.name not in here]


def model_size(path: Path) -> int:
    """Bytes of a model file, with the other shards of a split model (NAME-00001-of-0000N.gguf)."""
    m = hub.SPLIT.match(path.name)
    if not m:
        return path.stat().st_size
    shards = path.parent.glob(f"{m.group('stem')}-*-of-{m.group('count')}.gguf")
    return sum(p.stat().st_size for p in shards)


def drafts_for(target: Path, models_dir: Path | None = None) -> list[Candidate]:
    """The present drafts that fit `target`, smallest first."""
    target_vocab = vocab.read(target)
    limit = model_size(target)
    out = []
    for c in present(models_dir):
        if c.size >= limit or c.path.resolve() == target.resolve():
            continue
        try:
            f = vocab.fit(target_vocab, vocab.read(c.path))
        except ModelError:
            continue  # an unreadable file is no candidate; `models list` reports its problem
        if f.ok:
            out.append(Candidate(c.name, c.path, c.size, f))
    return sorted(out, key=lambda c: (c.size, c.name))
