"""What the training benchmarks share: the named workloads and what a step of them computes.

``CONFIGS`` names the three tuned configurations the speed figures use (rsc15, diginetica,
retailrocket); :func:`load_sessions` gives a workload's sessions (a training file, or synthetic
data); :func:`prefix_for_steps` cuts them to an epoch of about N mini-batches;
:func:`step_products` builds the fast step's matrix products on random operands, which
:func:`products_ms` times — the floor a step cannot go below on a machine. The scripts under
``benchmarks/train``, ``benchmarks/gpu`` and the thread-contention children import them from here.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap, Sessions, item_support, read_events, sessions_from_events

#: The repository root: the parameter files of ``CONFIGS`` are relative to it.
ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "rsc15": "paramfiles/rsc15_xe_shared_100_best.json",
    "diginetica": "paramfiles/diginetica_bprmax_shared_512_best.json",
    "retailrocket": "paramfiles/retailrocket_bprmax_shared_224_best.json",
}


def load_sessions(data: str | None, n_items: int, seed: int) -> tuple[Sessions, np.ndarray]:
    """The sessions of the training file ``data`` in time order, and each item's support (its
    count of clicks); without ``data``, of a synthetic data set of ``n_items`` items
    (:func:`gru4rec.datasets.synthetic.generate`, 60,000 sessions, seeded by ``seed``)."""
    if data:
        events = read_events(data)
    else:
        from gru4rec.datasets.synthetic import generate

        events = generate(n_sessions=60_000, n_items=n_items, seed=seed)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    return sessions, item_support(sessions.items, len(item_map))


#: One of the step's matrix products, on its operands: a call returns the product.
Product = Callable[[], torch.Tensor]


def step_products(config: Config, n_distinct: float, device: torch.device, dtype: torch.dtype) -> tuple[list[Product], float]:
    """The fast step's matrix products (shared-embedding layout) as callables on random operands
    with the step's shapes and operand layouts, and their GFLOP per step. ``n_distinct``: the
    rows of the score, dL/dx and Wy-gradient products — the mean number of distinct scored items
    on the CPU path, all C = B + n_sample columns elsewhere."""
    B, L = config.batch_size, config.layers[-1]
    K = int(round(n_distinct))
    mk = lambda *shape: torch.randn(*shape, device=device).to(dtype)  # noqa: E731
    shapes: list[tuple[torch.Tensor, torch.Tensor]] = []  # (left operand, right operand): transposed views where the step uses them
    d_in = L
    for n in config.layers:
        shapes += [(mk(B, d_in), mk(d_in, 3 * n)), (mk(B, n), mk(n, 2 * n)), (mk(B, n), mk(n, n)),  # forward
                   (mk(B, n).t(), mk(B, n)), (mk(B, n), mk(n, n).t()), (mk(B, n).t(), mk(B, 2 * n)),  # Wh, d_r, Wrz
                   (mk(B, d_in).t(), mk(B, 3 * n)), (mk(B, 3 * n), mk(d_in, 3 * n).t())]  # Wx, d_x
        d_in = n
    shapes += [(mk(B, L), mk(K, L).t()), (mk(B, K), mk(K, L)), (mk(B, K).t(), mk(B, L))]  # scores, d, Wy rows
    gflop = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in shapes) / 1e9
    return [lambda a=a, b=b: torch.mm(a, b) for a, b in shapes], gflop


def products_ms(products: list[Product], device: torch.device, repeats: int, warmup: int = 0) -> float:
    """Median ms of ``repeats`` passes of ``products`` (from :func:`step_products`) back to back,
    after ``warmup`` passes that do not count."""
    times = []
    for r in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for f in products:
            f()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if r >= warmup:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def matmul_floor_ms(config: Config, n_distinct: float, device: torch.device, dtype: torch.dtype, repeats: int = 30) -> tuple[float, float]:
    """(median ms, GFLOP) of the step's matrix products run back to back on their own: the time a
    step cannot go below on this machine with these BLAS kernels."""
    products, gflop = step_products(config, n_distinct, device, dtype)
    return products_ms(products, device, repeats, warmup=3), gflop


def prefix_for_steps(items: np.ndarray, offsets: np.ndarray, batch_size: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The first sessions whose predictions fill about ``steps`` mini-batches (an epoch of that length)."""
    predictions = np.cumsum(np.diff(offsets) - 1)
    n = int(np.searchsorted(predictions, steps * batch_size)) + 1
    n = min(n, len(offsets) - 1)
    return items[: offsets[n]], offsets[: n + 1]


def add_config_arguments(parser: argparse.ArgumentParser, *, config: str, n_items: int) -> None:
    """--config, --params, --data and --n-items (shared by the training benchmarks)."""
    parser.add_argument("--config", default=config, help=f"one of {sorted(CONFIGS)} or a parameter string")
    parser.add_argument("--params", default="", help="parameter string applied on top, e.g. 'n_sample=512'")
    parser.add_argument("--data", help="training file (default: synthetic data)")
    parser.add_argument("--n-items", type=int, default=n_items, help="items of the synthetic data")


def config_of(args: argparse.Namespace) -> Config:
    """The configuration --config and --params name."""
    base = Config.from_file(ROOT / CONFIGS[args.config]) if args.config in CONFIGS else Config.from_string(args.config)
    return base.replace_from_string(args.params) if args.params else base
