"""Derived variants: a catalog model converted to another type on this device (`ssd-edge models derive`).

Two uses. A faster draft (below). And a measuring stand-in: the target converted to bf16, f16 or
q8_0 from its 4-bit file has 4-bit quality at 16- or 8-bit cost, which on a CPU makes its verify
of several tokens cost little more than one step, the memory-bound regime of GPUs and Apple
silicon (FIELD_NOTES, "Two regimes"). Its provenance note and every listing that shows it say
so: it is for measuring speculation's other regime on this machine, not a model to use.


llama.cpp's CPU kernels for Q4_0 are faster than its Q4_K ones on x86 with AVX-512 (FIELD_NOTES:
the 0.5B draft decodes 20% faster at 1 thread, 12% at 2), and a faster draft makes every draft
round cheaper. A draft's q4_0 variant is made pure (RECIPES): the output layer in Q4_0 too,
where llama.cpp would keep it in Q6_K (a target's keeps the mix). A small draft's output layer is
much of its work (the 0.5B draft's 152k-token vocabulary: 136M of its 494M weights), and Q6_K's
kernel computes several rows one at a time: on this project's machine the pure file decodes a
token 24-29% faster than the default mix, at about the same agreement with the target on code and
2 points less on prose (docs/models.md). The draft's quantization never changes what is committed (coupling.py: the target
decides every token), only speed and acceptance. The derived file lives beside the original in
the models folder, named NAME.KIND.gguf, with a JSON note of its provenance beside it; it is used
as `-md NAME:KIND`, and as the default draft when the default draft has a q4_0 variant.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

from ..errors import ModelNotFoundError
from . import catalog


def provenance_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


# How a draft's variant of each type is made, where it is not llama.cpp's default mix (a target keeps
# the mix: its output layer shapes every answer); a file made by another recipe (an older version) is
# made again, in seconds
RECIPES = {"q4_0": "pure"}


def derive(name: str, kind: str = "q4_0", models_dir: Path | None = None, force: bool = False) -> tuple[Path, bool]:
    """(the derived file, whether it was made now). The source must be pulled and verified."""
    from ..llama.library import llama_cpp_version
    from ..llama.quantization import quantize  # llama.cpp loads when it runs

    cat = catalog.load_catalog()
    model = cat.get(name, other=None)  # a catalog model only
    if kind not in catalog.DERIVED_KINDS:
        raise ModelNotFoundError(f"unknown type '{kind}': choose one of {', '.join(catalog.DERIVED_KINDS)}")
    src = catalog.resolve_model(name, models_dir)
    dst = catalog.derived_path(model, kind, models_dir)
    recipe = RECIPES.get(kind) if model.role != "target" else None
    if dst.exists() and provenance_path(dst).exists() and not force and _recipe(dst) == recipe:
        return dst, False
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    t0 = time.perf_counter()
    try:
        quantize(src, tmp, kind, pure=recipe == "pure")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)  # a failure or Ctrl-C leaves no half-written file
    note = {"source": model.name, "source_file": model.file, "source_sha256": model.sha256, "type": kind,
            **({"recipe": recipe} if recipe else {}),
            **({"stand_in": True, "note": STAND_IN_NOTE} if catalog.is_stand_in(model, kind) else {}),
            "size": dst.stat().st_size, "llama_cpp_python": llama_cpp_version(),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t0, 2)}
    provenance_path(dst).write_text(json.dumps(note, indent=2) + "\n")
    return dst, True


STAND_IN_NOTE = ("a measuring stand-in, not a model to use: converted from a lower-precision file, it has that file's "
                 "quality at this type's cost (the memory-bound regime, measurable on a CPU)")


def _recipe(path: Path) -> str | None:
    """The recipe a derived file's provenance note records (None: llama.cpp's default mix)."""
    try:
        return json.loads(provenance_path(path).read_text()).get("recipe")
    except (OSError, ValueError):
        return None


def is_stand_in_file(path: Path) -> bool:
    """Whether a model file is a derived measuring stand-in (its provenance note says so)."""
    try:
        return bool(json.loads(provenance_path(path).read_text()).get("stand_in"))
    except (OSError, ValueError):
        return False


def default_draft(models_dir: Path | None = None) -> str:
    """The catalog's default draft, as its q4_0 variant when one has been derived here."""
    cat = catalog.load_catalog()
    name = cat.default_draft
    path = catalog.derived_path(cat.get(name), "q4_0", models_dir)
    return f"{name}:q4_0" if path.exists() and provenance_path(path).exists() else name
