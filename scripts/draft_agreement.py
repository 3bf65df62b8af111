"""How often each draft model would guess the target's next token: teacher-forced greedy agreement
on the target's own greedy answers, by prompt category. The target answers each prompt once (greedy,
--tokens tokens, its chat template); each draft then reads prompt and answer in one batch, and its
argmax at each answer position is compared with the target's token there. The measurement behind
docs/models.md's line on the pure Q4_0 draft (`ssd-edge models derive-draft`).

    .venv/bin/python scripts/draft_agreement.py
    .venv/bin/python scripts/draft_agreement.py --drafts qwen2.5-coder-0.5b qwen2.5-coder-0.5b:q4_0 \\
        --prompts docs/bench-regimes.jsonl --tokens 192
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="catalog name or GGUF path")
    ap.add_argument("--drafts", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b:q4_0"],
                    help="catalog names or GGUF paths (default: the default draft and its Q4_0 variant)")
    ap.add_argument("--prompts", default=str(ROOT / "docs" / "bench-regimes.jsonl"),
                    help="a JSONL file of {id, category, messages} (default: the bench's two-regime set)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens of each greedy answer")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np

    from ssd_edge import Engine, EngineConfig
    from ssd_edge.llama.backend import Context, Model
    from ssd_edge.models.catalog import resolve_model

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    answers = []  # (category, prompt tokens, the target's greedy answer)
    config = EngineConfig.build(target={"path": args.target, "threads": args.threads}, mode="ar")
    with Engine(config) as engine:
        for p in prompts:
            done = engine.complete(messages=p["messages"], max_tokens=args.tokens)
            answers.append((p["category"], engine.prompt_tokens(messages=p["messages"]), list(done.tokens)))
            print(f"target: {p['id']} ({len(done.tokens)} tokens)", flush=True)

    for name in args.drafts:
        model = Model(resolve_model(name))
        by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        try:
            for category, prompt, answer in answers:
                full = prompt + answer
                ctx = Context(model, len(full) + 8, max(512, len(full)), args.threads)
                try:
                    n = len(full) - 1
                    rows = ctx.decode(full[:n], range(n), [0] * n, list(range(len(prompt) - 1, n)))
                finally:
                    ctx.close()
                agree = int(np.sum(rows.argmax(axis=1) == np.asarray(answer)))
                for key in (category, "all"):
                    by[key][0] += agree
                    by[key][1] += len(answer)
        finally:
            model.close()
        print(f"{name}: " + ", ".join(f"{k} {a / t:.3f}" for k, (a, t) in sorted(by.items())) +
              " (greedy agreement with the target's answers)", flush=True)


if __name__ == "__main__":
    main()
