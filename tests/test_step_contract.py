"""One step contract: every form of the training step that this machine has runs N steps from one
state over a grid of configurations, and gives the autograd reference's losses, weights and hidden
states within a stated tolerance — bit for bit where the docs promise it (the one-call C step is
FastStep over the same kernels, gru4rec/training/cpu_step.py).

The forms (gru4rec/training/backend.py): ``reference`` (autograd over PyTorch operations, the step
the others are held to), ``c-step`` (the CPU's default where it covers the configuration),
``cpu-kernels`` (FastStep over the fused CPU kernels: the CPU's step for what the C step declines),
``torch`` (FastStep over PyTorch operations; here with the CPU's unique rows and with CUDA's
scratch-table rows), ``triton`` (FastStep over the Triton kernels; on the CPU through Triton's
interpreter). Each form is asked of the backend, and the backend must name the form it runs: a
form that silently became another would compare a step with itself.

The grid covers both sampled losses (cross-entropy, BPR-max after elu), logQ, BPR-max's score
regularisation, the three embedding modes, both dropouts, momentum and two layers. The samples of
each step are drawn once and handed to every form, so the contract is the step's, not the
sampler's (tests/test_sampling.py holds that one).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap, item_support, sessions_from_events
from gru4rec.datasets.synthetic import generate
from gru4rec.kernels.cpu import cpu_kernels, sgemm_binding
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import Backend, select_backend
from gru4rec.training.batching import Schedule, build_schedule
from gru4rec.training.cpu_step import covers
from gru4rec.training.trainer import Trainer

torch.set_num_threads(1)

#: Steps run from the common start: enough for every slot to start a new session and for the
#: sample store's rows to differ, few enough for Triton's interpreter.
N_STEPS = 6
#: float32 agreement with the reference after N_STEPS: relative to the loss, and per weight
#: (relative, absolute). The forms differ from autograd only in rounding (the order of sums, fused
#: multiply-adds, the C kernels' own exp and tanh within a few ulps); a change to the maths of a
#: loss, a gate or an update moves the results by orders of magnitude more (a 1e-3 change of
#: bpreg or of the learning rate already fails).
LOSS_RTOL = 1e-6
WEIGHT_RTOL, WEIGHT_ATOL = 1e-4, 2e-6

BASE = "batch_size=8,sample_store_size=48,learning_rate=0.1,sample_alpha=0.5"
GRID = {
    "xe-shared-logq-dropout-momentum": BASE + ",layers=16,n_sample=12,logq=1.0,dropout_p_hidden=0.3,dropout_p_embed=0.2,momentum=0.2",
    "bprmax-shared-bpreg-dropout-momentum": BASE + ",layers=16,n_sample=12,loss=bpr-max,final_act=elu-1,bpreg=0.9,"
                                                  "dropout_p_hidden=0.3,dropout_p_embed=0.5,momentum=0.15",
    "xe-shared-2layers-lmbd": BASE + ",layers=12/8,n_sample=12,lmbd=0.01,dropout_p_hidden=0.2",
    "bprmax-shared-2layers-linear-logq": BASE + ",layers=12/8,n_sample=12,loss=bpr-max,final_act=linear,bpreg=0.5,logq=0.5",
    "xe-separate-2layers-logq-dropout-momentum": BASE + ",layers=12/8,n_sample=12,constrained_embedding=False,embedding=10,"
                                                        "logq=1.0,dropout_p_hidden=0.2,dropout_p_embed=0.3,momentum=0.3",
    "bprmax-separate-bpreg-momentum": BASE + ",layers=16,n_sample=12,constrained_embedding=False,embedding=10,loss=bpr-max,"
                                             "final_act=elu-0.5,bpreg=1.5,momentum=0.4,dropout_p_hidden=0.1",
    "xe-none-2layers-dropout": BASE + ",layers=12/8,n_sample=12,constrained_embedding=False,embedding=0,dropout_p_hidden=0.3,"
                                      "momentum=0.1",
    "bprmax-none-bpreg-logq-momentum": BASE + ",layers=16,n_sample=12,constrained_embedding=False,embedding=0,loss=bpr-max,"
                                              "final_act=elu-1,bpreg=0.5,logq=1.0,momentum=0.5,lmbd=0.01",
}


@dataclass(frozen=True)
class Form:
    """A form of the step: how to ask the backend for it, and why it cannot run here (or None)."""

    name: str
    device: str
    switches: dict
    unavailable: str | None


def _kernels_missing() -> str | None:
    return None if cpu_kernels() is not None else "the fused CPU kernels cannot be built here"


def _triton_missing(device: str) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if device == "cpu" and torch.cuda.is_available():
        return "Triton runs on the GPU here (the interpreter is set where there is none: tests/conftest.py)"
    return None


CUDA_MISSING = None if torch.cuda.is_available() else "no CUDA device"
FORMS = [
    Form("c-step", "cpu", dict(cpu_step=True), _kernels_missing() or (None if sgemm_binding()[0] else sgemm_binding()[1])),
    Form("cpu-kernels", "cpu", dict(cpu_kernels=True, cpu_step=False), _kernels_missing()),
    Form("torch", "cpu", dict(cpu_kernels=False), None),
    Form("torch", "cpu", dict(unique_rows=False, cpu_kernels=False, fused_gpu=False), None),  # CUDA's row merging
    Form("triton", "cpu", dict(unique_rows=False, fused_gpu=True), _triton_missing("cpu")),
    Form("torch", "cuda", dict(fused_gpu=False, graph_replay=False), CUDA_MISSING),
    Form("triton", "cuda", dict(fused_gpu=True, graph_replay=False), CUDA_MISSING or _triton_missing("cuda")),
]


def _form_id(form: Form) -> str:
    rows = "scratch" if form.switches.get("unique_rows") is False or form.device == "cuda" else "unique"
    return f"{form.name}-{form.device}-{rows}"


def _cases() -> list:
    cases = []
    for form in FORMS:
        for name, params in GRID.items():
            marks = []
            if form.unavailable is not None:
                marks.append(pytest.mark.skip(reason=form.unavailable))
            if form.device == "cuda":
                marks.append(pytest.mark.cuda)
            if form.name == "c-step" and covers(Config.from_string(params), float32_products=True) is not None:
                continue  # the C step declines it; the backend then runs cpu-kernels, which is its own case
            cases.append(pytest.param(form, name, marks=marks, id=f"{_form_id(form)}-{name}"))
    return cases


@dataclass
class Run:
    """A form's N steps: the loss of each, then the weights and hidden states."""

    losses: list[torch.Tensor]
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]
    hidden: list[torch.Tensor]
    form: str


def _data(config: Config) -> tuple[np.ndarray, Schedule]:
    events = generate(n_sessions=60, n_items=40, seed=11)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    schedule = build_schedule(sessions.items, sessions.offsets, config.batch_size, config.n_sample, torch.device("cpu"), torch.float32)
    return support, schedule


_RUNS: dict[tuple, Run] = {}


def _run(config_name: str, backend: Backend, *, reference: bool = False) -> Run:
    """N_STEPS from the common start (the network of the config's seed, zero hidden states),
    with each step's samples drawn once from a fixed generator."""
    config = Config.from_string(GRID[config_name])
    support, schedule = _data(config)
    device = backend.device
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed)).to(device)
    trainer = Trainer(net, config, support, backend=backend, reference=reference)
    draws = torch.Generator().manual_seed(99)
    losses = []
    for t in range(N_STEPS):
        samples = torch.randint(len(support), (config.n_sample,), generator=draws).to(device)
        row = [x[t].to(device) for x in (schedule.inputs, schedule.targets, schedule.active, schedule.keep)]
        losses.append(trainer.train_step(*row, samples).cpu())
    form = backend.step_form(config, reference=reference)
    assert (trainer._cpu_step is not None) == (form == "c-step")
    weights = {k: v.detach().cpu().clone() for k, v in trainer.net.state_dict().items()}
    optimizer = {k: v.detach().cpu().clone() for k, v in trainer.optimizer.state_dict().items()}
    return Run(losses, weights, optimizer, [h.cpu().clone() for h in trainer.hidden], form)


def _reference(config_name: str) -> Run:
    """The autograd step over PyTorch operations on the CPU (computed once per configuration)."""
    key = ("reference", config_name)
    if key not in _RUNS:
        _RUNS[key] = _run(config_name, select_backend("cpu", cpu_kernels=False), reference=True)
    return _RUNS[key]


def _assert_close(got: Run, want: Run, what: str) -> None:
    for t, (a, b) in enumerate(zip(got.losses, want.losses)):
        assert float(a) == pytest.approx(float(b), rel=LOSS_RTOL), f"{what}: loss of step {t + 1}"
    assert got.weights.keys() == want.weights.keys()
    for k in want.weights:
        torch.testing.assert_close(got.weights[k], want.weights[k], rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL,
                                   msg=lambda m, k=k: f"{what}: {k}: {m}")
    for i, (a, b) in enumerate(zip(got.hidden, want.hidden)):
        torch.testing.assert_close(a, b, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, msg=lambda m, i=i: f"{what}: hidden state {i}: {m}")


@pytest.mark.parametrize(("form", "config_name"), _cases())
def test_every_form_gives_the_references_steps(form: Form, config_name: str) -> None:
    backend = select_backend(form.device, **form.switches)
    run = _run(config_name, backend)
    assert run.form == form.name  # the backend runs the form asked for, and names it
    assert float(run.losses[-1]) > 0 and float(run.hidden[-1].abs().sum()) > 0  # it trained, and carried state
    _assert_close(run, _reference(config_name), f"{_form_id(form)} against the autograd reference")
    if form.name == "c-step":  # documented: FastStep's results over the same kernels, bit for bit
        fast = _run(config_name, select_backend("cpu", cpu_kernels=True, cpu_step=False))
        assert fast.form == "cpu-kernels"
        for t, (a, b) in enumerate(zip(run.losses, fast.losses)):
            assert torch.equal(a, b), f"loss of step {t + 1}"
        for table in ("weights", "optimizer"):
            for k, v in getattr(fast, table).items():
                assert torch.equal(getattr(run, table)[k], v), f"{table}: {k}"
        for a, b in zip(run.hidden, fast.hidden):
            assert torch.equal(a, b)


def test_the_grid_has_what_the_contract_names() -> None:
    """Both sampled losses, logQ, BPR-max's regularisation, the three embedding modes, both
    dropouts, momentum and two layers; and the C step covers some of it and declines some."""
    configs = [Config.from_string(p) for p in GRID.values()]
    assert {c.loss for c in configs} == {"cross-entropy", "bpr-max"}
    assert {c.embedding_mode for c in configs} == {"shared", "separate", "none"}
    assert any(c.logq > 0 for c in configs) and any(c.bpreg > 0 and c.loss == "bpr-max" for c in configs)
    assert any(c.dropout_p_hidden > 0 for c in configs) and any(c.dropout_p_embed > 0 for c in configs)
    assert any(c.momentum > 0 for c in configs) and any(len(c.layers) == 2 for c in configs)
    assert all(c.n_sample > 0 for c in configs)
    declined = [covers(c, float32_products=True) for c in configs]
    assert None in declined and any(why is not None for why in declined)
