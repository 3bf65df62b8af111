"""The table of options that `generate`, `chat`, `tui`, `serve`, `bench` and `calibrate` share: one row
per setting, its flag spellings (llama.cpp's where they overlap), its type, its help line and its panel in
`--help`. settings.py layers their values (flag, environment, config file, default); cli/ declares the
flags from it; the server checks requests against it.
"""

from __future__ import annotations

from dataclasses import dataclass

ENV_PREFIX = "SSD_EDGE_"


@dataclass(frozen=True)
class Option:
    name: str                 # python name and config-file key (dashes or underscores)
    decls: tuple[str, ...]    # flag spellings, e.g. ("-c", "--ctx-size")
    kind: type                # int, float, str, bool or list (of str; the flag repeats)
    help: str
    panel: str
    env: str = ""             # environment variable; default SSD_EDGE_<NAME>

    @property
    def env_var(self) -> str:
        return self.env or ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "/".join(self.decls)


_M, _R, _MEM, _S, _X, _O, SERVER = "Models", "Runtime", "Memory", "Sampling", "Speculation", "Output", "Server"
OPTIONS: dict[str, Option] = {o.name: o for o in [
    Option("model", ("-m", "--model"), str, "target model: a catalog name or a .gguf path (default: the "
           "catalog's default target)", _M),
    Option("model_draft", ("-md", "--model-draft"), str, "draft model: a catalog name (NAME:q4_0 for a variant made by `models "
           "derive-draft`) or a .gguf path (default: the catalog's default draft when the target is the default "
           "target, as its q4_0 variant once derived; else none)", _M),
    Option("hf_repo", ("-hf", "-hfr", "--hf-repo"), str, "target model from the Hugging Face Hub, ORG/REPO[:QUANT] "
           "(QUANT case-insensitive; default Q4_K_M, else the repo's first GGUF), pulled into the models folder "
           "on first use; HF_TOKEN for gated repos, HF_HUB_OFFLINE=1 to use only what is pulled", _M),
    Option("hf_repo_draft", ("-hfd", "-hfrd", "--hf-repo-draft"), str, "draft model from the Hub, as -hf (default "
           "for a Hub target: the smallest draft here that fits it, else none)", _M),
    Option("no_draft", ("--no-draft",), bool, "run without a draft model (modes ar and lookup only)", _M),
    Option("models_dir", ("--models-dir",), str, "folder of pulled models", _M, env="SSD_EDGE_MODELS"),
    Option("n_gpu_layers", ("-ngl", "--n-gpu-layers"), int, "target layers offloaded to a GPU (-1: all, the "
           "default where this build has a local GPU (CUDA, Metal) or with --rpc; else 0; ignored, with a "
           "warning, on a CPU-only build)", _M),
    Option("n_gpu_layers_draft", ("-ngld", "--n-gpu-layers-draft"), int, "draft layers offloaded to a GPU", _M),
    Option("rpc", ("--rpc",), str, "llama.cpp rpc-servers HOST:PORT[,HOST:PORT...] that take the target's "
           "offloaded layers (-ngl; with --rpc it defaults to all); the draft stays here, on a local GPU at most. "
           "No authentication or encryption: trusted networks only (`ssd-edge rpc-server` starts one)", _M),
    Option("threads", ("-t", "--threads"), int, "target threads (default: for ssd, the cores minus the draft's "
           "share, e.g. 1 of 2; for ar, sd and lookup, all cores; without -t/-td the target's plain steps then "
           "follow the machine, now and then timing one thread fewer and keeping the faster). Given, they stand", _R),
    Option("threads_draft", ("-td", "--threads-draft"), int, "draft threads (default: for ssd, a third of the "
           "cores, at least 1, since draft and target run at the same time; for sd, all cores, since they take "
           "turns)", _R),
    Option("cache_type_k", ("-ctk", "--cache-type-k"), str, "KV cache type of the target's K: f16, q8_0, q4_0 "
           "(default f16)", _MEM),
    Option("cache_type_v", ("-ctv", "--cache-type-v"), str, "KV cache type of the target's V: f16, q8_0, q4_0 "
           "(default f16; quantized V needs flash attention)", _MEM),
    Option("cache_type_k_draft", ("-ctkd", "--cache-type-k-draft"), str, "KV cache type of the draft's K "
           "(default f16)", _MEM),
    Option("cache_type_v_draft", ("-ctvd", "--cache-type-v-draft"), str, "KV cache type of the draft's V "
           "(default f16)", _MEM),
    Option("flash_attn", ("-fa", "--flash-attn"), str, "flash attention: on, off or auto (default auto: where "
           "the backend has it)", _MEM),
    Option("mlock", ("--mlock",), bool, "lock the models' weights in RAM (never swapped out)", _MEM),
    Option("no_mmap", ("--no-mmap",), bool, "read the weights into memory instead of mapping the files", _MEM),
    Option("memory_budget", ("--memory-budget",), str, "most memory the app may take, e.g. 3G or 800M (default: "
           "no limit): shrinks the context, then the KV type, then the branch cells, then drops the draft, and "
           "says what it chose; refuses when the target alone cannot fit", _MEM),
    Option("ctx_size", ("-c", "--ctx-size"), int, "context size in tokens, prompt and answer together "
           "(default 4096)", _R),
    Option("batch_size", ("-b", "--batch-size"), int, "tokens a prompt is read in at a time (default 512); a "
           "fill-in-the-middle prompt keeps at most 3/4 of it before the cursor and 1/4 after (llama-server's cut)", _R),
    Option("cache_reuse", ("--cache-reuse",), int, "also reuse chunks of at least N tokens that the cache holds and "
           "the next prompt has at another place (an editor's window moved: lines gone at the top), shifting their "
           "positions as llama-server's --cache-reuse does; such a chunk attended to text that is gone, so the "
           "answer is an approximation of a cold read's (default 0: off; every answer equals a cold read's)", _R),
    Option("n_predict", ("-n", "--n-predict"), int, "most tokens to generate; -1: until end of text or a full "
           "context (default: generate 256, tui 512, chat and serve -1)", _R),
    Option("temp", ("--temp",), float, "temperature; 0 = greedy (default 0)", _S),
    Option("top_k", ("--top-k",), int, "top-k sampling (default 40); 0 = off, which samples from each whole "
           "row of the vocabulary: slower (on a GPU, much slower) than the top-k candidates alone", _S),
    Option("top_p", ("--top-p",), float, "top-p sampling, in (0, 1] (default 0.95)", _S),
    Option("min_p", ("--min-p",), float, "min-p sampling, in [0, 1) (default 0.05)", _S),
    Option("seed", ("--seed",), int, "random seed; -1 = random (default -1)", _S),
    Option("presence_penalty", ("--presence-penalty",), float, "subtracted once from the logit of every token the "
           "answer already holds, in [-2, 2] (default 0)", _S),
    Option("frequency_penalty", ("--frequency-penalty",), float, "subtracted from a token's logit once per time "
           "the answer holds it, in [-2, 2] (default 0)", _S),
    Option("logit_bias", ("-l", "--logit-bias"), list, "TOKEN_ID=BIAS (or llama.cpp's TOKEN_ID+BIAS, TOKEN_ID-BIAS) "
           "added to a token's logit, in [-100, 100]; -100 (or -inf) all but bans it (repeatable)", _S),
    Option("mode", ("--mode",), str, "decoding: auto | ar | sd | lookup | ssd (default auto: each round, "
           "a plain step, the n-gram lookup, the draft or a pre-speculated branch, whichever is expected fastest)", _X),
    Option("no_calibrate", ("--no-calibrate",), bool, "do not measure this device the first time mode auto "
           "meets a model pair (auto then prices rounds from what each generation times)", _X),
    Option("draft_max", ("-k", "--draft-max"), int, "most draft tokens per round, k (default: auto plans up to 8 from the draft, 16 from an n-gram copy; sd, lookup, ssd 3)", _X),
    Option("draft_min", ("--draft-min",), int, "rounds with fewer drafted tokens verify none (default 0)", _X),
    Option("draft_p_min", ("--draft-p-min",), float, "stop drafting below this draft probability (default 0)", _X),
    Option("budget_cells", ("--budget-cells",), int, "SSD: draft KV cells that pre-speculated branches may hold "
           "(default (k + 1) x k: a branch for each acceptance length; 72 at k = 8)", _X),
    Option("stop", ("--stop",), list, "stop at this text (repeatable)", _O),
    Option("config", ("--config",), str, "TOML config file (default ~/.config/ssd-edge/config.toml)", _O),
    Option("verbose", ("-v", "--verbose"), bool, "show llama.cpp's own logs", _O),
    Option("debug", ("--debug",), bool, "show tracebacks and debug logs", _O),
    # `ssd-edge serve` only
    Option("host", ("--host",), str, "address to listen on (default 127.0.0.1, this machine only; any other "
           "needs --api-key)", SERVER),
    Option("port", ("--port",), int, "port to listen on (default 8080; 0: any free port)", SERVER),
    Option("api_key", ("--api-key",), str, "require 'Authorization: Bearer KEY' on every request but /health",
           SERVER),
    Option("max_queue", ("--max-queue",), int, "requests that may wait while one generates; beyond them: 503 "
           "with Retry-After (default 8)", SERVER),
    Option("max_body", ("--max-body",), int, "largest request body in bytes (default 4194304)", SERVER),
]}
SERVER_OPTIONS = [n for n, o in OPTIONS.items() if o.panel == SERVER]
