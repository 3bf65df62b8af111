"""ssd-edge generate, chat and tui: the commands that load an engine and talk with it on this terminal.

The TUI is a face of its own (the folder tui/): it is found by its entry point, group "ssd_edge.faces",
name "tui" (pyproject.toml), so nothing in ssd_edge imports it."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from importlib.metadata import entry_points
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from .. import settings
from ..config import EngineConfig
from ..errors import ConfigError, SSDEdgeError
from ..events import FinishEvent, TokenEvent
from ..infill import layout
from ..structured import Constraint
from ..stats_text import stats_line
from . import loader, sources
from .app import ENGINE_OPTIONS, EPILOG, app, with_options
from .structured import (GrammarFlag, JsonObjectFlag, JsonSchemaFlag, LogprobsFlag, RegexFlag, StrictFlag,
                         check_logprobs, constraint_from, logprobs_json, read_text)
from .reporting import EXIT_CONTEXT_FULL, reported, stderr
from .signals import EXIT_INTERRUPTED, CancelOnSignal

log = logging.getLogger("ssd_edge.cli")

FACES = "ssd_edge.faces"  # the entry-point group of the faces installed beside the package


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin (strict UTF-8; one trailing newline dropped) when it is omitted or '-'."""
    if prompt is not None and prompt != "-":
        if not prompt.strip():
            raise ConfigError("the prompt is empty")
        return prompt
    stdin = sys.stdin
    if stdin is None or stdin.isatty():
        raise ConfigError('give a PROMPT, or pipe one on stdin (echo "def fib(n):" | ssd-edge generate)')
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"the prompt on stdin is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
                          f"{e.start}, line {line})") from None
    if not text.strip():
        raise ConfigError("the prompt on stdin is empty")
    return text[:-1] if text.endswith("\n") else text


def read_suffix(arg: str) -> str:
    """--suffix's argument: the text itself, or the file it names after '@' (read as it is)."""
    return read_text(arg[1:], "--suffix") if arg.startswith("@") else arg


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="the prompt; omit it or give - to read it from stdin",
                                                    show_default=False, metavar="PROMPT")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="wrap the prompt as a user message in the model's chat "
                                       "template (default: the prompt is plain text to continue)")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="a system message (implies --chat)",
                                                  show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object (text, token ids, stop_reason, "
                                           "stats) instead of streaming")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no stats line on stderr")] = False,
    suffix: Annotated[Optional[str], typer.Option(
        "--suffix", metavar="TEXT|@FILE", show_default=False,
        help="fill in the middle: the text after the cursor (@FILE: read from FILE), the prompt the text "
             "before it, both laid out in the model's own fill-in-the-middle tokens")] = None,
    json_schema: JsonSchemaFlag = None, json_object: JsonObjectFlag = False, regex: RegexFlag = None,
    grammar: GrammarFlag = None, strict: StrictFlag = False, logprobs: LogprobsFlag = None,
    *, flags: dict[str, Any],
) -> None:
    """Stream a completion of PROMPT to stdout (stats on stderr)."""
    with reported(flags):
        s = sources.with_hub_models(settings.resolve(flags))
        constraint = constraint_from(json_schema, json_object, regex, grammar, strict)
        check_logprobs(logprobs, json_out)
        text = read_prompt(prompt)
        cfg = settings.engine_config(s)
        max_tokens = s.max_tokens(256, cfg.n_ctx)
        messages = None
        if chat or system is not None:
            if suffix is not None:
                raise ConfigError("--suffix fills in the middle of plain text, not of a chat (--chat, --system)")
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        after = read_suffix(suffix) if suffix is not None else None
        engine = loader.load_engine(cfg, s)
        try:
            tokens = None
            if after is not None:  # ConfigError (exit 2) where the model has no FIM tokens
                tokens = list(layout(engine.target, text, after, n_batch=cfg.n_batch, n_ctx=cfg.n_ctx,
                                     n_predict=max_tokens).tokens)
            code = write_completion(engine, cfg, text, messages, max_tokens, s["stop"] or [], json_out, quiet,
                                    constraint, logprobs, tokens)
        finally:
            engine.close()
    raise typer.Exit(code)


def write_completion(engine: Any, cfg: EngineConfig, text: str, messages: list[dict[str, str]] | None, max_tokens: int,
                     stop: list[str], json_out: bool, quiet: bool, constraint: Constraint | None = None,
                     logprobs: int | None = None, tokens: list[int] | None = None) -> int:
    """tokens: the prompt already tokenized (a fill-in-the-middle layout), else `text` or `messages` are."""
    err = stderr()
    out = sys.stdout
    tokens = tokens if tokens is not None else engine.prompt_tokens(None if messages else text, messages)
    cancel = threading.Event()
    finish: FinishEvent | None = None
    state: str | None = None
    with CancelOnSignal(cancel) as sig:  # (said once the handlers are in: a Ctrl-C from now on is a clean stop)
        log.debug("processing the prompt: %d tokens, mode %s", len(tokens), cfg.mode)
        events = engine.generate(tokens=tokens, max_tokens=max_tokens, stop=stop, cancel=cancel,
                                 constraint=constraint, logprobs=logprobs)
        try:
            for ev in events:
                if isinstance(ev, TokenEvent):
                    state = ev.live.state
                    if ev.text and not json_out:
                        out.write(ev.text)
                        out.flush()
                else:
                    finish = ev
        finally:
            events.close()  # on any exit: the engine's finally joins its worker thread
    assert finish is not None
    if json_out:
        data = {
            "text": finish.text, "tokens": list(finish.tokens), "prompt_tokens": len(tokens),
            "stop_reason": finish.stop_reason, "message": finish.message, "mode": cfg.mode,
            "model": cfg.target.path, "draft": cfg.draft.path if cfg.draft else None, "stats": finish.stats.to_dict(),
        }
        if logprobs is not None:
            data["logprobs"] = logprobs_json(finish.logprobs, engine.piece)
        out.write(json.dumps(data, ensure_ascii=False) + "\n")
    else:
        if finish.tail:
            out.write(finish.tail)
        if not finish.text.endswith("\n") and (out.isatty() or same_file(out, sys.stderr)):
            out.write("\n")  # the stats line below starts a line of its own (a pipe gets the text exactly)
    out.flush()
    cancelled = finish.stop_reason == "cancelled"
    if not quiet and not (cancelled and not finish.stats.tokens):  # stopped before a token: nothing to report
        err.print(stats_line(finish.stats, state), soft_wrap=True)
    if cancelled:
        err.print("[yellow]interrupted[/]" if sig.exit_code == EXIT_INTERRUPTED else "[yellow]terminated[/]")
        return sig.exit_code
    if finish.stop_reason == "context":
        err.print(f"[yellow]stopped:[/] {escape(finish.message or 'the context is full')} (raise -c/--ctx-size)")
        return EXIT_CONTEXT_FULL
    return 0


def same_file(a: Any, b: Any) -> bool:
    """Whether two streams write to one file (`> out.txt 2>&1`): the text and the stats line meet there."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO)
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def chat(
    system: Annotated[Optional[str], typer.Option("--system", help="the system prompt", show_default=False)] = None,
    json_schema: JsonSchemaFlag = None, json_object: JsonObjectFlag = False, regex: RegexFlag = None,
    grammar: GrammarFlag = None, strict: StrictFlag = False,
    *, flags: dict[str, Any],
) -> None:
    """Chat in the terminal: streaming answers, a stats line after each, /help for commands.

    Reads a here-doc or a pipe as well as a terminal. Ctrl-C stops an answer, Ctrl-D quits. A constraint
    flag (--json-schema, --json-object, --regex, --grammar) holds every answer of the chat."""
    from .chat import ChatSession, stream_reader, terminal_reader

    with reported(flags):
        s = sources.with_hub_models(settings.resolve(flags))
        constraint = constraint_from(json_schema, json_object, regex, grammar, strict)
        cfg = settings.engine_config(s)
        max_tokens = s.max_tokens(-1, cfg.n_ctx)
        console = Console(highlight=False, soft_wrap=True)  # the terminal wraps; rich would break streamed words
        if sys.stdin.isatty():
            read = terminal_reader(console)
        else:
            if hasattr(sys.stdin, "reconfigure"):
                sys.stdin.reconfigure(encoding="utf-8", errors="strict")
            read = stream_reader(sys.stdin, console)
        engine = loader.load_engine(cfg, s)
        try:
            session = ChatSession(engine, console, max_tokens=max_tokens, stop=s["stop"] or [], system=system,
                                  title=loader.describe(cfg), constraint=constraint)
            code = session.run(read)
        finally:
            engine.close()
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def tui(*, flags: dict[str, Any]) -> None:
    """The full-screen terminal app (also what `ssd-edge` alone starts)."""
    open_tui(flags)


def open_tui(flags: dict[str, Any]) -> None:
    with reported(flags):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):  # it would draw into a pipe and wait for keys
            raise ConfigError("the terminal UI needs a terminal (stdin and stdout); use 'ssd-edge generate' "
                              "or 'ssd-edge chat'")
        s = sources.with_hub_models(settings.resolve(flags))
        cfg = settings.engine_config(s)
        sources.check_pair(cfg.target.path, cfg.draft.path if cfg.draft else None, s.models_dir)
        run_app = installed_face("tui")
        code = run_app(cfg, str(s.models_dir), calibrate=not s["no_calibrate"],
                       max_tokens=s.max_tokens(512, cfg.n_ctx))
    raise typer.Exit(code if isinstance(code, int) else 0)


def installed_face(name: str) -> Callable[..., Any]:
    """The face NAME's entry function, found by its entry point (e.g. tui = "tui.app:run_app")."""
    found = [ep for ep in entry_points(group=FACES) if ep.name == name]
    if not found:
        raise SSDEdgeError(f"the terminal app is not available (no entry point '{name}' in group {FACES}: "
                           "reinstall with scripts/setup.sh); `ssd-edge chat` works without it")
    try:
        return found[0].load()
    except ModuleNotFoundError as e:
        module = found[0].module
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise  # the face is there, a module it needs is not: not "not available"
        raise SSDEdgeError(f"the terminal app is not available ({e}); `ssd-edge chat` works without it") from None
