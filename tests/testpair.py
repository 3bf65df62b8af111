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


def rewrite_gguf(src: Path, dst: Path, layers: int | None,
                 edit_vocab: Callable[[list], list] | None = None, split_max_tensors: int = 0) -> Path:
    """Write `src` to `dst` keeping blocks 0..layers-1 (block_count rewritten; None: every block) and, with
    `edit_vocab`, its token list passed through that function. Quantized tensors copy as
    raw bytes. Written in a scratch folder first, so an interrupted run leaves no `dst`.
    With `split_max_tensors`, a split model (gguf-split's naming, DST-00001-of-0000N.gguf, ...),
    and the first shard's path is returned."""
    scratch = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        _write_gguf(src, scratch / dst.name, layers, edit_vocab, split_max_tensors)
        written = sorted(scratch.iterdir())
        for path in written:
            path.replace(dst.parent / path.name)
    finally:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()
    return dst.parent / written[0].name


def _write_gguf(src: Path, dst: Path, layers: int | None, edit_vocab: Callable[[list], list] | None,
                split_max_tensors: int) -> None:
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    block_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess, split_max_tensors=split_max_tensors)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith(("GGUF.", "split.")):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = layers if layers is not None and field.name == block_key else field.contents()
        if edit_vocab is not None and field.name == gguf.Keys.Tokenizer.LIST:
            value = edit_vocab(value)
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    keep = [t for t in reader.tensors
            if layers is None or not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < layers]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def truncated_gguf(src: Path, dst: Path, layers: int) -> Path:
    """`src` with only its first `layers` blocks, written once and cached."""
    return dst if dst.exists() else rewrite_gguf(src, dst, layers)


def ensure_pair(layers: int = DRAFT_LAYERS) -> tuple[Path, Path]:
    target = ensure_target()
    out_dir = paths.home() / "test-models"
    out_dir.mkdir(parents=True, exist_ok=True)
    draft = truncated_gguf(target, out_dir / f"smollm2-135m-first{layers}.gguf", layers)
    return target, draft
