"""The intents benchmark with item attributes and cold items: a known optimum where attributes carry the signal.

The process is the intent model of :mod:`gru4rec.datasets.intent_model` (a session keeps one
intent k ~ rho; first item from ``(b phi_k + c pop) / (b + c)``, every next one from
``a T[prev] + b phi_k + c pop``) with an intent's items defined by their attributes:

* every item has a ``category`` (int, 1..``n_categories``) and a ``brand`` (``b01``...), each
  dealt out evenly at random, and a ``price`` (lognormal around a per-category level: numeric,
  informative of the category only);
* an intent k weighs ``intent_categories`` categories, chosen uniformly, with Dirichlet
  (``category_concentration``) weights ``psi_k``; within a category an item's weight is
  ``w_j = brand_weight[brand_j] * noise_j`` (both lognormal, spreads ``brand_spread`` and
  ``item_spread``): ``phi_k(j) = psi_k(category_j) w_j / W(category_j)``, W the category's total;
* ``pop`` is Zipf(``zipf_exponent``) over a random order of the items; T: each item has
  ``n_successors`` distinct successors among the warm items (a new item is nobody's successor yet).

A share ``cold_share`` of the items (chosen at random) are **new**: sessions that start before the
test boundary (T_max - ``test_days``, the boundary of the time split) are drawn from the model
restricted to the other items (phi, pop renormalised; T needs nothing), test sessions from the
whole model. So a new item is never clicked in training and is clicked in test, and only its
attributes (and its popularity, which no model can know) say what it is. The split is the public
data sets' rule (:func:`gru4rec.datasets.synthetic.time_split`) **without** removing test events of
items unknown to training: every item has a row in ``items.tsv``, written beside the four split
files (columns ItemId, category, brand, price).

``oracle.json`` reports the Bayes-optimal predictor (the exact posterior over intents under the
period's model, :meth:`IntentModel.oracle_metrics`) on test and on train_valid: Recall/MRR@k over
every prediction (``all``; items ranked among the whole catalogue, as a model that knows the
attribute table ranks them), on predictions whose target is an item the training split never
clicked (``cold``) and on the rest (``warm``); and ``plain``: the same oracle measured as a model
without attributes is evaluated today (test events of unknown items removed, ranked among the
training items).
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.data import ItemMap, sessions_from_events, write_events
from gru4rec.datasets.intent_model import DEFAULT_CUTOFFS, IntentModel, check_cutoffs
from gru4rec.datasets.intents import (
    ORACLE_FILE,
    _check,
    _dirichlet_rows,
    _is_int,
    _is_real,
    session_times,
)
from gru4rec.datasets.synthetic import split_paths, write_splits
from gru4rec.errors import ConfigError, DataError
from gru4rec.files import atomic_write

__all__ = ["ATTRIBUTES_FILE", "AttributeIntentParams", "AttributeIntents", "generate_attribute_intents",
           "write_attribute_intents"]

#: The item attribute table written beside the split files.
ATTRIBUTES_FILE = "items.tsv"
_DAY = 86_400


@dataclass(frozen=True)
class AttributeIntentParams:
    """The generator's parameters (see the module docstring); ConfigError naming the first bad one."""

    n_sessions: int = 20_000
    n_items: int = 3_000
    n_intents: int = 50
    n_categories: int = 60
    n_brands: int = 40
    intent_categories: int = 4
    category_concentration: float = 1.0
    brand_spread: float = 1.0
    item_spread: float = 0.3
    cold_share: float = 0.1
    n_successors: int = 4
    mix: tuple[float, float, float] = (0.2, 0.65, 0.15)
    zipf_exponent: float = 1.0
    prior_concentration: float = 10.0
    mean_length: float = 6.0
    max_length: int = 50
    n_days: float = 30.0
    start_time: int = 1_600_000_000
    seed: int = 42

    def __post_init__(self) -> None:
        n, c = self.n_items, self.n_categories
        ints = {"n_sessions": 1, "n_intents": 1, "n_categories": 1, "n_brands": 1, "intent_categories": 1,
                "n_successors": 1, "max_length": 2, "start_time": 0, "seed": 0}
        for name, low in ints.items():
            value = getattr(self, name)
            _check(_is_int(value) and value >= low, name, value, f"need an int >= {low}")
        _check(_is_int(n) and max(c, self.n_brands, 2) <= n <= 900_000_000, "n_items", n,
               "need an int in [max(2, n_categories, n_brands), 900000000]")
        _check(self.intent_categories <= c, "intent_categories", self.intent_categories, f"need at most n_categories={c}")
        for name in ("category_concentration", "prior_concentration", "zipf_exponent", "n_days"):
            _check(_is_real(getattr(self, name)) and getattr(self, name) > 0, name, getattr(self, name), "need a number > 0")
        for name in ("brand_spread", "item_spread"):
            _check(_is_real(getattr(self, name)) and getattr(self, name) >= 0, name, getattr(self, name), "need a number >= 0")
        n_cold = round(self.cold_share * n) if _is_real(self.cold_share) else -1
        _check(_is_real(self.cold_share) and 0 <= self.cold_share < 1 and n - n_cold > self.n_successors, "cold_share",
               self.cold_share, f"need a number in [0, 1) that leaves more than n_successors={self.n_successors} warm items")
        _check(_is_real(self.mean_length) and self.mean_length >= 2, "mean_length", self.mean_length, "need a number >= 2")
        mix = self.mix
        ok = isinstance(mix, (tuple, list)) and len(mix) == 3 and all(_is_real(w) and w >= 0 for w in mix)
        _check(ok and abs(sum(mix) - 1.0) < 1e-9 and mix[2] > 0, "mix", mix,
               "need three weights (a, b, c) >= 0 of T, phi_k and pop summing to 1, with c > 0")
        object.__setattr__(self, "mix", tuple(float(w) / float(sum(mix)) for w in mix))

    @classmethod
    def of(cls, params: AttributeIntentParams | None = None, **changes: Any) -> AttributeIntentParams:
        """``params`` (default: the defaults) with ``changes``; ConfigError naming an unknown one."""
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown intents-attributes parameter(s) {unknown}; known: {sorted(f.name for f in fields(cls))}")
        return replace(params or cls(), **changes)

    def to_json(self) -> dict[str, Any]:
        """The parameters as plain JSON values."""
        return {k: (list(v) if k == "mix" else v) for k, v in asdict(self).items()}


@dataclass(frozen=True, eq=False)
class AttributeIntents:
    """A generated data set: the events, the item attribute table, the model of the training
    period (``warm``: new items left out) and the whole model (``full``, the test period),
    and the time from which sessions are drawn from ``full``."""

    events: pd.DataFrame
    items: pd.DataFrame
    warm: IntentModel
    full: IntentModel
    test_boundary: float


def _spread(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Labels 0..k-1 for n things, dealt out evenly, in random order (every label used when n >= k)."""
    return rng.permutation(np.arange(n) % k)


def _successors(rng: np.random.Generator, n: int, n_warm: int, m: int) -> np.ndarray:
    """m distinct successors per item among the warm items 0..n_warm-1, never the item itself."""
    own = np.arange(n)[:, None]
    high = np.where(own < n_warm, n_warm - 1, n_warm)

    def draw(size: tuple[int, ...] | int, hi: np.ndarray, me: np.ndarray) -> np.ndarray:
        x = np.floor(rng.random(size) * hi).astype(np.int64)
        return x + ((x >= me) & (me < n_warm))

    succ = draw((n, m), high, own)
    while True:
        succ.sort(axis=1)
        dup = np.zeros_like(succ, dtype=bool)
        dup[:, 1:] = succ[:, 1:] == succ[:, :-1]
        if not dup.any():
            return succ
        me = np.broadcast_to(own, succ.shape)[dup]
        succ[dup] = draw(int(dup.sum()), np.broadcast_to(high, succ.shape)[dup], me)


def generate_attribute_intents(params: AttributeIntentParams | None = None, /, *, test_days: float = 1.0,
                               **changes: Any) -> AttributeIntents:
    """Generate the events and the attribute table (see the module docstring). Deterministic for
    given parameters; the internal item order puts the warm items first, then the new ones."""
    p = AttributeIntentParams.of(params, **changes)
    _check(_is_real(test_days) and 0 < test_days < p.n_days / 2, "test_days", test_days,
           f"need a number in (0, n_days / 2 = {p.n_days / 2})")
    rng = np.random.default_rng(p.seed)
    n, k, m = p.n_items, p.n_intents, p.n_successors
    n_warm = n - round(p.cold_share * n)
    item_ids = rng.choice(900_000_000, size=n, replace=False).astype(np.int64) + 100_000_000
    category = _spread(rng, n, p.n_categories)
    brand = _spread(rng, n, p.n_brands)
    weight = np.exp(p.brand_spread * rng.standard_normal(p.n_brands))[brand] * np.exp(p.item_spread * rng.standard_normal(n))
    level = np.exp(rng.normal(3.0, 1.0, size=p.n_categories))
    price = np.round(level[category] * np.exp(0.3 * rng.standard_normal(n)), 2)
    pop = 1.0 / (rng.permutation(n) + 1.0) ** p.zipf_exponent
    pop /= pop.sum()
    rho = _dirichlet_rows(rng, p.prior_concentration, (1, k), "prior_concentration")[0]
    chosen = np.argpartition(rng.random((k, p.n_categories)), p.intent_categories - 1, axis=1)[:, :p.intent_categories]
    psi = np.zeros((k, p.n_categories))
    np.put_along_axis(psi, chosen, _dirichlet_rows(rng, p.category_concentration, (k, p.intent_categories),
                                                   "category_concentration"), axis=1)
    phi = psi[:, category] * (weight / np.bincount(category, weights=weight, minlength=p.n_categories)[category])
    succ = _successors(rng, n, n_warm, m)
    probs = _dirichlet_rows(rng, 1.0, (n, m), "n_successors").ravel()
    indptr = np.arange(0, n * m + 1, m, dtype=np.int64)
    full = IntentModel(item_ids, pop, phi, rho, indptr, succ.ravel().astype(np.int64), probs, p.mix)
    phi_warm = phi[:, :n_warm]
    mass = phi_warm.sum(axis=1, keepdims=True)
    _check(bool(np.all(mass > 0)), "cold_share", p.cold_share, "leaves an intent without warm items; use fewer new items")
    warm = IntentModel(item_ids[:n_warm], pop[:n_warm] / pop[:n_warm].sum(), phi_warm / mass, rho,
                       indptr[: n_warm + 1], full.succ_indices[: n_warm * m], probs[: n_warm * m], p.mix)

    extra = rng.geometric(1.0 / (p.mean_length - 1.0), size=p.n_sessions) - 1
    lengths = np.minimum(2 + extra, p.max_length).astype(np.int64)
    times = session_times(rng, lengths, p.n_days, p.start_time)
    offsets = np.r_[0, np.cumsum(lengths)]
    boundary = float(times.max()) - test_days * _DAY  # time_split's boundary: times do not depend on items
    late = times[offsets[:-1]] >= boundary
    items = np.empty(len(times), dtype=np.int64)
    for model, which in ((warm, ~late), (full, late)):
        drawn, _ = model.sample(lengths[which], rng)
        # The positions of the chosen sessions' events, session after session.
        first = np.repeat(offsets[:-1][which], lengths[which])
        items[first + np.arange(len(first)) - np.repeat(np.r_[0, np.cumsum(lengths[which])[:-1]], lengths[which])] = drawn
    events = pd.DataFrame({"SessionId": np.repeat(np.arange(1, p.n_sessions + 1, dtype=np.int64), lengths),
                           "ItemId": item_ids[items], "Time": times})
    table = pd.DataFrame({"ItemId": item_ids, "category": category + 1,
                          "brand": np.char.add("b", np.char.zfill((brand + 1).astype(str), 2)), "price": price})
    return AttributeIntents(events, table.sort_values("ItemId", ignore_index=True), warm, full, boundary)


def split_keeping_items(df: pd.DataFrame, seconds: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`gru4rec.datasets.synthetic.time_split` without removing test events whose item
    training lacks (every item has attributes): train = events before T_max - seconds in
    sessions of 2+ such events, test = sessions starting at or after it."""
    boundary = df["Time"].max() - seconds
    start = df.groupby("SessionId", sort=False)["Time"].transform("min")
    test = df[start >= boundary]
    train = df[df["Time"] < boundary]
    train = train[train.groupby("SessionId", sort=False)["Time"].transform("size") >= 2]
    return train.reset_index(drop=True), test.reset_index(drop=True)


def oracle_by_target(model: IntentModel, test: pd.DataFrame, train: pd.DataFrame, cutoffs: Sequence[int]) -> dict[str, Any]:
    """The oracle's Recall/MRR@c on ``test`` over all predictions, cold targets (items ``train``
    never clicked) and warm ones, ranking among the model's whole catalogue; and ``plain``
    (unknown items removed, ranked among ``train``'s items, as a model without attributes)."""
    cut = list(cutoffs)
    res = model.oracle_metrics(test, model.item_ids, cut, return_ranks=True)
    catalogue = ItemMap.from_ids(model.item_ids)
    sessions, _ = sessions_from_events(test, catalogue, drop_unknown=True)
    is_input = np.ones(len(sessions.items), dtype=bool)
    is_input[sessions.offsets[1:][np.diff(sessions.offsets) > 0] - 1] = False  # as oracle_metrics orders them
    targets = catalogue.ids[sessions.items[np.flatnonzero(is_input) + 1]]
    cold = ~np.isin(targets, train["ItemId"].unique())
    ranks = res["ranks"]

    def figures(mask: np.ndarray) -> dict[str, Any]:
        r = ranks[mask]
        out: dict[str, Any] = {f"recall@{c}": float(np.mean(r <= c)) if len(r) else 0.0 for c in cut}
        out.update({f"mrr@{c}": float(np.mean(np.where(r <= c, 1.0 / r, 0.0))) if len(r) else 0.0 for c in cut})
        out["n_predictions"] = int(mask.sum())
        return out

    plain = model.oracle_metrics(test, np.intersect1d(train["ItemId"].unique(), model.item_ids), cut)
    return {
        "all": figures(np.ones(len(ranks), dtype=bool)), "cold": figures(cold), "warm": figures(~cold),
        "plain": {**{f"{name}@{c}": plain[name][c] for name in ("recall", "mrr") for c in cut},
                  "n_predictions": plain["n_predictions"], "n_dropped_events": plain["n_dropped_events"]},
        "n_items": model.n_items, "n_cold_items_clicked": int(len(np.unique(targets[cold]))),
    }


def write_attribute_intents(
    out_dir: str | os.PathLike[str],
    params: AttributeIntentParams | None = None,
    /,
    *,
    test_days: float = 1.0,
    cutoffs: int | Sequence[int] = DEFAULT_CUTOFFS,
    force: bool = False,
    **changes: Any,
) -> dict[str, Path]:
    """Generate a data set (see the module docstring) and write ``train_full``, ``test``,
    ``train_tr``, ``train_valid`` (TSV), ``items.tsv`` and ``oracle.json`` into ``out_dir``,
    atomically; existing files are kept unless ``force`` (DataError naming the first, nothing
    written). Returns ``{name: path}`` (names ``train_full``, ..., ``attributes``, ``oracle``)."""
    spec = AttributeIntentParams.of(params, **changes)
    cut = check_cutoffs(cutoffs)
    paths = split_paths(out_dir, force, extra={"attributes": ATTRIBUTES_FILE, "oracle": ORACLE_FILE})
    data = generate_attribute_intents(spec, test_days=test_days)
    seconds = test_days * _DAY
    train_full, test = split_keeping_items(data.events, seconds)
    train_tr, train_valid = split_keeping_items(train_full, seconds)
    frames = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": train_valid}
    for name, frame in frames.items():
        if len(frame) == 0:
            raise DataError(f"{paths[name]}: the split would be empty (n_sessions={spec.n_sessions}, "
                            f"test_days={test_days}); use more sessions or fewer test days")
    report = {
        "generator": "gru4rec.datasets.intents_attributes",
        "params": {**spec.to_json(), "test_days": test_days},
        "mode": "conservative",
        "cutoffs": cut,
        "attributes": ATTRIBUTES_FILE,
        "test": {"train": "train_full.tsv", **oracle_by_target(data.full, test, train_full, cut)},
        "train_valid": {"train": "train_tr.tsv", **oracle_by_target(data.warm, train_valid, train_tr, cut)},
    }
    write_splits(frames, paths, force)
    write_events(data.items, paths["attributes"], force=force)
    atomic_write(paths["oracle"], lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8"))
    return paths
