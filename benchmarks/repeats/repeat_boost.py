"""Plain GRU4Rec against GRU4Rec with repeat-aware scoring (issue 29), on one data set.

    python -m benchmarks.repeats.repeat_boost --data ../shared/data/tmall_srgnn -pf paramfiles/tmall_srgnn_xe_best.py
    python -m benchmarks.repeats.repeat_boost --data ../shared/data/diginetica_srgnn -pf paramfiles/diginetica_srgnn_xe_best.py --test

1. trains the parameter file on ``train_tr`` (or loads ``--work``'s model from an earlier run);
2. chooses the boost's weight and decay on ``train_valid`` (a grid: ``--weights`` × ``--decays``,
   MRR@20, conservative ties; the network runs once, every point ranked from its scores) and
   prints every grid point — the plain row is weight 0 — and the seconds the choice took
   (``fit_seconds``);
3. with ``--test``: trains on ``train_full`` and evaluates ``test`` plain and with the chosen
   boost (the coefficients come from validation only).

Prints one JSON line per result; every model is saved under ``--work`` (default
``.bench/repeat/<data set>``, git-ignored) and reused when present.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gru4rec import Config, GRU4Rec, evaluate
from gru4rec.fitting.repeat_fit import fit_repeat_boost


def trained(config: Config, data: Path, path: Path, threads: int) -> GRU4Rec:
    if path.exists():
        return GRU4Rec.load(path, device="cpu")
    start = time.perf_counter()
    model = GRU4Rec(config, device="cpu", threads=threads).fit(data, progress=False)
    model.save(path)
    print(json.dumps({"trained": str(data), "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with train_tr, train_valid (and train_full, test)")
    p.add_argument("-pf", "--paramfile", required=True)
    p.add_argument("--weights", default="0.5,1,2,4,8", help="grid of repeat_weight (default: 0.5,1,2,4,8)")
    p.add_argument("--decays", default="0.5,0.8,1", help="grid of repeat_decay (default: 0.5,0.8,1)")
    p.add_argument("--test", action="store_true", help="also train on train_full and evaluate test")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = args.work or Path(".bench/repeat") / args.data.name
    work.mkdir(parents=True, exist_ok=True)
    config = Config.from_file(args.paramfile)
    ext = next(s for s in (".tsv", ".tsv.gz") if (args.data / f"train_tr{s}").exists())
    model = trained(config, args.data / f"train_tr{ext}", work / "train_tr.safetensors", args.threads)
    weights = [float(w) for w in args.weights.split(",")]
    decays = [float(d) for d in args.decays.split(",")]
    start = time.perf_counter()
    best, table = fit_repeat_boost(model, args.data / f"train_valid{ext}", weights=weights, decays=decays, metric="mrr@20")
    for row in table:
        print(json.dumps({"split": "train_valid", **row}), flush=True)
    print(json.dumps({"fit_seconds": round(time.perf_counter() - start, 1), "grid_points": len(table)}), flush=True)
    for name, scored in (("plain", model), ("repeat-aware", model.with_repeat_boost(best.weight, best.decay))):
        cfg = scored.config
        r = evaluate(scored, args.data / f"train_valid{ext}", cutoffs=(10, 20), mode="conservative", beyond_accuracy=False)
        print(json.dumps({"split": "train_valid", "row": name, "repeat_weight": cfg.repeat_weight, "repeat_decay": cfg.repeat_decay,
                          "recall@20": round(r.recall[20], 4), "mrr@20": round(r.mrr[20], 4),
                          "recall@10": round(r.recall[10], 4), "mrr@10": round(r.mrr[10], 4)}), flush=True)
    print(json.dumps({"grid_seconds": round(time.perf_counter() - start, 1)}), flush=True)
    if args.test:
        full = trained(config, args.data / f"train_full{ext}", work / "train_full.safetensors", args.threads)
        for name, scored in (("plain", full), ("repeat-aware", full.with_repeat_boost(best.weight, best.decay))):
            cfg = scored.config
            r = evaluate(scored, args.data / f"test{ext}", cutoffs=(10, 20), mode="conservative", beyond_accuracy=False)
            print(json.dumps({"split": "test", "row": name, "repeat_weight": cfg.repeat_weight, "repeat_decay": cfg.repeat_decay,
                              "recall@20": round(r.recall[20], 4), "mrr@20": round(r.mrr[20], 4),
                              "recall@10": round(r.recall[10], 4), "mrr@10": round(r.mrr[10], 4)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
