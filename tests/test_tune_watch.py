"""paropt's opt-in early stopping (``--early-stop``) and run folder per trial (``--run-dirs``):
a trial keeps its best epoch and is scored by it, and its folder's command line retrains it."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

optuna = pytest.importorskip("optuna")

from gru4rec.cli import main  # noqa: E402
from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tracking.runs import read_run  # noqa: E402
from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import FIXED, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture

FIVE_EPOCHS = FIXED.replace("n_epochs=2", "n_epochs=5")


def test_trials_stop_early_and_write_their_run_folders(data: dict[str, Path], tmp_path: Path) -> None:
    s = settings(data, tmp_path, fixed=FIVE_EPOCHS, early_stop=1, run_dirs=str(tmp_path / "runs"), pruning=False,
                 storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="watch")
    run_study(s)
    trials = trials_of(s.storage, "watch")
    assert len(trials) == 3
    for trial in trials:
        folder = read_run(tmp_path / "runs" / "watch" / f"trial-{trial.number:05d}")
        epochs = folder["epochs"]
        mrr = [e["valid"]["mrr@20"] for e in epochs]
        best = trial.user_attrs["best_epoch"]
        assert trial.user_attrs["epochs"] == len(epochs)
        assert mrr[best - 1] == max(mrr) and trial.value == mrr[best - 1]  # scored by its best epoch
        assert len(epochs) == 5 or len(epochs) == best + 1  # all epochs, or stopped one after the best
        assert folder["config"]["trial"] == trial.number and folder["config"]["params"] == pytest.approx(trial.params)
        (valid,) = folder["metrics"].values()
        assert valid["mrr"]["20"] == pytest.approx(trial.value, abs=1e-12)  # the kept model on VALID
        assert valid["breakdown"]["popularity"]
        assert not (tmp_path / "runs" / "watch" / f"trial-{trial.number:05d}" / "model.safetensors").exists()

    # The command in a trial's folder retrains exactly that trial.
    trial = trials[0]
    command = shlex.split(read_run(tmp_path / "runs" / "watch" / "trial-00000")["command"])
    assert command[:2] == ["gru4rec", "train"] and "--threads 1" in shlex.join(command)
    assert read_run(tmp_path / "runs" / "watch" / "trial-00000")["config"]["threads"] == 1
    torch.set_num_threads(1)
    assert main(["-q", *command[1:], "-d", "cpu", "--run-dir", str(tmp_path / "again")]) == 0
    again = read_run(tmp_path / "again")["epochs"]
    assert [e["valid"] for e in again] == [e["valid"] for e in read_run(tmp_path / "runs" / "watch" / "trial-00000")["epochs"]]

    # A report over trial folders.
    trial_dirs = [str(tmp_path / "runs" / "watch" / f"trial-{t.number:05d}") for t in trials]
    assert main(["-q", "report", *trial_dirs, "-o", str(tmp_path / "trials.html")]) == 0


@pytest.mark.parametrize(("threads", "workers", "expected"), [(1, 1, 1), (2, 1, 2), (None, 1, 3)])
def test_trials_train_with_the_threads_asked_for(data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  threads: int | None, workers: int, expected: int) -> None:
    # The machine's default (3 here) must not replace --threads when a trial's fit starts.
    import gru4rec.fitting
    import gru4rec.machine.threads

    monkeypatch.setattr(gru4rec.machine.threads, "default_threads", lambda: 3)
    seen: list[int] = []
    real = gru4rec.fitting.using_threads  # fit's threads are set where fit is wired

    def spy(n: int | None = None):  # type: ignore[no-untyped-def]
        seen.append(3 if n is None else n)
        return real(n)

    monkeypatch.setattr(gru4rec.fitting, "using_threads", spy)
    before = torch.get_num_threads()
    try:
        run_study(settings(data, tmp_path, threads=threads, workers=workers, n_trials=2, storage=f"sqlite:///{tmp_path / 't.db'}",
                           study_name="threads", final_test=str(data["valid"])))
    finally:
        torch.set_num_threads(before)
    assert seen == [expected] * 3  # two trials and the final test


def test_a_used_trial_folder_stops_the_study_with_a_clear_error(data: dict[str, Path], tmp_path: Path) -> None:
    used = tmp_path / "runs" / "used" / "trial-00000"
    used.mkdir(parents=True)
    (used / "mine.txt").write_text("keep")
    s = settings(data, tmp_path, run_dirs=str(tmp_path / "runs"), storage=f"sqlite:///{tmp_path / 'u.db'}", study_name="used", n_trials=1)
    with pytest.raises(Exception, match="is not empty"):
        run_study(s)
    assert [p.name for p in used.iterdir()] == ["mine.txt"]


def test_early_stop_must_be_positive(data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--early-stop"):
        settings(data, tmp_path, early_stop=0).check()


def test_paropt_flags_reach_the_settings() -> None:
    import argparse

    from gru4rec.cli.paropt import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["T", "V", "-opf", "S", "--early-stop", "3", "--run-dirs", "R"])
    s = settings_from_args(args)
    assert (s.early_stop, s.run_dirs) == (3, "R")
    assert json.loads(json.dumps({"early_stop": s.early_stop}))["early_stop"] == 3
