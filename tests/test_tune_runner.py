"""Tests of gru4rec.tune.runner: worker processes sharing one study (SQLite, a real PostgreSQL
server and journal storages) and a worker that stops after too many failed trials in a row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.tune import open_storage, parse_paramspace, run_study  # noqa: E402
from tune_helpers import (  # noqa: E402,F401 - data and postgres are fixtures
    ROOT,
    TrialState,
    cli_args,
    data_fixture,
    postgres_fixture,
    settings,
    stop,
    subprocess_env,
    trials_of,
)


def test_two_worker_processes_share_one_study(data: dict[str, Path], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    processes = []
    for worker in range(2):
        args = cli_args(data, storage=storage, study_name="shared", out=str(tmp_path / f"w{worker}"), seed=str(worker))
        processes.append(subprocess.Popen([sys.executable, str(ROOT / "paropt.py"), *args, "-nt", "3"],
                                          env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=300)[0].decode() for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    trials = trials_of(storage, "shared")
    assert sorted(t.number for t in trials) == list(range(6))  # no duplicate, none lost
    assert all(t.state == TrialState.COMPLETE for t in trials)
    workers = [t.user_attrs["worker"] for t in trials]
    assert len(set(workers)) == 2 and sorted(workers.count(w) for w in set(workers)) == [3, 3]


def test_two_commands_with_two_workers_each_share_one_postgresql_study(data: dict[str, Path], tmp_path: Path,
                                                                       postgres: object) -> None:
    url = postgres.url(postgres.new_database(), password="s3cret")  # type: ignore[attr-defined]
    out = tmp_path / "out"  # shared: both commands write the study's reports here at their end
    args = [*cli_args(data, storage=url, study_name="pg", out=str(out)), "-nt", "3", "--workers", "2"]
    processes = [subprocess.Popen([sys.executable, str(ROOT / "paropt.py"), *args], env=subprocess_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=300)[0].decode() for p in processes]
    finally:
        for p in processes:
            stop(p)
    assert [p.returncode for p in processes] == [0, 0], outputs
    trials = trials_of(url, "pg")
    # Exactly the 2 x 3 trials asked for, each number once, all finished.
    assert [t.number for t in trials] == list(range(6)) and all(t.state == TrialState.COMPLETE for t in trials)
    runs = [t.user_attrs["run"] for t in trials]
    assert sorted(runs.count(r) for r in set(runs)) == [3, 3]
    assert len({t.user_attrs["worker"] for t in trials}) == 4  # 2 commands x 2 worker processes
    # The report of the last command to finish holds every trial's value as the storage has it.
    exported = json.loads((out / "pg.trials.json").read_text())
    assert [(r["number"], r["state"], r["value"]) for r in exported] == [(t.number, "COMPLETE", t.value) for t in trials]
    summary = json.loads((out / "pg.summary.json").read_text())
    assert summary["counts"] == {"COMPLETE": 6} and summary["this_run"]["counts"] == {"COMPLETE": 3}
    assert summary["best_value"] == max(t.value for t in trials)
    # The URL is printed for the dashboard, without the password.
    for text in outputs:
        assert "s3cret" not in text and "Watch it live: optuna-dashboard 'postgresql" in text and "postgres:***@" in text
    assert "s3cret" not in (out / "pg.summary.json").read_text()


def test_local_workers_on_a_journal_storage(data: dict[str, Path], tmp_path: Path) -> None:
    journal = tmp_path / "journal.log"
    report = run_study(settings(data, tmp_path, storage=f"journal:{journal}", study_name="journal", n_trials=4,
                                workers=2, pruning=False))
    storage, _ = open_storage(f"journal:{journal}")
    trials = optuna.load_study(study_name="journal", storage=storage).get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2, 3] and report.counts == {"COMPLETE": 4}
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # the spawned worker ran its share


def test_a_space_where_every_trial_fails_stops_early(data: dict[str, Path], tmp_path: Path) -> None:
    from gru4rec.tune.runner import MAX_CONSECUTIVE_FAILURES

    space = parse_paramspace('{"name": "loss", "dtype": "categorical", "values": ["bpr-max"]}\n'
                             '{"name": "smoothing", "dtype": "categorical", "values": [0.1]}')
    # --total would otherwise never end: failed trials do not count.
    report = run_study(settings(data, tmp_path, paramspace=space, fixed="n_sample=16,n_epochs=1", n_trials=5, total=True,
                                study_name="hopeless"))
    assert report.counts == {"FAIL": MAX_CONSECUTIVE_FAILURES}
    assert any(f"stopped after {MAX_CONSECUTIVE_FAILURES} failed trials in a row" in p for p in report.problems)
    assert "no trial completed" in report.problems and report.best_param_string is None
