"""Tests of gru4rec.tune.reports through a whole study: the best-parameter files reproduce the
best trial's value, the final test matches an independent run, the exports hold every trial and
a rerun of the same study replaces its reports."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

optuna = pytest.importorskip("optuna")

from gru4rec import GRU4Rec, evaluate  # noqa: E402
from gru4rec.config import Config  # noqa: E402
from gru4rec.data.events import read_events  # noqa: E402
from gru4rec.tune import load_paramspace, run_study  # noqa: E402
from tune_helpers import TrialState, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture


def test_three_trial_study_writes_best_parameters_that_reproduce_its_value(data: dict[str, Path], tmp_path: Path) -> None:
    s = settings(data, tmp_path, final_test=str(data["test"]), final_measure=(5, 20))
    report = run_study(s)
    storage = f"sqlite:///{tmp_path / 'out' / 'paropt.db'}"
    trials = trials_of(storage, report.study_name)
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state == TrialState.COMPLETE for t in trials)
    assert report.counts == {"COMPLETE": 3} and report.problems == []
    best = max(trials, key=lambda t: t.value)
    assert (report.best_number, report.best_value) == (best.number, best.value)
    # After each epoch the metric is reported; the objective is the last epoch's.
    assert all(sorted(t.intermediate_values) == [0, 1] and t.intermediate_values[1] == t.value for t in trials)

    space = load_paramspace(data["space"])
    params = json.loads(Path(report.files["best_json"]).read_text())
    for spec in space:
        value = params[spec.name][0] if spec.name == "layers" else params[spec.name]
        assert spec.contains(value), (spec.name, value)
        assert value == spec.clean(best.params[spec.name])
    assert {k: params[k] for k in ("loss", "n_sample", "n_epochs", "logq")} == {
        "loss": "cross-entropy", "n_sample": 16, "n_epochs": 2, "logq": 1.0}
    # Both files and the printed string describe the same configuration.
    from_json = Config.from_file(report.files["best_json"])
    assert Config.from_file(report.files["best_py"]) == from_json
    assert Config.from_string(report.best_param_string) == from_json

    # Independent reference: train the best configuration here and evaluate it on VALID.
    train, valid = read_events(data["train"]), read_events(data["valid"])
    model = GRU4Rec(from_json, device="cpu").fit(train, progress=False)
    assert evaluate(model, valid, cutoffs=(20,)).mrr[20] == pytest.approx(report.best_value, abs=1e-9)

    # The final test: TRAIN+VALID -> TEST at the -fm cutoffs.
    full = GRU4Rec(from_json, device="cpu").fit(pd.concat([train, valid], ignore_index=True), progress=False)
    result = evaluate(full, read_events(data["test"]), cutoffs=(5, 20))
    assert report.final is not None
    for c in (5, 20):
        assert report.final["recall"][str(c)] == pytest.approx(result.recall[c], abs=1e-9)
        assert report.final["mrr"][str(c)] == pytest.approx(result.mrr[c], abs=1e-9)

    # Exports hold every trial.
    csv = pd.read_csv(report.files["trials_csv"])
    assert csv["number"].tolist() == [0, 1, 2] and csv["value"].tolist() == pytest.approx([t.value for t in trials])
    exported = json.loads(Path(report.files["trials_json"]).read_text())
    assert [r["state"] for r in exported] == ["COMPLETE"] * 3
    summary = json.loads(Path(report.files["summary"]).read_text())
    assert summary["best_trial"] == best.number and summary["final_test"]["recall"]["20"] == report.final["recall"]["20"]

    assert summary["counts"] == {"COMPLETE": 3} and summary["this_run"]["counts"] == {"COMPLETE": 3}

    # Extending the study is rerunning it: the reports are its own, so they are replaced.
    again = run_study(settings(data, tmp_path, n_trials=1))
    trials = trials_of(storage, report.study_name)
    assert again.counts == {"COMPLETE": 4} and again.run_counts == {"COMPLETE": 1}
    exported = json.loads(Path(again.files["trials_json"]).read_text())
    assert [(r["number"], r["value"]) for r in exported] == [(t.number, t.value) for t in trials]
    best = max(trials, key=lambda t: t.value)
    summary = json.loads(Path(again.files["summary"]).read_text())
    assert summary["counts"] == {"COMPLETE": 4} and summary["this_run"]["counts"] == {"COMPLETE": 1}
    assert summary["best_trial"] == best.number and summary["best_value"] == best.value
    assert Config.from_file(again.files["best_json"]) == Config.from_string(again.best_param_string)
    # The final test ran for the best trial of the first run and names it.
    assert report.final["best_trial"] == report.best_number and again.final is None
