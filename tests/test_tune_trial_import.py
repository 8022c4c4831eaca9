"""Tests of gru4rec.tune.trial_import (--add-trials STUDY.trials.json): a study continued on
"another machine" (a second storage) from the first one's export holds the same finished trials
(parameters, values, per-epoch values) and the same best trial, reruns a trial the first machine
had only queued, adds nothing twice, and refuses a file of another space naming the culprit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import run_study  # noqa: E402
from tune_helpers import TrialState, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture


def _first_machine(data: dict[str, Path], tmp_path: Path) -> tuple[list, Path]:
    report = run_study(settings(data, tmp_path / "a", n_trials=3, study_name="moved", pruning=False))
    trials = trials_of(f"sqlite:///{tmp_path / 'a' / 'out' / 'paropt.db'}", "moved")
    return trials, Path(report.files["trials_json"])


def test_a_study_continued_from_its_export_keeps_its_trials_and_best(data: dict[str, Path], tmp_path: Path) -> None:
    original, export = _first_machine(data, tmp_path)
    assert [t.state for t in original] == [TrialState.COMPLETE] * 3
    # The first machine had also queued a configuration it never ran (its export lists it).
    records = json.loads(export.read_text())
    queued = {"layers": 24, "batch_size": 8, "learning_rate": 0.2, "dropout_p_hidden": 0.0, "momentum": 0.5}
    records.append({"number": 3, "state": "WAITING", "value": None, "params": {}, "queued_params": queued})
    moved = tmp_path / "moved.trials.json"
    moved.write_text(json.dumps(records))

    s = settings(data, tmp_path / "b", n_trials=1, study_name="moved", pruning=False, add_trials=(str(moved),))
    report = run_study(s)
    trials = trials_of(f"sqlite:///{tmp_path / 'b' / 'out' / 'paropt.db'}", "moved")
    assert len(trials) == 4
    for old, new in zip(original, trials[:3]):
        assert (new.state, new.params, new.value, new.intermediate_values) == (
            old.state, old.params, old.value, old.intermediate_values)
        assert new.user_attrs["imported_from"] == f"{moved}#{old.number}"
    # This run's one trial is the queued configuration, run here.
    assert trials[3].state == TrialState.COMPLETE and trials[3].params == queued
    best = max(original + [trials[3]], key=lambda t: t.value)
    assert report.best_value == best.value and report.best_params == best.params

    # The same command again adds nothing twice (the queued one is finished now).
    run_study(settings(data, tmp_path / "b", n_trials=4, total=True, study_name="moved", pruning=False,
                       add_trials=(str(moved),)))
    assert len(trials_of(f"sqlite:///{tmp_path / 'b' / 'out' / 'paropt.db'}", "moved")) == 4


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r[0]["params"].update(n_layers=2), "trial 0: parameters ['n_layers'] are not searched"),
        (lambda r: r[1]["params"].pop("momentum"), "trial 1: gives no value for the searched parameters ['momentum']"),
        (lambda r: r[2].update(value="high"), "trial 2: a COMPLETE trial without a numeric 'value'"),
        (lambda r: r[0].update(state="EXPLODED"), "trial 0: unknown state 'EXPLODED'"),
    ],
)
def test_a_file_that_does_not_fit_the_study_is_refused_naming_the_trial(
        data: dict[str, Path], tmp_path: Path, change, message: str) -> None:
    _, export = _first_machine(data, tmp_path)
    records = json.loads(export.read_text())
    change(records)
    bad = tmp_path / "bad.trials.json"
    bad.write_text(json.dumps(records))
    s = settings(data, tmp_path / "b", n_trials=1, study_name="other", add_trials=(str(bad),))
    with pytest.raises(ConfigError) as info:
        run_study(s)
    assert f"--add-trials '{bad}'" in str(info.value) and message in str(info.value)
    assert trials_of(f"sqlite:///{tmp_path / 'b' / 'out' / 'paropt.db'}", "other") == []  # nothing added


@pytest.mark.parametrize("text, message", [("{not json", "not a trials JSON export"), ('{"a": 1}', "expected a list")])
def test_a_file_that_is_not_an_export_fails_before_a_study_is_made(
        data: dict[str, Path], tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        run_study(settings(data, tmp_path, n_trials=1, add_trials=(str(bad),)))
    assert not (tmp_path / "out" / "paropt.db").exists()


def test_a_study_given_its_own_export_adds_nothing(tmp_path: Path) -> None:
    # A sampled stepped float is stored raw (0.05 + 2 * 0.05 = 0.15000000000000002) and exported
    # cleaned (0.15): the study must still recognise its own trials (gpu_paropt.py passes the
    # committed export to a study that may already hold them).
    from gru4rec.tune import parse_paramspace
    from gru4rec.tune.reports import trials_json_text
    from gru4rec.tune.trial_import import add_trials
    from tune_helpers import SPACE_LINES

    space = parse_paramspace("\n".join(SPACE_LINES))
    study = optuna.create_study(direction="maximize")
    raw = {"layers": 16, "batch_size": 8, "learning_rate": 0.05 + 2 * 0.05, "dropout_p_hidden": 0.25, "momentum": 0.1 * 3}
    assert raw["learning_rate"] != 0.15 and raw["momentum"] != 0.3  # the floats the test is about
    dists = {s.name: optuna.distributions.FloatDistribution(s.low, s.high, step=s.step) if s.dtype == "float"
             else optuna.distributions.IntDistribution(s.low, s.high, step=s.step) for s in space}
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=0.25, params=raw, distributions=dists))
    study.add_trial(optuna.trial.create_trial(state=TrialState.PRUNED, params={**raw, "layers": 24}, distributions=dists,
                                              intermediate_values={0: 0.1}))
    export = tmp_path / "own.trials.json"
    export.write_text(trials_json_text(study, space))
    assert json.loads(export.read_text())[0]["params"]["learning_rate"] == 0.15  # exported cleaned
    assert add_trials(study, export, space) == (0, 0, 2)
    assert len(study.trials) == 2
