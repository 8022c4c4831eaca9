"""``run.py``: the original GRU4Rec command line, run in-process with ``sys.argv`` patched.

Printed metrics are compared with an independent brute-force evaluator (tests/test_cli.py).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from cli_helpers import TINY, assert_metrics_close, brute_force, parse_metrics

ROOT = Path(__file__).resolve().parents[1]
RUN_PY = ROOT / "run.py"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# The original's result line, exactly: 'Recall@20: 0.123456 MRR@20: 0.123456'.
EXACT_LINE = re.compile(r"^Recall@(\d+): (\d+\.\d{6}) MRR@(\d+): (\d+\.\d{6})$")


def run_py(argv: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """Execute run.py as __main__ with argv; returns (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
    capsys.readouterr()
    try:
        runpy.run_path(str(RUN_PY), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("run.py: error: ")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def saved_config(path: Path) -> dict[str, Any]:
    from gru4rec.config import Config
    from gru4rec.formats.checkpoint import load_file

    return Config.from_dict(load_file(path)[1]["config"]).to_dict()  # the parameters a file leaves at their defaults too


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from gru4rec.datasets.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("syn"), n_sessions=150, n_items=40, seed=5, test_days=6)


@pytest.fixture(scope="module")
def trained(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run through run.py, shared by the tests that only read its results."""
    torch.set_num_threads(1)
    model = tmp_path_factory.mktemp("m") / "model.safetensors"
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sys, "argv", ["run.py", str(data["train_full"]), "-ps", TINY, "-s", str(model),
                                 "-t", str(data["test"]), str(data["train_valid"]), "-m", "1", "5", "10",
                                 "-e", "conservative", "-lpm", "-pm", "mrr", "-d", "cpu", "--seed", "11"])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(RUN_PY), run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        mp.undo()
    assert code == 0, err.getvalue()
    return {"model": model, "out": out.getvalue(), "err": err.getvalue()}


def test_training_run_output(trained: dict[str, Any], data: dict[str, Path]) -> None:
    out = trained["out"]
    lines = out.splitlines()
    # The original prints everything on stdout: epoch lines, then a block per test file.
    assert sum(1 for line in lines if re.match(r"^Epoch\d+ --> loss: ", line)) == 2
    metric_lines = [line for line in lines if line.startswith("Recall@")]
    assert len(metric_lines) == 6 and all(EXACT_LINE.match(line) for line in metric_lines)
    blocks = parse_metrics(out)
    assert [sorted(b) for b in blocks] == [[1, 5, 10], [1, 5, 10]]
    # -lpm -pm mrr: the MRR at the first cutoff, once per test file, after its block.
    primary = [float(line.split(": ")[1]) for line in lines if line.startswith("PRIMARY METRIC: ")]
    assert len(primary) == 2
    for value, block in zip(primary, blocks):
        assert value == pytest.approx(block[1][1], abs=6e-7)
    assert "Training took" in out and "Evaluation took" in out  # timings


def test_metrics_match_brute_force(trained: dict[str, Any], data: dict[str, Path]) -> None:
    from gru4rec.recommender import GRU4Rec

    model = GRU4Rec.load(trained["model"], device="cpu")
    blocks = parse_metrics(trained["out"])
    for block, name in zip(blocks, ("test", "train_valid")):
        want = brute_force(model, pd.read_csv(data[name], sep="\t"), (1, 5, 10), "conservative")
        assert_metrics_close(block, want)


def test_load_model_gives_identical_results(
    trained: dict[str, Any], data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_py([trained["model"], "-l", "-t", data["test"], data["train_valid"], "-m", 1, 5, 10,
                             "-e", "conservative", "-lpm", "-pm", "mrr"], capsys, monkeypatch)
    assert code == 0, err
    want = [line for line in trained["out"].splitlines() if line.startswith(("Recall@", "PRIMARY METRIC"))]
    got = [line for line in out.splitlines() if line.startswith(("Recall@", "PRIMARY METRIC"))]
    assert got == want
    assert "Epoch" not in out  # loaded, not trained


def test_saved_config_has_the_flags(trained: dict[str, Any]) -> None:
    cfg = saved_config(trained["model"])
    assert cfg["layers"] == [8] and cfg["n_sample"] == 16 and cfg["seed"] == 11
    assert cfg["sample_store_size"] == 1600


def test_default_measure_and_mode(
    trained: dict[str, Any], data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gru4rec.recommender import GRU4Rec

    # '-m' with no value keeps the default (20) as in the original; the default mode is standard.
    code, out, err = run_py([trained["model"], "-l", "-t", data["test"], "-m"], capsys, monkeypatch)
    assert code == 0, err
    (block,) = parse_metrics(out)
    model = GRU4Rec.load(trained["model"], device="cpu")
    assert_metrics_close(block, brute_force(model, pd.read_csv(data["test"], sep="\t"), (20,), "standard"))
    assert "PRIMARY METRIC" not in out  # only with -lpm


def test_param_file_sample_store_and_ignored_module(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pf = tmp_path / "params.json"
    pf.write_text(json.dumps({"loss": "bpr-max", "final_act": "elu-0.5", "layers": [6], "n_epochs": 1,
                              "n_sample": 12, "batch_size": 8, "bpreg": 1.5}))
    model = tmp_path / "m"
    code, out, err = run_py([data["train_tr"], "-pf", pf, "-ss", 120, "-g", "gru4rec_pytorch", "-s", model,
                             "-t", data["train_valid"]], capsys, monkeypatch)
    assert code == 0, err
    assert "-g gru4rec_pytorch is ignored" in out
    cfg = saved_config(model)
    assert cfg["loss"] == "bpr-max" and cfg["bpreg"] == 1.5 and cfg["layers"] == [6]
    assert cfg["sample_store_size"] == 120
    assert len(parse_metrics(out)) == 1


def test_ps_overrides_pf(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-pf with -ps: the file's values with the string's on top (a published file shortened to a
    smoke test without editing it); the original accepted one of the two."""
    from gru4rec.config import Config

    pf = ROOT / "paramfiles" / "rsc15_xe_shared_100_best.py"
    model = tmp_path / "m"
    code, _, err = run_py([data["train_tr"], "-pf", pf, "-ps", "n_epochs=1,layers=6,n_sample=8", "-s", model],
                          capsys, monkeypatch)
    assert code == 0, err
    want = Config.from_file(pf).replace(n_epochs=1, layers=[6], n_sample=8).to_dict()
    assert saved_config(model) == want and want["loss"] == "cross-entropy"
    code, _, err = run_py([data["train_tr"], "-pf", pf, "-l"], capsys, monkeypatch)
    assert code == 2 and "argument -l/--load_model: not allowed with argument -pf/--parameter_file" in err


def test_column_keys_reach_the_model(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {"SessionId": "session", "ItemId": "product", "Time": "ts"}
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    pd.read_csv(data["train_full"], sep="\t").rename(columns=names).to_csv(train, sep="\t", index=False)
    pd.read_csv(data["test"], sep="\t").rename(columns=names).to_csv(test, sep="\t", index=False)
    model = tmp_path / "m"
    code, out, err = run_py([train, "-ps", TINY.replace("n_epochs=2", "n_epochs=1"), "-sk", "session",
                             "-ik", "product", "-tk", "ts", "-s", model, "-t", test], capsys, monkeypatch)
    assert code == 0, err
    cfg = saved_config(model)
    assert (cfg["session_key"], cfg["item_key"], cfg["time_key"]) == ("session", "product", "ts")
    # Loading: test files with the model's own column names need no flags ...
    code, out2, err = run_py([model, "-l", "-t", test], capsys, monkeypatch)
    assert code == 0, err
    assert parse_metrics(out2) == parse_metrics(out)
    # ... and other names are given with -ik/-sk/-tk.
    code, out3, err = run_py([model, "-l", "-t", data["test"], "-sk", "SessionId", "-ik", "ItemId",
                              "-tk", "Time"], capsys, monkeypatch)
    assert code == 0, err
    assert parse_metrics(out3) == parse_metrics(out)


# ------------------------------------------------------------------------------------ errors


def test_needs_exactly_one_of_ps_pf_l(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_py([data["train_tr"]], capsys, monkeypatch)
    assert code == 2 and "one of the arguments -ps/--parameter_string -pf/--parameter_file -l/--load_model" in err
    code, _, err = run_py([data["train_tr"], "-ps", TINY, "-l"], capsys, monkeypatch)
    assert code == 2 and "not allowed with" in err


def test_usage_errors(data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_py([data["train_tr"], "-ps", TINY, "-e", "optimistic"], capsys, monkeypatch)
    assert code == 2 and "invalid choice" in err
    code, _, err = run_py([data["train_tr"], "-ps", TINY, "-pm", "ndcg"], capsys, monkeypatch)
    assert code == 2 and "invalid choice" in err
    code, _, err = run_py([data["train_tr"], "-ps", "n_epochs=zero"], capsys, monkeypatch)
    assert code == 2
    assert_one_line_error(err, "n_epochs")


def test_missing_files(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_py([tmp_path / "nope.tsv", "-ps", TINY], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, "nope.tsv")
    code, _, err = run_py([tmp_path / "nope.model", "-l", "-t", data["test"]], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, "nope.model", "not found")
    code, _, err = run_py([data["train_tr"], "-ps", TINY, "-t", tmp_path / "t.tsv"], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, "t.tsv")


def test_a_bad_test_file_fails_before_the_first_epoch(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50 item 1: the original's everyday command (no -s) with a test file that lacks a
    column fails before training, naming the file and the column, not after the last epoch."""
    test = tmp_path / "test.tsv"
    pd.read_csv(data["test"], sep="\t").drop(columns="Time").to_csv(test, sep="\t", index=False)
    code, out, err = run_py([data["train_tr"], "-ps", TINY, "-t", data["test"], test], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, str(test), "'Time'")
    assert "Epoch" not in out and "Training GRU4Rec" not in out  # not one epoch ran
    # gru4rec train checks its test files the same way.
    from cli_helpers import assert_one_line_error as assert_cli_error
    from cli_helpers import run as run_cli

    code, out, err = run_cli(["train", data["train_tr"], "-ps", TINY, "-t", test, "-d", "cpu"], capsys)
    assert code == 1
    assert_cli_error(err, str(test), "'Time'")
    assert "Epoch" not in out and "Epoch" not in err


def test_evaluate_checks_the_test_files_before_its_repeat_grid(
    trained: dict[str, Any], data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gru4rec evaluate --fit-repeat searches a grid first: a bad test file fails before it."""
    from cli_helpers import assert_one_line_error as assert_cli_error
    from cli_helpers import run as run_cli

    test = tmp_path / "test.tsv"
    pd.read_csv(data["test"], sep="\t").drop(columns="ItemId").to_csv(test, sep="\t", index=False)
    code, _, err = run_cli(["evaluate", trained["model"], "-t", test, "--fit-repeat", data["train_valid"], "-d", "cpu"], capsys)
    assert code == 1
    assert_cli_error(err, str(test), "'ItemId'")
    assert "Choosing the repeat boost" not in err


def test_a_failure_after_training_keeps_the_model(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What no check can see before training (here: a test file none of whose items the model
    learnt) still fails after it, but the trained model is saved where the error says."""
    from gru4rec.recommender import GRU4Rec

    test = tmp_path / "test.tsv"
    frame = pd.read_csv(data["test"], sep="\t")
    frame.assign(ItemId=frame["ItemId"] + 10**6).to_csv(test, sep="\t", index=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_py([data["train_tr"], "-ps", TINY, "-t", test, "-d", "cpu"], capsys, monkeypatch)
    assert code == 1
    assert sum(1 for line in out.splitlines() if line.startswith("Epoch")) == 2  # it did train
    assert_one_line_error(err, str(test), "training had finished")
    (kept,) = tmp_path.glob("gru4rec-unsaved-*.safetensors")
    assert str(kept) in err
    model = GRU4Rec.load(kept, device="cpu")
    assert model.epochs_trained == 2 and tuple(model.config.layers) == (8,)


def test_ctrl_c_during_the_evaluation_keeps_the_trained_model(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after training (in the test evaluation): run.py and gru4rec train keep the model."""
    import gru4rec.cli.run_py
    import gru4rec.cli.train
    from cli_helpers import run as run_cli

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gru4rec.cli.run_py, "evaluate_files", stopped)
    monkeypatch.setattr(gru4rec.cli.train, "evaluate_files", stopped)
    code, out, err = run_py([data["train_tr"], "-ps", TINY, "-t", data["test"], "-d", "cpu"], capsys, monkeypatch)
    assert code == 130 and "Epoch2" in out
    (kept,) = tmp_path.glob("gru4rec-unsaved-*.safetensors")
    assert f"interrupted; training had finished: the model was saved to {kept}" in err
    kept.unlink()
    code, _, err = run_cli(["train", data["train_tr"], "-ps", TINY, "-t", data["test"], "-d", "cpu"], capsys)
    assert code == 130
    (kept,) = tmp_path.glob("gru4rec-unsaved-*.safetensors")
    assert f"training had finished: the model was saved to {kept}" in err


def test_unknown_column_key(data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_py([data["train_tr"], "-ps", TINY, "-sk", "Session"], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, "Session")


def test_corrupt_and_foreign_model(
    trained: dict[str, Any], data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = tmp_path / "bad"
    raw = trained["model"].read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])
    code, _, err = run_py([bad, "-l", "-t", data["test"]], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, str(bad), "truncated or corrupt")
    code, _, err = run_py([data["test"], "-l", "-t", data["test"]], capsys, monkeypatch)
    assert code == 1
    assert_one_line_error(err, "not a gru4rec model file")


def test_save_refuses_to_overwrite(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "model"
    target.write_text("mine")
    code, out, err = run_py([data["train_tr"], "-ps", TINY, "-s", target], capsys, monkeypatch)
    assert code == 2
    assert_one_line_error(err, str(target), "--force")
    assert "Epoch" not in out and target.read_text() == "mine"  # refused before training
    code, _, err = run_py([data["train_tr"], "-ps", TINY.replace("n_epochs=2", "n_epochs=1"), "-s", target,
                           "--force"], capsys, monkeypatch)
    assert code == 0, err
    assert saved_config(target)["n_epochs"] == 1


def test_debug_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run_py([tmp_path / "none", "-l", "--debug"], capsys, monkeypatch)
    assert code == 1 and "Traceback" in err and "run.py: error:" in err


def test_runs_as_a_script() -> None:
    # The real entry point: a fresh interpreter, started from another folder.
    proc = subprocess.run([sys.executable, str(RUN_PY), "--help"], capture_output=True, text=True,
                          cwd="/", timeout=120)
    assert proc.returncode == 0
    for flag in ("-ps", "-pf", "-l", "-s", "-t", "-m", "-e", "-ss", "-g", "-d", "-ik", "-sk", "-tk", "-pm", "-lpm"):
        assert re.search(rf"(^|[\s\[]){re.escape(flag)}[\s,]", proc.stdout), flag


# ----------------------------------------------------------------------------- real data (slow)


@pytest.mark.slow
def test_rsc15_reaches_the_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 3 acceptance: rsc15_100k with the best parameters within 2 % of the reference."""
    d = SHARED_DATA / "rsc15_100k"
    if not (d / "train_full.tsv").exists():
        pytest.skip(f"real data not present at {d}")
    code, out, err = run_py([d / "train_full.tsv", "-pf", ROOT / "paramfiles" / "rsc15_xe_shared_100_best.py",
                             "-t", d / "test.tsv", "-m", 1, 5, 10, 20, "-e", "conservative", "-d", "cpu"],
                            capsys, monkeypatch)
    assert code == 0, err
    (block,) = parse_metrics(out)
    recall, mrr = block[20]
    assert recall == pytest.approx(0.6839, rel=0.02)
    assert mrr == pytest.approx(0.3586, rel=0.02)
