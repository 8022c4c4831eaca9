"""Config: defaults, parsing of every type, round trips, parameter files and every error kind."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gru4rec.config import Config
from gru4rec.config.param_files import read_param_file
from gru4rec.errors import ConfigError

PARAMFILES = Path(__file__).resolve().parents[1] / "paramfiles"

# The defaults of docs/behaviour.md §7, written out independently of config.py.
DOCUMENTED_DEFAULTS: dict[str, Any] = {
    "loss": "cross-entropy", "final_act": "softmax", "hidden_act": "tanh", "layers": (100,),
    "n_epochs": 10, "batch_size": 64, "dropout_p_embed": 0.0, "dropout_p_hidden": 0.0,
    "dropout_p_id": 0.0, "learning_rate": 0.05, "momentum": 0.0, "lmbd": 0.0, "embedding": 0,
    "constrained_embedding": True, "click_context": False, "n_sample": 2048, "sample_alpha": 0.5,
    "sample_store_size": 10_000_000, "smoothing": 0.0, "adapt": "adagrad", "adapt_params": (),
    "grad_cap": 0.0, "bpreg": 1.0, "logq": 0.0, "sigma": 0.0, "init_as_normal": False,
    "train_random_order": False, "time_sort": True, "seed": 42, "repeat_weight": 0.0, "repeat_decay": 1.0,
    "session_key": "SessionId", "item_key": "ItemId", "time_key": "Time",
}

# The table of published best settings (docs/behaviour.md §7):
# name: (loss, final_act, layer, batch, drop_emb, drop_hid, lr, momentum, alpha, bpreg, logq)
PUBLISHED = {
    "rsc15_xe_shared_100_best": ("cross-entropy", "softmax", 100, 32, 0.0, 0.4, 0.2, 0.2, 0.5, 0.0, 1.0),
    "yoochoose_xe_shared_480_best": ("cross-entropy", "softmax", 480, 48, 0.0, 0.2, 0.07, 0.0, 0.2, 0.0, 1.0),
    "rees46_xe_shared_512_best": ("cross-entropy", "softmax", 512, 240, 0.45, 0.0, 0.065, 0.0, 0.5, 0.0, 1.0),
    "coveo_bprmax_shared_512_best": ("bpr-max", "elu-1", 512, 144, 0.35, 0.0, 0.05, 0.4, 0.2, 1.85, 0.0),
    "retailrocket_bprmax_shared_224_best": ("bpr-max", "elu-0.5", 224, 80, 0.5, 0.05, 0.05, 0.4, 0.4, 1.95, 0.0),
    "diginetica_bprmax_shared_512_best": ("bpr-max", "elu-1", 512, 128, 0.5, 0.3, 0.05, 0.15, 0.3, 0.9, 0.0),
}


def problems_of(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    problems = excinfo.value.problems
    assert isinstance(problems, list)
    return problems


# ------------------------------------------------------------------------------ defaults


def test_defaults_equal_the_documented_ones() -> None:
    cfg = Config()
    assert Config.field_names() == tuple(DOCUMENTED_DEFAULTS)
    assert {name: getattr(cfg, name) for name in Config.field_names()} == DOCUMENTED_DEFAULTS
    assert Config.from_string("") == cfg == Config.from_dict({})
    assert cfg.resolved_adapt_params == ()
    assert cfg.embedding_mode == "shared"


@pytest.mark.parametrize(
    ("loss", "final_act"),
    [("cross-entropy", "softmax"), ("xe_logit", "softmax_logit"), ("bpr-max", "elu-0.5"),
     ("top1-max", "elu-0.5"), ("bpr", "elu-0.5"), ("top1", "elu-0.5")],
)
def test_final_act_derived_from_loss(loss: str, final_act: str) -> None:
    cfg = Config(loss=loss)
    assert cfg.final_act == final_act
    assert cfg.final_activation.spec == final_act


@pytest.mark.parametrize(
    ("adapt", "given", "resolved"),
    [("adagrad", (), ()), ("sgd", (), ()), ("rmsprop", (), (0.9,)), ("rmsprop", (0.8,), (0.8,)),
     ("adadelta", (), (0.95,)), ("adam", (), (0.9, 0.999)), ("adam", (0.5, 0.99), (0.5, 0.99))],
)
def test_resolved_adapt_params(adapt: str, given: tuple[float, ...], resolved: tuple[float, ...]) -> None:
    assert Config(adapt=adapt, adapt_params=given).resolved_adapt_params == resolved


# ------------------------------------------------------------------------------ parsing


def test_from_string_every_type() -> None:
    cfg = Config.from_string(
        " loss = bpr-max ,final_act=ELU-1,hidden_act=selu-1.0507-1.6733,layers=200/100,n_epochs=3,"
        "batch_size=32,dropout_p_embed=0.25,dropout_p_hidden=.5,learning_rate=1e-2,momentum=0.1,"
        "lmbd=0,embedding=16,constrained_embedding=False,click_context=true,n_sample=0,sample_alpha=1,"
        "sample_store_size=1e6,smoothing=0,adapt=adam,adapt_params=0.8/0.99,grad_cap=5,bpreg=1.5,"
        "logq=0.5,sigma=0.01,init_as_normal=true,train_random_order=1,time_sort=0,seed=7,"
        "repeat_weight=1.5,repeat_decay=0.5,session_key=sid,item_key=iid,time_key=ts,"  # a trailing comma is tolerated
    )
    want = {
        "loss": "bpr-max", "final_act": "elu-1", "hidden_act": "selu-1.0507-1.6733",
        "layers": (200, 100), "n_epochs": 3, "batch_size": 32, "dropout_p_embed": 0.25,
        "dropout_p_hidden": 0.5, "dropout_p_id": 0.0, "learning_rate": 0.01, "momentum": 0.1, "lmbd": 0.0,
        "embedding": 16, "constrained_embedding": False, "click_context": True, "n_sample": 0, "sample_alpha": 1.0,
        "sample_store_size": 1_000_000, "smoothing": 0.0, "adapt": "adam",
        "adapt_params": (0.8, 0.99), "grad_cap": 5.0, "bpreg": 1.5, "logq": 0.5, "sigma": 0.01,
        "init_as_normal": True, "train_random_order": True, "time_sort": False, "seed": 7,
        "repeat_weight": 1.5, "repeat_decay": 0.5, "session_key": "sid", "item_key": "iid", "time_key": "ts",
    }
    assert {name: getattr(cfg, name) for name in Config.field_names()} == want
    for name, value in want.items():  # exact types, not just equal values
        assert type(getattr(cfg, name)) is type(value), name
    assert cfg.embedding_mode == "separate"


@pytest.mark.parametrize(
    ("text", "value"),
    [("True", True), ("true", True), ("1", True), ("False", False), ("false", False), ("0", False)],
)
def test_boolean_spellings(text: str, value: bool) -> None:
    assert Config.from_string(f"time_sort={text}").time_sort is value


def test_single_layer_and_empty_list() -> None:
    assert Config.from_string("layers=512").layers == (512,)
    assert Config(layers=[300, 20]).layers == (300, 20)  # lists become tuples
    assert Config(layers=64).layers == (64,)
    assert Config.from_string("adapt=rmsprop,adapt_params=").adapt_params == ()


def test_embedding_layersize_and_modes() -> None:
    cfg = Config.from_string("embedding=layersize,layers=80/40,constrained_embedding=False")
    assert cfg.embedding == 80 and cfg.embedding_mode == "separate"
    assert Config(embedding="layersize", layers=(32,)).embedding == 32
    assert Config(constrained_embedding=False).embedding_mode == "none"
    # replace() derives it again from the new layers
    assert cfg.replace(layers=(10,)).embedding == 10
    assert cfg.replace(layers=(10,), embedding=3).embedding == 3


@pytest.mark.parametrize(
    ("alias", "final_act"), [("0.5", "elu-0.5"), ("1", "elu-1"), ("0", "linear"), ("0.0", "linear")]
)
def test_elu_param_alias(alias: str, final_act: str) -> None:
    assert Config.from_string(f"loss=bpr-max,elu_param={alias}").final_act == final_act
    assert Config.from_dict({"loss": "top1-max", "elu_param": float(alias)}).final_act == final_act


def test_elu_param_ignored_with_softmax_losses() -> None:
    # The official ports' cross-entropy param files carry ('elu_param', 0): they must keep working.
    assert Config.from_dict({"loss": "cross-entropy", "elu_param": 0}).final_act == "softmax"
    assert Config.from_string("elu_param=0.5").final_act == "softmax"  # default loss
    assert Config.from_string("loss=xe_logit,elu_param=1").final_act == "softmax_logit"


def test_from_dict_accepts_typed_values_and_strings() -> None:
    typed = Config.from_dict({"loss": "bpr-max", "layers": [64], "batch_size": 16, "momentum": 0.3,
                              "time_sort": False, "adapt_params": []})
    strings = Config.from_dict({"loss": "bpr-max", "layers": "64", "batch_size": "16", "momentum": "0.3",
                                "time_sort": "False", "adapt_params": ""})
    assert typed == strings == Config(loss="bpr-max", layers=(64,), batch_size=16, momentum=0.3, time_sort=False)
    assert Config(learning_rate=1).learning_rate == 1.0 and type(Config(learning_rate=1).learning_rate) is float


def test_numpy_values_are_converted() -> None:
    np = pytest.importorskip("numpy")
    cfg = Config(batch_size=np.int64(32), momentum=np.float32(0.25), time_sort=np.bool_(False),
                 layers=np.array([3, 4]), adapt="adam", adapt_params=np.array([0.5, 0.75]))
    assert (cfg.batch_size, cfg.momentum, cfg.time_sort, cfg.layers, cfg.adapt_params) == (
        32, 0.25, False, (3, 4), (0.5, 0.75))
    assert type(cfg.batch_size) is int and type(cfg.momentum) is float and type(cfg.layers[0]) is int


def test_pickle_keeps_derived_values() -> None:
    import pickle

    cfg = pickle.loads(pickle.dumps(Config(embedding="layersize", constrained_embedding=False)))
    assert cfg == Config(embedding=100, constrained_embedding=False)
    assert cfg.replace(layers=(7,)).embedding == 7
    assert cfg.replace(loss="bpr-max").final_act == "elu-0.5"


# ------------------------------------------------------------------------------ round trips


ROUND_TRIP_CONFIGS = [
    Config(),
    Config(loss="bpr-max", final_act="elu-1", layers=(512,), batch_size=144, dropout_p_embed=0.35,
           momentum=0.4, sample_alpha=0.2, bpreg=1.85),
    Config(loss="xe_logit", hidden_act="leaky-1e-05", layers=(200, 200), smoothing=0.1,
           learning_rate=0.1 + 0.2, adapt="adam", adapt_params=(0.9, 0.999), embedding=50,
           constrained_embedding=False, init_as_normal=True, seed=0, session_key="session id"),
]


@pytest.mark.parametrize("cfg", ROUND_TRIP_CONFIGS)
def test_round_trips(cfg: Config) -> None:
    assert Config.from_string(cfg.to_param_string()) == cfg
    as_dict = cfg.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict  # JSON-safe
    assert isinstance(as_dict["layers"], list)
    assert Config.from_dict(as_dict) == cfg
    assert Config.from_dict(json.loads(json.dumps(as_dict))) == cfg


def test_only_changed_param_string() -> None:
    assert Config().to_param_string(only_changed=True) == ""
    cfg = Config(loss="bpr-max", layers=(200, 200))
    assert cfg.to_param_string(only_changed=True) == "loss=bpr-max,final_act=elu-0.5,layers=200/200"
    assert Config.from_string(cfg.to_param_string(only_changed=True)) == cfg


def test_param_string_refuses_unwritable_value() -> None:
    cfg = Config(item_key="item,id")
    with pytest.raises(ConfigError, match="item_key"):
        cfg.to_param_string()
    assert Config.from_dict(cfg.to_dict()) == cfg  # the dict form still works


def test_replace_and_replace_from_string() -> None:
    cfg = Config()
    changed = cfg.replace(loss="bpr-max")  # derived final_act follows the new loss
    assert (changed.loss, changed.final_act) == ("bpr-max", "elu-0.5")
    assert changed.replace(loss="cross-entropy").final_act == "softmax"
    explicit = Config(loss="bpr-max", final_act="elu-1")
    assert explicit.replace(batch_size=8).final_act == "elu-1"  # explicit values are kept
    assert explicit.replace(elu_param=0.5).final_act == "elu-0.5"
    on_top = explicit.replace_from_string("layers=32/16,momentum=0.5")
    assert (on_top.layers, on_top.momentum, on_top.final_act, on_top.loss) == ((32, 16), 0.5, "elu-1", "bpr-max")
    assert cfg == Config()  # immutable: the original did not change
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loss = "bpr"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="batch_size: must be >= 1"):
        cfg.replace(batch_size=0)
    with pytest.raises(ConfigError, match="unknown parameter"):
        cfg.replace(batchsize=3)


def test_config_is_hashable() -> None:
    assert hash(Config()) == hash(Config.from_string("final_act=softmax"))


# ------------------------------------------------------------------------------ errors


def test_unknown_name_with_suggestion() -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_string("batchsize=32")
    assert problems_of(excinfo) == ["batchsize: unknown parameter (did you mean 'batch_size'?)"]
    with pytest.raises(ConfigError, match="zzz: unknown parameter"):
        Config.from_dict({"zzz": 1})


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"batch_size": "abc"}, "batch_size"),
        ({"batch_size": 3.5}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"learning_rate": [0.1]}, "learning_rate"),
        ({"learning_rate": "nan"}, "learning_rate"),
        ({"time_sort": "yes"}, "time_sort"),
        ({"time_sort": 2}, "time_sort"),
        ({"layers": "100/x"}, "layers"),
        ({"layers": [1.5]}, "layers"),
        ({"layers": {"a": 1}}, "layers"),
        ({"adapt_params": "0.9/b"}, "adapt_params"),
        ({"embedding": "wide"}, "embedding"),
        ({"session_key": 3}, "session_key"),
        ({"loss": 1}, "loss"),
        ({"elu_param": "x", "loss": "bpr-max"}, "elu_param"),
    ],
)
def test_wrong_type(params: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_dict(params)
    (problem,) = problems_of(excinfo)
    assert problem.startswith(f"{name}: "), problem


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("n_epochs=0", "n_epochs"), ("batch_size=0", "batch_size"), ("layers=0", "layers"),
        ("layers=", "layers"), ("dropout_p_embed=1", "dropout_p_embed"),
        ("dropout_p_hidden=-0.1", "dropout_p_hidden"), ("learning_rate=0", "learning_rate"),
        ("momentum=1", "momentum"), ("lmbd=-1", "lmbd"), ("embedding=-1", "embedding"),
        ("n_sample=-1", "n_sample"), ("sample_alpha=-0.5", "sample_alpha"),
        ("sample_store_size=-1", "sample_store_size"), ("smoothing=1", "smoothing"),
        ("grad_cap=-1", "grad_cap"), ("bpreg=-1", "bpreg"), ("logq=-1", "logq"),
        ("sigma=-0.1", "sigma"), ("seed=-1", "seed"), ("item_key=", "item_key"),
        ("adapt=rmsprop,adapt_params=1.5", "adapt_params"),
        ("loss=bpr-max,hidden_act=softmax", "hidden_act"), ("hidden_act=gelu", "hidden_act"),
        ("loss=bpr-max,final_act=elu-x", "final_act"), ("loss=nce", "loss"), ("adapt=adamw", "adapt"),
    ],
)
def test_out_of_range_or_unknown_value(text: str, name: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_string(text)
    (problem,) = problems_of(excinfo)
    assert problem.startswith(f"{name}: "), problem


@pytest.mark.parametrize(
    ("params", "name", "fragment"),
    [
        ({"loss": "cross-entropy", "final_act": "elu-1"}, "final_act", "needs final_act 'softmax'"),
        ({"loss": "xe_logit", "final_act": "softmax"}, "final_act", "needs final_act 'softmax_logit'"),
        ({"loss": "bpr-max", "final_act": "softmax"}, "final_act", "elementwise"),
        ({"loss": "top1", "final_act": "softmax_logit"}, "final_act", "elementwise"),
        ({"loss": "bpr-max", "smoothing": 0.1}, "smoothing", "cross-entropy losses only"),
        ({"adapt": "adam", "adapt_params": [0.9]}, "adapt_params", "takes 2 value"),
        ({"adapt": "rmsprop", "adapt_params": [0.9, 0.9]}, "adapt_params", "takes 1 value"),
        ({"adapt": "adagrad", "adapt_params": [0.9]}, "adapt_params", "takes no parameters"),
        ({"item_key": "SessionId"}, "item_key", "must differ from session_key"),
        ({"loss": "bpr-max", "final_act": "elu-1", "elu_param": 1}, "elu_param", "not both"),
    ],
)
def test_invalid_pairing(params: dict[str, Any], name: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_dict(params)
    (problem,) = problems_of(excinfo)
    assert problem.startswith(f"{name}: ") and fragment in problem, problem


def test_valid_pairings_accepted() -> None:
    assert Config(loss="bpr-max", final_act="linear").final_act == "linear"
    assert Config(loss="bpr", final_act="leaky-0.1").final_act == "leaky-0.1"
    assert Config(loss="xe_logit", final_act="softmax_logit", smoothing=0.2).smoothing == 0.2
    assert Config(adapt="adadelta", adapt_params=(0.9,)).resolved_adapt_params == (0.9,)


def test_several_problems_reported_together() -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_string("loss=cross-entropy,final_act=elu-1,batch_size=0,layers=a,bogus=1,momentum=2,oops")
    problems = problems_of(excinfo)
    assert len(problems) == 6
    names = sorted(p.split(":")[0] for p in problems)
    assert names == sorted(["'oops'", "bogus", "layers", "final_act", "batch_size", "momentum"])
    message = str(excinfo.value)
    assert message.startswith("6 invalid GRU4Rec parameters")
    assert all(p in message for p in problems)
    # Direct construction collects everything too.
    with pytest.raises(ConfigError) as excinfo:
        Config(batch_size=0, n_epochs=0, dropout_p_hidden=2.0, seed="x")
    assert sorted(p.split(":")[0] for p in problems_of(excinfo)) == ["batch_size", "dropout_p_hidden", "n_epochs", "seed"]


def test_malformed_param_string_parts() -> None:
    with pytest.raises(ConfigError) as excinfo:
        Config.from_string("layers=100,=5,batch_size=3,batch_size=4")
    assert problems_of(excinfo) == ["'=5': expected name=value", "batch_size: given more than once"]
    with pytest.raises(ConfigError, match="must be a str"):
        Config.from_string(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mapping"):
        Config.from_dict([("loss", "bpr")])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ parameter files


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_paramfiles(name: str) -> None:
    from_py = Config.from_file(PARAMFILES / f"{name}.py")
    from_json = Config.from_file(PARAMFILES / f"{name}.json")
    assert from_py == from_json
    loss, final_act, layer, batch, drop_emb, drop_hid, lr, mom, alpha, bpreg, logq = PUBLISHED[name]
    want = dict(DOCUMENTED_DEFAULTS, loss=loss, final_act=final_act, layers=(layer,), batch_size=batch,
                dropout_p_embed=drop_emb, dropout_p_hidden=drop_hid, learning_rate=lr, momentum=mom,
                sample_alpha=alpha, bpreg=bpreg, logq=logq, constrained_embedding=True,
                n_sample=2048, n_epochs=10, adapt="adagrad")
    assert {f: getattr(from_py, f) for f in Config.field_names()} == want


# The files tuned in docs/results.md: the study whose best trial they hold (results/STUDY.best.json,
# written by gru4rec paropt) and the full-length n_epochs chosen from its per-epoch validation.
TUNED = {
    "diginetica_srgnn_bprmax_best": ("diginetica_srgnn_bprmax", 10),
    "diginetica_srgnn_xe_best": ("diginetica_srgnn_xe", 10),
    "tmall_srgnn_bprmax_best": ("tmall_srgnn_bprmax", 3),
    "tmall_srgnn_xe_best": ("tmall_srgnn_xe", 4),
    "synthetic_intents_best": ("synthetic_intents_xe", 10),
}


@pytest.mark.parametrize("name", sorted(TUNED))
def test_tuned_paramfiles_hold_their_studys_best_trial(name: str) -> None:
    study, n_epochs = TUNED[name]
    best = Config.from_file(PARAMFILES.parent / "results" / f"{study}.best.json")
    assert Config.from_file(PARAMFILES / f"{name}.py") == best.replace_from_string(f"n_epochs={n_epochs}")


def test_every_paramfile_is_covered() -> None:
    stems = {p.stem for p in PARAMFILES.glob("*.py")} | {p.stem for p in PARAMFILES.glob("*.json")}
    assert stems == set(PUBLISHED) | set(TUNED)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_original_py_format_variants(tmp_path: Path) -> None:
    # The ports' files: comments, trailing commas, elu_param next to cross-entropy.
    ported = write(tmp_path, "a.py", (
        "from collections import OrderedDict  # ordered\n"
        "gru4rec_params = OrderedDict([\n"
        "('loss', 'cross-entropy'),  # the loss\n('constrained_embedding', True),\n('embedding', 0),\n"
        "('elu_param', 0),\n('layers', [100]),\n('n_epochs', 10),\n('batch_size', 32),\n"
        "('learning_rate', 0.2),\n('logq', 1.0),\n])\n"
        "# gru4rec_old = OrderedDict([('loss', 'top1')])\n"
    ))
    cfg = Config.from_file(ported)
    assert (cfg.loss, cfg.final_act, cfg.layers, cfg.batch_size, cfg.learning_rate, cfg.logq) == (
        "cross-entropy", "softmax", (100,), 32, 0.2, 1.0)
    plain = write(tmp_path, "b.py", "gru4rec_params = {'loss': 'bpr-max', 'elu_param': 1, 'layers': [64]}\n")
    assert Config.from_file(plain) == Config(loss="bpr-max", final_act="elu-1", layers=(64,))
    dotted = write(tmp_path, "c.py", "import collections\ngru4rec_params = collections.OrderedDict(loss='bpr', n_sample=0)\n")
    assert Config.from_file(dotted) == Config(loss="bpr", n_sample=0)
    assert read_param_file(dotted) == {"loss": "bpr", "n_sample": 0}


def test_toml_and_yaml_files(tmp_path: Path) -> None:
    toml = write(tmp_path, "p.toml", 'loss = "bpr-max"\nfinal_act = "elu-1"\nlayers = [512]\nmomentum = 0.4\n')
    want = Config(loss="bpr-max", final_act="elu-1", layers=(512,), momentum=0.4)
    assert Config.from_file(toml) == want
    nested = write(tmp_path, "q.toml", '[gru4rec_params]\nloss = "bpr-max"\nfinal_act = "elu-1"\nlayers = [512]\nmomentum = 0.4\n')
    assert Config.from_file(nested) == want
    pytest.importorskip("yaml")
    yaml = write(tmp_path, "p.yaml", "loss: bpr-max\nfinal_act: elu-1\nlayers: [512]\nmomentum: 0.4\n")
    assert Config.from_file(yaml) == want


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("syntax.py", "gru4rec_params = OrderedDict([('loss', 'bpr-max')\n", "syntax error"),
        ("none.py", "from collections import OrderedDict\nparams = OrderedDict([('loss', 'bpr')])\n",
         "does not define gru4rec_params"),
        ("call.py", "gru4rec_params = make_params()\n", "must be OrderedDict"),
        ("pairs.py", "gru4rec_params = OrderedDict([('loss', 'bpr', 3)])\n", "not a (name, value) pair"),
        ("nonlit.py", "gru4rec_params = OrderedDict([('layers', [2 ** x])])\n", "not a literal value"),
        ("twice.py", "gru4rec_params = {}\ngru4rec_params = {}\n", "more than once"),
        ("dupkey.py", "gru4rec_params = OrderedDict([('loss', 'bpr'), ('loss', 'top1')])\n", "more than once"),
        ("badjson.json", '{"loss": "bpr-max",}', "not valid JSON"),
        ("list.json", '[["loss", "bpr-max"]]', "expected a mapping"),
        ("bad.toml", 'loss = bpr-max\n', "not valid TOML"),
        ("params.ini", "loss=bpr-max\n", "unknown format"),
        ("value.json", '{"loss": "bpr-max", "batch_size": 0}', "batch_size: must be >= 1"),
    ],
)
def test_bad_param_files(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as excinfo:
        Config.from_file(path)
    message = str(excinfo.value)
    assert fragment in message and name in message, message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as excinfo:
        Config.from_file(tmp_path / "nope.py")
    assert "nope.py" in str(excinfo.value)
    with pytest.raises(ConfigError, match="is a directory"):
        Config.from_file(tmp_path)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.system('touch {marker}')\ngru4rec_params = OrderedDict([('loss', 'bpr-max')])\n",
        "gru4rec_params = OrderedDict([('loss', __import__('os').system('touch {marker}'))])\n",
        "gru4rec_params = OrderedDict([('loss', 'bpr-max')])\nopen('{marker}', 'w').close()\n",
        "def f():\n    open('{marker}', 'w').close()\ngru4rec_params = {{'loss': f()}}\n",
    ],
)
def test_param_file_code_is_never_run(tmp_path: Path, code: str) -> None:
    marker = tmp_path / "side_effect"
    path = write(tmp_path, "evil.py", code.format(marker=marker))
    with pytest.raises(ConfigError) as excinfo:
        Config.from_file(path)
    assert "evil.py" in str(excinfo.value)
    assert not marker.exists()


# ------------------------------------------------------------------------------ declarations


def test_every_field_declares_its_group_converter_and_check() -> None:
    from gru4rec.config import DATA_FIELDS, INFERENCE_FIELDS, NETWORK_FIELDS, SPECS
    from gru4rec.config.values import GROUPS, FieldSpec
    from gru4rec.training import warm_start

    assert tuple(SPECS) == Config.field_names()
    assert all(isinstance(spec, FieldSpec) and spec.group in GROUPS and callable(spec.convert) for spec in SPECS.values())
    # The groups, written out independently of the declarations.
    assert set(NETWORK_FIELDS) == {"layers", "hidden_act", "embedding", "constrained_embedding", "click_context"}
    assert set(INFERENCE_FIELDS) == {"repeat_weight", "repeat_decay"}
    assert set(DATA_FIELDS) == {"session_key", "item_key", "time_key"}
    assert warm_start.NETWORK_FIELDS == tuple(name for name, spec in SPECS.items() if spec.group == "network")
    with pytest.raises(TypeError):
        SPECS["loss"] = SPECS["seed"]  # type: ignore[index]  # read-only


def test_a_field_declared_without_its_spec_is_refused() -> None:
    from gru4rec.config import _specs

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Forgetful(Config):
        extra: int = 3

    with pytest.raises(TypeError, match="without a group, converter and check.*extra"):
        _specs(Forgetful)


def test_each_field_is_converted_and_checked_by_its_declaration() -> None:
    from gru4rec.config import SPECS

    # A value its converter refuses, and one its own check refuses, for a field of each kind.
    with pytest.raises(ConfigError) as excinfo:
        Config(n_epochs="x", repeat_decay=1.5, layers=(0,), item_key="")
    assert problems_of(excinfo) == [
        "n_epochs: expected an integer, got 'x'",
        "layers: every layer size must be >= 1, got [0]",
        "repeat_decay: must be in [0, 1], got 1.5",
        "item_key: must be a non-empty column name",
    ]
    assert SPECS["seed"].check(2**63) == "must be in [0, 2**63), got 9223372036854775808"
    assert SPECS["learning_rate"].check(0.0) == "must be > 0, got 0.0" and SPECS["learning_rate"].check(0.1) is None


def test_a_config_remembers_which_fields_were_given() -> None:
    import pickle

    assert Config().given == frozenset() == Config.from_string("").given == Config.from_dict({}).given
    assert Config(n_epochs=10, layers=(100,)).given == {"n_epochs", "layers"}  # given, although equal to the defaults
    cfg = Config.from_string("loss=bpr-max,elu_param=1,batch_size=8")
    assert cfg.given == {"loss", "final_act", "batch_size"}
    assert cfg.replace(seed=1).given == {"loss", "final_act", "batch_size", "seed"}
    assert cfg.replace_from_string("momentum=0.1").given == {"loss", "final_act", "batch_size", "momentum"}
    assert cfg.replace(seed=1) == Config(loss="bpr-max", final_act="elu-1", batch_size=8, seed=1)
    assert pickle.loads(pickle.dumps(cfg)).given == cfg.given
    assert Config.from_dict(Config().to_dict()).given == set(Config.field_names())  # a model file's config gives all
