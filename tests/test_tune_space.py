"""Tests of gru4rec.tune.space: the paramspace format (every dtype, step and log), its error
messages, sampling within the bounds, trial parameter strings, the shipped paramspaces and the
check against the fixed parameters."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.config import Config  # noqa: E402
from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.tune import (  # noqa: E402
    ParamSpec,
    check_paramspace,
    load_paramspace,
    parse_paramspace,
    trial_param_string,
)
from tune_helpers import ROOT  # noqa: E402

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


def test_wide_spaces_have_the_ranges_of_issue_29() -> None:
    # The ranges the issue asks for, written out independently of the files.
    bpr = {s.name: s for s in load_paramspace(ROOT / "paramspaces" / "srgnn_bprmax_wide.json")}
    xe = {s.name: s for s in load_paramspace(ROOT / "paramspaces" / "srgnn_xe_wide.json")}
    assert set(bpr) - set(xe) == {"logq", "bpreg", "final_act"} and set(xe) <= set(bpr)
    for space in (bpr, xe):
        assert (space["n_sample"].low, space["n_sample"].high) == (2048, 16384)
        assert (space["n_epochs"].low, space["n_epochs"].high) == (10, 30)
        assert space["learning_rate"].log and space["learning_rate"].low < 0.05 and space["learning_rate"].high >= 0.25
        layer_tuples = [Config.from_string(f"layers={v}").layers for v in space["layers"].values]
        assert max(max(t) for t in layer_tuples) == 1024 and {len(t) for t in layer_tuples} == {1, 2}
        # The embedding's size and mode: none (0), separate (a size or the layer size), or shared.
        assert set(space["constrained_embedding"].values) == {True, False}
        assert 0 in space["embedding"].values and "layersize" in space["embedding"].values
        for name in ("momentum", "dropout_p_embed", "dropout_p_hidden", "sample_alpha"):
            assert name in space
    assert bpr["logq"].values == (0.0, 1.0) and "linear" in bpr["final_act"].values
    # Valid on top of the GPU script's fixed parameters (benchmarks/gpu/gpu_paropt.py).
    from script_modules import import_module

    gpu_paropt = import_module("benchmarks.gpu.gpu_paropt")
    for key, space in (("bprmax", bpr), ("xe", xe)):
        path, fixed = gpu_paropt.LOSSES[key]
        assert (ROOT / path).name == f"srgnn_{key}_wide.json"
        check_paramspace(list(space.values()), Config.from_string(fixed), fixed)
    # A two-layer choice reaches the model as two layers, through the trial's parameter string.
    trial = optuna.trial.FixedTrial({**{n: s.low if s.dtype != "categorical" else s.values[0] for n, s in bpr.items()},
                                     "layers": "512/512", "embedding": "layersize", "constrained_embedding": False})
    params = {s.name: s.suggest(trial) for s in bpr.values()}
    config = Config.from_string(gpu_paropt.LOSSES["bprmax"][1]).replace_from_string(trial_param_string(list(bpr.values()), params))
    assert config.layers == (512, 512) and config.embedding == 512 and config.embedding_mode == "separate"
