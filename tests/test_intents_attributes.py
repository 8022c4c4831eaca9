"""The intents benchmark with attributes and cold items (gru4rec.datasets.intents_attributes): the
oracle's figures in oracle.json (all, cold and warm targets; the plain protocol) against a brute
force that enumerates the intents of each test session in plain Python, the written files, the
attribute table through the item reader, and ``gru4rec synth --kind intents-attributes``."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cli_helpers import run
from gru4rec.data import ItemMap, read_events
from gru4rec.datasets.intent_model import IntentModel
from gru4rec.datasets.intents_attributes import (
    ATTRIBUTES_FILE,
    AttributeIntentParams,
    generate_attribute_intents,
    write_attribute_intents,
)
from gru4rec.errors import ConfigError
from gru4rec.items import ItemAttributes, read_item_table

SMALL: dict[str, Any] = {"n_sessions": 400, "n_items": 60, "n_intents": 4, "n_categories": 6, "n_brands": 4,
                         "intent_categories": 2, "cold_share": 0.2, "mean_length": 4.0, "seed": 7}
TEST_DAYS = 3.0
CUTOFFS = (1, 5, 10, 20)


def dense_t(m: IntentModel) -> np.ndarray:
    t = np.zeros((m.n_items, m.n_items))
    for i in range(m.n_items):
        for p in range(m.succ_indptr[i], m.succ_indptr[i + 1]):
            t[i, m.succ_indices[p]] = m.succ_probs[p]
    return t


def brute_ranks(m: IntentModel, sessions: list[list[int]], candidates: list[int]) -> list[tuple[int, float]]:
    """(target, conservative rank among ``candidates``) of every prediction, the posterior by
    enumerating the intents: rho_k P(x_1 | k) prod_s P(x_{s+1} | x_s, k), in plain floats."""
    a, b, c = m.mix
    t = dense_t(m)
    out = []
    for seq in sessions:
        for n in range(1, len(seq)):
            joint = []
            for k in range(m.n_intents):
                p = m.rho[k] * (b * m.phi[k, seq[0]] + c * m.pop[seq[0]]) / (b + c)
                for s in range(1, n):
                    p *= a * t[seq[s - 1], seq[s]] + b * m.phi[k, seq[s]] + c * m.pop[seq[s]]
                joint.append(p)
            post = np.array(joint) / sum(joint)
            probs = {j: sum(post[k] * (a * t[seq[n - 1], j] + b * m.phi[k, j] + c * m.pop[j]) for k in range(m.n_intents))
                     for j in candidates}
            target = seq[n]
            out.append((target, sum(1 for j in candidates if probs[j] >= probs[target] - 1e-15)))
    return out


def figures(ranks: list[float]) -> dict[str, float]:
    if not ranks:  # no prediction of that kind: the report says 0
        return {f"{name}@{c}": 0.0 for name in ("recall", "mrr") for c in CUTOFFS}
    out = {f"recall@{c}": sum(r <= c for r in ranks) / len(ranks) for c in CUTOFFS}
    out.update({f"mrr@{c}": sum(1 / r for r in ranks if r <= c) / len(ranks) for c in CUTOFFS})
    return out


def sessions_of(df: pd.DataFrame, m: IntentModel, keep: set[int] | None = None) -> list[list[int]]:
    """Test sessions as lists of the model's indices, in session-id order, sorted by time
    (events of items outside ``keep`` removed first, as the evaluator does)."""
    if keep is not None:
        df = df[df["ItemId"].isin(keep)]
    out = []
    for _, g in df.sort_values(["SessionId", "Time"], kind="stable").groupby("SessionId", sort=True):
        seq = m.index_of(g["ItemId"].to_numpy()).tolist()
        if len(seq) >= 2:
            out.append(seq)
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_attribute_intents(tmp_path_factory.mktemp("ia"), test_days=TEST_DAYS, **SMALL)


@pytest.mark.parametrize(("split", "train"), [("test", "train_full"), ("train_valid", "train_tr")])
def test_oracle_figures_against_brute_force(written: dict[str, Path], split: str, train: str) -> None:
    report = json.loads(written["oracle"].read_text())[split]
    data = generate_attribute_intents(AttributeIntentParams.of(**SMALL), test_days=TEST_DAYS)
    model = data.full if split == "test" else data.warm
    test, train_df = read_events(written[split]), read_events(written[train])
    train_items = set(train_df["ItemId"].tolist())
    found = brute_ranks(model, sessions_of(test, model), list(range(model.n_items)))
    cold = [r for target, r in found if int(model.item_ids[target]) not in train_items]
    warm = [r for target, r in found if int(model.item_ids[target]) in train_items]
    for name, ranks in (("all", [r for _, r in found]), ("cold", cold), ("warm", warm)):
        assert report[name]["n_predictions"] == len(ranks), name
        for key, value in figures(ranks).items():
            assert report[name][key] == pytest.approx(value, abs=1e-12), (name, key)
    # The plain protocol: unknown items removed, ranked among the training items.
    known = [int(j) for j in model.index_of(np.array(sorted(train_items)))]
    plain = brute_ranks(model, sessions_of(test, model, train_items), known)
    assert report["plain"]["n_predictions"] == len(plain)
    for key, value in figures([r for _, r in plain]).items():
        assert report["plain"][key] == pytest.approx(value, abs=1e-12), key
    if split == "test":  # the benchmark's point: cold targets exist, and only test has them by design
        assert len(cold) > 10 and report["n_cold_items_clicked"] > 3
    assert report["all"]["recall@20"] > 0


def test_the_files(written: dict[str, Path]) -> None:
    data = generate_attribute_intents(AttributeIntentParams.of(**SMALL), test_days=TEST_DAYS)
    frames = {name: read_events(written[name]) for name in ("train_full", "test", "train_tr", "train_valid")}
    new = set(data.full.item_ids[data.warm.n_items:].tolist())
    assert len(new) == round(0.2 * 60)
    assert not new & set(frames["train_full"]["ItemId"])  # new items never clicked in training
    assert new & set(frames["test"]["ItemId"])  # ... and clicked in test
    assert frames["train_full"]["Time"].max() < frames["test"]["Time"].min()
    # The events of the four files are the generated ones (nothing removed from test).
    late = data.events[data.events.groupby("SessionId")["Time"].transform("min") >= data.test_boundary]
    assert frames["test"]["ItemId"].tolist() == late["ItemId"].tolist()
    # The attribute table: every item, read by the item reader; aligned with the training items.
    table = read_item_table(written["attributes"], types={"category": "categorical"})
    assert written["attributes"].name == ATTRIBUTES_FILE
    assert table.kinds == {"category": "categorical", "brand": "categorical", "price": "numeric"}
    assert set(table.ids) == set(data.full.item_ids.tolist())
    train_items = ItemMap.from_ids(frames["train_full"]["ItemId"])
    attrs = ItemAttributes.build(table, train_items)
    assert attrs.counts() == {"known": len(train_items), "unknown": 0, "cold": 60 - len(train_items)}
    # The category of an item is what phi says: items of one category share phi's column pattern.
    items = pd.read_csv(written["attributes"], sep="\t")
    cat = items.set_index("ItemId").loc[data.full.item_ids, "category"].to_numpy()
    phi = data.full.phi
    for c in np.unique(cat):
        cols = phi[:, cat == c]
        assert np.all((cols > 0) == (cols[:, :1] > 0))


def test_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="cold_share"):
        AttributeIntentParams(cold_share=1.0)
    with pytest.raises(ConfigError, match="intent_categories"):
        AttributeIntentParams(n_categories=3, intent_categories=4)
    with pytest.raises(ConfigError, match="unknown intents-attributes parameter"):
        AttributeIntentParams.of(intent_size=3)


def test_synth_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synth", tmp_path / "s", "--kind", "intents-attributes", "--n-sessions", 300, "--n-items", 80,
            "--n-intents", 3, "--mix", "0.3,0.5,0.2", "--cold-share", 0.2, "--seed", 2, "--test-days", 3]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert sorted(Path(line).name for line in out.splitlines()) == [
        "items.tsv", "oracle.json", "test.tsv", "train_full.tsv", "train_tr.tsv", "train_valid.tsv"]
    want = write_attribute_intents(tmp_path / "ref", n_sessions=300, n_items=80, n_intents=3, mix=(0.3, 0.5, 0.2),
                                   cold_share=0.2, seed=2, test_days=3.0)
    for name, path in want.items():
        assert (tmp_path / "s" / path.name).read_bytes() == path.read_bytes(), name
    for extra, culprit in ((["--cold-share", "0.1"], "--cold-share"),
                           (["--kind", "intents-attributes", "--intent-size", "5"], "--intent-size")):
        code, _, err = run(["synth", tmp_path / "t", *extra], capsys)
        assert code == 2 and culprit in err
        assert not (tmp_path / "t").exists()
    assert math.isfinite(json.loads((tmp_path / "s" / "oracle.json").read_text())["test"]["cold"]["recall@20"])
