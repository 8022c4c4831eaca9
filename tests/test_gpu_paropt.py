"""benchmarks/gpu/gpu_paropt.py, the core of the GPU tuning window (issue 29), on a tiny synthetic data
set: a 2-trial study in a journal file, continued by a second call in a copy under OUT, the
trials cut by the end of a window queued again, and no trial started without time left."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_modules import import_module

optuna = pytest.importorskip("optuna")

from gru4rec.tune import open_storage  # noqa: E402
from tune_helpers import ROOT, TrialState, data_fixture  # noqa: E402,F401 - data is a fixture

gpu_paropt = import_module("benchmarks.gpu.gpu_paropt")

TINY = "n_sample=16,n_epochs=2,layers=16,batch_size=16,embedding=0,constrained_embedding=True"
NAME = "rsc15_100k_bprmax_wide_fixed"


def trials(journal: Path) -> list[optuna.trial.FrozenTrial]:
    storage, _ = open_storage(f"journal:{journal}")
    return optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)


def finished(journal: Path) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials(journal) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def call(data: dict[str, Path], tmp_path: Path, *extra: str) -> int:
    return gpu_paropt.main(["rsc15", "--train", str(data["train"]), "--valid", str(data["valid"]), "--fix", TINY,
                            "--trials", "2", "--threads", "1", "--minutes", "5", "--reserve", "1",
                            "--studies", str(tmp_path / "studies"), "--results", str(tmp_path / "results"), *extra])


def test_a_window_adds_trials_to_the_journal_and_the_next_continues_it(data: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    assert call(data, tmp_path) == 0
    committed = tmp_path / "studies" / f"{NAME}.journal"
    first = finished(committed)
    assert len(first) == 2 and len(trials(committed)) == 2
    # The reports of the study, as results/ holds them, beside the journal's folder.
    export = json.loads((tmp_path / "results" / f"{NAME}.trials.json").read_text())
    assert sorted(r["number"] for r in export) == [0, 1]
    summary = json.loads((tmp_path / "results" / f"{NAME}.summary.json").read_text())
    assert summary["objective"]["metric"] == "mrr" and summary["objective"]["eval_mode"] == "conservative"

    # The next window (a GPU machine: OUT set) continues the same study in a copy under OUT; the
    # committed export given as --add-trials adds nothing twice.
    out = tmp_path / "out"
    assert call(data, tmp_path, "--out", str(out)) == 0
    copy = out / f"{NAME}.journal"
    second = finished(copy)
    assert len(second) == 4 and len(trials(copy)) == 4
    assert [(t.number, t.params, t.value) for t in second[:2]] == [(t.number, t.params, t.value) for t in first]
    assert len(trials(committed)) == 2  # the committed journal is replaced by the copy by hand, not here
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{NAME}.journal"] + [NAME + s for s in gpu_paropt.REPORTS])

    # A window cut mid-trial leaves it RUNNING (killed) or FAIL without a reason (interrupted):
    # the next window queues each again once; a failure the objective explains is left alone.
    storage, _ = open_storage(f"journal:{copy}")
    study = optuna.load_study(study_name=NAME, storage=storage)
    study.enqueue_trial(second[0].params)
    killed = study.ask()
    study.enqueue_trial(second[1].params)
    interrupted = study.ask()
    study.tell(interrupted, state=TrialState.FAIL)
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, params=second[0].params,
                                              distributions=second[0].distributions,
                                              user_attrs={"fail_reason": "ConfigError: ..."}))
    assert (killed.number, interrupted.number, len(trials(copy))) == (4, 5, 7)
    assert trials(copy)[4].state == TrialState.RUNNING
    assert call(data, tmp_path, "--out", str(out)) == 0
    third = trials(copy)
    assert third[4].state == TrialState.FAIL and third[4].system_attrs["fail_reason"].startswith("orphaned")
    assert [t.user_attrs.get("enqueued_from") for t in third[7:]] == ["cut trial 4", "cut trial 5"]
    assert third[7].params == second[0].params and third[8].params == second[1].params
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in third[7:]) and len(third) == 9
    # Handled once: a further window queues nothing again.
    assert gpu_paropt.requeue_orphans(copy, NAME) == []


def test_no_trial_starts_without_time_left(data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no time left"):
        gpu_paropt.main(["rsc15", "--train", str(data["train"]), "--valid", str(data["valid"]), "--minutes", "1",
                         "--reserve", "1", "--studies", str(tmp_path / "s"), "--results", str(tmp_path / "r"),
                         "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o" / f"{gpu_paropt.study_name('rsc15', 'bprmax')}.journal").exists()
