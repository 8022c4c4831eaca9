"""The training step with item attributes against the plain step (issue 49: ≤ 1.3× the plain step
on the same backend), in one process, rounds alternating.

    python -m gru4rec synth .bench/iattr --kind intents-attributes
    python -m benchmarks.train.attribute_step --data .bench/iattr --threads 1,2

Four trainers over the same sessions (``train_tr.tsv`` of a ``gru4rec synth --kind
intents-attributes`` folder; ``paramfiles/synthetic_intents_best.py`` unless ``--config``), each
from the same network seed:

* ``plain c-step``: the plain network on the CPU's default backend (the one-call C step);
* ``plain fast``: the plain network, FastStep over the fused CPU kernels (``cpu_step=False``);
* ``attr fast``: the network with the ``--columns`` of ``items.tsv`` as categorical attributes
  (default: category and brand; price dropped), on the default backend — FastStep over the same
  kernels (the C step declines it);
* ``attr reference``: that network on the autograd reference step.

Each round times ``--steps`` eager ``train_step`` calls of every variant after ``--warmup``
untimed ones, the variants' order rotating from round to round; per thread count (``--threads``)
it prints each round, the medians (ms per step) and the medians of the per-round ratios: attr
fast / plain fast (the same backend: the issue's target), attr fast / plain c-step (what a plain
run gets by default) and attr reference / attr fast. ``--profile N`` instead prints torch's
profiler table of N steps of the attribute FastStep (what costs what).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from benchmarks.workloads import ROOT, prefix_for_steps
from gru4rec.config import Config
from gru4rec.data import ItemMap, item_support, read_events, sessions_from_events
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.machine.threads import set_threads
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import select_backend
from gru4rec.training.batching import Schedule, build_schedule
from gru4rec.training.trainer import Trainer

VARIANTS = ("plain c-step", "plain fast", "attr fast", "attr reference")
#: The ratios printed: (name, numerator variant, denominator variant).
RATIOS = (("attr fast / plain fast", "attr fast", "plain fast"), ("attr fast / plain c-step", "attr fast", "plain c-step"),
          ("attr reference / attr fast", "attr reference", "attr fast"))


def build(data: Path, config: Config, columns: list[str], steps: int) -> tuple[dict[str, Trainer], Schedule]:
    """The four trainers (:data:`VARIANTS`) and a schedule of about ``steps`` mini-batches."""
    events = read_events(data / "train_tr.tsv")
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    frame = pd.read_csv(data / "items.tsv", sep="\t")[["ItemId", *columns]]
    attrs = ItemAttributes.build(item_table_from_frame(frame, types=dict.fromkeys(columns, "categorical")), item_map)
    items, offsets = prefix_for_steps(sessions.items, sessions.offsets, config.batch_size, steps)
    schedule = build_schedule(items, offsets, config.batch_size, config.n_sample, torch.device("cpu"), torch.float32)

    def trainer(attributes: ItemAttributes | None, **kw: Any) -> Trainer:
        net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed), attributes=attributes)
        return Trainer(net, config, support, **kw)

    trainers = {"plain c-step": trainer(None), "plain fast": trainer(None, backend=select_backend("cpu", cpu_step=False)),
                "attr fast": trainer(attrs), "attr reference": trainer(attrs, reference=True)}
    forms = {name: t.backend.step_form(config, reference=t.reference, attributes=t.net.attributes is not None)
             for name, t in trainers.items()}
    print("step forms: " + ", ".join(f"{name}: {form}" for name, form in forms.items()), flush=True)
    return trainers, schedule


def measure(trainers: dict[str, Trainer], schedule: Schedule, steps: int, warmup: int, rounds: int
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per step of each variant, one entry per round (order rotating): wall-clock, and
    the process's CPU time (on one thread, the time it ran: what other processes took from it
    does not count)."""
    positions = dict.fromkeys(trainers, 0)

    def run(name: str, n: int) -> tuple[float, float]:
        trainer = trainers[name]
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            t = positions[name] % schedule.n_steps
            trainer.train_step(schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t])
            positions[name] += 1
        return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n

    for name in trainers:
        run(name, warmup)
    wall: dict[str, list[float]] = {name: [] for name in trainers}
    cpu: dict[str, list[float]] = {name: [] for name in trainers}
    names = list(trainers)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            w, c = run(name, steps)
            wall[name].append(w)
            cpu[name].append(c)
        print(f"  round {r + 1}: " + "  ".join(f"{name} {1e3 * wall[name][-1]:.3f} ms" for name in names), flush=True)
    return wall, cpu


def summary(seconds: dict[str, list[float]]) -> str:
    """The medians (ms per step) and the medians of the per-round ratios."""
    med = "  ".join(f"{name} {1e3 * statistics.median(v):.3f} ms" for name, v in seconds.items())
    ratios = "  ".join(f"{label} {statistics.median(a / b for a, b in zip(seconds[num], seconds[den])):.3f}x"
                       for label, num, den in RATIOS)
    return f"medians: {med}\n  ratios (median of rounds): {ratios}"


def profile(trainer: Trainer, schedule: Schedule, steps: int, warmup: int) -> None:
    """torch's profiler over ``steps`` steps of ``trainer`` (after ``warmup``): self CPU time by op."""
    for t in range(warmup):
        trainer.train_step(schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            t = (warmup + i) % schedule.n_steps
            trainer.train_step(schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=".bench/iattr", help="a gru4rec synth --kind intents-attributes folder")
    parser.add_argument("--config", default="paramfiles/synthetic_intents_best.py", help="parameter file (relative to the repository)")
    parser.add_argument("--params", default="", help="parameter string applied on top, e.g. 'n_sample=512'")
    parser.add_argument("--columns", default="category,brand", help="the items.tsv columns used, as categorical attributes")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--profile", type=int, default=0, help="profile this many attribute FastStep steps instead")
    args = parser.parse_args()
    keep_freed_memory()  # as the CLI's training process asks, before the trainers exist
    config = Config.from_file(ROOT / args.config)
    if args.params:
        config = config.replace_from_string(args.params)
    trainers, schedule = build(Path(args.data), config, args.columns.split(","), args.warmup + args.steps * args.rounds)
    for threads in [int(t) for t in args.threads.split(",")]:
        got = set_threads(threads)
        if got != threads:  # OMP_NUM_THREADS fixes the count: say so rather than mislabel the rounds
            print(f"asked for {threads} thread(s), torch runs {got} (OMP_NUM_THREADS?)", flush=True)
            threads = got
        if args.profile:
            for name in ("plain fast", "attr fast"):
                print(f"{name}, {threads} thread(s):")
                profile(trainers[name], schedule, args.profile, args.warmup)
            continue
        print(f"{threads} thread(s), {args.rounds} rounds x {args.steps} steps, {args.config}{' ' + args.params if args.params else ''}:",
              flush=True)
        wall, cpu = measure(trainers, schedule, args.steps, args.warmup, args.rounds)
        print("  wall-clock " + summary(wall), flush=True)
        print("  CPU time " + summary(cpu), flush=True)


if __name__ == "__main__":
    main()
