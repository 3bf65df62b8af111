"""ssd-edge bench and calibrate: the commands that measure (bench/run.py and bench/calibrate.py do the work).
They read their flags only, so the command line describes the run."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from .. import settings
from ..bench.args import BENCH_MODES, FIM_MODES, PROMPTS_HELP, BenchArgs, comma_list
from ..bench.fim_run import main as run_fim
from ..bench.run import main as run_bench
from ..bench.schema import CATEGORIES
from ..errors import ConfigError
from . import sources
from .app import app, with_options
from .reporting import reported


MEASURE_EPILOG = """\
[bold]Settings[/] come from these flags only: the config file and SSD_EDGE_<NAME> variables do not apply, \
so the command line describes the run (SSD_EDGE_MODELS, SSD_EDGE_HOME and SSD_EDGE_DEBUG still place the \
models and profiles, and show tracebacks). The flags this command shares with generate (-n, -m, -md...) mean the \
same here.

[bold]Progress[/] goes to stderr: a bar on a terminal, one line per step in a log or a pipe.

[bold]Exit codes[/]: 0 ok · 1 other error · 2 bad usage or config · 3 model error · 130 interrupted (Ctrl-C) \
· 143 terminated (SIGTERM)."""

_DEFAULT_DRAFT = ("draft model: a catalog name or a .gguf path (default, for the catalog's default target only: "
                  "the catalog's default draft, as its q4_0 variant once derived)")
BENCH_OPTIONS = ["model", "model_draft", "hf_repo", "hf_repo_draft", "models_dir", "n_predict", "draft_max", "ctx_size", "temp", "seed",
                 "no_calibrate", "rpc", "verbose", "debug"]
BENCH_HELP = {
    "model_draft": _DEFAULT_DRAFT,
    "n_predict": "tokens per generation (default 128; --quick: at most 24); a prompt's own max_tokens overrides it",
    "draft_max": "the most tokens a round drafts, in every mode (default: auto plans each round's length up to 8 "
                 "from the draft model, 16 from an n-gram copy; sd, lookup, ssd and llama.cpp's peer draft 3)",
    "ctx_size": "context size in tokens (default 2048)",
    "temp": "sampling temperature (default 0 = greedy)",
    "seed": "base seed; prompt i uses seed + i in every mode (default 0)",
    "no_calibrate": "never calibrate; without a saved profile auto's planner prices verifies from what each "
                    "generation times",
    "rpc": "HOST:PORT[,...]: the target's layers on these llama.cpp rpc-servers, the draft here (no calibration; "
           "the llama.cpp peer column stays local: add --no-peer)",
}
PRICED_HELP = ("run the modes on a priced pair instead of model files: a synthetic target and draft whose every "
               "decode waits what one llama_decode of its size took on a GPU (tables: h200-1.5b, h200-7b; one "
               "H200, FIELD_NOTES 2026-12-04), so the engine's host cost and the planner meet GPU prices on this "
               "CPU. @AGREEMENT: how often the draft agrees with the target (default 0.95). Results are labelled "
               "'priced: H200 table', never a GPU measurement. One setting, 'priced', at 1+1 threads (threads "
               "change no price; the draft's worker runs beside the target as on a GPU): --settings does not "
               "apply; no llama.cpp peer; auto plans from a profile measured on the priced pair, in memory "
               "(saved profiles are untouched)")
CALIBRATE_OPTIONS = ["model", "model_draft", "hf_repo", "hf_repo_draft", "models_dir", "n_gpu_layers",
                     "n_gpu_layers_draft", "n_predict", "verbose", "debug"]
CALIBRATE_HELP = {"model_draft": _DEFAULT_DRAFT,
                  "n_predict": "tokens per acceptance-probe generation (default 48; --quick: 24)"}


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
    modes: Annotated[Optional[str], typer.Option("--modes", help=f"comma-separated modes (default: "
                                                 f"{','.join(BENCH_MODES)}; with --fim: ar,auto); ar is the speedup "
                                                 "baseline", show_default=False)] = None,
    hardware: Annotated[str, typer.Option("--settings", help="hardware settings to run (default: separate,shared)",
                                          show_default=False)] = "separate,shared",
    category: Annotated[Optional[str], typer.Option("--category", help="only these prompt categories, "
                                                    f"comma-separated: {', '.join(CATEGORIES)}",
                                                    show_default=False)] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", metavar="FILE.jsonl|structured", help=PROMPTS_HELP,
                                                   show_default=False)] = None,
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
    no_peer: Annotated[bool, typer.Option("--no-peer", help="skip llama.cpp's own runs (llama-speculative-simple, llama-lookup)")] = False,
    recalibrate: Annotated[bool, typer.Option("--recalibrate", help="calibrate again before the run even if a "
                                              "profile exists")] = False,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="skip bench.png")] = False,
    stand_in: Annotated[Optional[str], typer.Option("--stand-in", help="also run every setting with the target "
                                                    "converted to this type (bf16, f16, q8_0: `ssd-edge models "
                                                    "derive`, made once if missing), a measuring stand-in of the "
                                                    "memory-bound regime of GPUs and Apple silicon",
                                                    show_default=False)] = None,
    priced: Annotated[Optional[str], typer.Option("--priced", metavar="TABLE[@AGREEMENT]", help=PRICED_HELP,
                                                  show_default=False)] = None,
    agreement: Annotated[Optional[float], typer.Option("--agreement", help="with --priced: how often the priced "
                                                       "draft's favourite is the target's (0..1, default 0.95)",
                                                       show_default=False)] = None,
    fim: Annotated[bool, typer.Option("--fim", help="the completion bench instead: an editing sequence in "
                                      "llama.vim's /infill requests (the cursor moving down three standard-library "
                                      "files, 256 lines above, 64 below, its ring of extra chunks; greedy, -n "
                                      "default 48) sent to `ssd-edge serve --cache-reuse 256` in each of --modes and "
                                      "to llama-server (alone, with the draft, with n-gram drafts; its FIM presets' "
                                      "flags) where found; -c default 8192; writes bench.json and bench.md")] = False,
    fim_cursors: Annotated[int, typer.Option("--fim-cursors", help="with --fim: cursor positions per file "
                                             "(default 3: 9 completions)", show_default=False)] = 3,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", hidden=True)] = None,  # -n's old name
    *, flags: dict[str, Any],
) -> None:
    """Benchmark ar, sd, lookup, ssd and auto on the shipped prompt suite (code, code-edit, prose, chat,
    translation) in two hardware settings: 'separate' (target and draft one core each) and 'shared' (both
    models on all cores). Greedy and seeded; modes interleaved after a warm-up. Writes bench.json, bench.md
    and bench.png, and prints the summary tables. llama.cpp's own speculative decoding runs beside them when
    llama-speculative-simple is found (scripts/build_llama_tools.sh)."""
    with reported(flags):
        flags = sources.flags_with_hub_models(flags)
        f = {k: v for k, v in flags.items() if v is not None and v is not False}
        n = _old_name(flags, "n_predict", "--max-tokens", max_tokens)
        args = BenchArgs(
            model=f.get("model"), model_draft=f.get("model_draft"), models_dir=f.get("models_dir"), output=output,
            modes=comma_list("--modes", modes or (",".join(FIM_MODES if fim else BENCH_MODES)), BENCH_MODES),
            settings=comma_list("--settings", hardware, ("separate", "shared")),
            category=comma_list("--category", category, CATEGORIES) if category is not None else None,
            prompts=prompts, max_tokens=(48 if fim else 128) if n is None else n, k=f.get("draft_max"), reps=reps,
            seed=f.get("seed", 0), temp=f.get("temp", 0.0), ctx_size=f.get("ctx_size", 8192 if fim else 2048), quick=quick,
            llama_tools=llama_tools, peer_k=tuple(_ints("--peer-k", peer_k)), no_peer=no_peer,
            no_calibrate=bool(flags["no_calibrate"]), recalibrate=recalibrate, no_plot=no_plot,
            verbose=bool(flags["verbose"]), rpc=f.get("rpc"), stand_in=stand_in, priced=priced, agreement=agreement,
            fim=fim, fim_cursors=fim_cursors, argv=_argv_after(ctx, "bench"))
        code = run_fim(args) if fim else run_bench(args)
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
    k_max: Annotated[int, typer.Option("--k-max", help="longest draft length to measure (default 16)",
                                       show_default=False)] = 16,
    reps: Annotated[int, typer.Option("--reps", help="timed runs per measurement; the median is kept (default 3)",
                                      show_default=False)] = 3,
    quick: Annotated[bool, typer.Option("--quick", help="fewer repetitions and a shorter probe (about half the "
                                        "time)")] = False,
    show: Annotated[bool, typer.Option("--show", help="print the saved profile and what it means for auto; measure "
                                       "nothing")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
    probe_tokens: Annotated[Optional[int], typer.Option("--probe-tokens", hidden=True)] = None,  # -n's old name
    *, flags: dict[str, Any],
) -> None:
    """Measure this device for a (target, draft) pair and save the profile that mode auto uses: step costs
    per thread count, the slowdown of running both models at once, and acceptance on a short probe."""
    from ..bench.calibrate import main as calibrate_main

    with reported(flags):
        flags = sources.flags_with_hub_models(flags)
        n = _old_name(flags, "n_predict", "--probe-tokens", probe_tokens)
        code = calibrate_main(flags["model"], flags["model_draft"], flags["models_dir"], k_max=k_max, reps=reps,
                              probe_tokens=48 if n is None else n, quick=quick, show=show, json_out=json_out,
                              verbose=bool(flags["verbose"]), n_gpu_layers=flags["n_gpu_layers"],
                              n_gpu_layers_draft=flags["n_gpu_layers_draft"])
    raise typer.Exit(code)
