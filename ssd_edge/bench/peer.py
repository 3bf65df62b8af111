"""The peer columns of `ssd-edge bench`: llama.cpp's own speculative decoding
(`llama-speculative-simple`, the draft model) and its n-gram lookup decoding
(`llama-lookup`, the target alone), built by scripts/build_llama_tools.sh from
the llama.cpp sources that the pinned llama-cpp-python carries, on the same
models, prompt text, threads and draft length, read from their own timing
output (both tools print the same lines):

    decoded  120 tokens in   10.512 seconds, speed:   11.416 t/s
    n_drafted = 96
    n_accept  = 80

Its "decoded" time starts after the prompt (all but its last token) is
encoded, so it compares with ssd-edge's decode tokens/s (which starts after the
first token) up to one target step, and its "encoded" time, the prompt read by
the target and the draft model, with ssd-edge's time to the first token. Which
side of that line the draft's reading of the prompt falls on differs (llama.cpp
and `sd`: before the first token; `auto`: in its first draft round, so that its
first token comes as fast as `ar`'s), so the bench also compares the whole
answer, prompt to last token (report.py: answer tokens/s).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import paths

BINARY = "llama-speculative-simple"
LOOKUP = "llama-lookup"  # beside BINARY in the same build
TOOLS = {"draft": BINARY, "lookup": LOOKUP}  # a peer's kind -> its binary
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([0-9.]+)\s+seconds, speed:\s+([0-9.]+) t/s")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([0-9.]+)\s+seconds")
_FIELD = re.compile(r"\b(n_drafted|n_accept|n_predict|n_draft)\s*=\s*(\d+)")


def default_dirs() -> list[Path]:
    env = os.environ.get("SSD_EDGE_LLAMA_TOOLS")
    out = [Path(env).expanduser() / "bin"] if env else []
    return out + [paths.home() / "llama-tools" / "bin"]


def find_binary(tools_dir: str | os.PathLike[str] | None = None, name: str = BINARY) -> Path | None:
    """A llama.cpp tool (llama-speculative-simple unless named): in `tools_dir` (or its bin/), the
    default build folder, or PATH."""
    dirs = []
    if tools_dir:
        d = Path(tools_dir).expanduser()
        dirs += [d, d / "bin"]
    else:
        dirs += default_dirs()
    for d in dirs:
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    if tools_dir:
        return None
    found = shutil.which(name)
    return Path(found) if found else None


@dataclass(frozen=True)
class PeerRun:
    tokens: int
    decode_s: float
    tokens_per_s: float
    prompt_tokens: int
    drafted: int
    accepted: int
    encode_s: float | None = None  # reading the prompt: the target's, and the draft model's where there is one


def parse_output(text: str) -> PeerRun:
    """Read a peer's timing lines; ValueError if they are missing."""
    m = _DECODED.search(text)
    if not m:
        raise ValueError("no 'decoded N tokens in S seconds' line in the llama.cpp tool's output")
    fields = {k: int(v) for k, v in _FIELD.findall(text)}
    enc = _ENCODED.search(text)
    return PeerRun(tokens=int(m.group(1)), decode_s=float(m.group(2)), tokens_per_s=float(m.group(3)),
                   prompt_tokens=int(enc.group(1)) if enc else 0, drafted=fields.get("n_drafted", 0),
                   accepted=fields.get("n_accept", 0), encode_s=float(enc.group(2)) if enc else None)


def command(binary: Path, target: Path, draft: Path | None, prompt_file: Path, *, k: int, target_threads: int,
            draft_threads: int, max_tokens: int, temperature: float, seed: int, n_ctx: int) -> list[str]:
    """The peer's command line: llama-speculative-simple with the draft model, or llama-lookup
    (draft None: n-gram lookup over the prompt and the answer so far, the target alone)."""
    common = ["-t", str(target_threads), "-tb", str(target_threads), "-c", str(n_ctx), "-n", str(max_tokens),
              "--temp", str(temperature), "--seed", str(seed), "-f", str(prompt_file), "--spec-draft-n-max", str(k)]
    if draft is None:
        return [str(binary), "-m", str(target), *common]
    return [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple", *common,
            "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(draft_threads), "-tbd", str(draft_threads)]


def run(binary: Path, target: Path, draft: Path | None, prompt_text: str, *, timeout_s: float = 600,
        **kwargs) -> PeerRun:
    """Run a peer once on `prompt_text` (already rendered with the chat template); draft None: llama-lookup."""
    with tempfile.TemporaryDirectory(prefix="ssd-edge-peer-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(prompt_text)
        cmd = command(binary, target, draft, prompt_file, **kwargs)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, errors="replace")
    out = proc.stdout + "\n" + proc.stderr
    if proc.returncode != 0:
        last = [ln for ln in out.strip().splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"{binary.name} exited with {proc.returncode}: {' | '.join(last)}")
    return parse_output(out)


def version(binary: Path) -> str:
    """The llama.cpp build string the binary reports (or 'unknown')."""
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (proc.stdout + proc.stderr).strip().splitlines()
    return next((ln.strip() for ln in text if "version" in ln.lower()), text[0] if text else "unknown")
