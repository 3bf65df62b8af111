"""ssd-edge's terminal UI (Textual). `tui.app.run_app(config)` starts it.

Layers: `chats` (history on disk), `stream` (engine events -> UI batches),
`live` (panel figures), `loader` (engine build and model pulls), `session` (the
conversation: chat, engine, reply, settings, workers), `widgets/`, `frames` (a
streaming reply drawn in frames), `dialogs` and `screens`, `commands` (palette),
`app` (the app: layout, the engine's life on screen, keys and actions).
`tui` depends on `ssd_edge`; `ssd_edge` never imports Textual.
"""
