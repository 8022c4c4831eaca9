"""Run folders (``--run-dir``), TensorBoard scalars (``--tensorboard``) and the validation flags
of ``gru4rec train`` and ``run.py``, run in-process on tiny synthetic data; every file is read
back and checked against the model it describes."""
from __future__ import annotations

import json
import shlex
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from gru4rec import GRU4Rec, evaluate
from gru4rec.cli import main, run_py_main
from gru4rec.tracking.runs import RUN_CUTOFFS, read_run

TINY = "layers=8,n_sample=16,n_epochs=3,batch_size=8,sample_store_size=1600,learning_rate=0.1"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from gru4rec.datasets.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("synthetic"), n_sessions=200, n_items=40, seed=3, test_days=6)


@pytest.fixture(scope="module")
def run_a(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run with every output: run folder, TensorBoard, --metrics-json, validation."""
    d = tmp_path_factory.mktemp("run_a")
    torch.set_num_threads(1)
    argv = ["train", str(data["train_tr"]), "-ps", TINY, "--valid", str(data["train_valid"]), "-t", str(data["test"]),
            "-m", "5", "10", "-e", "conservative", "-d", "cpu", "--run-dir", str(d / "run"), "--tensorboard", str(d / "tb"),
            "--metrics-json", str(d / "metrics.json")]
    assert main(argv) == 0
    return {"dir": d / "run", "tb": d / "tb", "metrics_json": d / "metrics.json", "argv": argv}


def test_the_run_folder_holds_the_command_config_epochs_metrics_and_model(run_a: dict[str, Any], data: dict[str, Path]) -> None:
    folder = run_a["dir"]
    assert sorted(p.name for p in folder.iterdir()) == ["command.txt", "config.json", "epochs.jsonl", "metrics.json", "model.safetensors"]
    command = (folder / "command.txt").read_text().splitlines()
    assert command[0].startswith("# run in ") and shlex.split(command[-1]) == ["gru4rec", *run_a["argv"], "--threads", "1"]
    config = json.loads((folder / "config.json").read_text())
    assert config["config"]["layers"] == [8] and config["config"]["n_epochs"] == 3
    assert (config["device"], config["precision"], config["threads"]) == ("cpu", "float32", torch.get_num_threads())
    assert config["valid"] == str(data["train_valid"]) and config["test"] == [str(data["test"])] and config["cutoffs"] == [5, 10]

    epochs = [json.loads(line) for line in (folder / "epochs.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    model = GRU4Rec.load(folder / "model.safetensors", device="cpu")
    assert model.epochs_trained == 3 and model.config.to_dict() == config["config"]
    for e in epochs:
        assert e["loss"] > 0 and e["seconds"] > 0 and e["peak_host_mb"] > 10 and e["peak_device_mb"] is None
        assert e["mb_per_s"] > 0 and e["events_per_s"] >= e["mb_per_s"]
        # The -m cutoffs and that of --valid-metric (recall@20 by default).
        assert set(e["valid"]) == {f"{m}@{k}" for m in ("recall", "mrr", "ndcg") for k in (5, 10, 20)}
    # The last epoch's validation metrics are those of the saved model on the validation file.
    valid = evaluate(model, data["train_valid"], cutoffs=(5, 10), mode="conservative")
    assert epochs[-1]["valid"]["mrr@10"] == pytest.approx(valid.mrr[10], abs=1e-12)

    # metrics.json is the --metrics-json payload, with every cutoff the report draws, and it
    # describes the saved model.
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics == json.loads(run_a["metrics_json"].read_text())
    entry = metrics[str(data["test"])]
    assert [int(k) for k in entry["recall"]] == sorted(set(RUN_CUTOFFS) | {5, 10})
    test = evaluate(model, data["test"], cutoffs=sorted(set(RUN_CUTOFFS) | {5, 10}), mode="conservative", breakdown=True)
    assert entry["recall"]["10"] == pytest.approx(test.recall[10], abs=1e-12)
    assert entry["breakdown"] == json.loads(json.dumps(test.breakdown.to_dict()))


def test_tensorboard_scalars_read_back_equal_the_epochs(run_a: dict[str, Any]) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(run_a["tb"]))
    acc.Reload()
    epochs = read_run(run_a["dir"])["epochs"]
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "speed/mb_per_s", "speed/events_per_s", "time/epoch_seconds", "memory/peak_host_mb",
            "valid/recall@10", "valid/mrr@5"} <= tags
    assert not {t for t in tags if t.startswith("gpu/")}  # GPU scalars only on CUDA
    for tag, get in (("train/loss", lambda e: e["loss"]), ("speed/events_per_s", lambda e: e["events_per_s"]),
                     ("valid/mrr@10", lambda e: e["valid"]["mrr@10"])):
        scalars = acc.Scalars(tag)
        assert [s.step for s in scalars] == [1, 2, 3]
        assert [s.value for s in scalars] == pytest.approx([get(e) for e in epochs], rel=1e-6)  # stored as float32


def test_early_stopping_from_the_command_line(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = TINY.replace("n_epochs=3", "n_epochs=6")
    code, _, err = run(["train", str(data["train_tr"]), "-ps", params, "--valid", str(data["train_valid"]), "--early-stop", "1",
                        "--valid-metric", "mrr@5", "-d", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 0, err
    epochs = read_run(tmp_path / "run")["epochs"]
    mrr = [e["valid"]["mrr@5"] for e in epochs]
    best = epochs[-1]["best_epoch"]
    assert mrr[best - 1] == max(mrr)
    if len(epochs) < 6:  # it stopped: the epoch after the best did not improve
        assert len(epochs) == best + 1 and "Early stopping after epoch" in err
    model = GRU4Rec.load(tmp_path / "run" / "model.safetensors", device="cpu")
    assert model.epochs_trained == best
    assert evaluate(model, data["train_valid"], cutoffs=(5,)).mrr[5] == pytest.approx(mrr[best - 1], abs=1e-12)


def test_a_used_run_folder_is_refused_before_training(run_a: dict[str, Any], data: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    argv = ["train", str(data["train_tr"]), "-ps", TINY.replace("n_epochs=3", "n_epochs=1"), "-d", "cpu", "--run-dir", str(folder)]
    code, _, err = run(argv, capsys)
    assert code == 2 and "is not empty" in err and "--force" in err
    assert "Epoch1" not in err and sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    # --force replaces the run files of an earlier run and leaves the user's own files alone.
    (folder / "metrics.json").write_text("{}")
    code, _, err = run(argv + ["--force"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["command.txt", "config.json", "epochs.jsonl", "model.safetensors", "notes.txt"]
    assert (folder / "notes.txt").read_text() == "mine"
    # A file where the folder should be.
    code, _, err = run(argv[:-1] + [str(folder / "notes.txt")], capsys)
    assert code == 2 and "is a file" in err


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--early-stop", "2"], "--early-stop needs --valid"),
        (["--valid", "VALID", "--valid-metric", "hits@10"], "--valid-metric"),
        (["--valid", "MISSING"], "validation file not found"),
        (["--early-stop", "0"], "positive integer"),
    ],
)
def test_bad_validation_flags_are_one_line_errors(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  extra: list[str], fragment: str) -> None:
    extra = [str(data["train_valid"]) if a == "VALID" else str(tmp_path / "missing.tsv") if a == "MISSING" else a for a in extra]
    code, _, err = run(["train", str(data["train_tr"]), "-ps", TINY, "-d", "cpu", *extra], capsys)
    assert code in (1, 2) and fragment in err.splitlines()[-1] and "Epoch1" not in err
    if not err.startswith("usage:"):  # our own checks: one line; argparse's: its usage, then one line
        assert len(err.splitlines()) == 1, err


def test_tensorboard_without_the_package_says_how_to_install(data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if missing
    code, _, err = run(["train", str(data["train_tr"]), "-ps", TINY, "-d", "cpu", "--tensorboard", str(tmp_path / "tb")], capsys)
    assert code == 1 and "pip install 'gru4rec[tensorboard]'" in err and "Epoch1" not in err


def test_run_py_writes_a_run_folder_too(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    argv = [str(data["train_tr"]), "-ps", TINY.replace("n_epochs=3", "n_epochs=2"), "-t", str(data["test"]), "-m", "5",
            "-d", "cpu", "--run-dir", str(tmp_path / "run"), "--valid", str(data["train_valid"])]
    assert run_py_main(argv) == 0
    out = capsys.readouterr().out
    folder = read_run(tmp_path / "run")
    assert shlex.split(folder["command"]) == ["python", "run.py", *argv, "--threads", str(torch.get_num_threads())]
    assert len(folder["epochs"]) == 2 and "valid" in folder["epochs"][0]
    entry = folder["metrics"][str(data["test"])]
    assert f"Recall@5: {entry['recall']['5']:.6f} MRR@5: {entry['mrr']['5']:.6f}" in out  # the printed lines, the same numbers
    assert "breakdown" in entry
    code = run_py_main([str(tmp_path / "run" / "model.safetensors"), "-l", "--run-dir", str(tmp_path / "other")])
    assert code == 2


class FakeNVML(types.ModuleType):
    """Stands in for nvidia-ml-py (pynvml): utilisation and memory readings the test chooses."""

    class NVMLError(Exception):
        pass

    def __init__(self, readings: list[tuple[float, float]]) -> None:
        super().__init__("pynvml")
        self.readings = iter(readings)
        self.bus_ids: list[str] = []
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        self.bus_ids.append(bus_id)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return "handle"

    def _next(self) -> tuple[float, float]:
        self.current = next(self.readings)
        return self.current

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return types.SimpleNamespace(gpu=self._next()[0])

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        return types.SimpleNamespace(used=self.current[1] * 2**20)


def test_gpu_utilisation_and_memory_per_epoch_in_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the logger writes the GPU's mean utilisation and peak memory of each epoch. No GPU
    here: NVML is replaced by readings the test chooses and the sampling thread never fires
    (interval of an hour); the test feeds the samples as the thread would."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from gru4rec.recommender import EpochInfo
    from gru4rec.tracking.tensorboard import TensorBoardLogger

    fake = FakeNVML([(50.0, 1000.0), (10.0, 900.0)])  # the readings taken at the end of epochs 1 and 2
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0))
    logger = TensorBoardLogger(tmp_path, device="cuda", gpu_interval=3600)
    assert fake.bus_ids == ["00000000:1b:00.0"]
    info = dict(loss=1.0, seconds=2.0, events_per_s=3.0, mb_per_s=4.0, model=None, peak_host_mb=5.0, peak_device_mb=6.0)
    for util, used in ((90.0, 2000.0), (70.0, 1500.0)):  # epoch 1's samples
        logger.gpu.record(util, used)
    logger(EpochInfo(epoch=1, **info))
    logger(EpochInfo(epoch=2, **info))  # no sample during epoch 2: only the one read at its end
    logger.close()
    assert fake.shut
    acc = event_accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("gpu/utilization_pct")] == [(1, pytest.approx((90 + 70 + 50) / 3)), (2, 10.0)]
    assert [(s.step, s.value) for s in acc.Scalars("gpu/memory_used_mb")] == [(1, 2000.0), (2, 900.0)]
    assert [s.value for s in acc.Scalars("memory/peak_device_mb")] == [6.0, 6.0]
