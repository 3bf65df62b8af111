"""How well the target's confidence predicts the draft's acceptance, per prompt.

Mode auto's planner, while only plain steps run, estimates the draft's acceptance from the
target's mean top-1 probability (ssd_edge/planning/planner.py). This script measures the
two side by side: greedy sd over prompts of the suite, counting for each drafted
position the target reached whether the draft's token was accepted, and the
target's top-1 probability there.

    .venv/bin/python scripts/confidence_vs_acceptance.py            # every other prompt, 48 tokens
    .venv/bin/python scripts/confidence_vs_acceptance.py --every 1 -n 96
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import numpy as np

from ssd_edge import engine as engine_mod
from ssd_edge.config import EngineConfig, SamplingConfig
from ssd_edge.engine import Engine
from ssd_edge.planning.rounds import top1
from ssd_edge.events import TokenEvent
from ssd_edge.models.catalog import load_catalog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--max-tokens", type=int, default=48)
    ap.add_argument("-k", "--draft-max", type=int, default=3)
    ap.add_argument("--every", type=int, default=2, help="take every n-th prompt of the suite (default 2)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()

    cat = load_catalog()
    cfg = EngineConfig.build(target=dict(path=cat.default_target, threads=args.threads),
                             draft=dict(path=cat.default_draft, threads=args.threads), mode="sd", spec=dict(k=args.draft_max))
    seen: dict[str, object] = {}
    verify = engine_mod.verify

    def spy(draft, argmax):  # the engine's greedy rule, unchanged; remember what it decided
        a, b = verify(draft, argmax)
        seen["round"] = (len(draft), a)
        return a, b

    engine_mod.verify = spy
    with Engine(cfg) as eng:
        feed = eng.target_kv.feed

        def feed_spy(full, rows=1, cancelled=None):
            out = feed(full, rows, cancelled)
            seen["top1"] = top1(out, SamplingConfig())
            return out

        eng.target_kv.feed = feed_spy
        suite = resources.files("ssd_edge").joinpath("data/prompts.jsonl").read_text().splitlines()
        print(f"{'prompt':24s} {'category':12s} {'acceptance':>10s} {'confidence':>10s}")
        for line in suite[::args.every]:
            p = json.loads(line)
            conf, acc = [], []
            for ev in eng.generate(messages=p["messages"], max_tokens=args.max_tokens, mode="sd"):
                if isinstance(ev, TokenEvent) and "round" in seen:
                    d, a = seen.pop("round")
                    for i in range(min(d, a + 1)):  # drafted positions the target reached
                        conf.append(seen["top1"][i])
                        acc.append(i < a)
            print(f"{p['id']:24s} {p['category']:12s} {np.mean(acc):10.2f} {np.mean(conf):10.2f}", flush=True)


if __name__ == "__main__":
    main()
