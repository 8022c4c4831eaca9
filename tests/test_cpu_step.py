"""The one-call CPU step (gru4rec/training/cpu_step.py, ``g4r_train_step``) against FastStep, the
step it replaces: the same losses, weights, optimiser state and hidden states, bit for bit, over
many steps — FastStep itself is held to the autograd reference (tests/test_step_reference.py) —
and FastStep wherever it does not cover the configuration."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap, item_support, sessions_from_events
from gru4rec.datasets.synthetic import generate
from gru4rec.kernels.cpu import cpu_kernels
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.batching import build_schedule
from gru4rec.training.trainer import Trainer

torch.set_num_threads(1)

pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="the fused CPU kernels cannot be built here")

BASE = "batch_size=8,sample_store_size=240,learning_rate=0.1"
ONE = BASE + ",layers=16"
COVERED = [
    ONE + ",n_sample=24,momentum=0.2,dropout_p_hidden=0.3,dropout_p_embed=0.2,logq=1.0",  # rsc15's form
    BASE + ",layers=12/8,n_sample=24,loss=xe_logit,adapt=adam,dropout_p_hidden=0.2",  # two layers, Adam
    ONE + ",n_sample=24,adapt=rmsprop,lmbd=0.01",  # another rule, weight decay, no velocity
    ONE + ",n_sample=0,momentum=0.2",  # in-batch negatives only
    ONE + ",n_sample=24,loss=bpr-max,final_act=elu-1,bpreg=0.9,dropout_p_embed=0.5,dropout_p_hidden=0.3,momentum=0.15",  # DIGINETICA's form
    BASE + ",layers=12/8,n_sample=24,loss=bpr-max,final_act=linear,bpreg=0.5,logq=0.5",  # linear scores, logQ
]


def _data(config: Config, n_items: int = 60, n_sessions: int = 160) -> tuple[np.ndarray, object]:
    events = generate(n_sessions=n_sessions, n_items=n_items, seed=7)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    support = item_support(sessions.items, len(item_map))
    schedule = build_schedule(sessions.items, sessions.offsets, config.batch_size, config.n_sample, torch.device("cpu"), torch.float32)
    return support, schedule


def _trainer(config: Config, support: np.ndarray, one_call: bool, monkeypatch: pytest.MonkeyPatch) -> Trainer:
    monkeypatch.setenv("GRU4REC_CPU_STEP", "1" if one_call else "0")
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed))
    trainer = Trainer(net, config, support)
    assert (trainer._cpu_step is not None) == one_call
    return trainer


@pytest.mark.parametrize("params", COVERED)
def test_the_one_call_step_is_fast_step_bit_for_bit(params: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_as_fast_step(Config.from_string(params), _data(Config.from_string(params)), monkeypatch)


def test_wide_steps_split_between_threads_are_fast_step_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of distinct 256-wide rows a step: the gather of the scored rows is split between
    the threads (over 65,536 floats), as on real data."""
    config = Config.from_string(BASE + ",layers=256,n_sample=600,loss=bpr-max,final_act=elu-1,bpreg=0.9,dropout_p_embed=0.5")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _same_as_fast_step(config, _data(config, n_items=1000), monkeypatch, min_distinct=300)
    finally:
        torch.set_num_threads(threads)


def test_products_split_between_threads_are_fast_step_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Products of at least 4M multiply-adds, which the C step splits between 2 threads itself (one
    one-thread sgemm per half), against FastStep's torch products on MKL's own 2 threads: halves
    of columns (the layers' forward products, the scores), halves of rows (the weight gradients,
    A transposed, and Wy's gradient rows: C taller than wide), down to gWh at exactly 4M."""
    config = Config.from_string("batch_size=64,sample_store_size=4000,learning_rate=0.1,layers=256,n_sample=600,loss=bpr-max,"
                                "final_act=elu-1,bpreg=0.9,dropout_p_embed=0.5,dropout_p_hidden=0.3,momentum=0.15")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _same_as_fast_step(config, _data(config, n_items=1000, n_sessions=500), monkeypatch, min_distinct=300)
    finally:
        torch.set_num_threads(threads)


def _same_as_fast_step(config: Config, data: tuple[np.ndarray, object], monkeypatch: pytest.MonkeyPatch,
                       min_distinct: int = 0) -> None:
    support, schedule = data
    fast, one = _trainer(config, support, False, monkeypatch), _trainer(config, support, True, monkeypatch)
    n = min(schedule.n_steps, 60)
    for t in range(n):  # > 10 store rows: the sample store is redrawn on the way
        args = (schedule.inputs[t], schedule.targets[t], schedule.active[t], schedule.keep[t])
        assert torch.equal(fast.train_step(*args), one.train_step(*args)), t
    for (name, a), (_, b) in zip(fast.net.state_dict().items(), one.net.state_dict().items()):
        assert torch.equal(a, b), name
    for (name, a), (_, b) in zip(fast.optimizer.state_dict().items(), one.optimizer.state_dict().items()):
        assert torch.equal(a, b), name
    for a, b in zip(fast.hidden, one.hidden):
        assert torch.equal(a, b)
    assert n >= 40 and float(one.hidden[-1].abs().sum()) > 0  # it trained, and carried state
    assert one._cpu_step is not None and one._cpu_step.counts[0] >= min_distinct


@pytest.mark.parametrize(("params", "why"), [
    (ONE + ",loss=bpr-max,final_act=tanh", "final_act 'tanh'"),
    (ONE + ",loss=top1-max,final_act=elu-1", "loss 'top1-max'"),
    (ONE + ",smoothing=0.1", "with smoothing"),
    (ONE + ",constrained_embedding=False,embedding=8", "embedding mode 'separate'"),
    (ONE + ",grad_cap=1.0", "grad_cap"),
    (ONE + ",hidden_act=relu", "other than tanh"),
])
def test_what_it_does_not_cover_runs_fast_step(params: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gru4rec.training.cpu_step import fused_cpu_step

    config = Config.from_string(params)
    support, schedule = _data(config)
    trainer = _trainer(config, support, False, monkeypatch)  # FastStep whatever the switch says
    monkeypatch.setenv("GRU4REC_CPU_STEP", "1")
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed))
    assert Trainer(net, config, support)._cpu_step is None
    step, reason = fused_cpu_step(trainer.net, config, trainer.optimizer, trainer.ops.kernels, trainer.dropout, None, trainer.hidden,
                                  float32_products=True)
    assert step is None and why in reason


def test_a_moved_table_or_a_wrong_input_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config.from_string(COVERED[0])
    support, schedule = _data(config)
    trainer = _trainer(config, support, True, monkeypatch)
    args = (schedule.inputs[0], schedule.targets[0], schedule.active[0], schedule.keep[0])
    with pytest.raises(ValueError, match="contiguous torch.int64 tensors of 8 elements"):
        trainer.train_step(schedule.inputs[0].float(), *args[1:])
    trainer.train_step(*args)
    trainer.net.Wy.data = trainer.net.Wy.data.clone()  # the C side holds the old address
    with pytest.raises(RuntimeError, match="moved in memory"):
        trainer.train_step(*args)
    moved = _trainer(config, support, True, monkeypatch)
    moved.train_step(*args)
    acc = moved.optimizer.state["Wy"].acc
    old = acc.untyped_storage()  # kept alive: a step that misses the move writes there, and fails below
    acc.set_(acc.clone())  # new storage: the update's rule (the C step runs it) holds the old address
    assert old.data_ptr() != acc.data_ptr()
    with pytest.raises(RuntimeError, match="moved in memory"):
        moved.train_step(*args)
