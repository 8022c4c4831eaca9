"""Tests of gru4rec.tune.enqueue (--enqueue PARAMFILE): the published best files against the
original's spaces, every disagreement named, and a study whose first trial is the file's
configuration (its value checked against an independent training)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec import GRU4Rec, evaluate  # noqa: E402
from gru4rec.config import Config  # noqa: E402
from gru4rec.data.events import read_events  # noqa: E402
from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import load_paramspace, run_study  # noqa: E402
from gru4rec.tune.enqueue import read_enqueued  # noqa: E402
from tune_helpers import ROOT, data_fixture, settings, trials_of  # noqa: E402,F401 - data is a fixture

XE_SPACE = load_paramspace(ROOT / "paramspaces" / "gru4rec_xe_shared_parspace.json")
BPRMAX_SPACE = load_paramspace(ROOT / "paramspaces" / "gru4rec_bprmax_shared_parspace.json")
README_FIXED = "loss=cross-entropy,constrained_embedding=True,n_sample=2048,logq=1.0,n_epochs=10"


def _read(path: Path | str, space: list, fixed: str):
    return read_enqueued(path, space, Config.from_string(fixed), fixed)


def test_the_published_best_files_against_the_originals_spaces() -> None:
    rsc15 = _read(ROOT / "paramfiles" / "rsc15_xe_shared_100_best.py", XE_SPACE, README_FIXED)
    assert rsc15.params == {"layers": 100, "batch_size": 32, "learning_rate": 0.2, "dropout_p_embed": 0.0,
                            "dropout_p_hidden": 0.4, "momentum": 0.2, "sample_alpha": 0.5}
    assert type(rsc15.params["layers"]) is int and type(rsc15.params["learning_rate"]) is float
    # 100 units is off the space's grid of 64 + 32k; bpreg is neither fixed nor searched.
    assert any(w.startswith("layers=100 lies outside the searched grid 64..512 step 32") for w in rsc15.warnings)
    assert any(w.startswith("bpreg=0.0 is neither fixed nor searched: the trial runs the default 1.0") for w in rsc15.warnings)
    assert len(rsc15.warnings) == 2
    fixed = "loss=bpr-max,constrained_embedding=True,n_sample=2048,n_epochs=10"
    digi = _read(ROOT / "paramfiles" / "diginetica_bprmax_shared_512_best.json", BPRMAX_SPACE, fixed)
    assert digi.params == {"layers": 512, "batch_size": 128, "learning_rate": 0.05, "dropout_p_embed": 0.5,
                           "dropout_p_hidden": 0.3, "momentum": 0.15, "sample_alpha": 0.3, "bpreg": 0.9,
                           "final_act": "elu-1"}
    assert digi.warnings == ()
    # A study of shorter trials is seeded from the same file: n_epochs only warns.
    short = _read(ROOT / "paramfiles" / "diginetica_bprmax_shared_512_best.py", BPRMAX_SPACE,
                  fixed.replace("n_epochs=10", "n_epochs=4"))
    assert short.params == digi.params
    assert short.warnings == ("n_epochs=10: the trial trains for the study's n_epochs=4",)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_sample": 1024}, "n_sample=1024 but the study fixes n_sample=2048 (-fp)"),
        ({"learning_rate": 0.0123}, "learning_rate=0.0123 has more digits than the space's step 0.005 (a trial would run 0.012)"),
        ({"layers": [100, 100]}, "layers=[100, 100]: the space searches one int, the file gives 2 values"),
        ({"loss": "bpr-max", "final_act": "elu-2"}, "final_act='elu-2' is not among the space's choices"),
        ({"n_sampel": 5}, "n_sampel: unknown parameter"),
    ],
)
def test_a_file_that_disagrees_with_the_study_is_an_error_naming_it(tmp_path: Path, change: dict, message: str) -> None:
    params = json.loads((ROOT / "paramfiles" / "rsc15_xe_shared_100_best.json").read_text())
    params.update(change)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(params))
    space, fixed = XE_SPACE, README_FIXED
    if params["loss"] == "bpr-max":
        space, fixed = BPRMAX_SPACE, README_FIXED.replace("cross-entropy", "bpr-max").replace("logq=1.0", "logq=0.0")
    with pytest.raises(ConfigError) as info:
        _read(path, space, fixed)
    assert f"--enqueue '{path}'" in str(info.value) and message in str(info.value)


def test_a_study_starts_from_the_enqueued_configuration_and_a_rerun_does_not_queue_it_again(
        data: dict[str, Path], tmp_path: Path) -> None:
    best = tmp_path / "known_good.json"
    best.write_text(json.dumps({"loss": "cross-entropy", "n_sample": 16, "n_epochs": 2, "logq": 1.0, "layers": [16],
                                "batch_size": 16, "learning_rate": 0.1, "dropout_p_hidden": 0.25, "momentum": 0.3}))
    s = settings(data, tmp_path, n_trials=2, study_name="seeded", enqueue=(str(best),), pruning=False)
    run_study(s)
    storage = f"sqlite:///{tmp_path / 'out' / 'paropt.db'}"
    first = trials_of(storage, "seeded")[0]
    assert first.params == {"layers": 16, "batch_size": 16, "learning_rate": 0.1, "dropout_p_hidden": 0.25, "momentum": 0.3}
    assert first.user_attrs["enqueued_from"] == str(best)
    # Independent reference: the file's configuration trained and evaluated here.
    train, valid = read_events(data["train"]), read_events(data["valid"])
    model = GRU4Rec(Config.from_file(best), device="cpu").fit(train, progress=False)
    assert first.value == pytest.approx(evaluate(model, valid, cutoffs=(20,)).mrr[20], abs=1e-9)
    # The same command again extends the study without running the file's values twice.
    run_study(s)
    trials = trials_of(storage, "seeded")
    assert len(trials) == 4 and [t.number for t in trials if "enqueued_from" in t.user_attrs] == [0]
    assert all(t.params != first.params for t in trials[1:])


def test_an_off_grid_value_is_warned_about_once_by_paropt_not_again_by_optuna(
        data: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import warnings

    off_grid = tmp_path / "off_grid.json"  # layers 20: the space's grid is 8, 16, 24
    off_grid.write_text(json.dumps({"loss": "cross-entropy", "n_sample": 16, "n_epochs": 2, "logq": 1.0, "layers": [20],
                                    "batch_size": 16, "learning_rate": 0.1, "dropout_p_hidden": 0.25, "momentum": 0.3}))
    s = settings(data, tmp_path, n_trials=1, study_name="off_grid", enqueue=(str(off_grid),), pruning=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_study(s)
    assert not [w for w in caught if "Fixed parameter" in str(w.message)]
    assert "layers=20 lies outside the searched grid" in caplog.text
    first = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "off_grid")[0]
    assert first.params["layers"] == 20  # run as given
