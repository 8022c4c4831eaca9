"""One GPU window of tuning (issue 29): ``paropt`` on a wide space for a bounded wall-clock time,
continuing a study kept in a journal file under ``results/studies/``, so that the study grows
from one GPU window to the next wherever that GPU is.

    python -m benchmarks.gpu.gpu_paropt diginetica [--loss bprmax|xe] [--minutes 8]

What it runs: ``gru4rec paropt`` on ``DATA/<dataset>_train_tr.tsv.gz`` -> ``..._train_valid.tsv.gz``
(the gzipped copies in the ignored ``.gpu_data/``; see :data:`PREPARE`), the space
``paramspaces/srgnn_<loss>_wide.json``, MRR@20 with conservative ties, ``--early-stop 3``, the
median pruner on the per-epoch validation MRR, and a trial whose loss explodes pruned at once.
No trial starts after ``minutes - reserve`` minutes from the script's start (paropt's
``--timeout``); a trial still running at ``minutes`` is left to the shell's ``timeout``.

Where the study lives: ``results/studies/<study>.journal`` (committed). With ``$OUT`` (or
``--out``) set, the journal is copied there first and the study runs in the copy, so that what a
GPU machine sends back holds every finished trial even if the window is cut short: commit that
copy over ``results/studies/<study>.journal``. The reports (``<study>.trials.csv/.json``,
``.best.json/.py``, ``.summary.json``) go to ``$OUT`` or, without it, to ``results/``; the
committed ``results/<study>.trials.json`` is also passed as ``--add-trials`` (nothing is added
twice), so a study whose journal was lost continues from its export. A trial cut by the end of a
window (interrupted: FAIL without a reason; killed: left RUNNING, marked FAIL here) is queued
again, once, at the end of that window or at the start of the next.

``--fix PARAMS`` pins searched parameters (they leave the space: a tiny CPU check, e.g.
``--fix n_sample=64,n_epochs=2,layers=32``) and gives the study its own name (``..._fixed``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Data set argument -> folder of ../shared/data (the gzipped copies are named <argument>_<split>.tsv.gz).
DATASETS = {"diginetica": "diginetica_srgnn", "tmall": "tmall_srgnn", "rsc15": "rsc15_100k"}
#: Loss argument -> (search space, fixed parameters).
LOSSES = {
    "bprmax": ("paramspaces/srgnn_bprmax_wide.json", "loss=bpr-max"),
    "xe": ("paramspaces/srgnn_xe_wide.json", "loss=cross-entropy,logq=1.0"),
}
SPLITS = ("train_tr", "train_valid")
#: The one command that prepares .gpu_data/ from ../shared/data (run from the project root).
PREPARE = ("mkdir -p .gpu_data && for d in diginetica:diginetica_srgnn tmall:tmall_srgnn rsc15:rsc15_100k; do "
           "for s in train_tr train_valid; do gzip -c ../shared/data/${d#*:}/$s.tsv > .gpu_data/${d%%:*}_$s.tsv.gz; "
           "done; done")
REPORTS = (".trials.csv", ".trials.json", ".best.json", ".best.py", ".summary.json")


def study_name(dataset: str, loss: str, fix: str = "") -> str:
    """``diginetica_srgnn_bprmax_wide`` (``..._fixed`` when parameters are pinned)."""
    return f"{DATASETS[dataset]}_{loss}_wide" + ("_fixed" if fix else "")


def narrowed_space(space: Path, fix: str, dest: Path) -> Path:
    """``space`` without the parameters that ``fix`` pins, written into ``dest`` (the same file
    when nothing is pinned)."""
    from gru4rec.tune.space import canonical_name, fixed_names, load_paramspace

    if not fix:
        return space
    pinned = {canonical_name(n) for n in fixed_names(fix)}
    kept = [s for s in load_paramspace(space) if canonical_name(s.name) not in pinned]
    dest.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(s.to_json()) + "\n" for s in kept)
    path = dest / f"{space.stem}.{hashlib.sha1(fix.encode()).hexdigest()[:8]}.json"
    path.write_text(text)
    return path


def requeue_orphans(journal: Path, name: str) -> list[int]:
    """Queue again the trials that the end of a window cut: left RUNNING (the process was killed:
    marked FAIL here, this script being the study's only writer while it runs) or FAILed by the
    interrupt (no ``fail_reason``: the objective records one for every failure of its own).
    Each is queued once (its copy says ``enqueued_from: cut trial N``), and a copy is not queued
    again. Returns the numbers of the trials marked or queued now."""
    if not journal.is_file():
        return []
    import optuna

    from gru4rec.tune.storage import open_storage

    states = optuna.trial.TrialState
    storage, _ = open_storage(f"journal:{journal}")
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return []
    trials = study.get_trials(deepcopy=False)
    queued = {str(t.user_attrs.get("enqueued_from", "")) for t in trials}
    handled = []
    for t in trials:
        params = t.params or t.system_attrs.get("fixed_params") or {}
        reason = t.user_attrs.get("fail_reason") or t.system_attrs.get("fail_reason")
        running = t.state == states.RUNNING
        if running:
            storage.set_trial_system_attr(t._trial_id, "fail_reason", "orphaned: its GPU window ended while it ran")
            storage.set_trial_state_values(t._trial_id, states.FAIL)
        elif not (t.state == states.FAIL and not reason):
            continue
        copy = f"cut trial {t.number}"
        again = params and copy not in queued and not str(t.user_attrs.get("enqueued_from", "")).startswith("cut trial")
        if again:
            study.enqueue_trial(params, user_attrs={"enqueued_from": copy})
        if running or again:
            handled.append(t.number)
    return handled


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=sorted(DATASETS))
    p.add_argument("--loss", choices=sorted(LOSSES), default="bprmax")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget from the script's start (default 8)")
    p.add_argument("--reserve", type=float, default=1.5,
                   help="minutes before the end of the budget after which no trial starts (default 1.5)")
    p.add_argument("--data", default=".gpu_data", help="folder of the gzipped copies (default .gpu_data)")
    p.add_argument("--train", default=None, help="training events instead of DATA/<dataset>_train_tr.tsv.gz")
    p.add_argument("--valid", default=None, help="validation events instead of DATA/<dataset>_train_valid.tsv.gz")
    p.add_argument("--studies", default="results/studies", help="folder of the committed journals")
    p.add_argument("--results", default="results", help="folder of the committed reports (read for --add-trials)")
    p.add_argument("--out", default=os.environ.get("OUT") or None,
                   help="where the journal copy and the reports go (default $OUT; without it the journal is "
                        "used in place and the reports go to --results)")
    p.add_argument("--fix", default="", metavar="PARAMS", help="pin searched parameters, e.g. n_sample=64,n_epochs=2")
    p.add_argument("--trials", type=int, default=1000, help="at most this many trials in this run (default 1000)")
    p.add_argument("--early-stop", type=int, default=3, help="paropt --early-stop patience (default 3)")
    p.add_argument("--prune-startup", type=int, default=5, help="paropt --prune-startup (default 5)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=None,
                   help="paropt's TPE seed (default 42: trial n draws from (seed, n), so a continued study's new "
                        "trials draw anew)")
    p.add_argument("--study-name", default=None)
    return p


def paropt_argv(args: argparse.Namespace, start: float, scratch: Path) -> tuple[list[str], Path, Path]:
    """The ``gru4rec paropt`` arguments of this window (a narrowed space is written into
    ``scratch``); returns ``(argv, journal, reports folder)``. Copies the committed journal into
    ``--out``; raises SystemExit when the budget leaves no time for a trial."""
    remaining = args.minutes * 60 - (time.monotonic() - start) - args.reserve * 60
    if remaining <= 0:
        raise SystemExit(f"gpu_paropt: no time left for a trial ({args.minutes} min budget, {args.reserve} min reserve)")
    space_file, fixed = LOSSES[args.loss]
    name = args.study_name or study_name(args.dataset, args.loss, args.fix)
    train = args.train or f"{args.data}/{args.dataset}_{SPLITS[0]}.tsv.gz"
    valid = args.valid or f"{args.data}/{args.dataset}_{SPLITS[1]}.tsv.gz"
    committed = Path(args.studies) / f"{name}.journal"
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        journal = out / committed.name
        if committed.is_file() and not journal.exists():
            shutil.copyfile(committed, journal)
    else:
        out = Path(args.results)
        committed.parent.mkdir(parents=True, exist_ok=True)
        journal = committed
    space = narrowed_space(ROOT / space_file, args.fix, scratch)
    argv = [train, valid, "--optuna-parameter-file", str(space), "--fixed-parameters", ",".join(p for p in (fixed, args.fix) if p),
            "-nt", str(args.trials), "--timeout", f"{remaining:.0f}", "-pm", "mrr", "-m", "20", "--eval-mode", "conservative",
            "--storage", f"journal:{journal}", "--study-name", name, "--early-stop", str(args.early_stop),
            "--prune-startup", str(args.prune_startup), "--device", args.device, "--out", str(out)]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.seed is not None:
        argv += ["--seed", str(args.seed)]
    export = Path(args.results) / f"{name}.trials.json"
    if not args.train and not Path(train).is_file():
        raise SystemExit(f"gpu_paropt: {train} not found; prepare .gpu_data/ from the project root with:\n  {PREPARE}")
    if export.is_file():
        argv += ["--add-trials", str(export)]
    return argv, journal, out


def main(argv: Sequence[str] | None = None) -> int:
    start = time.monotonic()
    args = build_parser().parse_args(argv)
    from gru4rec.cli.paropt import add_arguments
    from gru4rec.cli.paropt import run as run_paropt

    with tempfile.TemporaryDirectory(prefix="gpu_paropt_") as scratch:
        pargs, journal, out = paropt_argv(args, start, Path(scratch))
        name = pargs[pargs.index("--study-name") + 1]
        orphans = requeue_orphans(journal, name)
        if orphans:
            print(f"gpu_paropt: trials {orphans} were cut by the end of the last window: queued again", file=sys.stderr)
        print("gpu_paropt: paropt " + " ".join(pargs), file=sys.stderr, flush=True)
        parser = argparse.ArgumentParser(prog="gru4rec paropt")
        add_arguments(parser)
        code = run_paropt(parser.parse_args(pargs))
        if code == 130:  # the window's end (timeout's SIGINT) cut a trial: queue it, write the reports
            requeue_orphans(journal, name)
            n = pargs.index("-nt")
            code = run_paropt(parser.parse_args(pargs[:n] + ["-nt", "0", "--total"] + pargs[n + 2:]))
            code = 130 if code == 0 else code
    lock = out / f".{name}.lock"
    if args.out and lock.exists():
        lock.unlink()  # what comes back from a GPU machine is counted in files
    return code


if __name__ == "__main__":
    sys.exit(main())
