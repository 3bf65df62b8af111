"""Fill-in-the-middle prompts: the text before and after the cursor (and other files' chunks) laid out in
the model's own FIM tokens, as llama-server's /infill lays them out (its `format_infill`):

    [extra context]  <rep>myproject\\n <sep>{filename}\\n{text} ... <sep>filename\\n
    [BOS]  <pre>{prefix}{prompt}  <suf>{suffix}  <mid>

Every piece of text is tokenized as plain text: a special token's spelling in the user's code
(`<|fim_middle|>`) stays text, never becomes that token. Only the layout writes FIM tokens, by id.

The pieces are cut to fit as llama-server cuts them, in tokens, with the engine's n_batch (-b/--batch-size,
512 unless set; llama.cpp's FIM presets run 1024):
  - the prefix keeps at most 3/4 of n_batch, from its end (the lines nearest the cursor);
  - the suffix at most n_batch/4 - 2 - len(prompt), from its start;
  - the extra context what is left of n_ctx - n_batch - 2 * n_predict, from its end: the oldest chunks
    (the first ones) go first, the first kept one may start mid-chunk (as in llama-server); and never
    more than leaves the answer room in the context (n_predict tokens, at least one: llama-server's
    sum can pass n_ctx by a token or two when n_predict is 0 or -1, an editor's warm-up).
One difference: where the vocabulary adds a start token, it opens the prompt here; llama-server puts it
between the extra context and the prefix. (Qwen2.5-Coder adds none, so both read the same tokens there.)

A vocabulary without prefix, suffix and middle tokens cannot fill in the middle: ConfigError (a 400 on
the server, exit 2 on the CLI). `infill()` is the Python API: a generation of the middle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .errors import ConfigError
from .interface import BackendModel, FimTokens

REPO = "myproject\n"       # llama-server's repository name line (its TODO: an input)
LAST_FILE = "filename\n"   # and the current file's name line
NO_SEP = "\n\n--- snippet ---\n\n"  # a chunk's opening where the vocabulary has no file separator


@dataclass(frozen=True)
class Chunk:
    """One piece of repository context (llama-server's input_extra item)."""

    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class InfillPrompt:
    """The laid-out prompt and what the cut left of each piece (in tokens)."""

    tokens: tuple[int, ...]
    n_prefix: int          # prefix tokens kept
    n_suffix: int          # suffix tokens kept
    n_extra: int           # extra-context tokens kept
    truncated: bool        # whether any piece was cut


def fim_tokens(model: BackendModel) -> FimTokens:
    """The model's FIM tokens, or ConfigError saying it has none."""
    fim = model.fim_tokens()
    if fim is None:
        raise ConfigError(f"the model {model.path.name} has no fill-in-the-middle tokens (prefix, suffix and middle), "
                          "so it cannot complete between a prefix and a suffix; use a FIM model such as "
                          "Qwen2.5-Coder (the default pair)")
    return fim


def layout(model: BackendModel, prefix: str, suffix: str, *, prompt: str = "", extra: Sequence[Chunk] = (),
           n_batch: int = 512, n_ctx: int = 4096, n_predict: int = 0) -> InfillPrompt:
    """The FIM prompt of `prefix` + `prompt` (the text before the cursor; prompt is the cursor's line so far),
    `suffix` (after it) and `extra` (other files' chunks, oldest first), cut as the module says."""
    fim = fim_tokens(model)

    def text(s: str) -> list[int]:
        return model.tokenize(s, add_special=False, parse_special=False) if s else []

    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep, *text(REPO)]
    for chunk in extra:
        extra_tokens += [fim.sep, *text(chunk.filename + "\n")] if fim.sep is not None else text(NO_SEP)
        extra_tokens += text(chunk.text)
    if fim.sep is not None:
        extra_tokens += [fim.sep, *text(LAST_FILE)]
    pre, suf, mid = text(prefix), text(suffix), text(prompt)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(mid))))
    start = [t for t in model.tokenize("", add_special=True, parse_special=False) if not model.is_eog(t)]
    local = [fim.pre] + pre[len(pre) - n_pre:] + mid + [fim.suf] + suf[:n_suf] + [fim.mid]
    room = n_ctx - len(start) - len(local) - max(n_predict, 1)
    n_extra = max(0, min(n_ctx - n_batch - 2 * n_predict, room, len(extra_tokens)))
    tokens = start + extra_tokens[len(extra_tokens) - n_extra:] + local
    cut = n_pre < len(pre) or n_suf < len(suf) or n_extra < len(extra_tokens)
    return InfillPrompt(tuple(tokens), n_pre, n_suf, n_extra, cut)


def infill(engine: Any, prefix: str, suffix: str = "", *, prompt: str = "", extra: Sequence[Chunk] = (),
           max_tokens: int = 256, **kwargs: Any) -> Iterator[Any]:
    """Generate the middle between `prefix` and `suffix` on a loaded Engine: its generate() events
    (kwargs: mode, stop, cancel, sampling, ...), over the layout at the engine's n_batch and n_ctx.

        for ev in infill(engine, "def area(r):\\n    ", "\\n\\nprint(area(2))\\n", max_tokens=32): ...
    """
    cfg = engine.config
    laid = layout(engine.target, prefix, suffix, prompt=prompt, extra=extra, n_batch=cfg.n_batch, n_ctx=cfg.n_ctx,
                  n_predict=max_tokens)
    return engine.generate(tokens=list(laid.tokens), max_tokens=max_tokens, **kwargs)
