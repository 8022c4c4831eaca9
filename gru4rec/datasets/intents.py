"""A synthetic benchmark with a known optimum: sessions driven by hidden intents.

The data of :mod:`gru4rec.datasets.synthetic` have a realistic shape, but nobody knows the best
possible score on them. Here the generating process is simple enough that the Bayes-optimal
next-item predictor (the *oracle*) is computed exactly, so a trained model can be reported as a
fraction of the optimum. The process and the oracle are defined in
:mod:`gru4rec.datasets.intent_model`: a session keeps one intent k ~ rho; its first item comes
from ``(b phi_k + c pop) / (b + c)``, every next one from ``a T[prev] + b phi_k + c pop``.

The parameters, as :func:`generate_intents` draws them (N = ``n_items``, K = ``n_intents``):

* ``pop(j) ∝ 1 / (j + 1)^zipf_exponent`` (strictly decreasing, so no two items tie);
* ``phi_k``: a Dirichlet(``intent_concentration``) draw over ``intent_size`` items chosen
  uniformly at random (zero elsewhere);
* ``rho``: a Dirichlet(``prior_concentration``) draw;
* ``T``: item i has ``n_successors`` distinct successors, uniform over the other items, with
  Dirichlet(1) probabilities;
* ``mix = (a, b, c)`` as given (a + b + c = 1, c > 0).

Session lengths are 2 + a geometric number (mean ``mean_length``, at most ``max_length``),
independent of the intent. Sessions start at sorted random integer times over ``n_days`` days;
events inside a session are 1 + Exp(60 s) seconds apart (strictly increasing). Session ids are
1..n_sessions in order of start time; item ids are distinct random 9-digit integers, so code
that confuses ids with indices fails visibly.

With the defaults, memory of the whole session matters: one click leaves several intents
plausible (mean posterior of the true intent 0.51 after one click, 0.76 after two, 0.95 after
four), and the last click alone explains only part of the next one. Measured on the default
test split (3,469 predictions), Recall@20 / MRR@20: the oracle 0.541 / 0.188; the same Bayes
rule with the intent inferred from the last click only 0.419 / 0.172; the last click's successors
then popularity 0.270 / 0.153; popularity 0.082 / 0.035. 2 of the 4,156 test clicks are items
unseen in training (dropped, so the oracle is exact up to that).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gru4rec.datasets.intent_model import DEFAULT_CUTOFFS, IntentModel, check_cutoffs
from gru4rec.datasets.synthetic import split_frames, split_paths, write_splits
from gru4rec.errors import ConfigError
from gru4rec.files import atomic_write

__all__ = ["IntentModel", "IntentParams", "generate_intents", "write_intents", "ORACLE_FILE", "DEFAULT_CUTOFFS"]

ORACLE_FILE = "oracle.json"
_SECONDS_PER_DAY = 86_400


def _check(cond: bool, name: str, value: object, rule: str) -> None:
    if not cond:
        raise ConfigError(f"intents data: {name}={value!r} is invalid; {rule}")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class IntentParams:
    """The generator's parameters (see the module docstring); checked when made: ConfigError
    naming the first bad one. ``mix`` is kept exactly normalised."""

    n_sessions: int = 20_000
    n_items: int = 3_000
    n_intents: int = 50
    intent_size: int = 150
    intent_concentration: float = 0.3
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
        n_items, mix = self.n_items, self.mix
        _check(_is_int(self.n_sessions) and self.n_sessions >= 1, "n_sessions", self.n_sessions, "need an int >= 1")
        _check(_is_int(n_items) and 2 <= n_items <= 900_000_000, "n_items", n_items, "need an int in [2, 900000000]")
        _check(_is_int(self.n_intents) and self.n_intents >= 1, "n_intents", self.n_intents, "need an int >= 1")
        _check(_is_int(self.intent_size) and 1 <= self.intent_size <= n_items, "intent_size", self.intent_size,
               f"need an int in [1, n_items={n_items}]")
        _check(_is_real(self.intent_concentration) and self.intent_concentration > 0, "intent_concentration",
               self.intent_concentration, "need a number > 0")
        _check(_is_int(self.n_successors) and 1 <= self.n_successors < n_items, "n_successors", self.n_successors,
               f"need an int in [1, n_items - 1={n_items - 1}]")
        ok = isinstance(mix, (tuple, list)) and len(mix) == 3 and all(_is_real(w) and w >= 0 for w in mix)
        _check(ok and abs(sum(mix) - 1.0) < 1e-9 and mix[2] > 0, "mix", mix,
               "need three weights (a, b, c) >= 0 of T, phi_k and pop summing to 1, with c > 0")
        _check(_is_real(self.zipf_exponent) and self.zipf_exponent > 0, "zipf_exponent", self.zipf_exponent,
               "need a number > 0 (popularity strictly decreasing)")
        _check(_is_real(self.prior_concentration) and self.prior_concentration > 0, "prior_concentration",
               self.prior_concentration, "need a number > 0")
        _check(_is_real(self.mean_length) and self.mean_length >= 2, "mean_length", self.mean_length,
               "need a number >= 2 (sessions have at least 2 events)")
        _check(_is_int(self.max_length) and self.max_length >= 2, "max_length", self.max_length, "need an int >= 2")
        _check(_is_real(self.n_days) and self.n_days > 0, "n_days", self.n_days, "need a number > 0")
        _check(_is_int(self.start_time) and self.start_time >= 0, "start_time", self.start_time,
               "need an int >= 0 (unix seconds)")
        _check(_is_int(self.seed) and self.seed >= 0, "seed", self.seed, "need an int >= 0")
        object.__setattr__(self, "mix", tuple(float(w) / float(sum(mix)) for w in mix))

    @classmethod
    def of(cls, params: IntentParams | None = None, **changes: Any) -> IntentParams:
        """``params`` (default: the defaults) with ``changes``; ConfigError naming an unknown one."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"unknown intents parameter(s) {unknown}; known: {sorted(known)}")
        return replace(params or cls(), **changes)

    def to_json(self) -> dict[str, Any]:
        """The parameters as plain JSON values (as ``oracle.json`` records them)."""
        return {k: (list(v) if k == "mix" else v.item() if isinstance(v, np.generic) else v) for k, v in asdict(self).items()}


def _dirichlet_rows(rng: np.random.Generator, alpha: float, shape: tuple[int, int], name: str) -> np.ndarray:
    """Rows of independent Dirichlet(alpha) draws (normalised gammas); ConfigError when alpha is
    so small that a row underflows to all zeros."""
    g = rng.standard_gamma(alpha, size=shape)
    total = g.sum(axis=1, keepdims=True)
    _check(bool(np.all(total > 0)), name, alpha, "too small: a Dirichlet draw underflowed to zero")
    return g / total


def _model(rng: np.random.Generator, n_items: int, n_intents: int, intent_size: int, intent_concentration: float,
           n_successors: int, mix: tuple[float, float, float], zipf_exponent: float, prior_concentration: float) -> IntentModel:
    N, K, m = n_items, n_intents, n_successors
    item_ids = rng.choice(900_000_000, size=N, replace=False).astype(np.int64) + 100_000_000
    pop = 1.0 / np.arange(1, N + 1, dtype=np.float64) ** zipf_exponent
    pop /= pop.sum()
    rho = _dirichlet_rows(rng, prior_concentration, (1, K), "prior_concentration")[0]
    # Intent supports: the intent_size items with the smallest of N uniform keys (a uniform subset).
    support = np.argpartition(rng.random((K, N)), intent_size - 1, axis=1)[:, :intent_size]
    phi = np.zeros((K, N))
    np.put_along_axis(phi, support, _dirichlet_rows(rng, intent_concentration, (K, intent_size), "intent_concentration"), axis=1)
    # Successors: m distinct items other than i, uniformly; duplicates are redrawn until none is left.
    own = np.arange(N)[:, None]
    succ = rng.integers(0, N - 1, size=(N, m))
    succ += succ >= own
    while True:
        succ.sort(axis=1)
        dup = np.zeros_like(succ, dtype=bool)
        dup[:, 1:] = succ[:, 1:] == succ[:, :-1]
        if not dup.any():
            break
        redraw = rng.integers(0, N - 1, size=int(dup.sum()))
        succ[dup] = redraw + (redraw >= np.broadcast_to(own, succ.shape)[dup])
    probs = _dirichlet_rows(rng, 1.0, (N, m), "n_successors")
    indptr = np.arange(0, N * m + 1, m, dtype=np.int64)
    return IntentModel(item_ids, pop, phi, rho, indptr, succ.ravel().astype(np.int64), probs.ravel(), mix)


def generate_intents(params: IntentParams | None = None, /, **changes: Any) -> tuple[pd.DataFrame, IntentModel]:
    """Generate an event log from the intent model (see the module docstring) and return it
    with the model: ``(events, model)``, events with int64 columns SessionId, ItemId, Time,
    ordered by session (in start-time order) and time.

    The parameters are an :class:`IntentParams` and/or its fields as keywords
    (``generate_intents(n_sessions=5000, seed=3)``). Deterministic for given parameters. ``mix =
    (a, b, c)`` weighs the successor table, the session's intent and global popularity. The
    defaults (about 120,000 events) train 10 epochs of GRU4Rec with 100 units in one to two
    minutes on one CPU core. Invalid parameters raise ConfigError naming the parameter.
    """
    p = IntentParams.of(params, **changes)
    n_sessions, mean_length, max_length = p.n_sessions, p.mean_length, p.max_length
    n_days, start_time = p.n_days, p.start_time
    mix = p.mix
    rng = np.random.default_rng(p.seed)
    model = _model(rng, int(p.n_items), int(p.n_intents), int(p.intent_size), float(p.intent_concentration),
                   int(p.n_successors), mix, float(p.zipf_exponent), float(p.prior_concentration))
    extra = rng.geometric(1.0 / (mean_length - 1.0), size=n_sessions) - 1
    lengths = np.minimum(2 + extra, max_length).astype(np.int64)
    items, _ = model.sample(lengths, rng)
    times = session_times(rng, lengths, n_days, start_time)
    session_ids = np.repeat(np.arange(1, n_sessions + 1, dtype=np.int64), lengths)
    return pd.DataFrame({"SessionId": session_ids, "ItemId": model.item_ids[items], "Time": times}), model


def session_times(rng: np.random.Generator, lengths: np.ndarray, n_days: float, start_time: int) -> np.ndarray:
    """The events' times (int64, session after session) of sessions of the given lengths: sorted
    random integer start times over ``n_days`` days from ``start_time``, events 1 + Exp(60 s)
    seconds apart (also used by :mod:`gru4rec.datasets.intents_attributes`)."""
    span = int(n_days * _SECONDS_PER_DAY)
    starts = start_time + np.sort(rng.integers(0, span, size=len(lengths)))
    first = np.r_[0, np.cumsum(lengths)[:-1]]
    gaps = 1 + np.floor(rng.exponential(60.0, size=int(lengths.sum()))).astype(np.int64)
    gaps[first] = 0
    within = np.cumsum(gaps)
    within -= np.repeat(within[first], lengths)
    return np.asarray(np.repeat(starts, lengths) + within, dtype=np.int64)


# ---------------------------------------------------------------------- writing


def _flat_metrics(m: dict[str, Any], train_file: str) -> dict[str, Any]:
    out: dict[str, Any] = {"train": train_file}
    for name in ("recall", "mrr"):
        out.update({f"{name}@{c}": v for c, v in m[name].items()})
    out.update({k: m[k] for k in ("n_predictions", "n_sessions", "n_dropped_events", "n_items")})
    return out


def write_intents(
    out_dir: str | os.PathLike[str],
    params: IntentParams | None = None,
    /,
    *,
    test_days: float = 1.0,
    cutoffs: int | Sequence[int] = DEFAULT_CUTOFFS,
    force: bool = False,
    **changes: Any,
) -> dict[str, Path]:
    """Generate an intents data set (``params`` and/or ``changes`` as in :func:`generate_intents`) and write
    the four TSVs of the public data sets (``train_full``, ``test``, ``train_tr``,
    ``train_valid``) and ``oracle.json`` into ``out_dir``.

    test = sessions starting in the last ``test_days`` days; the same rule on train_full gives
    train_tr / train_valid (:func:`gru4rec.datasets.synthetic.time_split`). ``oracle.json`` holds
    the parameters (seed included), and the oracle's ``recall@c`` / ``mrr@c`` for each of
    ``cutoffs`` on test (ranked among train_full's items) and on train_valid (among train_tr's,
    for tuning), with the numbers of predictions, as ``gru4rec.evaluate(..., mode='conservative')``
    would count them. Every file is written atomically; existing files are never replaced unless
    ``force`` (DataError naming the first existing file, and nothing is written). Returns
    ``{name: path}`` for ``train_full``, ``test``, ``train_tr``, ``train_valid`` and ``oracle``.
    """
    spec = IntentParams.of(params, **changes)
    n_days = spec.n_days
    _check(_is_real(test_days) and 0 < test_days < n_days / 2, "test_days", test_days, f"need a number in (0, n_days / 2 = {n_days / 2})")
    cut = check_cutoffs(cutoffs)
    paths = split_paths(out_dir, force, extra={"oracle": ORACLE_FILE})
    df, model = generate_intents(spec)
    frames = split_frames(df, test_days, paths, spec.n_sessions)
    train_full, test, train_tr, train_valid = (frames[n] for n in ("train_full", "test", "train_tr", "train_valid"))
    report = {
        "generator": "gru4rec.datasets.intents",
        "params": {**spec.to_json(), "test_days": test_days},
        "mode": "conservative",
        "cutoffs": cut,
        "test": _flat_metrics(model.oracle_metrics(test, train_full["ItemId"].unique(), cut), "train_full.tsv"),
        "train_valid": _flat_metrics(model.oracle_metrics(train_valid, train_tr["ItemId"].unique(), cut), "train_tr.tsv"),
    }
    write_splits(frames, paths, force)
    atomic_write(paths["oracle"], lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8"))
    return paths
