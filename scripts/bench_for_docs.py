"""A bench run's bench.json as docs/bench commits it: its summary rows, goals and the run's metadata (command,
machine, models, options, settings, prompts, profile, notes), without the records of each generation
(ssd_edge.bench.schema.summary_only). Commit the run's bench.md and bench.png as they are: they were made
from the whole file, which stays where the run wrote it (or in git, for a run committed whole before).

    .venv/bin/python scripts/bench_for_docs.py docs/bench/RUN/bench.json ...     # each file in place
    .venv/bin/python scripts/bench_for_docs.py OUT/bench.json -o docs/bench/RUN/bench.json

A copy made before is left as it is. Prints each file's size before and after.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ssd_edge.bench.schema import summary_only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="bench.json files (rewritten in place without -o)")
    ap.add_argument("-o", "--out", type=Path, help="write the one file's copy here instead")
    args = ap.parse_args()
    if args.out and len(args.files) != 1:
        ap.error("-o takes one file")
    for path in args.files:
        text = path.read_text()
        data = summary_only(json.loads(text))
        out = args.out or path
        new = json.dumps(data, indent=1)  # as report.write writes bench.json
        if out != path or new != text:
            out.write_text(new)
        print(f"{path}: {len(text) / 1024:.0f} KiB -> {out}: {len(new) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
