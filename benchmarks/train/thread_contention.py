"""Training and evaluation speed by thread setting, on a quiet machine and beside busy processes.

    python -m benchmarks.train.thread_contention --busy 0            # one load per command: each fits in minutes
    python -m benchmarks.train.thread_contention --busy 1 --epochs 3 --repeats 2 --cap 60
    python -m benchmarks.train.thread_contention --busy 2 --variants default passive threads=1

Every measurement is a fresh process (the OpenMP runtime reads its wait policy when it loads) that
trains ``--epochs`` epochs of the rsc15 configuration (``--paramfile``, default
paramfiles/rsc15_xe_shared_100_best.py) on ``--train`` (default ../shared/data/rsc15_100k/train_full.tsv)
and then evaluates ``--test`` ``--eval-repeats`` times with the same setting, printing every
epoch's events/s and every evaluation's predictions/s. Variants (``--variants``):

* ``default``: what a user gets — no wait policy set, the thread count chosen online
  (gru4rec/machine/threads.py ThreadChoice);
* ``passive``: the CPUs available, ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once: the
  default before issue 39);
* ``spin``: the CPUs available, no wait policy set (the OpenMP runtime's spin-then-sleep);
* ``active``: the CPUs available, ``OMP_WAIT_POLICY=ACTIVE``;
* ``threads=1``: one thread;
* ``oversubscribed``: one thread more than the CPUs, no wait policy set — GNU OpenMP then spins
  only 100 rounds before it sleeps (tried as a candidate of the online choice and dropped:
  docs/speed-history.md, "Threads under contention").

Each runs beside ``--busy`` processes that spin on a core each (``while True: pass``; 0 = a
quiet machine). The variants' repeats are interleaved so that a drifting load disturbs all
alike. A run is stopped after ``--cap`` seconds (a collapsing setting would take minutes per
epoch); its finished epochs still count, and a run without one finished epoch counts as the cap.
Printed: one JSON line per run, then per variant the median events/s of epochs 2.. (epoch 1
includes the one-off start and the online choice's first comparison; its median is printed too),
the median predictions/s of all its evaluations, both as ratios to ``passive``, and the medians
of the repeats' own ratios to the passive run beside them (paired: beside busy processes the
host's state moves between repeats, and passive's epochs have been bimodal there).

``--turns N`` measures instead inside one process, where ``default``, ``spin`` and ``threads=1``
share the OpenMP runtime's own wait policy: three trainers of the same model, each through the
training loop users run (gru4rec.training.loop.train_epochs, the default with its online choice
kept from turn to turn), take N turns of one epoch of ``--turn-steps`` mini-batches each, the
order rotating; after each round, each setting evaluates ``--test`` once with a model trained
one epoch (the default's evaluation choosing as it does after training). A host whose speed
drifts over seconds — the 2-core development host runs a 2-thread step at 2.2 times its time for
5-15 s at a time, then at its time again — is then seen by all three alike, where separate runs
of a few seconds each land in one state or the other. Printed: each variant's events/s and
predictions/s over all its turns, the default's ratio to the best fixed setting, and its median
ratio to the faster fixed setting of each round (a bound no fixed setting reaches: it switches
with the host).

``--short-runs N`` measures what a user of ``run.py`` sees (issue 50 item 8): N rounds; in each,
every variant of ``--variants`` (default: ``default spin``) runs ``python run.py TRAIN -pf PARAMFILE
-ps n_epochs=EPOCHS`` twice, the variants alternated (default, spin, default, spin), each a fresh
command-line process (with the allocator tuning the command lines ask for); a run's speed is
the median events/s of its epochs 2.., a variant's in the round the better of its two runs.
Printed: every run, then per round each variant's speed and the default's ratio to the best
fixed variant, and the median of those ratios. The issue's quiet target: ×0.95 or more in every
round. On the quiet 2-core host, for the lead:

    python -m benchmarks.train.thread_contention --short-runs 3 --epochs 3 --cap 300

``--simulate`` times nothing: it drives this tree's ``ThreadChoice`` (default settings) with
made-up step times of simulated hosts — steady; moments of 0.05-0.3 s every 1-5 s that slow every
count 2x ("alike") or only 2 threads 2.2x; the 2-core host's slow states (2 threads 1.15 ms for
5-15 s every 10-40 s); a host that becomes busy after 5 s — for 60,000 rsc15 steps (0.51 ms at 2
threads, 0.73 ms at one: about 30 s), 5 seeds each, and prints the default's speed over the best
fixed count's and its comparisons per run. Run it at two commits to compare two choices.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gru4rec.machine.cpus import available_cpus

ROOT = Path(__file__).resolve().parents[2]

DATA = ROOT.parent / "shared" / "data" / "rsc15_100k"

#: One run, in its own process: one JSON line per epoch, then one for the evaluation.
_CHILD = """
import json, sys
from gru4rec import Config, GRU4Rec, evaluate
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.machine.threads import last_decision, using_threads
keep_freed_memory()  # as the command lines do: a library process asks for the allocator tuning
paramfile, epochs, train, test, threads, eval_repeats = sys.argv[1:7]
eval_repeats = int(eval_repeats)
threads = None if threads == "default" else int(threads)
config = Config.from_file(paramfile).replace_from_string(f"n_epochs={epochs}")
model = GRU4Rec(config, device="cpu", threads=threads)
def epoch(info):
    print(json.dumps({"epoch": info.epoch, "events_per_s": info.events_per_s}), flush=True)
with using_threads(threads):  # one run, as a command line's: the evaluations share what training saw
    model.fit(train, callback=epoch, progress=False)
    chosen = last_decision("training")
    speeds = []
    for _ in range(eval_repeats):
        result = evaluate(model, test)
        speeds.append(result.n_predictions / result.seconds)
    evaluated = last_decision("evaluation")
print(json.dumps({"eval_per_s": speeds, "recall@20": result.recall[20],
                  "training_threads": chosen.as_dict() if chosen else None,
                  "evaluation_threads": evaluated.as_dict() if evaluated else None}), flush=True)
"""

#: Turns in one process (``--turns``): one JSON line per round of epochs (events/s by variant).
_TURNS_CHILD = """
import json, sys
from gru4rec import GRU4Rec, evaluate
from gru4rec.config import Config
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.network.gru import GRU4RecNet
from gru4rec.machine.threads import current_memory, using_threads
from gru4rec.training.loop import train_epochs
from gru4rec.training.trainer import Trainer
import torch
from benchmarks.workloads import load_sessions, prefix_for_steps
paramfile, train, test, turns, turn_steps, cpus = sys.argv[1:4] + [int(a) for a in sys.argv[4:7]]
keep_freed_memory()  # as the command lines do
config = Config.from_file(paramfile)
model = GRU4Rec(config.replace_from_string("n_epochs=1"), device="cpu", threads=cpus).fit(train, progress=False)
sessions, support = load_sessions(train, 0, 0)
items, offsets = prefix_for_steps(sessions.items, sessions.offsets, config.batch_size, turn_steps)
settings = {"default": None, "spin": cpus, "threads=1": 1}  # threads: None is the online choice
epochs, runs = {}, {}
for name, threads in settings.items():
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed))
    with using_threads(threads):  # the loop's choice is made at its first epoch: fixed, or online
        runs[name] = current_memory()  # each setting's own run: its evaluations share what its training saw
        epochs[name] = train_epochs(Trainer(net, config, support), items, offsets, n_epochs=turns + 1, progress=False)
        next(epochs[name])  # warm-up (the default's first comparison starts here)
names = list(epochs)
for turn in range(turns):
    order = names[turn % 3:] + names[:turn % 3]
    speeds = {name: next(epochs[name]).events_per_s for name in order}
    evaluations = {}
    for name in order:  # then one evaluation of the test set per setting, as after training
        with using_threads(settings[name], memory=runs[name]):
            result = evaluate(model, test)
        evaluations[name] = result.n_predictions / result.seconds
    print(json.dumps({"turn": turn, **speeds, "eval_per_s": evaluations,
                      "default_threads": runs["default"].decisions["training"].as_dict(),
                      "default_evaluation_threads": runs["default"].decisions["evaluation"].threads}), flush=True)
"""

#: name -> (threads argument, OMP_WAIT_POLICY or None for the runtime's own)
VARIANTS: dict[str, tuple[str, str | None]] = {
    "default": ("default", None),
    "passive": ("cpus", "PASSIVE"),
    "spin": ("cpus", None),
    "active": ("cpus", "ACTIVE"),
    "threads=1": ("1", None),
    "oversubscribed": ("cpus+1", None),
}


def _spin() -> None:
    while True:
        pass


def _child_env(policy: str | None = None) -> dict[str, str]:
    """A measured process's environment: this tree first on the path (its gru4rec and benchmarks), no thread count or OpenMP
    wait setting inherited, and ``OMP_WAIT_POLICY=policy`` where given (None: the runtime's own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(ROOT)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    return env


def _run(args: argparse.Namespace, variant: str) -> dict[str, object]:
    """One run of ``variant``: its epochs' events/s and its evaluation (None if cut off)."""
    threads, policy = VARIANTS[variant]
    threads = {"cpus": str(available_cpus()), "cpus+1": str(available_cpus() + 1)}.get(threads, threads)
    env = _child_env(policy)
    command = [sys.executable, "-c", _CHILD, args.paramfile, str(args.epochs), args.train, args.test, threads, str(args.eval_repeats)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=args.cap)
        cut = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        cut = True
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    epochs = [line["events_per_s"] for line in lines if "epoch" in line]
    final = next((line for line in lines if "eval_per_s" in line), {})
    return {"events_per_s": epochs, "eval_per_s": final.get("eval_per_s"), "recall@20": final.get("recall@20"),
            "training_threads": final.get("training_threads"), "evaluation_threads": final.get("evaluation_threads"),
            "cut_off": cut, "seconds": round(time.perf_counter() - started, 1)}


#: Seconds per rsc15 step by thread count on the quiet 2-core host in its fast state (benchmarks/README.md, "Round 8").
_SIM_FAST = {1: 0.73e-3, 2: 0.51e-3}


def _sim_host(kind: str, rng: random.Random) -> Callable[[float], dict[int, float]]:
    """Seconds per step by thread count at simulated time t, on a host of ``kind`` (``--simulate``)."""
    spans: list[tuple[float, float]] = []
    t, fast = 0.0, _SIM_FAST
    gaps, lengths = {"slow-states": ((10.0, 40.0), (5.0, 15.0))}.get(kind, ((1.0, 5.0), (0.05, 0.3)))
    while t < 400:
        t += rng.uniform(*gaps)
        length = rng.uniform(*lengths)
        spans.append((t, t + length))
        t += length
    slowed = {"moments-alike": {1: 2 * fast[1], 2: 2 * fast[2]}, "moments-2-threads": {1: fast[1], 2: 2.2 * fast[2]},
              "slow-states": {1: fast[1], 2: 1.15e-3}}
    if kind == "steady":
        return lambda now: fast
    if kind == "becomes-busy":
        return lambda now: fast if now < 5.0 else {1: 1.2e-3, 2: 5e-3}
    return lambda now: slowed[kind] if any(a <= now < b for a, b in spans) else fast


def _simulate() -> None:
    """``--simulate``: the default's speed over the best fixed count on simulated hosts."""
    import logging

    from gru4rec.machine.threads import ThreadChoice

    logging.disable(logging.INFO)

    def run(kind: str, seed: int, fixed: int | None) -> tuple[float, int]:
        rng = random.Random(seed)
        speed, now, held = _sim_host(kind, rng), [0.0], [2]
        choice = None
        if fixed is None:
            choice = ThreadChoice([1, 2], apply=lambda n: held.__setitem__(0, n), current=lambda: held[0],
                                  clock=lambda: now[0], load=lambda: 0.0)
            choice.__enter__()
        for _ in range(60_000):
            step = speed(now[0])[fixed or held[0]] * rng.uniform(0.97, 1.03)
            now[0] += step
            if choice is not None:
                choice.observe(step)
        return now[0], choice.comparisons if choice is not None else 0

    for kind in ("steady", "moments-alike", "moments-2-threads", "slow-states", "becomes-busy"):
        ratios, comparisons = [], []
        for seed in range(5):
            best = min(run(kind, seed, 1)[0], run(kind, seed, 2)[0])
            seconds, compared = run(kind, seed, None)
            ratios.append(best / seconds)
            comparisons.append(compared)
        print(f"  {kind:18s} default / best fixed count ×{statistics.mean(ratios):.3f}   comparisons per run "
              f"{statistics.mean(comparisons):.1f}", flush=True)


_EPOCH_LINE = re.compile(r"Epoch(\d+) --> .*\| *(\d+) e/s\]")


def _short_run(args: argparse.Namespace, variant: str) -> list[float]:
    """One ``run.py`` process of ``variant`` (``--short-runs``): the events/s of its epochs, from
    the original's per-epoch lines (those finished before ``--cap`` seconds)."""
    threads, policy = VARIANTS[variant]
    threads = {"cpus": str(available_cpus()), "cpus+1": str(available_cpus() + 1)}.get(threads, threads)
    command = [sys.executable, str(ROOT / "run.py"), args.train, "-pf", args.paramfile, "-ps", f"n_epochs={args.epochs}"]
    if threads != "default":
        command += ["--threads", threads]
    try:
        done = subprocess.run(command, env=_child_env(policy), capture_output=True, text=True, timeout=args.cap)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as cut:
        out = (cut.stdout or b"").decode() if isinstance(cut.stdout, bytes) else (cut.stdout or "")
    return [float(m.group(2)) for m in _EPOCH_LINE.finditer(out)]


def _short_runs(args: argparse.Namespace, busy: int) -> None:
    """``--short-runs``: rounds of two alternated ``run.py`` runs per variant; prints each run and
    each round, then the summary."""
    variants = args.variants if args.variants_given else ["default", "spin"]
    ratios = []
    for round_ in range(args.short_runs):
        speeds: dict[str, list[float]] = {v: [] for v in variants}
        for repeat in range(2):
            for variant in variants:
                epochs = _short_run(args, variant)
                later = epochs[1:] or epochs
                speed = statistics.median(later) if later else 0.0
                speeds[variant].append(speed)
                print(json.dumps({"busy": busy, "round": round_, "variant": variant, "repeat": repeat, "events_per_s": epochs,
                                  "epochs_2_on": speed}), flush=True)
        best = {v: max(s) for v, s in speeds.items()}
        fixed = [v for v in variants if v != "default"]
        text = "   ".join(f"{v} {best[v]:,.0f}" for v in variants)
        if "default" in best and fixed and max(best[v] for v in fixed) > 0:
            top = max(fixed, key=lambda v: best[v])
            ratios.append(best["default"] / best[top])
            text += f"   default / best fixed setting ×{ratios[-1]:.3f} ({top})"
        print(f"round {round_}: {text} e/s (best of two runs, median of epochs 2..{args.epochs})", flush=True)
    if ratios:
        print(f"\n{available_cpus()} CPU(s), busy processes: {busy}; {Path(args.paramfile).name}, {args.epochs} epochs of "
              f"{Path(args.train).name}: default / best fixed setting per round " + ", ".join(f"×{r:.3f}" for r in ratios)
              + f" (median ×{statistics.median(ratios):.3f}; the quiet target: ×0.95 or more)")


def _turns(args: argparse.Namespace, busy: int) -> None:
    """``--turns``: default, spin and threads=1 in turns inside one process; prints each round
    and the summary."""
    env = _child_env()
    command = [sys.executable, "-c", _TURNS_CHILD, args.paramfile, args.train, args.test,
               str(args.turns), str(args.turn_steps), str(available_cpus())]
    rounds = []
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                rounds.append(json.loads(line))
                print(json.dumps({"busy": busy, **rounds[-1]}), flush=True)
    if proc.returncode != 0 or not rounds:
        raise SystemExit(f"the turns' process failed (exit status {proc.returncode})")
    print(f"\n{available_cpus()} CPU(s); {Path(args.paramfile).name}, {args.turns} turns of {args.turn_steps} mini-batches "
          f"of {Path(args.train).name} each, then one evaluation of {Path(args.test).name}; busy processes: {busy}")
    fixed = ("spin", "threads=1")  # the settings the default is measured against
    for what, unit, speeds in (("training", "e/s", rounds), ("evaluation", "pred/s", [r["eval_per_s"] for r in rounds])):
        # over all turns: each turn has the same work, so the harmonic mean of its speeds
        overall = {n: len(speeds) / sum(1.0 / r[n] for r in speeds) for n in ("default", *fixed)}
        best = max(fixed, key=lambda n: overall[n])
        per_round = statistics.median(r["default"] / max(r[n] for n in fixed) for r in speeds)
        print(f"  {what:10s} " + "   ".join(f"{n} {v:,.0f}" for n, v in overall.items()) + f" {unit}; default / best fixed "
              f"setting ×{overall['default'] / overall[best]:.3f} ({best}), / the faster of each round: median ×{per_round:.3f}")


def _paired_ratios(runs: list[dict[str, object]], base: list[dict[str, object]]) -> dict[str, list[float]]:
    """Per repeat, a variant's median epochs 2.. and median evaluation over the same repeat's
    passive run's (the repeats run back to back: a drifting load moves both)."""
    ratios: dict[str, list[float]] = {"training": [], "evaluation": []}
    for run, ref in zip(runs, base):
        for name, key, skip in (("training", "events_per_s", 1), ("evaluation", "eval_per_s", 0)):
            mine, theirs = (list(r[key] or [])[skip:] for r in (run, ref))  # type: ignore[call-overload]
            if mine and theirs:
                ratios[name].append(statistics.median(mine) / statistics.median(theirs))
    return ratios


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, nargs="+", default=[0],
                        help="busy processes beside the runs (one load per command is best)")
    parser.add_argument("--variants", nargs="+", default=["default", "passive", "spin", "threads=1"], choices=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-repeats", type=int, default=5,
                        help="evaluations of the test set per run (one of rsc15_100k's takes ~0.3 s: too short to time alone)")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds before a run is stopped")
    parser.add_argument("--turns", type=int, default=0,
                        help="instead of --variants: default, spin and threads=1 in this many turns each in one process (see above)")
    parser.add_argument("--turn-steps", type=int, default=1500, help="mini-batches per turn (--turns)")
    parser.add_argument("--simulate", action="store_true", help="instead: the online choice on simulated hosts (see above)")
    parser.add_argument("--short-runs", type=int, default=0,
                        help="instead: this many rounds of two alternated run.py runs per variant (see above)")
    parser.add_argument("--paramfile", default=str(ROOT / "paramfiles" / "rsc15_xe_shared_100_best.py"))
    parser.add_argument("--train", default=str(DATA / "train_full.tsv"))
    parser.add_argument("--test", default=str(DATA / "test.tsv"))
    args = parser.parse_args()
    args.variants_given = any(a == "--variants" or a.startswith("--variants=") for a in sys.argv[1:])
    if args.simulate:
        _simulate()
        return
    for path in (args.train, args.test):
        if not Path(path).exists():
            raise SystemExit(f"{path} not found (see ../shared/data/README.md, or pass --train/--test)")

    summary: dict[int, dict[str, list[dict[str, object]]]] = {}
    for busy in args.busy:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        time.sleep(0.5)
        try:
            if args.turns:
                _turns(args, busy)
                continue
            if args.short_runs:
                _short_runs(args, busy)
                continue
            runs: dict[str, list[dict[str, object]]] = {v: [] for v in args.variants}
            for repeat in range(args.repeats):
                for variant in args.variants:
                    run = _run(args, variant)
                    runs[variant].append(run)
                    print(json.dumps({"busy": busy, "variant": variant, "repeat": repeat, **run}), flush=True)
            summary[busy] = runs
        finally:
            for p in spinners:
                p.terminate()
                p.join()

    if args.turns or args.short_runs:
        return
    print(f"\n{available_cpus()} CPU(s); {Path(args.paramfile).name}, {args.epochs} epoch(s) of {Path(args.train).name}, "
          f"{args.repeats} repeat(s); a run stops after {args.cap:.0f} s")
    for busy, runs in summary.items():
        print(f"busy processes: {busy}")
        rows = {}
        for variant, rs in runs.items():
            later = [e for r in rs for e in r["events_per_s"][1:]]  # type: ignore[index]
            first = [r["events_per_s"][0] for r in rs if r["events_per_s"]]  # type: ignore[index]
            if not later:  # no epoch after the first finished: the cap bounds the speed from above
                later = [e for r in rs for e in r["events_per_s"]] or [0.0]  # type: ignore[union-attr]
            evals = [e for r in rs for e in (r["eval_per_s"] or [])]  # type: ignore[attr-defined]
            rows[variant] = (statistics.median(later), statistics.median(first) if first else 0.0,
                             statistics.median(evals) if evals else None, sum(bool(r["cut_off"]) for r in rs))
        base = rows.get("passive")
        for variant, (later, first, evals, cut) in rows.items():
            ratio = f"×{later / base[0]:5.2f}" if base and base[0] else ""
            eval_text = f"{evals:9,.0f} pred/s" if evals is not None else "     (cut off)"
            eval_ratio = f"×{evals / base[2]:5.2f}" if base and base[2] and evals is not None else ""
            print(f"  {variant:10s} epochs 2..: {later:8,.0f} e/s {ratio}   epoch 1: {first:8,.0f} e/s   "
                  f"evaluation: {eval_text} {eval_ratio}" + (f"   ({cut} run(s) cut off)" if cut else ""))
        if "passive" in runs:
            for variant in (v for v in runs if v != "passive"):
                paired = _paired_ratios(runs[variant], runs["passive"])
                if paired:
                    print(f"  {variant:10s} paired with passive (median of the repeats' ratios): "
                          + ", ".join(f"{name} ×{statistics.median(values):.2f}" for name, values in paired.items() if values))
        fixed = {v: r for v, r in rows.items() if v != "default"}
        if "default" in rows and fixed:
            best = max(fixed, key=lambda v: fixed[v][0])
            best_eval = max((v for v in fixed if fixed[v][2] is not None), key=lambda v: fixed[v][2] or 0.0, default=None)
            text = f"  default / best fixed setting: training ×{rows['default'][0] / fixed[best][0]:.2f} ({best})"
            if best_eval is not None and rows["default"][2] is not None:
                text += f", evaluation ×{rows['default'][2] / fixed[best_eval][2]:.2f} ({best_eval})"
            print(text)


if __name__ == "__main__":
    main()
