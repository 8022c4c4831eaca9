"""Resumable training (gru4rec/training/resume.py): a run stopped in the middle of an epoch — by
SIGINT, SIGTERM, or after a timed checkpoint — resumes to exactly the model of an uninterrupted
run (every weight compared with torch.equal, every epoch loss with ==).

In-process tests raise a real signal from inside a chosen training step (deterministic
position); the subprocess tests start a real ``gru4rec train`` and kill it from outside while it
trains, then resume it with the command its error line prints.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.config import Config
from gru4rec.datasets.synthetic import generate
from gru4rec.errors import Gru4RecError, TrainingInterrupted
from gru4rec.formats import checkpoint
from gru4rec.training import resume as resume_module
from gru4rec.training.resume import CHECKPOINT_NAME, TrainingCheckpoint
from gru4rec.training.trainer import Trainer

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
#: Random session order, dropout, momentum and a sample store of 10 rows (redrawn every 10
#: steps, so mid-epoch checkpoints fall between redraws): every piece of state a resume needs.
PARAMS = ("layers=16,batch_size=16,n_sample=32,n_epochs=3,sample_store_size=320,momentum=0.3,"
          "dropout_p_hidden=0.2,dropout_p_embed=0.1,train_random_order=True")


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return generate(n_sessions=600, n_items=150, seed=3)


def config(extra: str = "") -> Config:
    c = Config.from_string(PARAMS)
    return c.replace_from_string(extra) if extra else c


def assert_same_model(a: GRU4Rec, b: GRU4Rec) -> None:
    sa, sb = a.net.state_dict(), b.net.state_dict()
    assert set(sa) == set(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def signal_at_step(monkeypatch: pytest.MonkeyPatch, step: int, signum: int, times: int = 1) -> list[int]:
    """Raise ``signum`` (``times`` times) inside the ``step``-th training step of the process
    (counted from 1 over all epochs); returns the live call counter."""
    original = Trainer.train_step
    calls = [0]

    def train_step(self: Trainer, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == step:
            for _ in range(times):
                signal.raise_signal(signum)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return calls


def steps(model: GRU4Rec, epoch: int) -> int:
    """Steps of ``epoch`` (with a random session order each epoch has its own number)."""
    return model.history[epoch - 1].n_steps


@pytest.fixture(scope="module")
def full(events: pd.DataFrame) -> dict[str, GRU4Rec]:
    """Uninterrupted runs of the configurations tested below."""
    return {extra: GRU4Rec(config(extra), device="cpu").fit(events, progress=False)
            for extra in ("", "layers=12/8,adapt=adam", "loss=bpr-max,final_act=elu-1,constrained_embedding=False,embedding=8")}


# ------------------------------------------------------------------------- in-process signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("extra", ["", "layers=12/8,adapt=adam", "loss=bpr-max,final_act=elu-1,constrained_embedding=False,embedding=8"])
def test_signal_in_the_middle_of_an_epoch_resumes_to_the_same_model(
    events: pd.DataFrame, full: dict[str, GRU4Rec], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    signum: int, extra: str,
) -> None:
    reference = full[extra]
    n, n2 = steps(reference, 1), steps(reference, 2)
    stop_at = n + n2 // 2 + 3  # in epoch 2, between two redraws of the sample store
    signal_at_step(monkeypatch, stop_at, signum)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as caught:
        GRU4Rec(config(extra), device="cpu").fit(events, checkpoint_dir=tmp_path, progress=False)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers restored
    assert caught.value.signal_name == signal.Signals(signum).name and caught.value.signal_number == signum
    assert isinstance(caught.value, KeyboardInterrupt)
    ckpt = tmp_path / CHECKPOINT_NAME
    assert caught.value.checkpoint == str(ckpt)
    _, meta = checkpoint.load_file(ckpt)
    # The signal came during step stop_at: the checkpoint is at the boundary right after it.
    assert (meta["epoch"], meta["step"], meta["n_steps"]) == (1, stop_at - n, n2)
    monkeypatch.undo()

    resumed = GRU4Rec(config(extra), device="cpu").fit(events, checkpoint_dir=tmp_path, resume=True, progress=False)
    assert [s.epoch for s in resumed.history] == [2, 3]
    assert [s.loss for s in resumed.history] == [s.loss for s in reference.history[1:]]
    assert resumed.epochs_trained == 3
    assert_same_model(resumed, reference)
    assert not ckpt.exists()  # the finished run removed its checkpoint


def test_a_checkpoint_at_the_last_step_of_an_epoch(events: pd.DataFrame, full: dict[str, GRU4Rec], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reference = full[""]
    n = steps(reference, 1)
    signal_at_step(monkeypatch, n, signal.SIGTERM)
    with pytest.raises(TrainingInterrupted):
        GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=tmp_path, progress=False)
    _, meta = checkpoint.load_file(tmp_path / CHECKPOINT_NAME)
    assert (meta["epoch"], meta["step"]) == (0, n)  # every step of epoch 1 done, its end not yet handled
    monkeypatch.undo()
    resumed = GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=tmp_path, resume=True, progress=False)
    assert [s.loss for s in resumed.history] == [s.loss for s in reference.history]
    assert_same_model(resumed, reference)


def test_a_second_signal_stops_at_once(events: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    signal_at_step(monkeypatch, 5, signal.SIGINT, times=2)
    with pytest.raises(KeyboardInterrupt) as caught:
        GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=tmp_path, progress=False)
    assert type(caught.value) is KeyboardInterrupt  # Python's own, raised inside the step: no checkpoint
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_checkpoint_folder_ctrl_c_is_a_plain_interrupt(events: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    signal_at_step(monkeypatch, 5, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        GRU4Rec(config(), device="cpu").fit(events, progress=False)
    assert type(caught.value) is KeyboardInterrupt


# ------------------------------------------------------------------------ timed checkpoints


def test_timed_checkpoints_inside_epochs_each_resume_to_the_same_model(
    events: pd.DataFrame, full: dict[str, GRU4Rec], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints every 6 µs (1e-7 minutes: due after every step, however fast the steps run — an epoch here takes a few
    ms on 2 threads): a copy of each mid-epoch one is kept, and the run is resumed from the first and from the last of them."""
    copies: list[tuple[int, int, Path]] = []
    save = checkpoint.save_file

    def save_and_copy(path: Any, tensors: Any, meta: dict[str, Any], **kwargs: Any) -> Path:
        written = save(path, tensors, meta, **kwargs)
        if meta["step"] > 0:
            copy = tmp_path / f"copy{len(copies)}"
            copy.mkdir()
            shutil.copy(written, copy / CHECKPOINT_NAME)
            copies.append((meta["epoch"], meta["step"], copy))
        return written

    monkeypatch.setattr(resume_module.checkpoint, "save_file", save_and_copy)
    ran = GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=tmp_path / "ck", checkpoint_every=1e-7, progress=False)
    monkeypatch.undo()
    assert_same_model(ran, full[""])  # checkpointing changes nothing
    assert copies, "no mid-epoch checkpoint was written"
    assert all(0 < step <= steps(ran, epoch + 1) for epoch, step, _ in copies)
    for epoch, step, folder in {copies[0], copies[-1]}:
        resumed = GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=folder, resume=True, progress=False)
        assert [s.epoch for s in resumed.history] == list(range(epoch + 1, 4)), (epoch, step)
        assert [s.loss for s in resumed.history] == [s.loss for s in full[""].history[epoch:]]
        assert_same_model(resumed, full[""])


def test_due_follows_the_clock_and_the_signals(events: pd.DataFrame, tmp_path: Path) -> None:
    model = GRU4Rec(config(), device="cpu")
    ck = TrainingCheckpoint(tmp_path, every_minutes=1.0)
    assert not ck.due(time.perf_counter() + 1e6)  # not attached: no clock yet
    model.fit(events.iloc[:60], progress=False)  # a net and item support for a trainer
    trainer = Trainer(model.net, model.config, model.item_support)
    ck.attach(trainer, model.config, {"n": 1})
    now = time.perf_counter()
    assert not ck.due(now + 59.0) and ck.due(now + 61.0)
    never = TrainingCheckpoint(tmp_path / "other")
    never.attach(trainer, model.config, {"n": 1})
    assert not never.due(time.perf_counter() + 1e9)
    with never.catching_signals():
        signal.raise_signal(signal.SIGTERM)
        assert never.due(0.0)
        with pytest.raises(TrainingInterrupted):
            never.write(resume_module.EpochPosition(1, 0, 0, 0.0, None, {}))
    assert (tmp_path / "other" / CHECKPOINT_NAME).exists()


# ----------------------------------------------------------------------- the folder's rules


def test_checkpoint_folder_rules(events: pd.DataFrame, tmp_path: Path) -> None:
    small = events.iloc[:400]
    with pytest.raises(Gru4RecError, match="nothing to resume"):
        GRU4Rec(config(), device="cpu").fit(small, checkpoint_dir=tmp_path, resume=True, progress=False)
    GRU4Rec(config("n_epochs=1"), device="cpu").fit(small, checkpoint_dir=tmp_path, progress=False)
    assert not (tmp_path / CHECKPOINT_NAME).exists()  # removed when the run completed
    GRU4Rec(config("n_epochs=1"), device="cpu").fit(small, checkpoint_dir=tmp_path, keep_checkpoint=True, progress=False)
    kept = (tmp_path / CHECKPOINT_NAME).read_bytes()
    with pytest.raises(Gru4RecError, match="holds a checkpoint of an earlier run.*not overwritten"):
        GRU4Rec(config("n_epochs=1"), device="cpu").fit(small, checkpoint_dir=tmp_path, progress=False)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == kept
    with pytest.raises(Gru4RecError, match="checkpoint_every needs checkpoint_dir"):
        GRU4Rec(config(), device="cpu").fit(small, checkpoint_every=5, progress=False)
    with pytest.raises(Gru4RecError, match="positive number of minutes"):
        GRU4Rec(config(), device="cpu").fit(small, checkpoint_dir=tmp_path / "x", checkpoint_every=0, progress=False)
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    with pytest.raises(Gru4RecError, match="a_file is a file, not a folder"):
        GRU4Rec(config(), device="cpu").fit(small, checkpoint_dir=a_file, progress=False)
    with pytest.raises(Gru4RecError, match="a_file is a file, not a folder"):
        GRU4Rec(config(), device="cpu").fit(small, checkpoint_dir=a_file / "ck", progress=False)
    assert a_file.read_text() == "mine"


def test_a_mid_epoch_checkpoint_needs_its_epoch(events: pd.DataFrame, full: dict[str, GRU4Rec], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    signal_at_step(monkeypatch, steps(full[""], 1) + steps(full[""], 2) + 4, signal.SIGTERM)  # inside epoch 3
    with pytest.raises(TrainingInterrupted):
        GRU4Rec(config(), device="cpu").fit(events, checkpoint_dir=tmp_path, progress=False)
    monkeypatch.undo()
    with pytest.raises(Gru4RecError, match="inside epoch 3.*n_epochs >= 3"):
        GRU4Rec(config("n_epochs=2"), device="cpu").fit(events, checkpoint_dir=tmp_path, resume=True, progress=False)


# ------------------------------------------------------------- a real process, killed from outside


def _tiny_train_file(folder: Path) -> Path:
    """Long enough epochs (≈0.5 s on a quiet core with the one-call CPU step; 1,800 sessions took
    0.04 s) for a signal sent 0.1 s after epoch 1's checkpoint to land inside the second one."""
    path = folder / "train.tsv"
    generate(n_sessions=18000, n_items=300, seed=5).to_csv(path, sep="\t", index=False)
    return path


CLI_PARAMS = (
    "layers=16,batch_size=16,n_sample=32,n_epochs=3,sample_store_size=320,momentum=0.3,dropout_p_hidden=0.2,train_random_order=True"
)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The training file and the model of an uninterrupted ``gru4rec train`` of it."""
    folder = tmp_path_factory.mktemp("cli")
    train = _tiny_train_file(folder)
    model = folder / "uninterrupted.safetensors"
    assert main(["train", str(train), "-ps", CLI_PARAMS, "-d", "cpu", "--threads", "1", "-q", "--save", str(model)]) == 0
    return {"train": train, "model": model}


def _train_then_signal(
    argv: list[str], signum: int, *, after_line: str = "Checkpoint at end of epoch 1", delay: float = 0.1
) -> tuple[int, str]:
    """Run ``gru4rec train`` in a subprocess, send it ``signum`` ``delay`` s after its stderr
    shows ``after_line``; returns its exit code and stderr. The default line (logged at DEBUG:
    ``argv`` needs ``-v``) comes after epoch 1's checkpoint is written, so that a signal sent then
    lands inside epoch 2 however slow the machine is (a signal before that write would make it
    the epoch-end checkpoint)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gru4rec.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if after_line in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(lines)
        time.sleep(delay)
        proc.send_signal(signum)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:  # never leave it running, also when an assertion failed
            proc.kill()
            proc.wait()
    reader.join(10)
    return code, "".join(lines)


def _resume_command(stderr: str) -> list[str]:
    error = [line for line in stderr.splitlines() if line.startswith("gru4rec: interrupted")]
    assert len(error) == 1, stderr
    assert "resume with: " in error[0], error[0]
    words = shlex.split(error[0].split("resume with: ", 1)[1])
    assert words[0] == "gru4rec" and words[-1] == "--resume"
    return words[1:]


def _assert_same_file_model(a: Path, b: Path) -> None:
    ta, _ = checkpoint.load_file(a)
    tb, _ = checkpoint.load_file(b)
    assert set(ta) == set(tb)
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


@pytest.mark.parametrize("signum, exit_code, timed", [(signal.SIGTERM, 143, True), (signal.SIGINT, 130, False)])
def test_a_killed_training_process_resumes_to_the_same_model(
    cli_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], signum: int, exit_code: int, timed: bool
) -> None:
    ck, model = tmp_path / "ck", tmp_path / "model.safetensors"
    argv = ["train", str(cli_run["train"]), "-ps", CLI_PARAMS, "-d", "cpu", "--threads", "1", "-v",
            "--checkpoint-dir", str(ck), "--save", str(model)]
    if timed:
        argv += ["--checkpoint-every", "0.005"]  # timed checkpoints before the signal's
    code, stderr = _train_then_signal(argv, signum)
    assert code == exit_code, stderr
    assert "Traceback" not in stderr and not model.exists()
    _, meta = checkpoint.load_file(ck / CHECKPOINT_NAME)
    assert meta["epoch"] == 1 and 0 < meta["step"] < meta["n_steps"], meta  # inside epoch 2
    resume_argv = _resume_command(stderr)
    assert resume_argv == argv + ["--resume"]  # the exact command, plus --resume
    capsys.readouterr()
    assert main(resume_argv) == 0
    err = capsys.readouterr().err
    assert f"Resuming from {ck / CHECKPOINT_NAME} after epoch 1 and {meta['step']} of the {meta['n_steps']} steps of epoch 2" in err
    assert "Epoch1 " not in err and "Epoch2 " in err and "Epoch3 " in err
    _assert_same_file_model(model, cli_run["model"])
    assert not (ck / CHECKPOINT_NAME).exists()  # removed once the model was saved
