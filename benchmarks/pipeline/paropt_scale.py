#!/usr/bin/env python
"""paropt at scale: trials per hour with 1, 2 and 4 worker processes on PostgreSQL, and the
storage's overhead per trial for SQLite, PostgreSQL and the journal file.

    python -m benchmarks.pipeline.paropt_scale throughput --data ../shared/data/rsc15_100k --workers 1 2 4 --trials 8
    python -m benchmarks.pipeline.paropt_scale overhead --trials 200 --repeats 3

``throughput`` runs ``paropt.py`` on TRAIN_TR / TRAIN_VALID with the original's cross-entropy space
(``paramspaces/gru4rec_xe_shared_parspace.json``) and the published fixed parameters, without
pruning (every trial trains all its epochs, so that the work per trial does not depend on pruning
decisions), ``--threads 1`` per worker, one new PostgreSQL database per worker count. The sampler
is seeded per trial, so every worker count runs the same first trials (TPE's first 10 are random).
Trials per hour = finished trials / (last trial end - first trial start) from the storage's
timestamps; the command's whole wall time (process start, reading data) is printed beside it.

``overhead`` measures what a trial costs the storage alone: an objective that suggests the seven
parameters of the same space, sets the user attributes and reports one value as paropt's objective
does, and returns at once, under paropt's per-trial callback; a seeded random sampler, so that no
sampler model is timed. Milliseconds per trial, median over repeats, for each storage as paropt
opens it (RDB storages with the heartbeat).

Without ``--storage``, both start a throwaway PostgreSQL server (tests/postgres_server.py: initdb
in a temporary folder, loopback port, fsync on, stopped at the end); SQLite and the journal file
live in a temporary folder on the same disk. Figures are printed as JSON lines and a
Markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "paramspaces" / "gru4rec_xe_shared_parspace.json"
FIXED = "loss=cross-entropy,constrained_embedding=True,n_sample=2048,logq=1.0,n_epochs={epochs}"


@contextlib.contextmanager
def postgres_databases(url: str | None) -> Iterator[Any]:
    """A function that returns the URL of a new database: of the server ``url`` names (each
    call: a fresh study name in the same database), or of a throwaway server."""
    if url is not None:
        yield lambda: url
        return
    # The tests' throwaway server (tests/ is no package): its module loaded from its file.
    spec = importlib.util.spec_from_file_location("postgres_server", ROOT / "tests" / "postgres_server.py")
    assert spec is not None and spec.loader is not None
    postgres_server = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = postgres_server  # its dataclasses resolve their module
    spec.loader.exec_module(postgres_server)

    with postgres_server.temporary_postgres(fsync=True) as server:  # commits flushed to disk, as on a real server
        yield lambda: server.url(server.new_database())


def trials_per_hour(storage_url: str, study: str) -> dict[str, Any]:
    """Finished trials and their rate over the span of their timestamps."""
    import optuna

    from gru4rec.tune import open_storage

    storage, _ = open_storage(storage_url)
    trials = [t for t in optuna.load_study(study_name=study, storage=storage).get_trials()
              if t.datetime_complete is not None and t.state.name == "COMPLETE"]
    span = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
    return {"complete": len(trials), "span_s": round(span, 1), "trials_per_hour": round(3600 * len(trials) / span, 1),
            "median_trial_s": round(statistics.median(t.duration.total_seconds() for t in trials), 1)}


def throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    data = Path(args.data)
    rows = []
    with postgres_databases(args.storage) as new_database:
        for workers in args.workers:
            url = new_database()
            study = f"scale_w{workers}_{uuid.uuid4().hex[:6]}"
            with tempfile.TemporaryDirectory() as out:
                command = [sys.executable, str(ROOT / "paropt.py"), str(data / "train_tr.tsv"), str(data / "train_valid.tsv"),
                           "-opf", str(SPACE), "-fp", FIXED.format(epochs=args.epochs), "-nt", str(args.trials),
                           "--workers", str(workers), "--threads", "1", "--no-pruning", "--storage", url,
                           "--study-name", study, "--out", out]
                env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
                start = time.perf_counter()
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                wall = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"paropt failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            row = {"bench": "throughput", "workers": workers, "threads_per_worker": 1, "trials": args.trials,
                   "epochs": args.epochs, "command_wall_s": round(wall, 1), **trials_per_hour(url, study)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _overhead_once(storage_url: str, n_trials: int) -> float:
    """Milliseconds per trial of a study of ``n_trials`` instant trials (see the module)."""
    import optuna

    from gru4rec.tune import ParoptSettings, load_paramspace, open_storage, trial_param_string
    from gru4rec.tune.objective import worker_tag
    from gru4rec.tune.workers import _TrialLog

    space = load_paramspace(SPACE)
    storage, _ = open_storage(storage_url)
    study = optuna.create_study(storage=storage, study_name=f"overhead_{uuid.uuid4().hex[:8]}", direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    tag = worker_tag()

    def objective(trial: optuna.trial.Trial) -> float:
        trial.set_user_attr("run", "bench")
        trial.set_user_attr("worker", tag)
        params = {spec.name: spec.suggest(trial) for spec in space}
        trial.set_user_attr("param_string", trial_param_string(space, params))
        trial.report(0.5, 0)
        trial.set_user_attr("epochs", 1)
        trial.set_user_attr("seconds", 0.0)
        return 0.5

    settings = ParoptSettings(train="-", valid="-", paramspace=space)
    callback = _TrialLog(settings, "", None)
    import logging

    logging.getLogger("gru4rec.tune").setLevel(logging.WARNING)  # no per-trial lines while timing
    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials, callbacks=[callback])
    return 1000 * (time.perf_counter() - start) / n_trials


def overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = []
    with tempfile.TemporaryDirectory() as folder, postgres_databases(args.storage) as new_database:
        storages = {
            "sqlite": lambda i: f"sqlite:///{folder}/overhead{i}.db",
            "postgresql": lambda i: new_database(),
            "journal": lambda i: f"journal:{folder}/overhead{i}.log",
        }
        for name, make in storages.items():
            runs = [_overhead_once(make(i), args.trials) for i in range(args.repeats)]
            row = {"bench": "overhead", "storage": name, "trials": args.trials, "ms_per_trial": round(statistics.median(runs), 2),
                   "runs_ms": [round(r, 2) for r in runs]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    t = sub.add_parser("throughput", help="trials/hour with 1, 2, 4 worker processes on PostgreSQL")
    t.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "rsc15_100k"),
                   help="folder with train_tr.tsv and train_valid.tsv (default ../shared/data/rsc15_100k)")
    t.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    t.add_argument("--trials", type=int, default=8, help="trials per worker count (default 8)")
    t.add_argument("--epochs", type=int, default=10, help="n_epochs of every trial (default 10, the published setting)")
    t.add_argument("--storage", default=None, help="a PostgreSQL URL (default: a throwaway server)")
    o = sub.add_parser("overhead", help="storage overhead per trial: SQLite, PostgreSQL, journal")
    o.add_argument("--trials", type=int, default=200)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--storage", default=None, help="a PostgreSQL URL (default: a throwaway server)")
    args = parser.parse_args()
    rows = throughput(args) if args.bench == "throughput" else overhead(args)
    print()
    if args.bench == "throughput":
        print("| worker processes (1 thread each) | trials | trials/hour | median trial (s) | command wall (s) |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['workers']} | {r['complete']} | {r['trials_per_hour']} | {r['median_trial_s']} | {r['command_wall_s']} |")
    else:
        print("| storage | ms per trial (median) | runs |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['storage']} | {r['ms_per_trial']} | {', '.join(map(str, r['runs_ms']))} |")


if __name__ == "__main__":
    main()
