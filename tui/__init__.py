"""ssd-edge's terminal UI (Textual). `tui.app.run_app(config)` starts it.

Layers: `chats` (history on disk), `stream` (engine events -> UI batches),
`live` (panel figures), `loader` (engine build and model pulls), `widgets/`,
`dialogs` and `screens`, `commands` (palette), `app` (the app: layout, streaming, the engine's life, actions).
`tui` depends on `ssd_edge`; `ssd_edge` never imports Textual.
"""
