"""A cheap real draft/target pair for tests: SmolLM2-135M-Instruct as the target
and, as the draft, the same GGUF with only its first L transformer blocks kept.

Same vocabulary, real weights, a few hundred ms per generation; the truncated
draft agrees with the target often enough to exercise accepted drafts and
rarely enough to exercise rejections. Generated once and cached beside the
models (never committed)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from ssd_edge import paths
from ssd_edge.models import catalog

TARGET = "smollm2-135m"
DRAFT_LAYERS = 28


def ensure_target() -> Path:
    cat = catalog.load_catalog()
    path, _ = catalog.pull(cat.get(TARGET))
    return path


def rewrite_gguf(src: Path, dst: Path, layers: int,
                 edit_vocab: Callable[[list], list] | None = None) -> Path:
    """Write `src` to `dst` keeping blocks 0..layers-1 (block_count rewritten) and, with
    `edit_vocab`, its token list passed through that function. Quantized tensors copy as
    raw bytes. Written to a temporary name first, so an interrupted run leaves no `dst`."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    block_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    tmp = dst.with_name(dst.name + f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = layers if field.name == block_key else field.contents()
        if edit_vocab is not None and field.name == gguf.Keys.Tokenizer.LIST:
            value = edit_vocab(value)
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    keep = [t for t in reader.tensors
            if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < layers]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    tmp.replace(dst)
    return dst


def truncated_gguf(src: Path, dst: Path, layers: int) -> Path:
    """`src` with only its first `layers` blocks, written once and cached."""
    return dst if dst.exists() else rewrite_gguf(src, dst, layers)


def ensure_pair(layers: int = DRAFT_LAYERS) -> tuple[Path, Path]:
    target = ensure_target()
    out_dir = paths.home() / "test-models"
    out_dir.mkdir(parents=True, exist_ok=True)
    draft = truncated_gguf(target, out_dir / f"smollm2-135m-first{layers}.gguf", layers)
    return target, draft
