"""FastStep with item attributes against the autograd reference step (issue 49): N steps from one
state, the same samples handed to both, over a grid of configurations — both sampled losses,
logQ, shared and separate embedding (and one-hot), both dropouts and id dropout, click context,
momentum, Adagrad — with a categorical, a multi and a numeric attribute column, on float64
(``torch`` ops with unique rows) and float32 (the fused CPU kernels, the CPU's default form for
such a network). Losses, every weight (id rows, By, the attribute tables with their bias column, the
projection, the GRU), the optimiser's state and the hidden states agree within the stated
tolerance.

Both steps hand their composed rows' gradients to one helper (gru4rec.training.composed), so this
test holds FastStep's own part — which rows it composes, which keep their id part, the dropout
mask of the composed input rows, the biases spread to the columns, the distinct rows' gradient —
against the reference; the helper itself is held against autograd over the whole composition by
tests/test_attributes_training.py. Plain networks: the contract test (tests/test_step_contract.py)
runs unchanged.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.config import Config
from gru4rec.data import ItemMap, item_support, sessions_from_events
from gru4rec.datasets.synthetic import generate
from gru4rec.items import ItemAttributes, item_table_from_frame
from gru4rec.kernels.cpu import cpu_kernels
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import Backend, select_backend
from gru4rec.training.batching import build_schedule
from gru4rec.training.trainer import Trainer
from script_modules import import_module

torch.set_num_threads(1)

N_STEPS = 6
BASE = "batch_size=8,sample_store_size=48,learning_rate=0.1,sample_alpha=0.5,adapt=adagrad"
GRID = {
    "xe-shared-logq-dropout-momentum": BASE + ",layers=16,n_sample=12,logq=1.0,dropout_p_hidden=0.3,dropout_p_embed=0.2,momentum=0.2",
    "xe-shared-logq-iddropout-momentum": BASE + ",layers=16,n_sample=12,logq=1.0,dropout_p_id=0.4,dropout_p_embed=0.2,momentum=0.2",
    "xe-shared-context-dropout": BASE + ",layers=16,n_sample=12,click_context=True,dropout_p_embed=0.2,dropout_p_hidden=0.2",
    "bprmax-shared-bpreg-dropout": BASE + ",layers=16,n_sample=12,loss=bpr-max,final_act=elu-1,bpreg=0.9,"
                                          "dropout_p_hidden=0.3,dropout_p_embed=0.5",
    "xe-separate-2layers-logq-dropout-momentum": BASE + ",layers=12/8,n_sample=12,constrained_embedding=False,embedding=10,"
                                                        "logq=1.0,dropout_p_hidden=0.2,dropout_p_embed=0.3,momentum=0.3",
    "bprmax-separate-logq-iddropout-momentum": BASE + ",layers=16,n_sample=12,constrained_embedding=False,embedding=10,loss=bpr-max,"
                                                      "final_act=elu-0.5,bpreg=1.5,logq=0.5,momentum=0.4,dropout_p_hidden=0.1,"
                                                      "dropout_p_id=0.5",
    "xe-none-dropout": BASE + ",layers=12,n_sample=12,constrained_embedding=False,embedding=0,dropout_p_hidden=0.3",
}
#: (loss rtol, weight rtol, weight atol) per dtype: float64 is the exact check (rounding only);
#: float32 as the plain contract (tests/test_step_contract.py) but atol 1e-5, not 2e-6: a composed
#: row sums four parts in another order than autograd's, and six Adagrad steps carry that
#: rounding to a few 1e-6 in single elements (a dropped or doubled gradient moves them by 1e-3).
TOLERANCE = {torch.float64: (1e-10, 1e-9, 1e-11), torch.float32: (1e-6, 1e-4, 1e-5)}


def _sessions() -> tuple[np.ndarray, np.ndarray, np.ndarray, ItemAttributes]:
    """Sessions of 40 items, and their attribute table: 5 categories (codes shared by many
    items), a multi column of 1–3 tags (one listed twice by an item), a numeric price; items 0–3
    have no row (the unknown codes, price 0)."""
    events = generate(n_sessions=60, n_items=40, seed=11)
    item_map = ItemMap.from_ids(events["ItemId"])
    sessions, _ = sessions_from_events(events, item_map, order="time")
    ids = item_map.to_list()
    tags = ["a", "b|c", "c|a|a", "d", "b|d"]
    frame = pd.DataFrame({"ItemId": ids[4:], "cat": [f"c{i % 5}" for i in range(4, len(ids))],
                          "tags": [tags[i % 5] for i in range(4, len(ids))],
                          "price": [1.0 + (i * 7 % 11) for i in range(4, len(ids))]})
    attrs = ItemAttributes.build(item_table_from_frame(frame, types={"tags": "multi"}), item_map)
    return sessions.items, sessions.offsets, item_support(sessions.items, len(item_map)), attrs


ITEMS, OFFSETS, SUPPORT, ATTRS = _sessions()


def _run(config_name: str, backend: Backend, *, reference: bool) -> tuple[list[torch.Tensor], dict, dict, list[torch.Tensor]]:
    """N_STEPS from the config's network (with the attributes), zero hidden states, each step's
    samples drawn once from a fixed generator: the losses, weights, optimiser state and hidden states."""
    config = Config.from_string(GRID[config_name])
    schedule = build_schedule(ITEMS, OFFSETS, config.batch_size, config.n_sample, torch.device("cpu"), backend.dtype)
    net = GRU4RecNet(len(SUPPORT), config, generator=torch.Generator().manual_seed(config.seed), attributes=ATTRS).to(backend.dtype)
    trainer = Trainer(net, config, SUPPORT, backend=backend, reference=reference)
    assert trainer.reference == reference and trainer._cpu_step is None
    assert backend.step_form(config, reference=reference, attributes=True) == ("reference" if reference else backend.name)
    draws = torch.Generator().manual_seed(99)
    losses, repeats = [], 0
    for t in range(N_STEPS):
        samples = torch.randint(len(SUPPORT), (config.n_sample,), generator=draws)
        inputs, targets, active, keep = (x[t] for x in (schedule.inputs, schedule.targets, schedule.active, schedule.keep))
        cols = torch.cat((targets, samples))
        repeats += int(cols.unique().shape[0] < cols.shape[0])
        context = torch.randn(config.batch_size, 5, generator=draws).to(backend.dtype) if config.click_context else None
        losses.append(trainer.train_step(inputs, targets, active, keep, samples, context=context))
    assert repeats > 0  # a step whose columns repeat an item (and so its codes)
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    state = {k: v.detach().clone() for k, v in trainer.optimizer.state_dict().items()}
    return losses, weights, state, [h.clone() for h in trainer.hidden]


def _backends() -> list:
    out = [pytest.param(torch.float64, dict(cpu_kernels=False), id="torch-float64")]
    missing = None if cpu_kernels() is not None else "the fused CPU kernels cannot be built here"
    out.append(pytest.param(torch.float32, {}, id="default-float32",
                            marks=[pytest.mark.skip(reason=missing)] if missing else []))
    return out


@pytest.mark.parametrize(("dtype", "switches"), _backends())
@pytest.mark.parametrize("config_name", list(GRID))
def test_fast_step_with_attributes_gives_the_reference_steps(config_name: str, dtype: torch.dtype, switches: dict) -> None:
    loss_rtol, rtol, atol = TOLERANCE[dtype]
    fast_backend = select_backend("cpu", dtype, **switches)
    assert fast_backend.name == ("torch" if dtype == torch.float64 else "cpu-kernels")
    got = _run(config_name, fast_backend, reference=False)
    want = _run(config_name, select_backend("cpu", dtype, cpu_kernels=False), reference=True)
    for t, (a, b) in enumerate(zip(got[0], want[0], strict=True)):
        assert float(a) == pytest.approx(float(b), rel=loss_rtol), f"loss of step {t + 1}"
    for what, g, w in (("weights", got[1], want[1]), ("optimizer", got[2], want[2])):
        assert g.keys() == w.keys()
        for k in w:
            torch.testing.assert_close(g[k], w[k], rtol=rtol, atol=atol, msg=lambda m, k=k, what=what: f"{what}: {k}: {m}")
    for i, (a, b) in enumerate(zip(got[3], want[3], strict=True)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, i=i: f"hidden state {i}: {m}")
    # the attribute tables and the projection did move, and have optimiser state (the test can fail)
    start = GRU4RecNet(len(SUPPORT), Config.from_string(GRID[config_name]),
                       generator=torch.Generator().manual_seed(Config.from_string(GRID[config_name]).seed), attributes=ATTRS)
    for k in ("attributes.tables.0", "attributes.tables.1", "attributes.projection"):
        assert not torch.allclose(got[1][k].double(), start.state_dict()[k].double(), rtol=0, atol=1e-6), k
        assert float(got[1][k][:, -1].abs().sum()) > 0, k  # the bias column learnt (it starts at 0)
    assert float(got[2]["attributes.cat1.acc"].abs().sum()) > 0


def test_the_attribute_step_benchmark_runs_and_its_ratios_are_the_rounds_medians(tmp_path: Path) -> None:
    """benchmarks/train/attribute_step.py on a tiny synthetic folder: the four variants run the
    forms they name (the C step, FastStep plain and with attributes over the same kernels, the
    reference), and the printed ratios are the medians of the per-round ratios."""
    bench = import_module("benchmarks.train.attribute_step")
    subprocess.run([sys.executable, "-m", "gru4rec", "synth", "--kind", "intents-attributes", "--n-sessions", "300",
                    "--seed", "1", "-q", str(tmp_path)], check=True)
    config = Config.from_string("layers=8,batch_size=4,n_sample=16,loss=cross-entropy,constrained_embedding=True")
    trainers, schedule = bench.build(tmp_path, config, ["category", "brand"], 6)
    assert list(trainers) == list(bench.VARIANTS)
    assert trainers["attr fast"].net.attributes is not None and not trainers["attr fast"].reference
    assert trainers["attr reference"].reference and trainers["plain fast"]._cpu_step is None
    wall, cpu = bench.measure(trainers, schedule, steps=2, warmup=1, rounds=3)
    assert all(len(v) == 3 and min(v) > 0 for v in (*wall.values(), *cpu.values()))
    rounds = {"plain c-step": [1.0, 2.0, 4.0], "plain fast": [2.0, 2.0, 2.0], "attr fast": [3.0, 2.0, 10.0],
              "attr reference": [6.0, 6.0, 6.0]}
    text = bench.summary(rounds)
    assert "attr fast / plain fast 1.500x" in text  # ratios 1.5, 1, 5: median 1.5 (not 5/2 of the medians)
    assert "attr fast / plain c-step 2.500x" in text and "attr reference / attr fast 2.000x" in text
