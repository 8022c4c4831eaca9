"""Training speed of GRU4Rec: mini-batches/s, events/s and peak memory, as JSON lines.

Examples, from the repository root (run alone on a quiet machine; two torch processes on 2 cores thrash each other):

    python -m benchmarks.train.train_speed --config rsc15 --data ../shared/data/rsc15_100k/train_full.tsv
    python -m benchmarks.train.train_speed --config diginetica --data ../shared/data/diginetica_srgnn/train_full.tsv
    python -m benchmarks.train.train_speed --config rsc15 --compare-reference      # fast vs plain autograd step
    python -m benchmarks.train.train_speed --sweep --device cuda                    # batch 32-256 × layers 100-512 × 2 losses

Each measurement times what ``run.py`` runs: ``--repeats`` whole epochs of about ``--steps``
mini-batches through the epoch loop (on CUDA replayed from a captured CUDA graph) after one
untimed epoch of warm-up and capture, and reports the median (and the best repeat, the least
disturbed on a shared host). ``--timing steps`` times eager ``train_step`` calls instead (the
step alone with its launch overhead: on a GPU several times slower than the replayed epoch).
``--compare-fused`` measures the PyTorch ops against the fused GPU kernels (Triton). The comparisons
build one trainer per variant in the same process and interleave their repeats, so a noisy host
disturbs both alike; ``speed_vs_first`` is the median of the per-repeat speed ratios (peak memory
is then the process's, all variants together). Without ``--data`` a synthetic data set
(gru4rec.datasets.synthetic) is used.

For the fast step it also reports the step's matrix products on their own: their GFLOP per step
and ``matmul_floor_ms``, the time they take back to back on random operands of the same shapes
and layouts — what a step cannot go below on this machine — and ``matmul_share`` = floor / step
time. Hosts differ (the rsc15 step takes 1.0 ms on one of this project's 2-core machines and
3–4 ms on another); the share says how much of a step is overhead on the host at hand.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch

from benchmarks.workloads import add_config_arguments, config_of, load_sessions, matmul_floor_ms, prefix_for_steps
from gru4rec.config import Config
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.machine.devices import resolve_device
from gru4rec.machine.threads import set_threads
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import select_backend
from gru4rec.training.batching import build_schedule
from gru4rec.training.loop import train_epochs
from gru4rec.training.trainer import Trainer

#: A variant: (reference step?, precision, select_backend switches).
Variant = tuple[bool, str, dict]


def measure(config: Config, sessions, support, device: torch.device, steps: int, warmup: int, repeats: int,
            variants: list[Variant], timing: str = "epoch") -> list[dict]:
    """One JSON-ready dict per variant. The variants' repeats are interleaved — repeat r of every
    variant runs before repeat r + 1 of any — so that a noisy host disturbs them alike and their
    ratio (``speed_vs_first``, median of per-repeat ratios) stays meaningful even when the
    absolute figures move.

    ``timing="epoch"`` (default) times what ``run.py`` and ``fit`` run: whole epochs of about
    ``steps`` mini-batches through :func:`gru4rec.training.loop.train_epochs` — on CUDA replayed
    from a captured graph — after one untimed epoch (warm-up and capture); a repeat is an epoch
    and its time is the loop's own (``EpochStats.seconds``). ``timing="steps"`` times ``steps``
    eager ``train_step`` calls after ``warmup`` of them: the step alone, launch overhead included."""
    trainers = []
    for reference, precision, switches in variants:
        net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed)).to(device)
        trainers.append(Trainer(net, config, support, reference=reference, precision=precision,
                                backend=select_backend(device, **switches)))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds: list[list[float]] = [[] for _ in trainers]
    if timing == "epoch":
        items, offsets = prefix_for_steps(sessions.items, sessions.offsets, config.batch_size, steps)
        schedule = build_schedule(items, offsets, config.batch_size, config.n_sample, device)
        epochs = [train_epochs(trainer, items, offsets, n_epochs=1 + repeats, progress=False) for trainer in trainers]
        for epoch in epochs:
            next(epoch)  # warm-up and graph capture
        for r in range(repeats):
            order = range(len(trainers)) if r % 2 == 0 else reversed(range(len(trainers)))
            for i in order:
                seconds[i].append(next(epochs[i]).seconds)
        steps = schedule.n_steps
    else:
        schedule = build_schedule(sessions.items, sessions.offsets, config.batch_size, config.n_sample, device)
        if schedule.n_steps < warmup + steps:
            raise SystemExit(f"the data gives only {schedule.n_steps} steps; lower --steps/--warmup")

        def run(trainer: Trainer, first: int, n: int) -> float:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            total = torch.zeros((), device=device)
            for t in range(first, first + n):
                total += trainer.train_step(schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t])
            float(total)  # one sync at the end
            return time.perf_counter() - start

        for trainer in trainers:
            run(trainer, 0, warmup)
        for r in range(repeats):
            first = (warmup + r * steps) % max(schedule.n_steps - steps, 1)
            order = range(len(trainers)) if r % 2 == 0 else reversed(range(len(trainers)))
            for i in order:
                seconds[i].append(run(trainers[i], first, steps))
    # Rows of the score, dL/dx and Wy-gradient products: the distinct scored items where the
    # optimiser merges duplicate rows (CPU), all C columns otherwise. Drawn after the timed runs (from the
    # first trainer's store), so that the variants' sample streams stay as they were.
    lead = trainers[0]
    n_distinct = float(np.mean([
        torch.unique(torch.cat((schedule.targets[t], lead.sampler.next() if lead.sampler else schedule.targets[t]))).numel()
        for t in range(min(20, schedule.n_steps))
    ])) if lead.backend.unique_rows else float(config.batch_size + config.n_sample)

    events = float(np.mean(schedule.n_active[: warmup + steps] if timing == "steps" else schedule.n_active))
    results = []
    for (reference, precision, _), trainer, secs in zip(variants, trainers, seconds):
        med = statistics.median(secs)
        out = {
            "loss": config.loss,
            "layers": list(config.layers),
            "batch_size": config.batch_size,
            "n_sample": config.n_sample,
            "n_items": len(support),
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            "threads": torch.get_num_threads(),
            "path": "reference" if reference else "fast",
            "precision": precision,
            "backend": trainer.backend.name,
            "graph_replay": trainer.backend.graph_replay and timing == "epoch" and not reference,
            "timing": timing,
            "steps": steps,
            "repeats": repeats,
            "ms_per_step": round(1e3 * med / steps, 4),
            "best_ms_per_step": round(1e3 * min(secs) / steps, 4),  # least disturbed repeat (noisy hosts)
            "mb_per_s": round(steps / med, 1),
            "events_per_s": round(steps * events / med, 0),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        if not reference:
            floor_ms, gflop = matmul_floor_ms(config, n_distinct, device, torch.bfloat16 if precision == "bfloat16" else torch.float32)
            out["matmul_gflop_per_step"] = round(gflop, 4)
            out["matmul_floor_ms"] = round(floor_ms, 4)  # the step's products alone, back to back
            out["matmul_share"] = round(floor_ms / out["ms_per_step"], 3)
        if len(variants) > 1:  # speed relative to the first variant, repeat by repeat
            out["speed_vs_first"] = round(statistics.median(a / b for a, b in zip(seconds[0], secs)), 3)
        if device.type == "cuda":
            out["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        results.append(out)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, config="rsc15", n_items=40_000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference", action="store_true", help="measure the plain autograd step only")
    parser.add_argument("--compare-reference", action="store_true", help="measure both paths, interleaved, and print the ratio")
    parser.add_argument("--precision", default="float32", help="float32 or bfloat16: operand type of the fast step's matrix products")
    parser.add_argument(
        "--compare-precision", action="store_true", help="measure float32 and --precision, interleaved, and print the ratio"
    )
    parser.add_argument(
        "--compare-kernels",
        action="store_true",
        help="measure the fast step with the optimiser in PyTorch and in the fused CPU kernels, interleaved",
    )
    parser.add_argument("--fused", action="store_true", help="the fused GPU kernels (Triton) instead of PyTorch ops on CUDA")
    parser.add_argument(
        "--compare-fused", action="store_true", help="measure the PyTorch ops and the fused GPU kernels (Triton), interleaved"
    )
    parser.add_argument("--timing", choices=("epoch", "steps"), default="epoch",
                        help="epoch: whole epochs as run.py trains them (graph replay on CUDA; default); steps: eager train_step calls")
    parser.add_argument("--sweep", action="store_true", help="batch 32..256 × layers 100..512 × {cross-entropy, bpr-max}")
    args = parser.parse_args(argv)
    keep_freed_memory()  # the allocator tuning run.py's process asks for (fit no longer does it)
    if args.threads:
        set_threads(args.threads)  # fixed: no online choice (gru4rec/machine/threads.py)
    device = resolve_device(args.device)
    base = config_of(args)
    sessions, support = load_sessions(args.data, args.n_items, base.seed)

    configs = [base]
    if args.sweep:
        configs = []
        for loss in ("cross-entropy", "bpr-max"):
            for batch in (32, 64, 128, 256):
                for size in (100, 256, 512):
                    extra = dict(logq=1.0, final_act="softmax") if loss == "cross-entropy" else dict(logq=0.0, final_act="elu-0.5")
                    configs.append(base.replace(loss=loss, batch_size=batch, layers=(size,), **extra))
    fused = {"fused_gpu": True} if args.fused else {}
    if args.compare_reference:
        variants = [(True, "float32", fused), (False, "float32", fused)]  # reference first: ratios = speed-up of the fast step
    elif args.compare_precision:
        variants = [(False, "float32", fused), (False, args.precision, fused)]
    elif args.compare_kernels:
        variants = [(False, "float32", {"cpu_kernels": False}), (False, "float32", {})]  # PyTorch first: ratio = the kernels' speed-up
    elif args.compare_fused:
        variants = [(False, "float32", {"fused_gpu": False}), (False, "float32", {"fused_gpu": True})]  # ratio = Triton's speed-up
    else:
        variants = [(args.reference, args.precision, fused)]
    for config in configs:
        for result in measure(config, sessions, support, device, args.steps, args.warmup, args.repeats, variants, args.timing):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
