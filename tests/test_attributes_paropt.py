"""``paropt --item-features`` (issue 49): a study's trials train with the item attribute table,
the objective is the validation figure ``evaluate`` gives such a model (cold targets ranked among
the whole catalogue), and the table (its content), ``--item-min-count`` and ``--item-types`` are
part of the study's identity: a resumed study with another table is refused, naming it.

The data is ``gru4rec synth --kind intents-attributes`` at its smallest; a study has two trials.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

optuna = pytest.importorskip("optuna")

from gru4rec import cli, evaluate  # noqa: E402
from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import ParoptSettings, run_study  # noqa: E402
from gru4rec.tune.objective import Objective  # noqa: E402
from tune_helpers import trials_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::gru4rec.items.table.HighCardinalityWarning")  # 60 items: few share a value

FIXED = "loss=cross-entropy,n_sample=16,n_epochs=2,constrained_embedding=True"
SPACE = ['{"name": "layers", "dtype": "int", "values": [8, 16], "step": 8}',
         '{"name": "learning_rate", "dtype": "float", "values": [0.05, 0.2], "step": 0.05}']


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("paropt_attributes")
    assert cli.main(["-q", "synth", str(folder / "d"), "--kind", "intents-attributes", "--n-sessions", "300",
                     "--n-items", "60", "--n-intents", "4", "--seed", "1"]) == 0
    space = folder / "space.json"
    space.write_text("\n".join(SPACE) + "\n")
    d = folder / "d"
    # VALID: the test split, whose sessions click the new (cold) items; the validation split has none.
    return {"train": d / "train_full.tsv", "valid": d / "test.tsv", "items": d / "items.tsv", "space": space}


def args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["-q", "paropt", str(data["train"]), str(data["valid"]), "-opf", str(data["space"]), "-fp", FIXED,
            "--threads", "1", "--no-pruning", "--seed", "0", "--out", str(out), "--study-name", "attrs", *extra]


def test_trials_train_with_the_table_and_the_study_refuses_another(
    data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    score = Objective.score

    def recording(self: Objective, model: Any) -> float:
        """The objective's own figure, beside an independent evaluation of the same model."""
        value = score(self, model)
        result = evaluate(model, str(data["valid"]), cutoffs=(20,), mode="standard")
        seen.append({"value": value, "attributes": model.net.attributes, "catalogue": len(model.catalogue),
                     "n_items": len(model.item_map), "evaluated": result.recall[20],
                     "groups": {g.label: g.n_predictions for g in result.target_groups}})
        return value

    monkeypatch.setattr(Objective, "score", recording)
    out = tmp_path / "out"
    flags = ["--item-features", str(data["items"]), "--item-types", "category=categorical", "--item-min-count", "2"]
    assert cli.main([*args(data, out, "-nt", "2", "--run-dirs", str(tmp_path / "runs")), *flags]) == 0
    trials = trials_of(f"sqlite:///{out / 'paropt.db'}", "attrs")
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"] and len(seen) == 2
    for trial, model in zip(trials, seen):
        rows = model["attributes"]
        assert rows is not None and rows.names == ["category"] + ["brand"]  # the table, with category declared
        assert model["catalogue"] > model["n_items"]  # the table's items without training events: cold items
        assert [enc.min_count for enc in rows.source.encoding.categorical] == [2, 2]
        assert trial.value == model["value"] == model["evaluated"]  # the figure evaluate gives the model
        assert model["groups"]["cold"] > 0  # VALID's cold targets count (ranked among the catalogue)
    summary = json.loads((out / "attrs.summary.json").read_text())
    assert summary["objective"]["item_features"] == flags[:2] + flags[4:] + flags[2:4]  # as train takes them
    # the trial's run folder retrains it with the same table and options
    command = (tmp_path / "runs" / "attrs" / "trial-00000" / "command.txt").read_text()
    assert f"--item-features {data['items']} --item-min-count 2 --item-types category=categorical" in command

    # the same table under another path resumes the study (its content is compared) ...
    copy = tmp_path / "copy.tsv"
    shutil.copy(data["items"], copy)
    flags_copy = ["--item-features", str(copy), "--item-types", "category=categorical", "--item-min-count", "2"]
    assert cli.main([*args(data, out, "-nt", "1"), *flags_copy]) == 0
    assert len(trials_of(f"sqlite:///{out / 'paropt.db'}", "attrs")) == 3
    # ... another table, another minimum count, other kinds or no table are refused by name
    other = tmp_path / "other.tsv"
    table = pd.read_csv(data["items"], sep="\t")
    table.loc[0, "price"] = float(np.asarray(table["price"])[0]) + 1.0
    table.to_csv(other, sep="\t", index=False)
    study = dict(train=str(data["train"]), valid=str(data["valid"]), paramspace=str(data["space"]), fixed=FIXED,
                 n_trials=1, out=str(out), study_name="attrs", threads=1, pruning=False)
    for changes in ({"item_features": str(other), "item_min_count": 2, "item_types": {"category": "categorical"}},
                    {"item_features": str(copy), "item_min_count": 1, "item_types": {"category": "categorical"}},
                    {"item_features": str(copy), "item_min_count": 2, "item_types": None},
                    {}):
        with pytest.raises(ConfigError, match="optimises something else") as info:
            run_study(ParoptSettings(**study, **changes))  # type: ignore[arg-type]
        assert "item_features: study has {'sha256'" in str(info.value)
    assert len(trials_of(f"sqlite:///{out / 'paropt.db'}", "attrs")) == 3  # nothing ran


def test_bad_item_options_are_usage_errors(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*args(data, tmp_path / "o"), "--item-features", str(data["items"]), "--item-types", "price=float"]) == 2
    assert "--item-types" in capsys.readouterr().err
    assert cli.main([*args(data, tmp_path / "o"), "--item-min-count", "3"]) == 2
    assert "need --item-features" in capsys.readouterr().err
    assert cli.main([*args(data, tmp_path / "o"), "--item-features", str(tmp_path / "none.tsv")]) == 1
    assert "none.tsv: file not found" in capsys.readouterr().err
    assert not (tmp_path / "o" / "paropt.db").exists()  # before any study


def test_an_early_stopped_trial_is_valued_as_evaluate_values_its_model(
    data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--early-stop`` the value is fit(valid=...)'s for the best epoch, which must be the
    figure ``evaluate`` gives the model the trial keeps (cold targets included)."""
    from gru4rec.tune import objective

    seen: list[tuple[float, int]] = []
    write = objective.write_trial_metrics

    def recording(folder: Any, model: Any, valid: Any, settings: Any) -> None:
        result = evaluate(model, str(data["valid"]), cutoffs=(20,), mode="standard")
        seen.append((result.recall[20], next(g.n_predictions for g in result.target_groups if g.label == "cold")))
        write(folder, model, valid, settings)

    monkeypatch.setattr(objective, "write_trial_metrics", recording)
    out = tmp_path / "out"
    assert cli.main([*args(data, out, "-nt", "1", "--early-stop", "1", "--run-dirs", str(tmp_path / "runs")),
                     "--item-features", str(data["items"]), "--item-types", "category=categorical"]) == 0
    (trial,) = trials_of(f"sqlite:///{out / 'paropt.db'}", "attrs")
    assert len(seen) == 1 and seen[0][1] > 0
    assert trial.value == pytest.approx(seen[0][0], abs=1e-12)
