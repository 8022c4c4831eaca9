"""The training backend is chosen once, from the device, the dtype, the caller's switches and the
GRU4REC_* environment switches (read in gru4rec.kernels.switches only), and every part of a
trainer takes it from there."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from gru4rec.config import Config
from gru4rec.kernels import cpu as cpu_module
from gru4rec.kernels import switches
from gru4rec.kernels.cpu import cpu_kernels, sgemm_binding
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training import backend as backend_module
from gru4rec.training.backend import BACKENDS, select_backend
from gru4rec.training.ops import CpuKernelOps, TorchOps
from gru4rec.training.trainer import Trainer

PACKAGE = Path(__file__).resolve().parents[1] / "gru4rec"


def test_environment_switches_are_read_in_one_module() -> None:
    """No module but kernels/switches.py reads a GRU4REC_* fast-path variable (the serving and
    tuning settings have their own documented variables)."""
    fast_path = {"GRU4REC_CPU_KERNELS", "GRU4REC_CPU_STEP", "GRU4REC_CUDA_GRAPHS", "GRU4REC_FUSED", "GRU4REC_MALLOPT",
                 "GRU4REC_CACHE_DIR"}
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in fast_path:
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers == {"kernels/switches.py"}


def test_the_training_code_asks_the_switches_through_the_backend_only() -> None:
    """In gru4rec/training only backend.py imports the switches: the whole step — its ops and the
    one-call C step — is chosen there (issue 48: the trainer used to pick the C step itself)."""
    importers = set()
    for path in (PACKAGE / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "gru4rec.kernels.switches":
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"training/backend.py"}


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


needs_kernels = pytest.mark.skipif(cpu_kernels() is None, reason="the fused CPU kernels cannot be built here")
needs_sgemm = pytest.mark.skipif(sgemm_binding()[0] is None, reason="torch exports no sgemm_ here")


@needs_kernels
@needs_sgemm
def test_the_backend_chooses_the_one_call_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C step is the CPU's default with the fused kernels; GRU4REC_CPU_STEP=0 or cpu_step=False
    refuse it, and it cannot be had without the kernels."""
    monkeypatch.delenv("GRU4REC_CPU_STEP", raising=False)
    backend = select_backend("cpu")
    assert backend.one_call_step and backend.name == "cpu-kernels" and "one-call step" in backend.describe()
    shared, separate = Config(layers=(8,), batch_size=4, n_sample=4), Config(layers=(8,), batch_size=4, n_sample=4,
                                                                            constrained_embedding=False, embedding=6)
    assert backend.step_form(shared) == "c-step" and backend.step_form(separate) == "cpu-kernels"
    assert backend.step_form(shared, reference=True) == "reference"
    assert backend.step_form(shared, float32_products=False) == "cpu-kernels"
    assert not select_backend("cpu", cpu_step=False).one_call_step
    assert select_backend("cpu", cpu_kernels=False).step_form(shared) == "torch"
    monkeypatch.setenv("GRU4REC_CPU_STEP", "0")
    assert not select_backend("cpu").one_call_step
    assert select_backend("cpu", cpu_step=True).one_call_step  # the caller's word wins
    with pytest.raises(ValueError, match="cannot be had with cpu_kernels=False"):
        select_backend("cpu", cpu_kernels=False, cpu_step=True)
    with pytest.raises(ValueError, match="apply to float32 tables on the CPU with unique rows only"):
        select_backend("cpu", unique_rows=False, cpu_step=True)


def _records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]


@needs_kernels
@needs_sgemm
def test_a_configuration_the_c_step_declines_is_said_once_at_info(caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRU4REC_CPU_STEP", raising=False)
    monkeypatch.setattr(backend_module, "_declined", set())
    cfg = Config(layers=(8,), batch_size=4, n_sample=4, grad_cap=1.0)
    with caplog.at_level(logging.INFO, logger="gru4rec.training.backend"):
        for _ in range(2):
            trainer = Trainer(GRU4RecNet(20, cfg), cfg, np.ones(20, dtype=np.int64))
            assert trainer._cpu_step is None and trainer.backend.one_call_step
    said = _records(caplog, logging.INFO, "not as one C call: grad_cap")
    assert len(said) == 1 and "1.25x" in said[0].getMessage()  # once, with what it costs
    covered = Config(layers=(8,), batch_size=4, n_sample=4)
    assert Trainer(GRU4RecNet(20, covered), covered, np.ones(20, dtype=np.int64))._cpu_step is not None


@needs_kernels
def test_a_missing_sgemm_is_a_warning_once_naming_the_cause(caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRU4REC_CPU_STEP", raising=False)
    monkeypatch.setattr(backend_module, "sgemm_binding", lambda: (None, "torch's CPU library (x.so) exports no sgemm_"))
    monkeypatch.setattr(cpu_module, "_lost", set())
    with caplog.at_level(logging.INFO, logger="gru4rec.kernels.cpu"):
        backends = [select_backend("cpu") for _ in range(2)]
    assert not any(b.one_call_step for b in backends) and backends[0].name == "cpu-kernels"
    said = _records(caplog, logging.WARNING, "the one-call CPU step is unavailable: torch's CPU library (x.so) exports no sgemm_")
    assert len(said) == 1 and "1.25x" in said[0].getMessage()
    with pytest.raises(ValueError, match="the C step cannot run here: .* exports no sgemm_"):
        select_backend("cpu", cpu_step=True)


@needs_kernels
def test_a_lost_rng_binding_is_a_warning_once_and_torch_rand_draws(caplog: pytest.LogCaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = cpu_kernels()
    assert kernels is not None
    monkeypatch.setattr(kernels.torch_rand, "_matches", False)
    monkeypatch.setattr(kernels.torch_rand, "why_not", "a generator state of 4000 bytes")
    monkeypatch.setattr(cpu_module, "_lost", set())
    ops = CpuKernelOps(kernels)
    ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with caplog.at_level(logging.INFO, logger="gru4rec.kernels.cpu"):
        for _ in range(2):
            u = torch.empty(100)
            ops.dropout_uniform(u, ours)
            assert torch.equal(u, torch.rand(100, generator=theirs))
    said = _records(caplog, logging.WARNING, "torch.rand (dropout draws) is unavailable: a generator state of 4000 bytes")
    assert len(said) == 1
