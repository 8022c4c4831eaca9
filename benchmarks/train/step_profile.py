"""Where one CPU training step's time goes, and the step's GEMM limit.

    python -m benchmarks.train.step_profile --config rsc15 --data ../shared/data/rsc15_100k/train_full.tsv
    python -m benchmarks.train.step_profile --config diginetica --data ../shared/data/diginetica_srgnn/train_tr.tsv --steps 150

Runs ``--steps`` training steps of the configuration (after ``--warmup`` untimed ones) on a fixed
``--threads`` count, twice: plain (the step's real time: ms/step and mini-batches/s) and with
every part of the step wrapped in a timer, which gives each part's share of the step (the parts
are timed exclusively: a product inside the GRU cell counts as a GEMM, not as the cell):

* GEMMs: every ``torch.mm`` / ``torch.addmm`` (the GRU's and the output layer's products,
  forward and backward);
* GRU gates: the cell's element-wise work around its products (fused kernels on the CPU);
* loss: the loss and its gradient dL/dscores (closed form);
* sampling: the next row of the negative-sample store;
* distinct rows: the step's distinct items (the CPU's products run over them);
* row/column ops: gathering input rows, the columns' bias, spreading scores to columns and
  merging their gradients, adding rows;
* update: the optimiser (dense weights, and the item tables' rows: the sparse update);
* dropout: drawing the masks;
* the rest: Python and the small torch operations between them (concatenations, copies, the
  hidden state's reset), measured as the step's time minus the parts.

The timers add a microsecond or two per call; the wrapped step's total is printed beside the
plain one. The parts are FastStep's (gru4rec/training/step.py): where the one-call CPU step covers
the configuration (gru4rec/training/cpu_step.py) its parts are not Python calls to time — run with
``GRU4REC_CPU_STEP=0`` for the breakdown; the plain step and the limits hold for whichever runs.
The GEMM limit is the step's products alone, back to back on random operands of the same shapes
and layouts (``benchmarks/train/train_speed.py``'s ``step_products``, with the measured
mean number of distinct scored items), torch's ``mm`` on its threads: the issue's measure. The
plain step and the limit are timed in alternating rounds (``--steps``/10 steps, then the products
three times), and the fraction of the limit is the median of the rounds' ratios: this host's
speed moves by 20-30 % within a minute. (The one-call step splits its larger products between
its two threads itself, which on 2 cores is 3-9 % faster than torch's products: it can come
within less of the limit than its other work suggests.)

The update's memory floor: the bytes the optimiser's update must stream — per updated element
the gradient read, and the weight and each state table (Adagrad's accumulator, the momentum's
velocity, ...) read and written — over the host's streaming bandwidth, measured as an in-place
add of two 128 MB tables (read 2, write 1) on the same threads. An update whose tables do not
stay in the cache between steps cannot be faster. Printed: a table and one JSON line.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.workloads import CONFIGS, load_sessions, prefix_for_steps, products_ms, step_products
from gru4rec.config import Config
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.machine.threads import set_threads
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.batching import build_schedule
from gru4rec.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


class PartTimer:
    """Exclusive seconds per part: a timed call inside another timed call counts for its own part only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._children: list[float] = []

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self._children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = self._children.pop()
                self.seconds[part] += elapsed - inner
                if self._children:
                    self._children[-1] += elapsed
        return timed


def instrument(trainer: Trainer, timer: PartTimer, distinct: list[int]) -> Callable[[], None]:
    """Wrap the step's parts (instance attributes and torch.mm/addmm); returns the undo."""
    undo: list[Callable[[], None]] = []

    def patch(obj: Any, name: str, part: str) -> None:
        if not hasattr(obj, name):
            return
        had = name in getattr(obj, "__dict__", {})
        original = getattr(obj, name)
        setattr(obj, name, timer.wrap(part, original))
        undo.append((lambda: setattr(obj, name, original)) if had else (lambda: delattr(obj, name)))

    step, ops, optimizer = trainer._step, trainer.ops, trainer.optimizer
    for name in ("mm", "addmm"):
        patch(torch, name, "GEMMs")
    patch(trainer.cell, "forward", "GRU gates")
    patch(trainer.cell, "backward", "GRU gates")
    patch(step, "loss_grad", "loss")
    if trainer.sampler is not None:
        patch(trainer.sampler, "next", "sampling")
    unique = optimizer.unique

    def counting_unique(*args: Any, **kwargs: Any) -> Any:
        out = unique(*args, **kwargs)
        distinct.append(int(out[2]))
        return out

    optimizer.unique = counting_unique  # type: ignore[method-assign]
    undo.append(lambda: delattr(optimizer, "unique"))
    patch(optimizer, "unique", "distinct rows")
    for name in ("column_bias", "spread_columns", "merge_columns", "gather_rows", "add_rows"):
        patch(ops, name, "row/column ops")
    patch(optimizer, "step", "update")
    patch(trainer.dropout, "draw", "dropout")
    if trainer._cpu_step is not None:  # its distinct scored items: the count it leaves after each call
        undo.append(after_each_call(trainer, lambda counts: distinct.append(int(counts[0]))))

    def restore() -> None:
        for u in reversed(undo):
            u()
    return restore


def after_each_call(trainer: Trainer, seen: Callable[[Any], None]) -> Callable[[], None]:
    """Make the trainer's one-call CPU step hand its distinct-item counts (scored, in all) to
    ``seen`` after each call; returns the function that undoes it."""
    one_call = trainer._cpu_step
    assert one_call is not None

    def watched(*args: Any) -> Any:
        out = one_call(*args)
        seen(one_call.counts)
        return out

    trainer._cpu_step = watched  # type: ignore[assignment]
    return lambda: setattr(trainer, "_cpu_step", one_call)


def streaming_gb_per_s(repeats: int = 7) -> float:
    """The host's streaming bandwidth, GB/s: ``a += b`` over two 128 MB float32 tables (3 × 128 MB
    moved), the median of ``repeats``."""
    a, b = torch.ones(32 << 20), torch.ones(32 << 20)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        a.add_(b)
        times.append(time.perf_counter() - start)
    return 3 * a.numel() * 4 / statistics.median(times[1:]) / 1e9


def update_bytes(trainer: Trainer, elements: float) -> float:
    """Bytes one update must move for ``elements`` updated elements: the gradient read, the weight
    and each state table the rule keeps read and written (4 bytes each)."""
    opt = trainer.optimizer
    states = sum(t is not None for t in (vars(opt.state["dense"]).get(k) for k in ("acc", "dacc", "m", "vel")))
    return elements * 4 * (1 + 2 * (1 + states))


def updated_elements(trainer: Trainer, run: Callable[[], None]) -> float:
    """Mean elements a step's update writes (the dense buffer and the item tables' rows), over
    the steps of ``run``: counted from the optimiser's gradients, or — the one-call CPU step runs
    the update itself — from the distinct items it leaves (Wy's rows, By's scored ones)."""
    optimizer, counts = trainer.optimizer, []
    if trainer._cpu_step is not None:
        dense, width = optimizer.flat_grad.numel(), trainer.net.Wy.shape[1]
        restore = after_each_call(trainer, lambda n: counts.append(dense + n[1] * width + n[0]))
        try:
            run()
        finally:
            restore()
        return float(np.mean(counts))
    update = optimizer.step

    def counting(dense: Any, sparse: dict[str, Any]) -> None:
        n = dense.numel() if isinstance(dense, torch.Tensor) else sum(g.numel() for g in dense)
        for parts in sparse.values():
            for part in (parts if isinstance(parts, list) else [parts]):
                n += part[1].numel()
        counts.append(n)
        update(dense, sparse)

    optimizer.step = counting  # type: ignore[method-assign]
    try:
        run()
    finally:
        del optimizer.step
    return float(np.mean(counts))


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="rsc15", choices=sorted(CONFIGS))
    parser.add_argument("--data", required=True, help="a training event file")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3, help="wrapped runs; the plain step and the limit: 10× as many rounds")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    keep_freed_memory()  # the allocator tuning run.py's process asks for (fit no longer does it)
    set_threads(args.threads)
    config = Config.from_file(ROOT / CONFIGS[args.config])
    device = torch.device("cpu")
    sessions, support = load_sessions(args.data, 0, 0)
    items, offsets = prefix_for_steps(sessions.items, sessions.offsets, config.batch_size,
                                      (args.warmup + args.steps) * (args.repeats * 2 + 1) + 10)
    schedule = build_schedule(items, offsets, config.batch_size, config.n_sample, device, torch.float32)
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed)).to(device)
    trainer = Trainer(net, config, support)
    inputs, targets, active, keep = schedule.inputs, schedule.targets, schedule.active, schedule.keep
    position = 0

    def steps(n: int) -> float:
        nonlocal position
        start = time.perf_counter()
        for _ in range(n):
            t = position % schedule.n_steps
            trainer.train_step(inputs[t], targets[t], active[t], keep[t])
            position += 1
        return time.perf_counter() - start

    steps(args.warmup)
    wrapped: list[float] = []
    parts: list[dict[str, float]] = []
    distinct: list[int] = []
    for _ in range(args.repeats):  # the parts (and the distinct items the limit's products score)
        timer = PartTimer()
        restore = instrument(trainer, timer, distinct)
        try:
            wrapped.append(steps(args.steps) / args.steps)
        finally:
            restore()
        parts.append({k: v / args.steps for k, v in timer.seconds.items()})
    n_distinct = float(np.mean(distinct)) if distinct else float(config.batch_size + config.n_sample)
    products, gflop = step_products(config, n_distinct, device, torch.float32)
    # The plain step and the limit, interleaved in short rounds: the host's speed moves by 20-30 %
    # within a minute, so the fraction of the limit is each round's ratio (their median).
    plain, limits, fractions = [], [], []
    chunk = max(1, args.steps // 10)
    for _ in range(args.repeats * 10):
        plain.append(steps(chunk) / chunk)
        limits.append(products_ms(products, device, repeats=3))
        fractions.append(limits[-1] / (1e3 * plain[-1]))
    step_s, wrapped_s = statistics.median(plain), statistics.median(wrapped)
    elements = updated_elements(trainer, lambda: steps(10))
    bandwidth = streaming_gb_per_s()
    update_floor_ms = update_bytes(trainer, elements) / bandwidth / 1e6
    names = ["GEMMs", "GRU gates", "loss", "sampling", "distinct rows", "row/column ops", "update", "dropout"]
    per_part = {name: statistics.median(p.get(name, 0.0) for p in parts) for name in names}
    per_part["the rest (Python, small torch ops)"] = max(wrapped_s - sum(per_part.values()), 0.0)
    floor_ms, fraction = statistics.median(limits), statistics.median(fractions)

    print(f"{args.config}: {config.layers} units, batch {config.batch_size}, {config.n_sample} samples, {config.loss}; "
          f"{args.threads} thread(s), {args.steps} steps × {args.repeats}")
    if trainer._cpu_step is not None:
        print("  (the one-call CPU step runs: its parts are not Python calls and show as 'the rest';"
              " GRU4REC_CPU_STEP=0 profiles FastStep)")
    print(f"  step (plain):     {1e3 * step_s:8.3f} ms   {1 / step_s:8.1f} mb/s   {config.batch_size / step_s:9,.0f} e/s")
    print(f"  step (wrapped):   {1e3 * wrapped_s:8.3f} ms   (the parts below add up to this)")
    for name, seconds in per_part.items():
        print(f"    {name:36s} {1e3 * seconds:8.3f} ms  {100 * seconds / wrapped_s:5.1f} %")
    print(f"  GEMM limit: {floor_ms:.3f} ms per step ({gflop:.3f} GFLOP, {gflop / floor_ms * 1e3:.1f} GFLOP/s, "
          f"{n_distinct:.0f} distinct scored items) = {1e3 / floor_ms:.1f} mb/s; the step runs at "
          f"{100 * fraction:.0f} % of it (median of the rounds' ratios)")
    print(f"  update's memory floor: {update_floor_ms:.3f} ms per step ({elements / 1e6:.2f}M elements, "
          f"{update_bytes(trainer, elements) / 1e6:.1f} MB at {bandwidth:.1f} GB/s streaming); GEMM limit + floor: "
          f"{floor_ms + update_floor_ms:.3f} ms")
    print(json.dumps({"config": args.config, "threads": args.threads, "step_ms": 1e3 * step_s, "mb_per_s": 1 / step_s,
                      "wrapped_step_ms": 1e3 * wrapped_s, "parts_ms": {k: 1e3 * v for k, v in per_part.items()},
                      "gemm_limit_ms": floor_ms, "gemm_limit_mb_per_s": 1e3 / floor_ms, "gflop": gflop,
                      "n_distinct": n_distinct, "fraction_of_limit": fraction, "fractions": fractions,
                      "update_elements": elements, "streaming_gb_per_s": bandwidth, "update_floor_ms": update_floor_ms}))


if __name__ == "__main__":
    main()
