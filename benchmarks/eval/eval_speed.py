"""Speed of full-catalogue evaluation: predictions/s and achieved FLOP/s against the machine's
matrix-product FLOP/s at the evaluation's shape (batch × L × N, float32).

Usage (from the repository root; the data set lives beside the project in ../shared/data):

    OMP_NUM_THREADS=2 python -m benchmarks.eval.eval_speed                      # diginetica, L=512
    python -m benchmarks.eval.eval_speed --batch-size 128 256 512 --runs 3
    python -m benchmarks.eval.eval_speed --device cuda --batch-size 512 2048 4096

The model is a randomly initialised GRU4Rec network of the requested size over the training
file's items (accuracy is irrelevant here; the work per prediction is the same). Prints one JSON
line per batch size with the medians of ``--runs`` runs:

* ``matmul_gflops``: the best of ``addmm(By, X, Wyᵀ)`` timed alone at shape B×L×N (with a fresh
  output and with a reused one) — the machine's speed for the evaluation's dominant product;
* ``achieved_gflops``: useful FLOPs of the evaluation / its wall time, where useful FLOPs per
  prediction = 2·L·N (scoring) + 2·Σ_layers(d_i·3L_i + 3L_i²) (the GRU step), masked idle rows
  not counted; the time covers the schedule, the loop and the final read-back (not reading the
  file);
* ``ratio`` = achieved / matmul (the target is ≥ 0.9).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "diginetica_srgnn"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(B: int, L: int, N: int, device: torch.device, reps: int) -> float:
    """Best FLOP/s (in GFLOP/s) of the B×L by L×N product plus bias, median over ``reps``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    W = torch.randn(N, L, generator=g).to(device)
    b = torch.zeros(N, device=device)
    x = torch.randn(B, L, generator=g).to(device)
    buf = torch.empty(B, N, device=device)
    best = 0.0
    for fn in (lambda: torch.addmm(b, x, W.t()), lambda: torch.addmm(b, x, W.t(), out=buf)):
        fn()
        _sync(device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
        best = max(best, 2.0 * B * L * N / statistics.median(times) / 1e9)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with train_full.tsv and test.tsv")
    p.add_argument("--layers", type=int, nargs="+", default=[512], help="GRU layer sizes")
    p.add_argument("--batch-size", type=int, nargs="+", default=[512], help="evaluation batch sizes to measure")
    p.add_argument("--mode", default="conservative", help="tie mode")
    p.add_argument("--cutoffs", type=int, nargs="+", default=[1, 5, 10, 20])
    p.add_argument("--no-beyond-accuracy", action="store_true", help="rank path only (no coverage/popularity)")
    p.add_argument("--runs", type=int, default=3, help="runs per batch size (the median is reported)")
    p.add_argument("--matmul-reps", type=int, default=5)
    p.add_argument("--max-sessions", type=int, default=0, help="evaluate only the first n test sessions (0 = all)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    args = p.parse_args(argv)

    from gru4rec.config import Config
    from gru4rec.data import ItemMap, item_support, read_events, sessions_from_events
    from gru4rec.evaluation.evaluator import evaluate_sessions
    from gru4rec.machine.threads import set_threads
    from gru4rec.network.gru import GRU4RecNet
    from gru4rec.recommender import GRU4Rec

    if args.threads:
        set_threads(args.threads)  # fixed: no online choice (gru4rec/machine/threads.py)
    device = torch.device(args.device)
    train_path, test_path = args.data / "train_full.tsv", args.data / "test.tsv"
    if not train_path.exists():
        print(f"data not found: {train_path}", file=sys.stderr)
        return 2
    train = read_events(train_path)
    item_map = ItemMap.from_ids(train["ItemId"])
    N = len(item_map)
    train_sessions, _ = sessions_from_events(train, item_map)
    support = item_support(train_sessions, N)
    test = read_events(test_path)
    sessions, n_dropped = sessions_from_events(test, item_map, drop_unknown=True)
    items, offsets = sessions.items, sessions.offsets
    if args.max_sessions:
        offsets = offsets[: args.max_sessions + 1]
        items = items[: offsets[-1]]

    cfg = Config(layers=tuple(args.layers))
    net = GRU4RecNet(N, cfg, generator=torch.Generator().manual_seed(1)).to(device).eval()
    model = GRU4Rec(cfg, device=device)  # an untrained network: the speed is the same
    model.net, model.item_map, model.item_support = net, item_map, support
    L = args.layers[-1]
    d = L  # shared embedding: layer 0 reads Wy rows
    gru_flops = 0
    for size in args.layers:
        gru_flops += 2 * (d * 3 * size + 3 * size * size)
        d = size
    flops_per_pred = 2 * L * N + gru_flops

    for B in args.batch_size:
        mm = matmul_gflops(B, L, N, device, args.matmul_reps)
        times, result = [], None
        for _ in range(args.runs):
            _sync(device)
            t0 = time.perf_counter()
            result = evaluate_sessions(
                model,
                items,
                offsets,
                cutoffs=args.cutoffs,
                mode=args.mode,
                batch_size=B,
                beyond_accuracy=not args.no_beyond_accuracy,
            )
            _sync(device)
            times.append(time.perf_counter() - t0)
        assert result is not None
        sec = statistics.median(times)
        achieved = result.n_predictions * flops_per_pred / sec / 1e9
        print(
            json.dumps(
                {
                    "benchmark": "eval_speed",
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()}",
                    "data": args.data.name,
                    "n_items": N,
                    "layers": args.layers,
                    "batch_size": B,
                    "mode": args.mode,
                    "beyond_accuracy": not args.no_beyond_accuracy,
                    "predictions": result.n_predictions,
                    "dropped_events": int(n_dropped),
                    "seconds": round(sec, 3),
                    "seconds_runs": [round(t, 3) for t in times],
                    "predictions_per_s": round(result.n_predictions / sec, 1),
                    "achieved_gflops": round(achieved, 2),
                    "matmul_gflops": round(mm, 2),
                    "ratio": round(achieved / mm, 4),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
