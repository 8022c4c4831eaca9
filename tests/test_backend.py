"""The training backend is chosen once, from the device, the dtype, the caller's switches and the
GRU4REC_* environment switches (read in gru4rec.kernels.switches only), and every part of a
trainer takes it from there."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from gru4rec.config import Config
from gru4rec.kernels import switches
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import BACKENDS, select_backend
from gru4rec.training.ops import CpuKernelOps, TorchOps
from gru4rec.training.trainer import Trainer

PACKAGE = Path(__file__).resolve().parents[1] / "gru4rec"


def test_environment_switches_are_read_in_one_module() -> None:
    """No module but kernels/switches.py reads a GRU4REC_* fast-path variable (the serving and
    tuning settings have their own documented variables)."""
    fast_path = {"GRU4REC_CPU_KERNELS", "GRU4REC_CUDA_GRAPHS", "GRU4REC_FUSED", "GRU4REC_MALLOPT", "GRU4REC_CACHE_DIR"}
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in fast_path:
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers == {"kernels/switches.py"}


@pytest.mark.parametrize("value, default, want", [(None, True, True), ("", False, False), ("0", True, False), ("1", False, True),
                                                  (" 0 ", True, False), ("yes", False, True)])
def test_a_switch_is_off_only_for_0(monkeypatch: pytest.MonkeyPatch, value: str | None, default: bool, want: bool) -> None:
    if value is None:
        monkeypatch.delenv("GRU4REC_FUSED", raising=False)
    else:
        monkeypatch.setenv("GRU4REC_FUSED", value)
    assert switches._flag("GRU4REC_FUSED", default) is want


def test_the_cpu_default_is_unique_rows_and_no_replay() -> None:
    backend = select_backend("cpu")
    assert backend.unique_rows and not backend.graph_replay
    assert backend.name in BACKENDS and backend.name == backend.ops.name
    assert backend.describe().startswith("cpu float32, ") and "unique rows" in backend.describe()
    plain = select_backend("cpu", torch.float32, cpu_kernels=False)
    assert type(plain.ops) is TorchOps and plain.name == "torch"


def test_cuda_defaults_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device (the object only: nothing is allocated) duplicates go through the scratch
    table and the step is replayed unless GRU4REC_CUDA_GRAPHS=0; the fused GPU kernels stay off
    unless GRU4REC_FUSED=1, and where they cannot run that is an error naming why."""
    monkeypatch.delenv("GRU4REC_CUDA_GRAPHS", raising=False)
    monkeypatch.delenv("GRU4REC_FUSED", raising=False)
    cuda = torch.device("cuda")
    backend = select_backend(cuda)
    assert not backend.unique_rows and backend.graph_replay and type(backend.ops) is TorchOps
    assert "scratch rows, graph replay" in backend.describe()
    monkeypatch.setenv("GRU4REC_CUDA_GRAPHS", "0")
    assert not select_backend(cuda).graph_replay
    assert select_backend(cuda, graph_replay=True).graph_replay  # the caller's word wins
    monkeypatch.setenv("GRU4REC_FUSED", "1")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GRU4REC_FUSED=1, but the fused GPU kernels cannot run here"):
            select_backend(cuda)
    assert type(select_backend(cuda, fused_gpu=False).ops) is TorchOps
    assert select_backend("cpu").name != "triton"  # the switch is about CUDA: ignored on the CPU


def test_impossible_combinations_are_refused() -> None:
    with pytest.raises(ValueError, match="CUDA devices only"):
        select_backend("cpu", graph_replay=True)
    with pytest.raises(ValueError, match="apply to float32 tables on the CPU with unique rows only"):
        select_backend("cpu", unique_rows=False, cpu_kernels=True)
    with pytest.raises(ValueError, match="scratch table"):
        select_backend("cpu", unique_rows=True, fused_gpu=True)
    with pytest.raises(ValueError, match="float32 tables"):
        select_backend("cpu", torch.float64, unique_rows=False, fused_gpu=True)


def test_every_part_of_a_trainer_holds_the_same_backend() -> None:
    cfg = Config(layers=(8,), batch_size=4, n_sample=4)
    backend = select_backend("cpu", unique_rows=False)
    trainer = Trainer(GRU4RecNet(20, cfg), cfg, np.ones(20, dtype=np.int64), backend=backend)
    assert trainer.backend is backend is trainer.optimizer.backend is trainer._step.backend
    assert trainer.ops is backend.ops and not trainer.optimizer.unique_rows
    default = Trainer(GRU4RecNet(20, cfg), cfg, np.ones(20, dtype=np.int64))
    assert default.backend.unique_rows and isinstance(default.ops, (TorchOps, CpuKernelOps))
    with pytest.raises(ValueError, match="backend is for"):
        Trainer(GRU4RecNet(20, cfg).double(), cfg, np.ones(20, dtype=np.int64), backend=backend)
