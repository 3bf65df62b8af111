"""The terminal face: commands (the typer app, every command; `ssd-edge` is commands.main),
settings (the flags' table and its layering), chat, signals, stats_text."""
