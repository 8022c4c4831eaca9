"""The benchmark scripts' arithmetic and parsing (their timings are not tested)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gru4rec.config import Config
from gru4rec.training.loop import EpochStats
from script_modules import import_module

ROOT = Path(__file__).resolve().parents[1]


workloads = import_module("benchmarks.workloads")
port_compare = import_module("benchmarks.train.port_compare")

#: Every module of the benchmarks package, as ``python -m`` names it.
BENCHMARK_MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                           for p in (ROOT / "benchmarks").rglob("*.py") if p.name != "__init__.py")


def test_benchmarks_import_as_modules_without_touching_sys_path() -> None:
    """Each benchmark is a module of the package, run as ``python -m benchmarks.<subject>.<name>``
    from the root: importing it must not put folders on ``sys.path`` (the scripts used to, to find
    gru4rec and each other), and each script has the ``main`` its ``-m`` entry calls."""
    assert len(BENCHMARK_MODULES) >= 20 and "benchmarks.workloads" in BENCHMARK_MODULES
    for name in BENCHMARK_MODULES:
        before = list(sys.path)
        sys.modules.pop(name, None)  # imported afresh, so that its module-level code runs here
        module = import_module(name)
        assert sys.path == before, f"importing {name} changed sys.path: {len(before)} entries, now {len(sys.path)}, first {sys.path[:2]}"
        assert name == "benchmarks.workloads" or callable(getattr(module, "main", None)), name


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
    products, gflop = workloads.step_products(config, 37.4, torch.device("cpu"), torch.float32)
    assert gflop == pytest.approx(hand_count_gflop(16, layers, 40, 37))
    assert len(products) == 8 * len(layers) + 3


@pytest.mark.parametrize("rows,want", [(2113, 1.9046), (2176, 1.9294)])  # distinct items (CPU); all columns (GPU)
def test_diginetica_step_is_1_9_gflop(rows: int, want: float) -> None:
    config = Config.from_file(ROOT / workloads.CONFIGS["diginetica"])
    _, gflop = workloads.step_products(config, rows, torch.device("cpu"), torch.float32)
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
    from gru4rec.data import ItemMap
    from gru4rec.formats.checkpoint import file_info
    from gru4rec.network.gru import GRU4RecNet

    export_speed = import_module("benchmarks.pipeline.export_speed")
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

    paropt_scale = import_module("benchmarks.pipeline.paropt_scale")
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
    gpu_profile = import_module("benchmarks.gpu.gpu_profile")
    from gru4rec.kernels.triton_step import dropout_threshold

    if torch.cuda.is_available():
        pytest.skip("the estimate is for machines without CUDA (a GPU's profiler counts its kernels)")
    x, rows, bias, u = torch.randn(6, 4), torch.tensor([1, 3]), torch.randn(4), torch.rand(100)
    with (
        gpu_profile.counting_triton_launches() as launches,
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
    ):
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
    """benchmarks/train/retrain.py's rolling split: a session belongs to the day (or block) it starts
    in, even when it crosses midnight; blocks are consecutive sessions of near-equal count."""
    import pandas as pd

    retrain = import_module("benchmarks.train.retrain")
    day = 86_400.0
    events = pd.DataFrame({"SessionId": [1, 1, 2, 2, 3, 4, 4, 5], "ItemId": [1, 2, 3, 4, 5, 6, 7, 8],
                           "Time": [10.0, 20.0, day - 5, day + 5, day + 100, 2 * day + 1, 2 * day + 2, 2 * day + 50]})
    days, how = retrain.split_days(events, "calendar")
    assert how.startswith("calendar") and [sorted(d["SessionId"].unique()) for d in days] == [[1, 2], [3], [4, 5]]
    blocks, how = retrain.split_days(events, "2")
    assert how == "2 blocks of consecutive sessions"
    assert [sorted(d["SessionId"].unique()) for d in blocks] == [[1, 2, 3], [4, 5]]
    assert sum(len(d) for d in blocks) == len(events)


# ---------------------------------------------------------------------- pipeline/scale.py


def test_scale_child_peak_rss_is_each_process_own(tmp_path: Path) -> None:
    """The per-stage figure comes from os.wait4: a child that touches 300 MB shows about that,
    and a smaller child after it shows its own smaller peak (RUSAGE_CHILDREN would not)."""
    scale = import_module("benchmarks.pipeline.scale")
    env = dict(__import__("os").environ)

    def peak_mb(mb: int) -> float:
        code = f"b = b'x' * ({mb} * 2**20)"  # every page written
        child = scale.Child(f"alloc{mb}", [sys.executable, "-c", code], env=env, logs=tmp_path, rss_limit_kb=None, timeout_s=60)
        child.wait()
        assert child.rc == 0 and child.wall_s > 0
        return child.maxrss_kb / 1024

    big, small = peak_mb(300), peak_mb(20)
    assert 300 <= big < 300 + 60
    assert 20 <= small < 20 + 60 and small < big - 200


def test_scale_child_over_the_rss_limit_is_killed(tmp_path: Path) -> None:
    scale = import_module("benchmarks.pipeline.scale")
    code = "import time\nb = b'x' * (400 * 2**20)\ntime.sleep(30)"
    child = scale.Child("greedy", [sys.executable, "-c", code], env=dict(__import__("os").environ), logs=tmp_path,
                        rss_limit_kb=200 * 1024, timeout_s=60)
    assert child.wait(20)
    assert child.rc == -9 and "RSS" in child.killed and child.wall_s < 20


def test_synth_plan_leaves_room_for_the_test_sessions() -> None:
    scale = import_module("benchmarks.pipeline.scale")
    n, days = scale.synth_plan(120_000, 10_000)
    share = days / scale.SYNTH_DAYS
    assert n * (1 - share) >= 120_000 * 1.04  # train_full: sessions before the test window
    assert n * share * 0.75 >= 10_000  # test: even if a quarter drops out (items unseen in training)


def test_scale_run_at_a_tiny_size_is_consistent(tmp_path: Path) -> None:
    """benchmarks/pipeline/scale.py end to end at a tiny size (≈30 s): the table's figures against the
    files the commands wrote and facts computed here from the data."""
    import importlib.util as iu
    import subprocess

    import numpy as np
    import pandas as pd

    stages = ["synth", "train", "evaluate", "recommend", "export"]
    if iu.find_spec("fastapi") and iu.find_spec("uvicorn"):
        stages.append("serve")
    work, out_json, k = tmp_path / "work", tmp_path / "scale.json", 5
    started = __import__("time").perf_counter()
    run = subprocess.run([sys.executable, "-m", "benchmarks.pipeline.scale", "--n-items", "2000", "--sessions", "300",
                          "--eval-sessions", "50", "--recommend-sessions", "100,200", "--serve-sessions", "20", "-k", str(k),
                          "--stages", ",".join(stages), "--work", str(work), "--json", str(out_json), "--threads", "1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    elapsed = __import__("time").perf_counter() - started
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = __import__("json").loads(out_json.read_text())
    rows = {r["stage"]: r for r in report["stages"]}
    assert all(r["ok"] for r in rows.values()), [r["note"] for r in rows.values() if not r["ok"]]

    # The printed table says what the JSON says.
    table = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [cells[0].strip() for cells in table] == list(rows)
    for cells in table:
        r = rows[cells[0].strip()]
        for cell, key, digits in ((cells[2], "wall_s", 2), (cells[4], "peak_rss_mb", 0), (cells[5], "above_model_mb", 0)):
            if r[key] is None:
                assert cell.strip() == "—"
            else:
                assert float(cell.replace(",", "")) == pytest.approx(round(r[key], digits), abs=10 ** -digits)

    # The data: the sizes asked for, counted here.
    train = pd.read_csv(work / "data" / "train_full.tsv", sep="\t")
    test = pd.read_csv(work / "data" / "test.tsv", sep="\t")
    assert train["SessionId"].nunique() >= 300 and test["SessionId"].nunique() >= 50
    assert report["data"]["train_sessions"] == train["SessionId"].nunique()

    # The model file: ≈ 4 bytes per float32 parameter, from the training items and layers=100,
    # plus the item ids (8-byte supports, ids in the header) and a small header.
    n_items, layers = train["ItemId"].nunique(), 100
    params = n_items * (layers + 1) + layers * 3 * layers + layers * layers + layers * 2 * layers + 3 * layers
    size = (work / "model.safetensors").stat().st_size
    assert report["model"]["n_items"] == n_items and report["model"]["parameters"] == params
    assert rows["train"]["extra"]["model_bytes"] == size == report["model"]["bytes"]
    assert 4 * params + 8 * n_items <= size <= 4 * params + 8 * n_items + 20 * n_items + 64 * 1024

    # recommend: one row per input session and rank, k of them, for exactly the first N sessions.
    for n in (100, 200):
        r = rows[f"recommend {n:,}"]
        assert r["sessions"] == n
        recs = pd.read_csv(r["extra"]["output"], sep="\t")
        assert len(recs) == n * k and r["extra"]["output_bytes"] == Path(r["extra"]["output"]).stat().st_size
        assert list(recs["SessionId"].unique()) == list(train["SessionId"].unique()[:n])
        assert (
            recs.groupby("SessionId")["Rank"].agg(list) == pd.Series([list(range(1, k + 1))] * n, index=recs["SessionId"].unique())
        ).all()
        assert not recs["Fallback"].any()

    # Memory: every figure positive and no more than the machine; "above model" = peak - model-only.
    model_mb = report["model_only_rss_mb"]
    assert model_mb == rows["model only (1 session)"]["peak_rss_mb"] and 50 < model_mb < 4096
    for r in rows.values():
        assert r["peak_rss_mb"] > 0
        if r["above_model_mb"] is not None:
            assert r["above_model_mb"] == pytest.approx(r["peak_rss_mb"] - model_mb)
        if r["sessions"]:
            assert r["s_per_1k_sessions"] == pytest.approx(r["wall_s"] / r["sessions"] * 1000)
    assert rows["recommend 200"]["peak_rss_mb"] < 2 * model_mb  # a tiny input costs little beyond the model
    assert sum(r["wall_s"] for r in rows.values()) < elapsed  # the stages ran one after the other inside the run

    # evaluate and the exports
    assert 0 <= rows["evaluate"]["extra"]["recall_20"] <= 1
    items = np.load(work / "exports" / "items.npy", allow_pickle=False)
    assert len(items) == n_items and rows["export item-embeddings"]["extra"]["bytes"] == (work / "exports" / "items.npy").stat().st_size
    assert len(np.load(work / "exports" / "sessions.npy", allow_pickle=False)) == 50

    if "serve" in stages:
        e, first = rows["serve"]["extra"], test[test["SessionId"].isin(test["SessionId"].unique()[:20])]
        assert rows["serve"]["sessions"] == 20 and e["sessions_held"] == 20
        assert e["requests"] == e["good_answers"] == len(first) and e["errors"] == 0
        assert 0 < e["latency_ms_p50"] <= e["latency_ms_p99"] < rows["serve"]["wall_s"] * 1000
        assert e["requests_per_s"] * rows["serve"]["wall_s"] == pytest.approx(len(first))
        assert e["exit_code"] == 0 and e["maxrss_at_exit_mb"] >= rows["serve"]["peak_rss_mb"] - 1
