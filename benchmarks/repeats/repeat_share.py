"""The share of prediction targets whose item is already in the session, per data set and split
of ../shared/data (docs/results.md, "Repeated targets").

    python -m benchmarks.repeats.repeat_share [--data ../shared/data]

Each evaluation split is read with the items of its training split (train_valid with train_tr,
test with train_full), unknown items dropped as the evaluator drops them
(:mod:`gru4rec.evaluation.repeats`). Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gru4rec.data import ItemMap, sessions_from_events
from gru4rec.data.events import read_events
from gru4rec.evaluation.repeats import repeat_shares

ROOT = Path(__file__).resolve().parents[2]

DATASETS = ("rsc15_100k", "diginetica_srgnn", "tmall_srgnn")
#: Evaluation split -> the training split whose items the evaluator knows.
SPLITS = (("train_valid", "train_tr"), ("test", "train_full"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    args = p.parse_args(argv)
    print("| data set | split (items of) | targets | repeated | previous item again |")
    print("|---|---|---|---|---|")
    for name in DATASETS:
        for split, train in SPLITS:
            split_file, train_file = Path(args.data) / name / f"{split}.tsv", Path(args.data) / name / f"{train}.tsv"
            if not (split_file.is_file() and train_file.is_file()):
                continue
            item_map = ItemMap.from_ids(read_events(train_file)["ItemId"])
            sessions, _ = sessions_from_events(read_events(split_file), item_map, order="id", drop_unknown=True)
            r = repeat_shares(sessions)
            print(f"| {name} | {split} ({train}) | {r.n_targets:,} | {100 * r.share:.1f} % | {100 * r.immediate_share:.1f} % |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
