"""The ``gru4rec`` command line, run in-process through ``main(argv)`` with its output parsed.

Metrics printed by the commands are checked against an independent brute-force evaluator that
steps the network one session at a time and ranks the target among all scores with NumPy.
Runs are tiny (a few hundred synthetic events, 8 units, 16 samples, 2 epochs).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from cli_helpers import CUTOFFS, TINY, assert_metrics_close, assert_one_line_error, brute_force, parse_metrics, run
from gru4rec import cli
from gru4rec.cli import COMMANDS, main

# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from gru4rec.datasets.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("synthetic")
    return write_synthetic(d, n_sessions=150, n_items=40, seed=3, test_days=6)


@pytest.fixture(scope="module")
def trained(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One CLI training run with a saved model and evaluation output, shared by many tests."""
    d = tmp_path_factory.mktemp("trained")
    model_path = d / "model.safetensors"
    metrics_path = d / "metrics.json"
    torch.set_num_threads(1)
    code = main([
        "train", str(data["train_full"]), "-ps", TINY, "--seed", "7", "--save", str(model_path),
        "-t", str(data["test"]), "-m", *map(str, CUTOFFS), "-e", "conservative", "-d", "cpu",
        "--metrics-json", str(metrics_path),
    ])
    assert code == 0
    return {"model": model_path, "metrics": metrics_path}


@pytest.fixture(scope="module")
def loaded(trained: dict[str, Any]) -> Any:
    from gru4rec.recommender import GRU4Rec

    return GRU4Rec.load(trained["model"], device="cpu")


# --------------------------------------------------------------------------------- top level


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([], capsys)
    assert code == 0
    assert out.startswith("usage: gru4rec")
    for name in COMMANDS:
        assert name in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec import __version__

    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"gru4rec {__version__}"


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["bogus"], capsys)
    assert code == 2 and "invalid choice: 'bogus'" in err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_help_for_every_option(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if COMMANDS[name].unavailable():
        pytest.skip(f"{name}: {COMMANDS[name].unavailable()}")
    parser = cli.build_parser(name)
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]  # type: ignore[union-attr]
    for action in sub._actions:
        assert action.help, f"{name}: option {action.option_strings or action.dest} has no help"
    code, out, _ = run([name, "--help"], capsys)
    assert code == 0 and out.startswith(f"usage: gru4rec {name}")


def test_missing_required_option_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["evaluate", "-t", "x.tsv"], capsys)
    assert code == 2 and "MODEL" in err


# -------------------------------------------------------------------------- train / evaluate


def test_train_prints_metrics_equal_to_brute_force(
    trained: dict[str, Any], loaded: Any, data: dict[str, Path]
) -> None:
    report = json.loads(trained["metrics"].read_text())
    (entry,) = report.values()
    test = pd.read_csv(data["test"], sep="\t")
    want = brute_force(loaded, test, CUTOFFS, "conservative")
    got = {c: (entry["recall"][str(c)], entry["mrr"][str(c)]) for c in CUTOFFS}
    for c in CUTOFFS:
        assert got[c][0] == pytest.approx(want[c][0], abs=1e-9)
        assert got[c][1] == pytest.approx(want[c][1], abs=1e-9)
    assert entry["mode"] == "conservative"
    assert entry["n_predictions"] == sum(len(g) - 1 for _, g in test.groupby("SessionId"))


def test_evaluate_saved_model_identical_to_training_run(
    trained: dict[str, Any], data: dict[str, Path], loaded: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    report = json.loads(trained["metrics"].read_text())
    (entry,) = report.values()
    code, out, err = run(["evaluate", trained["model"], "-t", data["test"], data["test"],
                          "-m", *CUTOFFS, "-e", "conservative", "-d", "cpu"], capsys)
    assert code == 0, err
    blocks = parse_metrics(out)
    assert len(blocks) == 2 and blocks[0] == blocks[1]
    for c in CUTOFFS:
        # Exactly the numbers of the run that trained the model, to the printed digits.
        assert blocks[0][c] == (round(entry["recall"][str(c)], 6), round(entry["mrr"][str(c)], 6))
    # The extended metrics are on the result lines too.
    assert re.search(r"NDCG@10: [0-9.]+ Coverage@10: [0-9.]+ Popularity@10: [0-9.]+", out)
    assert "Evaluation took" in err  # progress/timings on stderr, results on stdout


@pytest.mark.parametrize("mode", ["standard", "conservative"])
def test_evaluate_modes_match_brute_force(
    mode: str, trained: dict[str, Any], data: dict[str, Path], loaded: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["evaluate", trained["model"], "-t", data["train_valid"],
                          "-m", 1, 5, 10, 20, "-e", mode], capsys)
    assert code == 0, err
    (block,) = parse_metrics(out)
    want = brute_force(loaded, pd.read_csv(data["train_valid"], sep="\t"), (1, 5, 10, 20), mode)
    assert_metrics_close(block, want)


def test_train_column_keys_reach_the_model(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {"SessionId": "sid", "ItemId": "iid", "Time": "ts"}
    train = tmp_path / "train.csv"
    test = tmp_path / "test.csv"
    pd.read_csv(data["train_full"], sep="\t").rename(columns=names).to_csv(train, index=False)
    pd.read_csv(data["test"], sep="\t").rename(columns=names).to_csv(test, index=False)
    model = tmp_path / "m.safetensors"
    code, out, err = run(["train", train, "-ps", TINY.replace("n_epochs=2", "n_epochs=1"),
                          "-sk", "sid", "-ik", "iid", "-tk", "ts", "--save", model, "-t", test], capsys)
    assert code == 0, err
    assert len(parse_metrics(out)) == 1
    code, info, err = run(["info", model, "--json"], capsys)
    cfg = json.loads(info)["config"]
    assert (cfg["session_key"], cfg["item_key"], cfg["time_key"]) == ("sid", "iid", "ts")
    # The saved model evaluates files with its own column names without any flags.
    code, out2, err = run(["evaluate", model, "-t", test], capsys)
    assert code == 0, err
    assert parse_metrics(out2) == parse_metrics(out)


def test_evaluate_with_other_column_names(
    trained: dict[str, Any], data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    renamed = tmp_path / "t.tsv"
    pd.read_csv(data["test"], sep="\t").rename(columns={"ItemId": "product"}).to_csv(renamed, sep="\t", index=False)
    code, out_a, err = run(["evaluate", trained["model"], "-t", data["test"]], capsys)
    assert code == 0, err
    code, out_b, err = run(["evaluate", trained["model"], "-t", renamed, "-ik", "product"], capsys)
    assert code == 0, err
    assert parse_metrics(out_a) == parse_metrics(out_b)


def test_param_file_then_param_string(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pf = tmp_path / "p.py"
    pf.write_text("from collections import OrderedDict\n"
                  "gru4rec_params = OrderedDict([('loss', 'bpr-max'), ('layers', [6]), ('n_epochs', 1),"
                  " ('n_sample', 16), ('batch_size', 8), ('final_act', 'elu-1')])\n")
    model = tmp_path / "m"
    code, _, err = run(["train", data["train_tr"], "-pf", pf, "-ps", "layers=5,sample_store_size=160",
                        "--seed", "3", "--save", model], capsys)
    assert code == 0, err
    code, out, _ = run(["info", model, "--json"], capsys)
    cfg = json.loads(out)["config"]
    assert cfg["loss"] == "bpr-max" and cfg["final_act"] == "elu-1"
    assert cfg["layers"] == [5] and cfg["seed"] == 3 and cfg["sample_store_size"] == 160


def _interrupt_at_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Ctrl-C (a real SIGINT) during the ``step``-th training step."""
    import signal

    from gru4rec.training.trainer import Trainer

    original, calls = Trainer.train_step, [0]

    def train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == step:
            signal.raise_signal(signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def test_checkpoint_resume(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in epoch 2 writes a checkpoint and prints the exact command that resumes the run;
    the resumed run saves the uninterrupted run's model and removes the checkpoint (kept with
    --keep-checkpoint). The mid-epoch cases with real processes are in tests/test_resume.py."""
    from gru4rec.formats.checkpoint import load_file
    from gru4rec.training.resume import CHECKPOINT_NAME

    ck = tmp_path / "ck"
    ps = TINY.replace("n_epochs=2", "n_epochs=3")
    argv = ["train", data["train_tr"], "-ps", ps, "--checkpoint-dir", ck, "--save", tmp_path / "b"]
    _interrupt_at_step(monkeypatch, 20)
    code, _, err = run(argv, capsys)
    monkeypatch.undo()
    assert code == 130 and "Traceback" not in err and not (tmp_path / "b").exists()
    error = [line for line in err.splitlines() if line.startswith("gru4rec: interrupted")]
    assert error == [f"gru4rec: interrupted; checkpoint in {ck / CHECKPOINT_NAME}; resume with: gru4rec "
                     + " ".join(str(a) for a in argv) + " --resume"], err
    _, meta = load_file(ck / CHECKPOINT_NAME)
    assert meta["kind"] == "gru4rec-training-checkpoint" and meta["step"] > 0

    code, _, err = run(argv + ["--resume", "--keep-checkpoint"], capsys)
    assert code == 0, err
    assert "Resuming" in err and "Epoch3" in err
    code, out, err = run(["info", ck / CHECKPOINT_NAME, "--json"], capsys)
    assert code == 0, err
    info = json.loads(out)
    assert info["meta"]["kind"] == "gru4rec-training-checkpoint" and info["meta"]["epoch"] == 3
    assert info["container"] == "safetensors"  # training checkpoints use the model file format
    assert info["n_items"] == pd.read_csv(data["train_tr"], sep="\t")["ItemId"].nunique()
    code, _, err = run(["train", data["train_tr"], "-ps", ps, "--save", tmp_path / "c"], capsys)
    assert code == 0, err
    # The resumed run ends with exactly the model of an uninterrupted run.
    tb, _ = load_file(tmp_path / "b")
    tc, _ = load_file(tmp_path / "c")
    assert set(tb) == set(tc)
    for name in tb:
        assert torch.equal(tb[name], tc[name]), name
    # Extending the finished run by one epoch; without --keep-checkpoint it is removed at the end.
    more = TINY.replace("n_epochs=2", "n_epochs=4")
    code, _, err = run(["train", data["train_tr"], "-ps", more, "--checkpoint-dir", ck, "--resume"], capsys)
    assert code == 0, err
    assert "Epoch4" in err and "Epoch3" not in err and not (ck / CHECKPOINT_NAME).exists()


def test_checkpoint_folder_errors(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.training.resume import CHECKPOINT_NAME

    ck = tmp_path / "ck"
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "--checkpoint-dir", ck, "--resume"], capsys)
    assert code == 1
    assert_one_line_error(err, "nothing to resume", str(ck))
    ck.mkdir(exist_ok=True)
    (ck / CHECKPOINT_NAME).write_bytes(b"an earlier run's")
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "--checkpoint-dir", ck], capsys)
    assert code == 1
    assert_one_line_error(err, "holds a checkpoint of an earlier run", "--resume")
    assert (ck / CHECKPOINT_NAME).read_bytes() == b"an earlier run's"
    for flags in (["--checkpoint-every", "5"], ["--keep-checkpoint"]):
        code, _, err = run(["train", data["train_tr"], "-ps", TINY, *flags], capsys)
        assert code == 2
        assert_one_line_error(err, flags[0], "needs --checkpoint-dir")
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "--checkpoint-dir", ck, "--checkpoint-every", "0"], capsys)
    assert code == 2 and "positive number" in err


def test_ctrl_c_without_a_checkpoint_says_nothing_was_kept(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gru4rec.cli import run_py_main

    _interrupt_at_step(monkeypatch, 3)
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "--save", tmp_path / "m"], capsys)
    assert code == 130 and "Traceback" not in err
    assert err.splitlines()[-1] == "gru4rec: interrupted; nothing was kept (gru4rec train --checkpoint-dir DIR makes a run resumable)"
    _interrupt_at_step(monkeypatch, 3)
    capsys.readouterr()
    code = run_py_main([str(data["train_tr"]), "-ps", TINY])
    err = capsys.readouterr().err
    assert code == 130
    assert err.splitlines()[-1] == "run.py: interrupted; nothing was kept (gru4rec train --checkpoint-dir DIR makes a run resumable)"


# -------------------------------------------------------------------------------- error paths


def test_missing_training_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", tmp_path / "nope.tsv", "-ps", TINY], capsys)
    assert code == 1
    assert_one_line_error(err, "nope.tsv", "not found")


def test_missing_test_file(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "-t", tmp_path / "nope.tsv"], capsys)
    assert code == 1
    assert_one_line_error(err, "nope.tsv")


def test_bad_param(data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-ps", "layerz=8,loss=nope"], capsys)
    assert code == 2
    assert_one_line_error(err, "layerz")


def test_bad_param_file(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-pf", tmp_path / "missing.py"], capsys)
    assert code == 2
    assert_one_line_error(err, "missing.py")


def test_unknown_column_key(data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "-ik", "Product"], capsys)
    assert code == 1
    assert_one_line_error(err, "Product")


def test_bad_flag_values(data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-m", "0"], capsys)
    assert code == 2 and "positive integer" in err
    code, _, err = run(["train", data["train_tr"], "-e", "optimistic"], capsys)
    assert code == 2 and "invalid choice" in err
    code, _, err = run(["train", data["train_tr"], "--resume"], capsys)
    assert code == 2
    assert_one_line_error(err, "--checkpoint-dir")


def test_refuses_to_overwrite(
    data: dict[str, Path], trained: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "keep.bin"
    existing.write_bytes(b"user data")
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "--save", existing], capsys)
    assert code == 2
    assert_one_line_error(err, str(existing), "--force")
    assert existing.read_bytes() == b"user data"  # checked before training, nothing written
    code, _, err = run(["evaluate", trained["model"], "-t", data["test"],
                        "--metrics-json", existing], capsys)
    assert code == 2 and existing.read_bytes() == b"user data"
    code, _, err = run(["train", data["train_tr"], "-ps", TINY.replace("n_epochs=2", "n_epochs=1"),
                        "--save", existing, "--force"], capsys)
    assert code == 0, err
    assert existing.read_bytes() != b"user data"


def test_output_paths_are_checked_before_the_first_step(
    data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gru4rec.training.trainer import Trainer

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(Trainer, "train_step", no_training)
    a_file = tmp_path / "afile"
    a_file.write_text("mine")
    cases = [
        (["--save", a_file / "model.safetensors"], 2, ["afile is a file, not a folder"]),
        (["--save", tmp_path / "nope" / "model.safetensors"], 2, ["folder", "nope does not exist"]),
        (["--save", tmp_path], 2, ["is a folder, not a file"]),
        (["--metrics-json", a_file / "m.json"], 2, ["afile is a file, not a folder"]),
        (["--checkpoint-dir", a_file], 2, ["checkpoint folder", "afile is a file, not a folder"]),
        (["--checkpoint-dir", a_file / "ck"], 2, ["afile is a file, not a folder"]),
    ]
    if Path("/proc").is_dir():  # nobody, not even root, can create a file there
        cases += [(["--save", "/proc/model.safetensors"], 2, ["/proc is not writable"]),
                  (["--checkpoint-dir", "/proc/ck"], 2, ["/proc is not writable"])]
    for flags, code_wanted, fragments in cases:
        code, _, err = run(["train", data["train_tr"], "-ps", TINY, *flags], capsys)
        assert code == code_wanted, (flags, err)
        assert_one_line_error(err, *fragments)
    assert a_file.read_text() == "mine"


def test_help_names_one_model_file_extension(capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.cli.common import MODEL_FILE_EXAMPLE
    from gru4rec.formats.checkpoint import MODEL_SUFFIX
    from gru4rec.tracking.runs import MODEL_FILE

    assert MODEL_FILE_EXAMPLE == MODEL_FILE == "model" + MODEL_SUFFIX  # run folders name it the same way
    code, out, _ = run(["train", "--help"], capsys)
    assert code == 0 and MODEL_FILE_EXAMPLE in " ".join(out.split())
    for command in COMMANDS:
        code, out, _ = run([command, "--help"], capsys)
        assert ".pt " not in out and ".pt)" not in out and ".gru4rec" not in out, command


def test_corrupt_model_file(trained: dict[str, Any], data: dict[str, Path], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(trained["model"].read_bytes()[:200])
    for argv in (["evaluate", bad, "-t", data["test"]], ["info", bad],
                 ["recommend", bad, "-i", data["test"], "-o", tmp_path / "r.tsv"]):
        code, _, err = run(argv, capsys)
        assert code == 1, argv
        assert_one_line_error(err, str(bad), "truncated or corrupt")
    text = tmp_path / "model.txt"
    text.write_text("hello\n")
    code, _, err = run(["info", text], capsys)
    assert code == 1
    assert_one_line_error(err, "not a gru4rec model file")


def test_missing_model_file(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["evaluate", tmp_path / "none.safetensors", "-t", data["test"]], capsys)
    assert code == 1
    assert_one_line_error(err, "none.safetensors", "not found")


def test_bad_device(data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["train", data["train_tr"], "-ps", TINY, "-d", "tpu:9"], capsys)
    assert code == 1
    assert_one_line_error(err, "tpu:9")
    if not torch.cuda.is_available():
        code, _, err = run(["train", data["train_tr"], "-ps", TINY, "-d", "cuda"], capsys)
        assert code == 1
        assert_one_line_error(err, "CUDA is not available")


def test_device_out_of_memory_is_one_line(
    data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gru4rec.recommender import GRU4Rec

    def oom(self: Any, *args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has ...")

    monkeypatch.setattr(GRU4Rec, "fit", oom)
    code, _, err = run(["train", data["train_tr"], "-ps", TINY], capsys)
    assert code == 1
    assert_one_line_error(err, "out of device memory", "CUDA out of memory", "batch_size")


def test_unexpected_error_keeps_traceback(
    data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gru4rec.recommender import GRU4Rec

    def bug(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("an internal bug")

    monkeypatch.setattr(GRU4Rec, "fit", bug)
    # A bug is not a user error: it propagates with its traceback instead of a tidy one-liner.
    with pytest.raises(RuntimeError, match="an internal bug"):
        main(["train", str(data["train_tr"]), "-ps", TINY])


def test_debug_shows_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--debug", "info", tmp_path / "none"], capsys)
    assert code == 1 and "Traceback" in err and "gru4rec: error:" in err
    code, _, err = run(["info", tmp_path / "none", "--debug"], capsys)
    assert code == 1 and "Traceback" in err


# ------------------------------------------------------------------------ messages and verbosity


def test_quiet_keeps_results_and_warnings(
    trained: dict[str, Any], data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["evaluate", trained["model"], "-t", data["test"], "-d", "cpu"], capsys)
    assert code == 0 and "Loaded model" in err and "Evaluation took" in err
    for argv in (["-q", "evaluate"], ["evaluate", "--quiet"]):  # before or after the command name
        code, quiet_out, quiet_err = run([*argv, trained["model"], "-t", data["test"], "-d", "cpu"], capsys)
        assert code == 0, quiet_err
        assert quiet_out == out  # the results are not messages
        assert "Loaded model" not in quiet_err and "Evaluation took" not in quiet_err
    inp = tmp_path / "s.tsv"
    pd.DataFrame({"SessionId": [1], "ItemId": [998], "Time": [0]}).to_csv(inp, sep="\t", index=False)
    code, _, err = run(["recommend", "-q", trained["model"], "-i", inp, "-o", tmp_path / "r.tsv"], capsys)
    assert code == 0, err
    assert "gru4rec: warning: " in err and "unknown" in err and "Wrote" not in err


def test_verbose_adds_debug_messages_and_excludes_quiet(trained: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["-v", "info", trained["model"]], capsys)
    assert code == 0 and "gru4rec info with" in err and "format version" in out
    code, _, err = run(["info", trained["model"]], capsys)
    assert code == 0 and "gru4rec info with" not in err
    code, _, err = run(["-q", "info", trained["model"], "-v"], capsys)
    assert code == 2
    assert_one_line_error(err, "-q/--quiet", "-v/--verbose")


def test_logging_is_restored_after_a_command(
    trained: dict[str, Any], data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    logger = logging.getLogger("gru4rec")
    before = (logger.level, list(logger.handlers), logger.propagate)
    assert run(["-q", "evaluate", trained["model"], "-t", data["test"]], capsys)[0] == 0
    assert run(["info", tmp_path / "none"], capsys)[0] == 1  # a failed command restores it too
    assert (logger.level, list(logger.handlers), logger.propagate) == before


def test_paropt_keeps_its_own_verbose_flag() -> None:
    if COMMANDS["paropt"].unavailable():
        pytest.skip(str(COMMANDS["paropt"].unavailable()))
    argv = ["a.tsv", "b.tsv", "-opf", "space.json"]
    for given, verbose in ((["paropt", *argv], False), (["paropt", *argv, "-v"], True), (["-v", "paropt", *argv], True)):
        args = cli.build_parser("paropt").parse_args(given)
        assert args.verbose is verbose and args.quiet is False, given


def test_module_entry_point() -> None:
    import subprocess
    import sys

    from gru4rec import __version__

    proc = subprocess.run([sys.executable, "-m", "gru4rec.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"gru4rec {__version__}", proc.stderr


# ---------------------------------------------------------------------------------------- info


def test_info(trained: dict[str, Any], loaded: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.formats.checkpoint import FORMAT_VERSION

    code, out, _ = run(["info", trained["model"]], capsys)
    assert code == 0
    assert f"format version: {FORMAT_VERSION} (safetensors, written by gru4rec " in out
    assert f"items: {len(loaded.item_map)}" in out
    assert "  layers = [8]" in out and "  n_sample = 16" in out and "  seed = 7" in out
    code, out, _ = run(["info", trained["model"], "--json"], capsys)
    info = json.loads(out)
    assert info["n_items"] == len(loaded.item_map)
    assert info["format_version"] == FORMAT_VERSION and info["container"] == "safetensors"
    assert info["config"] == loaded.config.to_dict()


# ----------------------------------------------------------------------------------- recommend


def _expected_recs(model: Any, items: list[Any], k: int, exclude_seen: bool) -> tuple[list[Any], np.ndarray]:
    """Top-k ids and raw scores from the network directly (the evaluator's scores)."""
    index = {item: i for i, item in enumerate(model.item_map.to_list())}
    known = [index[i] for i in items if i in index]
    ids = model.item_map.to_list()
    if not known:  # the most popular items, without a score
        support = np.asarray(model.item_support, dtype=np.float64)
        order = np.argsort(-support, kind="stable")[:k]
        return [ids[j] for j in order], np.full(len(order), np.nan)
    net = model.net
    net.eval()
    with torch.no_grad():
        hidden = net.init_hidden(1)
        for i in known:
            out = net.step(torch.tensor([i]), hidden)
        scores = net.score_all(out)[0].double().numpy()
    if exclude_seen:
        scores[known] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[j] for j in order], scores[order]


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_recommend_agrees_with_network_scores(
    exclude_seen: bool, trained: dict[str, Any], loaded: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = loaded.item_map.to_list()
    sessions = {
        10: [ids[0], ids[1], ids[2]],
        11: [ids[3]],
        12: [999, ids[4], ids[4]],  # 999 is not a training item: skipped
        13: [ids[5], ids[0]],
    }
    rows = [(s, item, t) for s, items in sessions.items() for t, item in enumerate(items)]
    inp = tmp_path / "sessions.tsv"
    pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"]).sample(frac=1, random_state=0).to_csv(
        inp, sep="\t", index=False)  # shuffled rows: the command orders by time
    outp = tmp_path / "recs.tsv"
    argv = ["recommend", trained["model"], "-i", inp, "-o", outp, "-k", 5]
    code, _, err = run(argv + (["--exclude-seen"] if exclude_seen else []), capsys)
    assert code == 0, err
    recs = pd.read_csv(outp, sep="\t")
    assert set(recs["SessionId"]) == set(sessions)
    for sid, items in sessions.items():
        got = recs[recs["SessionId"] == sid].sort_values("Rank")
        want_ids, want_scores = _expected_recs(loaded, items, 5, exclude_seen)
        assert got["Rank"].tolist() == [1, 2, 3, 4, 5]
        assert got["ItemId"].tolist() == want_ids, sid
        np.testing.assert_allclose(got["Score"].to_numpy(), want_scores, rtol=1e-5, atol=1e-5)
        if exclude_seen:
            assert not set(got["ItemId"]) & set(items)


def test_recommend_unknown_only_session_gets_popular_items(
    trained: dict[str, Any], loaded: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "s.tsv"
    pd.DataFrame({"SessionId": [1, 1, 2], "ItemId": [998, 999, loaded.item_map.to_list()[0]],
                  "Time": [0, 1, 0]}).to_csv(inp, sep="\t", index=False)
    outp = tmp_path / "r.tsv"
    code, _, err = run(["recommend", trained["model"], "-i", inp, "-o", outp, "-k", 3], capsys)
    assert code == 0, err
    recs = pd.read_csv(outp, sep="\t")
    popular = np.argsort(-np.asarray(loaded.item_support), kind="stable")[:3]
    want = [loaded.item_map.to_list()[j] for j in popular]
    s1 = recs[recs["SessionId"] == 1].sort_values("Rank")
    assert s1["ItemId"].tolist() == want
    assert s1["Fallback"].tolist() == [True] * 3
    assert recs[recs["SessionId"] == 2]["Fallback"].tolist() == [False] * 3
    assert "unknown" in err  # the skipped items are counted in a warning
    # Fallback rows have no model score: the Score field is empty (not the training counts).
    rows = [line.split("\t") for line in outp.read_text().splitlines()]
    assert rows[0] == ["SessionId", "Rank", "ItemId", "Score", "Fallback"]
    assert [r[3] for r in rows[1:] if r[0] == "1"] == ["", "", ""]
    assert all(r[3] != "" and np.isfinite(float(r[3])) for r in rows[1:] if r[0] == "2")


def test_recommend_to_standard_output(trained: dict[str, Any], data: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    outp = tmp_path / "recs.tsv"
    code, _, err = run(["recommend", trained["model"], "-i", data["test"], "-o", outp, "-k", 3], capsys)
    assert code == 0, err
    code, out, err = run(["recommend", trained["model"], "-i", data["test"], "-o", "-", "-k", 3], capsys)
    assert code == 0, err
    assert out == outp.read_text()  # the same TSV, and nothing else on standard output
    assert "standard output" in err and not (Path.cwd() / "-").exists()


def test_recommend_parquet_and_overwrite(
    trained: dict[str, Any], loaded: Any, data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pyarrow")
    outp = tmp_path / "recs.parquet"
    argv = ["recommend", trained["model"], "-i", data["test"], "-o", outp, "-k", 4]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    recs = pd.read_parquet(outp)
    n_sessions = pd.read_csv(data["test"], sep="\t")["SessionId"].nunique()
    assert len(recs) == 4 * n_sessions
    before = outp.read_bytes()
    code, _, err = run(argv, capsys)
    assert code == 2
    assert_one_line_error(err, "recs.parquet", "--force")
    assert outp.read_bytes() == before
    code, _, err = run(argv + ["--force"], capsys)
    assert code == 0, err


# ------------------------------------------------------------------------------ synth and demo


def test_synth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synth", tmp_path / "s", "--n-sessions", 120, "--n-items", 30, "--seed", 1, "--test-days", 6]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    written = [Path(line) for line in out.splitlines()]
    assert sorted(p.name for p in written) == ["test.tsv", "train_full.tsv", "train_tr.tsv", "train_valid.tsv"]
    from gru4rec.datasets.synthetic import write_synthetic

    want = write_synthetic(tmp_path / "ref", n_sessions=120, n_items=30, seed=1, test_days=6)
    for name, path in want.items():
        assert (tmp_path / "s" / path.name).read_bytes() == path.read_bytes(), name
    code, _, err = run(argv, capsys)
    assert code == 1
    assert_one_line_error(err, "train_full.tsv already exists; pass --force to replace it")
    assert "force=True" not in err  # the command line's words, not the API's
    code, _, err = run(argv + ["--force"], capsys)
    assert code == 0, err


def test_synth_intents_writes_the_generator_files_and_its_oracle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synth", tmp_path / "s", "--kind", "intents", "--n-sessions", 400, "--n-items", 120, "--n-intents", 4,
            "--intent-size", 30, "--mix", "0.3,0.5,0.2", "--mean-length", 4, "--seed", 3, "--test-days", 2]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    written = sorted(Path(line).name for line in out.splitlines())
    assert written == ["oracle.json", "test.tsv", "train_full.tsv", "train_tr.tsv", "train_valid.tsv"]
    from gru4rec.datasets.intents import write_intents

    want = write_intents(tmp_path / "ref", n_sessions=400, n_items=120, n_intents=4, intent_size=30, mix=(0.3, 0.5, 0.2),
                         mean_length=4.0, seed=3, test_days=2.0)
    for name, path in want.items():
        assert (tmp_path / "s" / path.name).read_bytes() == path.read_bytes(), name


@pytest.mark.parametrize("extra, culprit", [
    (["--n-intents", "4"], "--n-intents"),  # an intents flag without --kind intents
    (["--kind", "intents", "--mix", "0.5,0.5"], "--mix"),
    (["--kind", "markov"], "--kind"),
])
def test_synth_bad_flags_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], culprit: str) -> None:
    code, _, err = run(["synth", tmp_path / "s", *extra], capsys)
    assert code == 2
    assert culprit in err
    assert not (tmp_path / "s").exists()


def test_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["demo", "--workdir", tmp_path, "--n-sessions", 300, "-ps", TINY, "-d", "cpu"], capsys)
    assert code == 0, err
    block = parse_metrics(out)
    assert len(block) == 1 and set(block[0]) == {1, 5, 10, 20}
    assert (tmp_path / "model.safetensors").exists()
    # The demo's printed numbers are those of its saved model on its test file.
    code, out2, err = run(["evaluate", tmp_path / "model.safetensors", "-t",
                           tmp_path / "synthetic" / "test.tsv", "-m", 1, 5, 10, 20, "-e", "conservative"], capsys)
    assert code == 0, err
    assert parse_metrics(out2) == block


# ------------------------------------------------------------------------ registered hooks


def test_hook_commands_registered() -> None:
    assert {"preprocess", "split", "paropt"} <= set(COMMANDS)
    for name in ("preprocess", "split", "paropt"):
        assert COMMANDS[name].unavailable() is None, COMMANDS[name].unavailable()


def test_split_then_train(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["split", data["train_full"], "--out", tmp_path / "sp", "--days", 3, "--quiet"], capsys)
    assert code == 0, err
    train = pd.read_csv(tmp_path / "sp" / "train_full.tsv", sep="\t")
    test = pd.read_csv(tmp_path / "sp" / "test.tsv", sep="\t")
    source = pd.read_csv(data["train_full"], sep="\t")
    # A time split: every test session starts after the last training event, and no event is invented.
    assert test.groupby("SessionId")["Time"].min().min() > train["Time"].max()
    assert len(train.merge(source)) == len(train) and len(test.merge(source)) == len(test)
    code, out, err = run(["train", tmp_path / "sp" / "train_full.tsv", "-ps", TINY, "-t", tmp_path / "sp" / "test.tsv"],
                         capsys)
    assert code == 0, err
    assert len(parse_metrics(out)) == 1
    code, _, err = run(["split", tmp_path / "nope.tsv", "--out", tmp_path / "x"], capsys)
    assert code == 1
    assert_one_line_error(err, "nope.tsv")


def test_preprocess_raw_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["preprocess", "rsc15", tmp_path / "missing.dat", "--out", tmp_path / "o"], capsys)
    assert code == 1
    assert_one_line_error(err, "missing.dat")
    code, _, err = run(["preprocess", "nosuchset", tmp_path, "--out", tmp_path / "o"], capsys)
    assert code in (1, 2) and "nosuchset" in err and "Traceback" not in err
    raw = Path(__file__).resolve().parents[2] / "shared" / "data" / "raw_samples" / "diginetica_train-item-views_sample.csv"
    if not raw.exists():
        pytest.skip(f"raw sample not present at {raw}")
    code, _, err = run(["preprocess", "diginetica", raw, "--out", tmp_path / "dg", "--quiet"], capsys)
    assert code == 0, err
    train = pd.read_csv(tmp_path / "dg" / "train_full.tsv", sep="\t")
    assert list(train.columns) == ["SessionId", "ItemId", "Time"] and len(train) > 0
    code, out, err = run(["train", tmp_path / "dg" / "train_full.tsv", "-ps", TINY, "-t", tmp_path / "dg" / "test.tsv"],
                         capsys)
    assert code == 0, err
    assert len(parse_metrics(out)) == 1


def test_unavailable_hook_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = cli._hook_command("ghost", "a command whose module is missing", "gru4rec._no_such_module")
    monkeypatch.setitem(COMMANDS, "ghost", cmd)
    code, _, err = run(["ghost", "--whatever", "x"], capsys)
    assert code == 1
    assert_one_line_error(err, "'ghost' command is not available", "gru4rec._no_such_module")
    code, out, _ = run([], capsys)
    assert code == 0 and "ghost" in out  # the rest of the command line keeps working


def test_hook_module_is_called(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    import types

    mod = types.ModuleType("gru4rec._fake_hook")
    calls: list[Any] = []

    def add_arguments(parser: Any) -> None:
        parser.add_argument("--size", type=int, required=True, help="size")

    def run_hook(args: Any) -> int:
        calls.append(args.size)
        return 0 if args.size > 0 else 1

    mod.add_arguments, mod.run = add_arguments, run_hook  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gru4rec._fake_hook", mod)
    monkeypatch.setitem(COMMANDS, "fake", cli._hook_command("fake", "a fake hook", "gru4rec._fake_hook"))
    assert run(["fake", "--size", "3"], capsys)[0] == 0 and calls == [3]
    assert run(["fake", "--size", "-1"], capsys)[0] == 1
    code, _, err = run(["fake"], capsys)
    assert code == 2 and "--size" in err


# ------------------------------------------------------------------------------------- examples

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_quickstart_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import runpy

    quickstart = runpy.run_path(str(EXAMPLES / "quickstart.py"))
    metrics = quickstart["main"](["--workdir", str(tmp_path), "--n-sessions", "300", "--epochs", "1",
                                  "--device", "cpu"])
    out = capsys.readouterr().out
    assert (tmp_path / "model.safetensors").exists()
    # The printed result lines are the returned metrics, which a fresh CLI evaluation reproduces.
    assert parse_metrics(out)[0] == {c: (round(metrics[f"recall@{c}"], 6), round(metrics[f"mrr@{c}"], 6))
                                     for c in (1, 5, 20)}
    code, out2, err = run(["evaluate", tmp_path / "model.safetensors", "-t", tmp_path / "data" / "test.tsv",
                           "-m", 1, 5, 20, "-e", "conservative"], capsys)
    assert code == 0, err
    assert parse_metrics(out2)[0] == parse_metrics(out)[0]


def test_cli_sh_example(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("bash") is None:
        pytest.skip("bash is not available")
    gru4rec = Path(sys.executable).with_name("gru4rec")
    if not gru4rec.exists():
        pytest.skip(f"the gru4rec console script is not installed next to {sys.executable}")
    env = dict(os.environ, GRU4REC=str(gru4rec), PYTHON=sys.executable, N_SESSIONS="300",
               PARAMS=TINY.replace("n_epochs=2", "n_epochs=1"), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(EXAMPLES / "cli.sh"), str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    blocks = parse_metrics(proc.stdout)
    # train -t, evaluate and run.py -l (the last block) report the same model on the same test
    # file; between them pop and itemknn in the same lines (their numbers: tests/test_baseline_cli.py).
    assert len(blocks) == 5
    assert blocks[0] == blocks[1] and blocks[4] == {20: blocks[0][20]}
    assert set(blocks[2]) == set(blocks[3]) == {1, 5, 20} and blocks[2] != blocks[0]
    assert "PRIMARY METRIC: " in proc.stdout
    recs = pd.read_csv(tmp_path / "recs.tsv", sep="\t")
    assert list(recs.columns) == ["SessionId", "Rank", "ItemId", "Score", "Fallback"]
    assert json.loads((tmp_path / "metrics.json").read_text())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_reports_peak_memory(data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["train", data["train_full"], "-ps", TINY, "-d", "cuda", "-t", data["test"]], capsys)
    assert code == 0, err
    peaks = re.findall(r"Peak device memory \((training|evaluation)\): ([0-9.]+) MiB allocated", err)
    assert [p[0] for p in peaks] == ["training", "evaluation"]
    assert all(float(p[1]) > 0 for p in peaks)


def test_no_memory_line_on_cpu(trained: dict[str, Any], data: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["evaluate", trained["model"], "-t", data["test"], "-d", "cpu"], capsys)
    assert code == 0 and "Peak device memory" not in err


def test_a_reader_that_stops_early_is_not_an_error(trained: dict[str, Any], data: dict[str, Path]) -> None:
    # `gru4rec recommend -o - | head -2`: the pipe closes after two lines; no traceback, exit 0.
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gru4rec", "recommend", str(trained["model"]), "-i", str(data["test"]),
                             "-o", "-", "-k", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # as head does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.decode().startswith("SessionId\tRank\tItemId") and "Traceback" not in err and "BrokenPipe" not in err
