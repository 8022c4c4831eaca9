"""Tests of gru4rec.tune.study: paramspace parsing, studies on synthetic data (best-parameter file,
resume after a kill, several workers on one storage, failed and pruned trials), storage URLs and
the command line.

Every study trains real (tiny) GRU4Rec models through the public API; the numbers a study
reports are checked against models trained and evaluated independently here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

optuna = pytest.importorskip("optuna")

from gru4rec import GRU4Rec, evaluate  # noqa: E402
from gru4rec.config import Config  # noqa: E402
from gru4rec.data.events import read_events, write_events  # noqa: E402
from gru4rec.datasets.synthetic import generate, time_split  # noqa: E402
from gru4rec.errors import ConfigError, Gru4RecError  # noqa: E402
from gru4rec.tune.study import (  # noqa: E402
    STORAGE_ENV,
    ParamSpec,
    ParoptSettings,
    check_paramspace,
    load_paramspace,
    main,
    open_storage,
    parse_paramspace,
    run_study,
    trial_param_string,
)

ROOT = Path(__file__).resolve().parents[1]
TrialState = optuna.trial.TrialState
optuna.logging.set_verbosity(optuna.logging.ERROR)

# Tiny models: a trial takes a fraction of a second on one CPU thread.
FIXED = "loss=cross-entropy,n_sample=16,n_epochs=2,logq=1.0"
SPACE_LINES = [
    '{"name": "layers", "dtype": "int", "values": [8, 24], "step": 8}',
    '{"name": "batch_size", "dtype": "int", "values": [8, 32], "step": 8}',
    '{"name": "learning_rate", "dtype": "float", "values": [0.05, 0.2], "step": 0.05}',
    '{"name": "dropout_p_hidden", "dtype": "float", "values": [0.0, 0.5], "step": 0.25}',
    '{"name": "momentum", "dtype": "float", "values": [0.0, 0.5], "step": 0.1}',
]


# ============================================================================================
# Fixtures
# ============================================================================================


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Synthetic train / valid / test files (about 1.3k / 0.4k / 0.4k events, 60 items)."""
    folder = tmp_path_factory.mktemp("paropt_data")
    df = generate(500, 60, seed=1, n_days=12)
    train_full, test = time_split(df, 2 * 86400)
    train, valid = time_split(train_full, 2 * 86400)
    paths = {"train": folder / "train.tsv", "valid": folder / "valid.tsv", "test": folder / "test.tsv"}
    for name, frame in (("train", train), ("valid", valid), ("test", test)):
        assert len(frame) > 100, name
        write_events(frame, paths[name])
    space = folder / "space.json"
    space.write_text("\n".join(SPACE_LINES) + "\n")
    paths["space"] = space
    return paths


def settings(data: dict[str, Path], tmp: Path, **kw: object) -> ParoptSettings:
    base: dict[str, object] = dict(
        train=str(data["train"]),
        valid=str(data["valid"]),
        paramspace=str(data["space"]),
        fixed=FIXED,
        n_trials=3,
        primary_metric="mrr",
        out=str(tmp / "out"),
        threads=1,
        sampler_seed=0,
    )
    base.update(kw)
    return ParoptSettings(**base)  # type: ignore[arg-type]


def trials_of(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop(STORAGE_ENV, None)
    return env


def cli_args(data: dict[str, Path], **kw: str) -> list[str]:
    args = [str(data["train"]), str(data["valid"]), "-opf", str(data["space"]), "-fp", FIXED, "-pm", "mrr", "--threads", "1"]
    for key, value in kw.items():
        args += [f"--{key.replace('_', '-')}", value] if value != "" else [f"--{key.replace('_', '-')}"]
    return args


class AlwaysPrune(optuna.pruners.BasePruner):
    """A pruner that prunes at every opportunity."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return True


# ============================================================================================
# Paramspace
# ============================================================================================

EVERY_OPTION = "\n".join(
    [
        '{"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}',
        '{"name": "n_sample", "dtype": "int", "values": [16, 4096], "log": true}',
        '{"name": "batch_size", "dtype": "int", "values": [32, 256]}',
        '{"name": "learning_rate", "dtype": "float", "values": [0.01, 0.25], "step": 0.005}',
        '{"name": "lmbd", "dtype": "float", "values": [1e-6, 1e-2], "log": true}',
        '{"name": "momentum", "dtype": "float", "values": [0, 0.9]}',
        "",
        '{"name": "final_act", "dtype": "categorical", "values": ["elu-0.5", "elu-1", "linear"]}',
        '{"name": "constrained_embedding", "dtype": "categorical", "values": [true, false]}',
        '{"name": "n_epochs", "dtype": "categorical", "values": [5, 10]}',
    ]
)


def test_parse_every_dtype_step_and_log() -> None:
    space = parse_paramspace(EVERY_OPTION)
    assert space == [
        ParamSpec("layers", "int", (64, 512), step=32),
        ParamSpec("n_sample", "int", (16, 4096), log=True),
        ParamSpec("batch_size", "int", (32, 256)),
        ParamSpec("learning_rate", "float", (0.01, 0.25), step=0.005),
        ParamSpec("lmbd", "float", (1e-6, 1e-2), log=True),
        ParamSpec("momentum", "float", (0.0, 0.9)),
        ParamSpec("final_act", "categorical", ("elu-0.5", "elu-1", "linear")),
        ParamSpec("constrained_embedding", "categorical", (True, False)),
        ParamSpec("n_epochs", "categorical", (5, 10)),
    ]
    # Line numbers count the blank line.
    assert [s.line for s in space] == [1, 2, 3, 4, 5, 6, 8, 9, 10]
    assert isinstance(space[5].low, float)  # [0, 0.9] of a float parameter: floats


def test_sampled_values_respect_steps_logs_and_bounds() -> None:
    space = parse_paramspace(EVERY_OPTION)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    samples: dict[str, list[object]] = {s.name: [] for s in space}
    for _ in range(300):
        trial = study.ask()
        for spec in space:
            samples[spec.name].append(spec.suggest(trial))
        study.tell(trial, 0.0)
    layers = np.array(samples["layers"])
    assert set(layers) <= set(range(64, 513, 32)) and {64, 512} & set(layers)
    lr = np.array(samples["learning_rate"])
    # On the grid exactly (rounded to the step's digits), not 0.035000000000000003.
    grid = {round(0.01 + 0.005 * k, 3) for k in range(49)}
    assert set(lr.tolist()) <= grid and len(set(lr.tolist())) > 30
    assert all(v == round(v, 3) for v in lr)
    # Log-uniform: the median sits near the geometric middle (1e-4), far below the linear one (5e-3).
    lmbd = np.array(samples["lmbd"])
    assert lmbd.min() >= 1e-6 and lmbd.max() <= 1e-2 and 1e-5 < np.median(lmbd) < 1e-3
    n_sample = np.array(samples["n_sample"])
    assert n_sample.min() >= 16 and n_sample.max() <= 4096 and 64 < np.median(n_sample) < 1024
    assert set(samples["batch_size"]) <= set(range(32, 257))
    assert all(0.0 <= m <= 0.9 for m in samples["momentum"])
    assert set(samples["final_act"]) == {"elu-0.5", "elu-1", "linear"}
    assert set(samples["constrained_embedding"]) == {True, False}
    assert set(samples["n_epochs"]) == {5, 10}


def test_suggest_cleans_values_and_reaches_both_ends() -> None:
    lr = ParamSpec("learning_rate", "float", (0.01, 0.25), step=0.005)
    assert lr.suggest(optuna.trial.FixedTrial({"learning_rate": 0.25})) == 0.25
    assert lr.suggest(optuna.trial.FixedTrial({"learning_rate": 0.035000000000000003})) == 0.035
    layers = ParamSpec("layers", "int", (64, 512), step=32)
    assert layers.suggest(optuna.trial.FixedTrial({"layers": 512})) == 512
    assert layers.contains(96) and not layers.contains(100) and not layers.contains(544)
    assert lr.contains(0.035) and not lr.contains(0.036) and not lr.contains(0.3)


def test_trial_param_string_reads_back_as_the_trial_config() -> None:
    space = parse_paramspace(EVERY_OPTION)
    params = {
        "layers": 96, "n_sample": 100, "batch_size": 48, "learning_rate": 0.035000000000000003, "lmbd": 1.5e-5,
        "momentum": 0.35, "final_act": "elu-1", "constrained_embedding": False, "n_epochs": 5,
    }
    text = trial_param_string(space, params)
    assert text == ("layers=96,n_sample=100,batch_size=48,learning_rate=0.035,lmbd=1.5e-05,momentum=0.35,"
                    "final_act=elu-1,constrained_embedding=False,n_epochs=5")
    config = Config.from_string("loss=bpr-max," + text)
    assert config.layers == (96,)  # an int 'layers' is one layer of that size, as in the original
    assert (config.n_sample, config.batch_size, config.learning_rate, config.lmbd) == (100, 48, 0.035, 1.5e-5)
    assert (config.final_act, config.constrained_embedding, config.n_epochs) == ("elu-1", False, 5)


GOOD = '{"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}'


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('[1, 2]', "expected a JSON object"),
        ('{"name": "batch_size", "dtype": "double", "values": [1, 2]}', "'dtype' must be one of int, float, categorical"),
        ('{"name": "batch_size", "values": [1, 2]}', "'dtype' must be one of"),
        ('{"name": "batch_size", "dtype": "int"}', "missing 'values'"),
        ('{"name": "batch_size", "dtype": "int", "values": []}', "'values' must be a non-empty list"),
        ('{"name": "batch_size", "dtype": "int", "values": 32}', "'values' must be a non-empty list"),
        ('{"name": "batch_size", "dtype": "int", "values": [64]}', "must be [low, high]"),
        ('{"name": "batch_size", "dtype": "int", "values": [256, 32]}', "low > high"),
        ('{"name": "momentum", "dtype": "float", "values": [0.9, 0.1]}', "low > high"),
        ('{"name": "batch_size", "dtype": "int", "values": [1.5, 3]}', "must be integers"),
        ('{"name": "momentum", "dtype": "float", "values": ["a", 1]}', "two finite numbers"),
        ('{"name": "batch_size", "dtype": "int", "values": [32, 256], "step": 0}', "'step' must be a positive number"),
        ('{"name": "batch_size", "dtype": "int", "values": [32, 256], "step": 1.5}', "must be an integer"),
        ('{"name": "momentum", "dtype": "float", "values": [0.0, 1.0], "step": 0.3}', "not a whole number of steps"),
        ('{"name": "batch_size", "dtype": "int", "values": [32, 256], "step": 20}', "not a whole number of steps"),
        ('{"name": "lmbd", "dtype": "float", "values": [0.0, 0.1], "log": true}', "'log' needs low > 0"),
        ('{"name": "lmbd", "dtype": "float", "values": [0.1, 1.0], "log": true, "step": 0.1}', "cannot be combined"),
        ('{"name": "batch_size", "dtype": "int", "values": [32, 256], "log": true, "step": 16}', "cannot be combined"),
        ('{"name": "lmbd", "dtype": "float", "values": [0.1, 1.0], "log": "yes"}', "'log' must be true or false"),
        ('{"name": "final_act", "dtype": "categorical", "values": ["linear"], "step": 1}', "'step' applies to int and float"),
        ('{"name": "final_act", "dtype": "categorical", "values": ["linear"], "log": true}', "'log' applies to int and float"),
        ('{"name": "final_act", "dtype": "categorical", "values": ["elu-1", "elu-1"]}', "listed more than once"),
        ('{"name": "final_act", "dtype": "categorical", "values": ["a,b"]}', "cannot be written in a parameter string"),
        ('{"name": "final_act", "dtype": "categorical", "values": [null]}', "must be a string, number or boolean"),
        ('{"name": "final_act", "dtype": "categorical", "values": [[1, 2]]}', "must be a string, number or boolean"),
        ('{"dtype": "int", "values": [1, 2]}', "'name' must be a non-empty string"),
        ('{"name": " ", "dtype": "int", "values": [1, 2]}', "'name' must be a non-empty string"),
        ('{"name": "batch_size", "dtype": "int", "values": [1, 2], "stpe": 1}', "unknown key(s) 'stpe'"),
        (GOOD, "already defined on line 1"),
    ],
)
def test_malformed_line_is_a_config_error_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_paramspace(GOOD + "\n" + line + "\n", source="'space.json'")
    text = str(info.value)
    assert "line 2" in text and message in text and "'space.json'" in text
    assert "line 1:" not in text  # the good line is not blamed


def test_every_problem_is_reported_at_once() -> None:
    text = "\n".join([GOOD, "{oops", '{"name": "x", "dtype": "int", "values": [3, 1]}'])
    with pytest.raises(ConfigError, match="2 problems") as info:
        parse_paramspace(text)
    assert "line 2: not valid JSON" in str(info.value) and "line 3: low > high" in str(info.value)


def test_empty_or_missing_paramspace(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no parameters"):
        parse_paramspace("\n\n")
    with pytest.raises(ConfigError, match="does not exist"):
        load_paramspace(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="is a directory"):
        load_paramspace(tmp_path)


def test_shipped_paramspaces_match_the_original_ranges() -> None:
    xe = load_paramspace(ROOT / "paramspaces" / "gru4rec_xe_shared_parspace.json")
    bpr = load_paramspace(ROOT / "paramspaces" / "gru4rec_bprmax_shared_parspace.json")
    common = {
        "layers": ("int", (64, 512), 32),
        "batch_size": ("int", (32, 256), 16),
        "learning_rate": ("float", (0.01, 0.25), 0.005),
        "dropout_p_embed": ("float", (0.0, 0.5), 0.05),
        "dropout_p_hidden": ("float", (0.0, 0.7), 0.05),
        "momentum": ("float", (0.0, 0.9), 0.05),
        "sample_alpha": ("float", (0.0, 1.0), 0.1),
    }
    assert {s.name: (s.dtype, s.values, s.step) for s in xe} == common
    assert {s.name: (s.dtype, s.values, s.step) for s in bpr} == {
        **common,
        "bpreg": ("float", (0.0, 2.0), 0.05),
        "final_act": ("categorical", ("elu-0.5", "elu-1", "linear"), None),
    }
    # Both are valid on top of the fixed parameters of the example.
    xe_fixed = "loss=cross-entropy,constrained_embedding=True,logq=1.0,n_sample=2048,n_epochs=10"
    bpr_fixed = "loss=bpr-max,constrained_embedding=True,logq=0.0,n_sample=2048,n_epochs=10"
    check_paramspace(xe, Config.from_string(xe_fixed), xe_fixed)
    check_paramspace(bpr, Config.from_string(bpr_fixed), bpr_fixed)


@pytest.mark.parametrize(
    "line, fixed, message",
    [
        ('{"name": "layer", "dtype": "int", "values": [8, 16]}', "", "unknown parameter (did you mean 'layers'?)"),
        ('{"name": "dropout_p_hidden", "dtype": "float", "values": [0.0, 1.0]}', "", "must be in [0, 1)"),
        ('{"name": "final_act", "dtype": "categorical", "values": ["linear"]}', "loss=cross-entropy", "needs final_act 'softmax'"),
        ('{"name": "batch_size", "dtype": "int", "values": [8, 16]}', "batch_size=32", "both fixed (-fp) and searched"),
        ('{"name": "elu_param", "dtype": "categorical", "values": [0.5, 1]}', "loss=bpr-max,final_act=linear", "both fixed"),
    ],
)
def test_space_checked_against_the_fixed_parameters(line: str, fixed: str, message: str) -> None:
    space = parse_paramspace(line)
    with pytest.raises(ConfigError) as info:
        check_paramspace(space, Config.from_string(fixed), fixed)
    assert message in str(info.value) and "line 1" in str(info.value)


# ============================================================================================
# Studies
# ============================================================================================


def test_three_trial_study_writes_best_parameters_that_reproduce_its_value(data: dict[str, Path], tmp_path: Path) -> None:
    s = settings(data, tmp_path, final_test=str(data["test"]), final_measure=(5, 20))
    report = run_study(s)
    storage = f"sqlite:///{tmp_path / 'out' / 'paropt.db'}"
    trials = trials_of(storage, report.study_name)
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state == TrialState.COMPLETE for t in trials)
    assert report.counts == {"COMPLETE": 3} and report.problems == []
    best = max(trials, key=lambda t: t.value)
    assert (report.best_number, report.best_value) == (best.number, best.value)
    # After each epoch the metric is reported; the objective is the last epoch's.
    assert all(sorted(t.intermediate_values) == [0, 1] and t.intermediate_values[1] == t.value for t in trials)

    space = load_paramspace(data["space"])
    params = json.loads(Path(report.files["best_json"]).read_text())
    for spec in space:
        value = params[spec.name][0] if spec.name == "layers" else params[spec.name]
        assert spec.contains(value), (spec.name, value)
        assert value == spec.clean(best.params[spec.name])
    assert {k: params[k] for k in ("loss", "n_sample", "n_epochs", "logq")} == {
        "loss": "cross-entropy", "n_sample": 16, "n_epochs": 2, "logq": 1.0}
    # Both files and the printed string describe the same configuration.
    from_json = Config.from_file(report.files["best_json"])
    assert Config.from_file(report.files["best_py"]) == from_json
    assert Config.from_string(report.best_param_string) == from_json

    # Independent reference: train the best configuration here and evaluate it on VALID.
    train, valid = read_events(data["train"]), read_events(data["valid"])
    model = GRU4Rec(from_json, device="cpu").fit(train, progress=False)
    assert evaluate(model, valid, cutoffs=(20,)).mrr[20] == pytest.approx(report.best_value, abs=1e-9)

    # The final test: TRAIN+VALID -> TEST at the -fm cutoffs.
    full = GRU4Rec(from_json, device="cpu").fit(pd.concat([train, valid], ignore_index=True), progress=False)
    result = evaluate(full, read_events(data["test"]), cutoffs=(5, 20))
    assert report.final is not None
    for c in (5, 20):
        assert report.final["recall"][str(c)] == pytest.approx(result.recall[c], abs=1e-9)
        assert report.final["mrr"][str(c)] == pytest.approx(result.mrr[c], abs=1e-9)

    # Exports hold every trial.
    csv = pd.read_csv(report.files["trials_csv"])
    assert csv["number"].tolist() == [0, 1, 2] and csv["value"].tolist() == pytest.approx([t.value for t in trials])
    exported = json.loads(Path(report.files["trials_json"]).read_text())
    assert [r["state"] for r in exported] == ["COMPLETE"] * 3
    summary = json.loads(Path(report.files["summary"]).read_text())
    assert summary["best_trial"] == best.number and summary["final_test"]["recall"]["20"] == report.final["recall"]["20"]

    # Outputs are not overwritten without --force.
    with pytest.raises(Gru4RecError, match="--force"):
        run_study(s)


def test_resume_continues_numbering_and_total_counts_the_study(data: dict[str, Path], tmp_path: Path) -> None:
    first = run_study(settings(data, tmp_path, n_trials=2, study_name="resume"))
    assert first.counts == {"COMPLETE": 2}
    # Same study, same storage: -nt runs that many more; numbering continues.
    second = run_study(settings(data, tmp_path, n_trials=1, study_name="resume", force=True))
    assert second.counts == {"COMPLETE": 3}
    # --total: only the trials missing to reach 4 finished ones; a second call runs none.
    run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume", force=True))
    report = run_study(settings(data, tmp_path, n_trials=4, total=True, study_name="resume", force=True))
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "resume")
    assert [t.number for t in trials] == [0, 1, 2, 3] and report.counts == {"COMPLETE": 4}
    # A study that optimises something else is not silently mixed in.
    with pytest.raises(ConfigError, match="optimises something else") as info:
        run_study(settings(data, tmp_path, fixed=FIXED.replace("n_epochs=2", "n_epochs=3"), study_name="resume", force=True))
    assert "n_epochs" in str(info.value)
    with pytest.raises(ConfigError, match="metric"):
        run_study(settings(data, tmp_path, primary_metric="recall", study_name="resume", force=True))
    # ... but the order of the fixed parameters does not matter.
    reordered = ",".join(reversed(FIXED.split(",")))
    run_study(settings(data, tmp_path, fixed=reordered, n_trials=4, total=True, study_name="resume", force=True))


def test_killed_run_resumes_on_the_same_sqlite_file(data: dict[str, Path], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [sys.executable, str(ROOT / "paropt.py"), *cli_args(data, storage=storage, study_name="killed", out=str(tmp_path / "a"))]
    command += ["-nt", "1000", "--no-pruning"]
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        completed = 0
        while completed < 2:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the worker did not finish 2 trials"
            time.sleep(0.2)
            try:
                completed = sum(t.state == TrialState.COMPLETE for t in trials_of(storage, "killed"))
            except KeyError:  # the study does not exist yet
                continue
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        if process.stderr:
            process.stderr.close()
    before = trials_of(storage, "killed")
    n_before = sum(t.state == TrialState.COMPLETE for t in before)
    assert n_before >= 2
    # The trial the kill interrupted (if any) stays RUNNING until its heartbeat expires.
    assert {t.state for t in before} <= {TrialState.COMPLETE, TrialState.RUNNING}

    target = n_before + 2
    report = run_study(settings(data, tmp_path, storage=storage, study_name="killed", n_trials=target, total=True,
                                pruning=False, out=str(tmp_path / "b")))
    after = trials_of(storage, "killed")
    numbers = [t.number for t in after]
    assert numbers == list(range(len(before) + 2))  # new trials continue the numbering, none lost
    assert [t.state for t in after[: len(before)]] == [t.state for t in before]
    assert all(t.state == TrialState.COMPLETE for t in after[len(before):])
    assert report.counts["COMPLETE"] == target


def test_two_worker_processes_share_one_study(data: dict[str, Path], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    processes = []
    for worker in range(2):
        args = cli_args(data, storage=storage, study_name="shared", out=str(tmp_path / f"w{worker}"), seed=str(worker))
        processes.append(subprocess.Popen([sys.executable, str(ROOT / "paropt.py"), *args, "-nt", "3"],
                                          env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=300)[0].decode() for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    trials = trials_of(storage, "shared")
    assert sorted(t.number for t in trials) == list(range(6))  # no duplicate, none lost
    assert all(t.state == TrialState.COMPLETE for t in trials)
    workers = [t.user_attrs["worker"] for t in trials]
    assert len(set(workers)) == 2 and sorted(workers.count(w) for w in set(workers)) == [3, 3]


def test_local_workers_on_a_journal_storage(data: dict[str, Path], tmp_path: Path) -> None:
    journal = tmp_path / "journal.log"
    report = run_study(settings(data, tmp_path, storage=f"journal:{journal}", study_name="journal", n_trials=4,
                                workers=2, pruning=False))
    storage, _ = open_storage(f"journal:{journal}")
    trials = optuna.load_study(study_name="journal", storage=storage).get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2, 3] and report.counts == {"COMPLETE": 4}
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # the spawned worker ran its share


def test_failed_trials_are_recorded_with_their_reason_and_the_study_goes_on(data: dict[str, Path], tmp_path: Path) -> None:
    # bpr-max + label smoothing is an invalid combination (each value alone is valid).
    space = parse_paramspace('{"name": "loss", "dtype": "categorical", "values": ["cross-entropy", "bpr-max"]}\n'
                             '{"name": "smoothing", "dtype": "categorical", "values": [0.0, 0.1]}')
    grid = optuna.samplers.GridSampler({"loss": ["cross-entropy", "bpr-max"], "smoothing": [0.0, 0.1]}, seed=0)
    fixed = "layers=8,batch_size=16,n_sample=16,n_epochs=1"
    report = run_study(settings(data, tmp_path, paramspace=space, fixed=fixed, n_trials=4, study_name="fail"), sampler=grid)
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "fail")
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(trials) == 4 and len(failed) == 1 and report.counts == {"COMPLETE": 3, "FAIL": 1}
    assert failed[0].params == {"loss": "bpr-max", "smoothing": 0.1}
    assert failed[0].user_attrs["fail_reason"].startswith("ConfigError:") and "smoothing" in failed[0].user_attrs["fail_reason"]
    assert report.best_number is not None and report.best_number != failed[0].number

    # A diverging training (NaN loss) is a FAIL too.
    space = parse_paramspace('{"name": "learning_rate", "dtype": "categorical", "values": [0.05, 1e30]}')
    grid = optuna.samplers.GridSampler({"learning_rate": [0.05, 1e30]}, seed=0)
    fixed = "loss=bpr-max,final_act=linear,adapt=sgd,layers=8,batch_size=16,n_sample=16,n_epochs=2"
    report = run_study(settings(data, tmp_path, paramspace=space, fixed=fixed, n_trials=2, study_name="nan", force=True),
                       sampler=grid)
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "nan")
    by_lr = {t.params["learning_rate"]: t for t in trials}
    assert by_lr[1e30].state == TrialState.FAIL and by_lr[0.05].state == TrialState.COMPLETE
    assert by_lr[1e30].user_attrs["fail_reason"].startswith("TrainingDivergedError:")


def test_a_space_where_every_trial_fails_stops_early(data: dict[str, Path], tmp_path: Path) -> None:
    from gru4rec.tune.study import MAX_CONSECUTIVE_FAILURES

    space = parse_paramspace('{"name": "loss", "dtype": "categorical", "values": ["bpr-max"]}\n'
                             '{"name": "smoothing", "dtype": "categorical", "values": [0.1]}')
    # --total would otherwise never end: failed trials do not count.
    report = run_study(settings(data, tmp_path, paramspace=space, fixed="n_sample=16,n_epochs=1", n_trials=5, total=True,
                                study_name="hopeless"))
    assert report.counts == {"FAIL": MAX_CONSECUTIVE_FAILURES}
    assert any(f"stopped after {MAX_CONSECUTIVE_FAILURES} failed trials in a row" in p for p in report.problems)
    assert "no trial completed" in report.problems and report.best_param_string is None


def test_pruning(data: dict[str, Path], tmp_path: Path) -> None:
    report = run_study(settings(data, tmp_path, n_trials=2, study_name="pruned"), pruner=AlwaysPrune())
    trials = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "pruned")
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    assert report.best_number is None and "no trial completed" in report.problems
    # Pruned after the first of two epochs; the reported value is that of a 1-epoch model.
    base = Config.from_string(FIXED)
    train, valid = read_events(data["train"]), read_events(data["valid"])
    for t in trials:
        assert list(t.intermediate_values) == [0] and t.user_attrs["epochs"] == 1
        config = base.replace_from_string(t.user_attrs["param_string"]).replace(n_epochs=1)
        model = GRU4Rec(config, device="cpu").fit(train, progress=False)
        assert evaluate(model, valid, cutoffs=(20,)).mrr[20] == pytest.approx(t.intermediate_values[0], abs=1e-9)
    # The last epoch's result is kept: a 1-epoch trial is never pruned.
    run_study(settings(data, tmp_path, n_trials=1, study_name="last", fixed=FIXED.replace("n_epochs=2", "n_epochs=1"),
                       force=True), pruner=AlwaysPrune())
    assert [t.state for t in trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "last")] == [TrialState.COMPLETE]
    # --no-pruning: no per-epoch validation, only the final value.
    run_study(settings(data, tmp_path, n_trials=1, study_name="nopruning", pruning=False, force=True))
    (t,) = trials_of(f"sqlite:///{tmp_path / 'out' / 'paropt.db'}", "nopruning")
    assert t.state == TrialState.COMPLETE and t.intermediate_values == {}


# ============================================================================================
# Storage and command line
# ============================================================================================


def test_storage_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    _, url = open_storage(None, tmp_path / "o")
    assert url == f"sqlite:///{(tmp_path / 'o' / 'paropt.db').resolve()}"
    monkeypatch.setenv(STORAGE_ENV, f"sqlite:///{tmp_path / 'env.db'}")
    assert open_storage(None, tmp_path)[1] == f"sqlite:///{tmp_path / 'env.db'}"
    assert open_storage(str(tmp_path / "x.db"), tmp_path)[1] == f"sqlite:///{(tmp_path / 'x.db').resolve()}"
    storage, url = open_storage(str(tmp_path / "j.log"), tmp_path)
    assert url == f"journal:{(tmp_path / 'j.log').resolve()}"
    assert isinstance(storage, optuna.storages.JournalStorage)
    with pytest.raises(Gru4RecError, match="cannot open the Optuna storage"):
        open_storage("nosuchdb://user:secret@host/db", tmp_path)
    try:
        open_storage("nosuchdb://user:secret@host/db", tmp_path)
    except Gru4RecError as exc:
        assert "secret" not in str(exc)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_trials": 0}, "-nt must be >= 1"),
        ({"measure": 0}, "-m must be >= 1"),
        ({"final_measure": (20, 0)}, "-fm needs cutoffs >= 1"),
        ({"primary_metric": "ndcg"}, "-pm must be one of"),
        ({"eval_mode": "pessimistic"}, "-e must be one of"),
        ({"workers": 0}, "--workers must be >= 1"),
        ({"threads": 0}, "--threads must be >= 1"),
        ({"fixed": "n_epochs=zero"}, "fixed parameters (-fp)"),
    ],
)
def test_invalid_settings(data: dict[str, Path], tmp_path: Path, change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_study(settings(data, tmp_path, **change))
    assert message in str(info.value)


def test_command_lines(data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Invalid input: exit code 2 and one line on stderr.
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "layers", "dtype": "int", "values": [64]}\n')
    assert main([str(data["train"]), str(data["valid"]), "-opf", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid paramspace") and "line 1" in err and "Traceback" not in err
    # Missing data: the same, before any storage is created.
    assert main([str(tmp_path / "nope.tsv"), str(data["valid"]), "-opf", str(data["space"]), "--out", str(tmp_path / "m")]) == 2
    assert "nope.tsv: file not found" in capsys.readouterr().err and not (tmp_path / "m").exists()
    # `gru4rec paropt` runs the same command.
    from gru4rec import cli

    out = tmp_path / "cli"
    code = cli.main(["paropt", *cli_args(data, out=str(out), study_name="cli"), "-nt", "1", "-m", "5", "-fm", "5", "10",
                     "--final-test", str(data["test"])])
    printed = capsys.readouterr().out
    assert code == 0
    assert "Best parameters: loss=cross-entropy,n_sample=16,n_epochs=2,logq=1.0,layers=" in printed
    assert "Recall@5: " in printed and "MRR@10: " in printed
    assert (out / "cli.best.json").is_file() and (out / "cli.best.py").is_file() and (out / "paropt.db").is_file()
