"""The terminal face: commands (the typer app, every command; `ssd-edge` is entry.main: libllama first,
then commands.main),
settings (the flags' table and its layering), chat, signals, stats_text."""
