"""Tests of gru4rec.tune.objective: failed trials (invalid combinations, a diverging loss) are
recorded with their reason while the study goes on; an exploding loss prunes its trial at once;
pruning after an epoch, never after the last; trials are quiet unless verbose."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec import GRU4Rec, evaluate  # noqa: E402
from gru4rec.config import Config  # noqa: E402
from gru4rec.data.events import read_events  # noqa: E402
from gru4rec.tune import parse_paramspace, run_study  # noqa: E402
from gru4rec.tune.objective import quiet_training  # noqa: E402
from tune_helpers import FIXED, AlwaysPrune, TrialState, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture


def test_failed_trials_are_recorded_with_their_reason_and_the_study_goes_on(data: dict[str, Path], tmp_path: Path) -> None:
    # bpr-max + label smoothing is an invalid combination (each value alone is valid).
    space = parse_paramspace('{"name": "loss", "dtype": "categorical", "values": ["cross-entropy", "bpr-max"]}\n'
                             '{"name": "smoothing", "dtype": "categorical", "values": [0.0, 0.1]}')
    grid = optuna.samplers.GridSampler({"loss": ["cross-entropy", "bpr-max"], "smoothing": [0.0, 0.1]}, seed=0)
    fixed = "layers=8,batch_size=16,n_sample=16,n_epochs=1"
    report = run_study(settings(data, tmp_path, paramspace=space, fixed=fixed, n_trials=4, study_name="fail"), sampler=grid)
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "fail")
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(trials) == 4 and len(failed) == 1 and report.counts == {"COMPLETE": 3, "FAIL": 1}
    assert failed[0].params == {"loss": "bpr-max", "smoothing": 0.1}
    assert failed[0].user_attrs["fail_reason"].startswith("ConfigError:") and "smoothing" in failed[0].user_attrs["fail_reason"]
    assert report.best_number is not None and report.best_number != failed[0].number

    # A diverging training (NaN loss) is a FAIL too.
    space = parse_paramspace('{"name": "learning_rate", "dtype": "categorical", "values": [0.05, 1e30]}')
    grid = optuna.samplers.GridSampler({"learning_rate": [0.05, 1e30]}, seed=0)
    fixed = "loss=bpr-max,final_act=linear,adapt=sgd,layers=8,batch_size=16,n_sample=16,n_epochs=2"
    report = run_study(settings(data, tmp_path, paramspace=space, fixed=fixed, n_trials=2, study_name="nan", force=True),
                       sampler=grid)
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "nan")
    by_lr = {t.params["learning_rate"]: t for t in trials}
    assert by_lr[1e30].state == TrialState.FAIL and by_lr[0.05].state == TrialState.COMPLETE
    assert by_lr[1e30].user_attrs["fail_reason"].startswith("TrainingDivergedError:")


def test_an_exploding_loss_prunes_the_trial_at_once(data: dict[str, Path], tmp_path: Path) -> None:
    # A learning rate of 2 with bpr-max explodes in the first of three epochs: the trial stops
    # there, before that epoch's validation, and is PRUNED with the reason; the other completes.
    space = parse_paramspace('{"name": "learning_rate", "dtype": "categorical", "values": [0.05, 2.0]}')
    grid = optuna.samplers.GridSampler({"learning_rate": [0.05, 2.0]}, seed=0)
    fixed = "loss=bpr-max,final_act=linear,momentum=0.5,layers=16,batch_size=16,n_sample=16,n_epochs=3"
    report = run_study(settings(data, tmp_path, paramspace=space, fixed=fixed, n_trials=2, study_name="explode"),
                       sampler=grid, pruner=optuna.pruners.NopPruner())
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "explode")
    by_lr = {t.params["learning_rate"]: t for t in trials}
    assert by_lr[0.05].state == TrialState.COMPLETE and report.best_number == by_lr[0.05].number
    bad = by_lr[2.0]
    assert bad.state == TrialState.PRUNED and bad.user_attrs["epochs"] == 1
    assert bad.intermediate_values == {}  # stopped before the epoch's validation
    assert "exploded in epoch 1" in bad.user_attrs["diverged"] and "fail_reason" not in bad.user_attrs
    # The same model outside paropt: its first epoch's loss is the one the trial was stopped for.
    model = GRU4Rec(Config.from_string(fixed).replace_from_string("learning_rate=2.0,n_epochs=1"), device="cpu", threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(read_events(data["train"]), progress=False)
    assert f"{model.history[0].loss:.6g}" in bad.user_attrs["diverged"]


def check_one_epoch_values(trials, data: dict[str, Path], mode: str) -> None:
    """Each trial was pruned after its first epoch and reported that 1-epoch model's MRR@20,
    recomputed here by training and evaluating the same configuration independently."""
    base = Config.from_string(FIXED)
    train, valid = read_events(data["train"]), read_events(data["valid"])
    for t in trials:
        assert list(t.intermediate_values) == [0] and t.user_attrs["epochs"] == 1
        config = base.replace_from_string(t.user_attrs["param_string"]).replace(n_epochs=1)
        model = GRU4Rec(config, device="cpu").fit(train, progress=False)
        assert evaluate(model, valid, cutoffs=(20,), mode=mode).mrr[20] == pytest.approx(t.intermediate_values[0], abs=1e-9)


def test_pruning(data: dict[str, Path], tmp_path: Path) -> None:
    report = run_study(settings(data, tmp_path, n_trials=2, study_name="pruned"), pruner=AlwaysPrune())
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "pruned")
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    assert report.best_number is None and "no trial completed" in report.problems
    # Pruned after the first of two epochs; the reported value is that of a 1-epoch model.
    check_one_epoch_values(trials, data, "standard")
    # The last epoch's result is kept: a 1-epoch trial is never pruned.
    run_study(settings(data, tmp_path, n_trials=1, study_name="last", fixed=FIXED.replace("n_epochs=2", "n_epochs=1"),
                       force=True), pruner=AlwaysPrune())
    assert [t.state for t in trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "last")] == [TrialState.COMPLETE]
    # --no-pruning: no per-epoch validation, only the final value.
    run_study(settings(data, tmp_path, n_trials=1, study_name="nopruning", pruning=False, force=True))
    (t,) = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "nopruning")
    assert t.state == TrialState.COMPLETE and t.intermediate_values == {}


def test_pruning_with_early_stopping_reports_the_validation_fit_computed(data: dict[str, Path], tmp_path: Path) -> None:
    # With --early-stop (benchmarks/gpu/gpu_paropt.py) the per-epoch value comes from fit's own
    # validation (EpochInfo.valid), not from a second evaluation: it must be the same number.
    run_study(settings(data, tmp_path, n_trials=2, study_name="pruned_es", early_stop=2, eval_mode="conservative"),
              pruner=AlwaysPrune())
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "pruned_es")
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    check_one_epoch_values(trials, data, "conservative")


def test_trials_are_quiet_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    # A trial hides the training loop's per-epoch lines (INFO), not its warnings, and restores the level.
    parent, loop = logging.getLogger("gru4rec.training"), logging.getLogger("gru4rec.training.loop")
    before = parent.level
    with quiet_training():
        loop.info("Epoch1 --> hidden")
        loop.warning("shown")
        assert parent.level == logging.WARNING
    assert parent.level == before
    with quiet_training(False):  # -v
        loop.info("Epoch1 --> shown")
    captured = capsys.readouterr()
    assert "hidden" not in captured.out and "Epoch1 --> shown" in captured.out
    assert "warning: shown" in captured.err
