"""Small GGUF files with a real header (a token list, BOS/EOS, a chat template) and one small
tensor: what the vocabulary and Hub tests read, written in milliseconds. llama.cpp cannot run
them (no model weights); the real layer uses the small real pair for that."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def tokens(n: int, pad: int = 0) -> list[str]:
    """n distinct tokens, then `pad` padding tokens as Qwen's tables have them."""
    return [f"tok{i}" for i in range(n)] + [f"[PAD{n + i}]" for i in range(pad)]


def write(path: Path, vocab: list[str], *, bos: int = 1, eos: int = 2, template: str | None = "{{ messages }}",
          tokenizer: str = "gpt2", pre: str = "tiny", weight_bytes: int = 4096) -> Path:
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocab)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if template is not None:
        w.add_chat_template(template)
    w.add_tensor("token_embd.weight", np.arange(weight_bytes // 4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
