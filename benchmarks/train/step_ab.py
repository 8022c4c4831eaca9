"""A/B of the CPU training step: this tree against another git revision, in one process.

    python -m benchmarks.train.step_ab --base main --config rsc15 --data ../shared/data/rsc15_100k/train_full.tsv
    python -m benchmarks.train.step_ab --base main --config diginetica --data ../shared/data/diginetica_srgnn/train_tr.tsv --steps 60

The base revision's ``gru4rec`` is extracted (``git archive``) into a temporary folder and
imported beside this tree's under its own module names, so both steps run in the same process
on the same data, their ``--rounds`` alternating (A B, B A, ...): a noisy host disturbs both
alike, and the ratio of each round is meaningful even when the absolute figures move. Each round
times ``--steps`` eager ``train_step`` calls of each variant after ``--warmup`` untimed ones.
Printed: each round's ms per step, the medians, the median of the per-round ratios
(base / this: > 1 means this tree is faster), and whether the two gave the same losses bit for
bit (both start from the same network and run the same steps).
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _first_module(paths: tuple[str, ...], root: Path) -> ModuleType:
    """The first of ``paths`` that ``root`` holds."""
    for name in paths:
        if (root / (name.replace(".", "/") + ".py")).exists() or (root / name.replace(".", "/") / "__init__.py").exists():
            return importlib.import_module(name)
    raise ModuleNotFoundError(f"none of {paths} in {root}")


def _import_tree(root: Path) -> dict[str, ModuleType]:
    """``gru4rec``'s modules from ``root``, imported fresh (the previous tree's are dropped from
    ``sys.modules`` first; the returned objects keep working)."""
    for name in [n for n in sys.modules if n == "gru4rec" or n.startswith("gru4rec.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        # Each role's module, by its path in this tree or (a base before the modules moved into
        # packages) in the old flat layout.
        roles = {"config": ("gru4rec.config",), "model": ("gru4rec.network.gru", "gru4rec.model"),
                 "threads": ("gru4rec.machine.threads", "gru4rec.threads"), "batching": ("gru4rec.training.batching",),
                 "trainer": ("gru4rec.training.trainer",), "data": ("gru4rec.data",), "memory": ("gru4rec.kernels.memory",)}
        return {role: _first_module(paths, root) for role, paths in roles.items()}
    finally:
        sys.path.remove(str(root))


def _variant(mods: dict[str, ModuleType], config_path: Path, params: str, data: str, steps: int) -> Any:
    """A trainer and its schedule built by one tree's modules."""
    config = mods["config"].Config.from_file(config_path)
    if params:
        config = config.replace_from_string(params)
    data_mod = mods["data"]
    events = data_mod.read_events(data)
    item_map = data_mod.ItemMap.from_ids(events["ItemId"])
    sessions, _ = data_mod.sessions_from_events(events, item_map, order="time")
    support = data_mod.item_support(sessions.items, len(item_map))
    import numpy as np
    import torch

    predictions = np.cumsum(np.diff(sessions.offsets) - 1)
    n = min(int(np.searchsorted(predictions, steps * config.batch_size)) + 1, len(sessions.offsets) - 1)
    items, offsets = sessions.items[: sessions.offsets[n]], sessions.offsets[: n + 1]
    schedule = mods["batching"].build_schedule(items, offsets, config.batch_size, config.n_sample, torch.device("cpu"), torch.float32)
    net = mods["model"].GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed))
    return mods["trainer"].Trainer(net, config, support), schedule


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main", help="the git revision to compare against")
    parser.add_argument("--config", default="rsc15", help="rsc15, diginetica or retailrocket (benchmarks/train/train_speed.py)")
    parser.add_argument("--params", default="", help="parameter string applied on top")
    parser.add_argument("--data", required=True, help="a training event file")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    from benchmarks.workloads import CONFIGS

    config_path = ROOT / CONFIGS[args.config]
    total = args.warmup + args.steps * args.rounds + 10
    with tempfile.TemporaryDirectory(prefix="step_ab-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "gru4rec"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        base_mods = _import_tree(Path(tmp))
        assert base_mods["trainer"].__file__.startswith(tmp), base_mods["trainer"].__file__
        base_mods["threads"].set_threads(args.threads)
        base_mods["memory"].keep_freed_memory()  # as run.py's process asks (each tree's trainer reads its own flag)
        base = _variant(base_mods, config_path, args.params, args.data, total)
        this_mods = _import_tree(ROOT)
        this_mods["threads"].set_threads(args.threads)
        this_mods["memory"].keep_freed_memory()
        this = _variant(this_mods, config_path, args.params, args.data, total)
    variants = {"base": base, "this": this}
    losses: dict[str, list[Any]] = {k: [] for k in variants}
    positions = dict.fromkeys(variants, 0)

    def run(name: str, n: int) -> float:
        trainer, schedule = variants[name]
        inputs, targets, active, keep = schedule.inputs, schedule.targets, schedule.active, schedule.keep
        start = time.perf_counter()
        for _ in range(n):
            t = positions[name] % schedule.n_steps
            losses[name].append(trainer.train_step(inputs[t], targets[t], active[t], keep[t]))
            positions[name] += 1
        return (time.perf_counter() - start) / n

    for name in variants:
        run(name, args.warmup)
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name in (("base", "this") if r % 2 == 0 else ("this", "base")):
            seconds[name].append(run(name, args.steps))
        print(f"round {r + 1}: base {1e3 * seconds['base'][-1]:.3f} ms  this {1e3 * seconds['this'][-1]:.3f} ms", flush=True)
    same = all(bool(torch.equal(a, b)) for a, b in zip(losses["base"], losses["this"]))
    med = {k: statistics.median(v) for k, v in seconds.items()}
    ratio = statistics.median(a / b for a, b in zip(seconds["base"], seconds["this"]))
    print(f"{args.config}{' ' + args.params if args.params else ''}: {args.threads} thread(s), {args.rounds} rounds × {args.steps} steps; "
          f"base ({args.base}) {1e3 * med['base']:.3f} ms, this {1e3 * med['this']:.3f} ms per step (medians); "
          f"speed-up {ratio:.3f}× (median of the rounds' ratios); losses bit for bit equal: {same}")


if __name__ == "__main__":
    main()
