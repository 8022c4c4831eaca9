"""Daily retraining: is a warm start worth it? A rolling split of consecutive days.

Examples (run alone; --threads 1 on a shared host):

    python -m benchmarks.train.retrain --data ../shared/data/rsc15_100k/train_full.tsv ../shared/data/rsc15_100k/test.tsv \\
        --config paramfiles/rsc15_xe_shared_100_best.py --days calendar --window 3 --threads 1
    python -m benchmarks.train.retrain --data ../shared/data/diginetica_srgnn/train_full.tsv ../shared/data/diginetica_srgnn/test.tsv \\
        --config paramfiles/diginetica_srgnn_xe_best.py --days 12 --window 3 --fresh-epochs 3 --threads 1

The events (all files together) are cut into days: ``--days calendar`` by the UTC date of each
session's first event (real timestamps), ``--days N`` into N blocks of consecutive sessions in
time order (for data whose ``Time`` is only a running position, as DIGINETICA's: a "day" is
then a block, said in the output). For every test day d after the first ``--window`` days:

* **fresh**: a new model trained for ``--fresh-epochs`` on the ``--window`` days before d;
* **warm**: yesterday's warm model (on the first test day: the fresh model of the first window)
  continued for ``--warm-epochs`` on day d-1 alone (``fit(init_from=...)``, optimiser state
  carried), so it has seen every day so far;

then both are evaluated on day d (next-item Recall@20 / MRR@20, standard ties) — on the same
events: day d's events whose item the fresh model knows (the window's items; every such item is
known to the warm model too; sessions are cut at the unknown items by the evaluator's rule).
Also reported: the share of day d's events whose item occurs in no earlier day (``new_share``:
no model trained before d can predict them) and the share whose item is older than the window
(``old_share``: known to the warm model only). One JSON line per test day, then a table.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gru4rec import GRU4Rec
from gru4rec.config import Config
from gru4rec.data import read_events
from gru4rec.evaluation import evaluate

ROOT = Path(__file__).resolve().parents[2]


def split_days(events: pd.DataFrame, days: str) -> tuple[list[pd.DataFrame], str]:
    """The events cut into consecutive days (a session belongs to the day it starts in)."""
    start = events.groupby("SessionId")["Time"].transform("min")
    if days == "calendar":
        label = pd.to_datetime(start, unit="s").dt.date
        keys = sorted(label.unique())
        return [events[label == k] for k in keys], "calendar days (UTC)"
    n = int(days)
    order = start.rank(method="dense").to_numpy()
    sessions_per_block = np.ceil(order.max() / n)
    block = ((order - 1) // sessions_per_block).astype(int)
    return [events[block == b] for b in range(n)], f"{n} blocks of consecutive sessions"


def trained(data: pd.DataFrame, config: Config, epochs: int, init_from: GRU4Rec | None, threads: int) -> tuple[GRU4Rec, float]:
    model = GRU4Rec(config.replace(n_epochs=epochs), device="cpu", threads=threads)
    t0 = time.perf_counter()
    model.fit(data, progress=False, init_from=init_from)
    return model, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", required=True, help="event files (TSV), read together")
    ap.add_argument("--config", required=True, help="parameter file")
    ap.add_argument("--days", default="calendar", help="'calendar' or a number of blocks")
    ap.add_argument("--window", type=int, default=3, help="days a fresh model trains on")
    ap.add_argument("--fresh-epochs", type=int, default=10)
    ap.add_argument("--warm-epochs", type=int, nargs="+", default=[1, 2], help="one warm chain per value")
    ap.add_argument("--test-days", type=int, default=None, help="only the first N test days")
    ap.add_argument("--min-day-events", type=int, default=100,
                    help="drop days with fewer events (a calendar split's last day holds a few late events)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the JSON lines and the table here")
    args = ap.parse_args()
    logging.getLogger("gru4rec").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)

    config = Config.from_file(args.config)
    events = pd.concat([read_events(p) for p in args.data], ignore_index=True).sort_values(["Time"], kind="stable")
    days, how = split_days(events, args.days)
    dropped = [len(d) for d in days if len(d) < args.min_day_events]
    days = [d for d in days if len(d) >= args.min_day_events]
    lines: list[str] = []

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        lines.append(line)

    emit(
        {
            "data": args.data,
            "days": how,
            "n_days": len(days),
            "events_per_day": [len(d) for d in days],
            "dropped_days_events": dropped,
            "window": args.window,
            "fresh_epochs": args.fresh_epochs,
            "warm_epochs": args.warm_epochs,
            "config": args.config,
            "threads": args.threads,
            "torch": torch.__version__,
        }
    )
    test_days = list(range(args.window, len(days)))[: args.test_days]
    warm: dict[int, GRU4Rec] = {}
    rows = []
    for d in test_days:
        window = pd.concat(days[d - args.window:d])
        fresh, fresh_s = trained(window, config, args.fresh_epochs, None, args.threads)
        warm_s: dict[int, float] = {}
        for e in args.warm_epochs:
            if d == test_days[0]:
                warm[e], warm_s[e] = fresh, fresh_s  # the chain starts from the first fresh model
            else:
                warm[e], warm_s[e] = trained(days[d - 1], config, e, warm[e], args.threads)
        test = days[d]
        earlier = pd.concat(days[:d])["ItemId"].unique()
        in_window = test["ItemId"].isin(window["ItemId"].unique())
        in_earlier = test["ItemId"].isin(earlier)
        shared = test[in_window]
        record: dict[str, Any] = {"test_day": d, "test_events": len(test), "new_share": round(float((~in_earlier).mean()), 4),
                                  "old_share": round(float((in_earlier & ~in_window).mean()), 4)}
        res = evaluate(fresh, shared, cutoffs=20)
        record["fresh"] = {"recall@20": round(res.recall[20], 4), "mrr@20": round(res.mrr[20], 4), "train_s": round(fresh_s, 1),
                           "predictions": res.n_predictions if hasattr(res, "n_predictions") else None}
        for e in args.warm_epochs:
            res = evaluate(warm[e], shared, cutoffs=20)
            record[f"warm{e}"] = {"recall@20": round(res.recall[20], 4), "mrr@20": round(res.mrr[20], 4), "train_s": round(warm_s[e], 1)}
        emit(record)
        rows.append(record)

    table = ["| day | new items | older items | fresh R@20 / MRR@20 (s) | "
             + " | ".join(f"warm {e} ep R@20 / MRR@20 (s)" for e in args.warm_epochs) + " |",
             "|---|---|---|---|" + "---|" * len(args.warm_epochs)]
    for r in rows:
        cells = [f"{r['fresh']['recall@20']:.4f} / {r['fresh']['mrr@20']:.4f} ({r['fresh']['train_s']:.0f})"]
        for e in args.warm_epochs:
            w = r[f"warm{e}"]
            first = " (= fresh: first day)" if r is rows[0] else ""
            cells.append(f"{w['recall@20']:.4f} / {w['mrr@20']:.4f} ({w['train_s']:.0f}){first}")
        table.append(f"| {r['test_day']} | {r['new_share']:.1%} | {r['old_share']:.1%} | " + " | ".join(cells) + " |")
    later = rows[1:]
    if later:
        summary = {name: {k: round(statistics.median(r[name][k] for r in later), 4) for k in ("recall@20", "mrr@20", "train_s")}
                   for name in ["fresh", *(f"warm{e}" for e in args.warm_epochs)]}
        emit({"median_over_days_after_the_first": summary})
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n\n" + "\n".join(table) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
