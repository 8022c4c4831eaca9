"""The benchmark scripts' arithmetic and parsing (their timings are not tested)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gru4rec.config import Config
from gru4rec.training.loop import EpochStats

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


train_speed = load("train_speed")
port_compare = load("port_compare")


def hand_count_gflop(batch: int, layers: list[int], n_sample: int, n_distinct: int) -> float:
    """The fast step's multiply-adds, counted by hand: per layer 3 forward and 5 backward products
    (input rows d_in wide), then scores, their backward and the Wy-row gradient over the
    ``n_distinct`` rows of the products (distinct items on the CPU, all columns on a GPU)."""
    total, d_in = 0, layers[-1]
    for n in layers:
        total += d_in * 3 * n + n * 2 * n + n * n  # forward: Wx, Wrz, Wh
        total += n * n + n * n + n * 2 * n + d_in * 3 * n + 3 * n * d_in  # backward: Wh, d_r, Wrz, Wx, d_x
        d_in = n
    total += layers[-1] * 3 * n_distinct  # scores, d, Wy rows
    return 2 * batch * total / 1e9


@pytest.mark.parametrize("layers", [[512], [100], [64, 32]])
def test_step_products_count_the_steps_flops(layers: list[int]) -> None:
    config = Config(batch_size=16, layers=tuple(layers), n_sample=40)
    products, gflop = train_speed.step_products(config, 37.4, torch.device("cpu"), torch.float32)
    assert gflop == pytest.approx(hand_count_gflop(16, layers, 40, 37))
    assert len(products) == 8 * len(layers) + 3


@pytest.mark.parametrize("rows,want", [(2113, 1.9046), (2176, 1.9294)])  # distinct items (CPU); all columns (GPU)
def test_diginetica_step_is_1_9_gflop(rows: int, want: float) -> None:
    config = Config.from_file(ROOT / train_speed.CONFIGS["diginetica"])
    _, gflop = train_speed.step_products(config, rows, torch.device("cpu"), torch.float32)
    assert gflop == pytest.approx(want, abs=1e-4)


def test_epoch_lines_of_both_implementations_parse() -> None:
    ours = EpochStats(epoch=2, loss=8.894735, seconds=6.03, n_steps=1651, n_events=52_484).line()
    port = "Epoch3 --> loss: 7.625124 \t(20.25s) \t[81.49 mb/s | 2592 e/s]"
    assert port_compare.epochs_of(f"noise\n{ours}\nmore noise\n{port}\n") == [pytest.approx(52_484 / 6.03, abs=0.5), 2592.0]
    assert port_compare.epochs_of("Epoch1 --> loss: nan") == []


def test_port_params_follow_the_parameter_file() -> None:
    digi = port_compare.port_params(Config.from_file(ROOT / port_compare.CONFIGS["diginetica"]), epochs=1)
    assert digi["loss"] == "bpr-max" and digi["elu_param"] == 1.0 and digi["layers"] == [512]
    assert digi["n_epochs"] == 1 and digi["batch_size"] == 128 and digi["bpreg"] == 0.9
    rsc15 = port_compare.port_params(Config.from_file(ROOT / port_compare.CONFIGS["rsc15"]), epochs=3)
    assert rsc15["loss"] == "cross-entropy" and rsc15["logq"] == 1.0 and rsc15["sample_alpha"] == 0.5
    assert "elu_param" not in rsc15  # the port's cross-entropy has no final activation


@pytest.mark.parametrize("change", [dict(loss="top1-max"), dict(adapt="rmsprop"), dict(loss="bpr-max", final_act="tanh")])
def test_port_params_refuse_what_the_port_cannot_train(change: dict) -> None:
    with pytest.raises(SystemExit, match="port"):
        port_compare.port_params(Config(**change), epochs=1)


def test_export_benchmarks_format_1_file_is_what_the_reader_reads(tmp_path: Path) -> None:
    """export_speed.py compares file sizes against format 1, which no current code writes: the
    file it rebuilds must be one the format-1 reader accepts, with the model inside."""
    import numpy as np

    from gru4rec import GRU4Rec
    from gru4rec.checkpoint import file_info
    from gru4rec.data import ItemMap
    from gru4rec.model import GRU4RecNet

    export_speed = load("export_speed")
    model = GRU4Rec("layers=4", device="cpu")
    model.item_map = ItemMap.from_ids([5, 7, 9])
    model.item_support = np.array([3, 2, 1], np.int64)
    model.net = GRU4RecNet(3, model.config).eval()
    export_speed.save_format_1(model, tmp_path / "m.pt")
    assert file_info(tmp_path / "m.pt")["format_version"] == 1
    again = GRU4Rec.load(tmp_path / "m.pt", device="cpu")
    assert again.item_map.to_list() == [5, 7, 9]
    np.testing.assert_array_equal(again.score_sessions([[7, 9]]), model.score_sessions([[7, 9]]))


def test_paropt_scale_counts_trials_per_hour_from_the_storage_timestamps(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    import datetime

    paropt_scale = load("paropt_scale")
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=url, study_name="s")
    t0 = datetime.datetime(2026, 1, 1, 12, 0, 0)
    # Three complete trials over 90 s (one of them 60 s long) and a failed one that does not count.
    for start, seconds, state in ((0, 30, "COMPLETE"), (10, 60, "COMPLETE"), (60, 30, "COMPLETE"), (95, 5, "FAIL")):
        trial = optuna.trial.create_trial(state=getattr(optuna.trial.TrialState, state),
                                          value=1.0 if state == "COMPLETE" else None)
        trial.datetime_start = t0 + datetime.timedelta(seconds=start)
        trial.datetime_complete = t0 + datetime.timedelta(seconds=start + seconds)
        study.add_trial(trial)
    assert paropt_scale.trials_per_hour(url, "s") == {"complete": 3, "span_s": 90.0, "trials_per_hour": 120.0,
                                                      "median_trial_s": 30.0}


def test_the_cpu_estimate_of_kernels_counts_computing_operators_once() -> None:
    """gpu_profile's estimate: an operator that computes counts once (not with the operators it
    calls), a view or an allocation counts nothing, a Triton launch counts one."""
    pytest.importorskip("triton")
    gpu_profile = load("gpu_profile")
    from gru4rec.kernels.triton_step import dropout_threshold

    if torch.cuda.is_available():
        pytest.skip("the estimate is for machines without CUDA (a GPU's profiler counts its kernels)")
    x, rows, bias, u = torch.randn(6, 4), torch.tensor([1, 3]), torch.randn(4), torch.rand(100)
    with gpu_profile.counting_triton_launches() as launches, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            y = x.index_select(0, rows)  # 1
            z = torch.addmm(bias, y, x.t().contiguous().t()[:4].t())  # the transpose's copy 1, addmm 1 (not its own copies)
            z.view(-1).mul_(2.0)  # view 0, mul_ 1
            torch.empty(3)  # nothing
            dropout_threshold(u, 0, 0.0, 0.5)  # one Triton launch (the interpreter's own operators: nothing)
    got = gpu_profile.estimate_cpu_kernels(prof.events(), launches[0], steps=2)
    assert got["torch_ops_per_step"] == 4.0 and got["triton_launches_per_step"] == 1.0
    assert got["kernels_per_step_estimate"] == 5.0


def test_retrain_days_keep_sessions_whole_and_in_time_order() -> None:
    """benchmarks/retrain.py's rolling split: a session belongs to the day (or block) it starts
    in, even when it crosses midnight; blocks are consecutive sessions of near-equal count."""
    import pandas as pd

    retrain = load("retrain")
    day = 86_400.0
    events = pd.DataFrame({"SessionId": [1, 1, 2, 2, 3, 4, 4, 5], "ItemId": [1, 2, 3, 4, 5, 6, 7, 8],
                           "Time": [10.0, 20.0, day - 5, day + 5, day + 100, 2 * day + 1, 2 * day + 2, 2 * day + 50]})
    days, how = retrain.split_days(events, "calendar")
    assert how.startswith("calendar") and [sorted(d["SessionId"].unique()) for d in days] == [[1, 2], [3], [4, 5]]
    blocks, how = retrain.split_days(events, "2")
    assert how == "2 blocks of consecutive sessions"
    assert [sorted(d["SessionId"].unique()) for d in blocks] == [[1, 2, 3], [4, 5]]
    assert sum(len(d) for d in blocks) == len(events)
