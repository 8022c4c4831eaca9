"""A synthetic session data set with a realistic shape, for quick starts, tests and benchmarks.

The generating process (all of it vectorised over sessions; the only Python loop runs over the
positions inside a session):

* Item popularity is Zipf-like: the item of popularity rank r has weight 1 / (r + 1)^a.
* Items belong to hidden clusters (topics). Each session picks a topic (in proportion to the
  topic's total popularity) and keeps it.
* Every item has a few likely successors, drawn uniformly from its own topic (a sparse
  first-order Markov structure). Each next event is, with probability ``p_successor``, one of the current item's
  successors (weights halving from the first to the last); else, with probability
  ``p_topic``, a popular item of the session's topic; else an item drawn from global
  popularity. So a first-order Markov model beats popularity by a wide margin, and a model
  that remembers the session's topic (a GRU) can do better still.
* Session lengths are 2 + a geometric number (mean ``mean_length``, at most ``max_length``).
* Sessions start at sorted random times over ``n_days`` days; events inside a session are
  1 + Exp(60 s) seconds apart (integer unix seconds, strictly increasing).

With the defaults the shape is close to the rsc15 100k sample: the top 1 % of items hold
18 % of the events (rsc15: 17 %), the 20 most popular items catch 14 % of next items (9 %),
the 20 most frequent successors of the previous item 58 % (51 %).

Session ids are 1..n_sessions in order of start time; item ids are distinct random 9-digit
integers (like YOOCHOOSE's), so code that confuses ids with indices fails visibly.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from gru4rec.data.events import write_events
from gru4rec.errors import ConfigError, DataError, OutputExistsError

__all__ = ["generate", "write_synthetic", "time_split", "split_paths", "split_frames", "write_splits", "SPLIT_FILES"]

# Defaults sized so that 10 epochs of the default GRU4Rec train in about a minute on 2 cores.
DEFAULT_N_SESSIONS = 25_000
DEFAULT_N_ITEMS = 3_000

SPLIT_FILES = ("train_full.tsv", "test.tsv", "train_tr.tsv", "train_valid.tsv")

_SECONDS_PER_DAY = 86_400


def _check(cond: bool, name: str, value: object, rule: str) -> None:
    if not cond:
        raise ConfigError(f"synthetic data: {name}={value!r} is invalid; {rule}")


class _ClusterSampler:
    """Draws items from a topic in proportion to their popularity weights (vectorised)."""

    def __init__(self, weights: np.ndarray, cluster: np.ndarray, n_clusters: int) -> None:
        self.order = np.argsort(cluster, kind="stable")
        self.cum = np.cumsum(weights[self.order])
        sizes = np.bincount(cluster, minlength=n_clusters)
        self.block_end = np.cumsum(sizes)  # exclusive end of each topic's block in `order`
        block_start = self.block_end - sizes
        totals = np.bincount(cluster, weights=weights, minlength=n_clusters)
        self.base = np.r_[0.0, self.cum][block_start]
        self.totals = totals

    def sample(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
        u = self.base[clusters] + rng.random(len(clusters)) * self.totals[clusters]
        pos = np.searchsorted(self.cum, u, side="right")
        # Rounding can step one past the block: clamp to the topic's last item.
        pos = np.minimum(pos, self.block_end[clusters] - 1)
        return self.order[pos]


def generate(
    n_sessions: int = DEFAULT_N_SESSIONS,
    n_items: int = DEFAULT_N_ITEMS,
    seed: int = 0,
    *,
    mean_length: float = 5.0,
    max_length: int = 200,
    zipf_exponent: float = 0.8,
    n_topics: int | None = None,
    n_successors: int = 3,
    p_successor: float = 0.5,
    p_topic: float = 0.3,
    n_days: float = 30.0,
    start_time: int = 1_600_000_000,
) -> pd.DataFrame:
    """Generate a synthetic event log (columns SessionId, ItemId, Time; all int64).

    Rows are ordered by session (in start-time order) and time. Deterministic for a given
    ``seed`` and arguments. ``n_topics`` defaults to ``max(1, n_items // 50)``. About
    ``n_sessions * mean_length`` events; one million take a few seconds. Invalid arguments
    raise ConfigError.
    """
    _check(isinstance(n_sessions, (int, np.integer)) and n_sessions >= 1, "n_sessions", n_sessions, "need an int >= 1")
    _check(isinstance(n_items, (int, np.integer)) and n_items >= 2, "n_items", n_items, "need an int >= 2")
    _check(mean_length >= 2, "mean_length", mean_length, "need >= 2 (sessions have at least 2 events)")
    _check(max_length >= 2, "max_length", max_length, "need >= 2")
    _check(zipf_exponent >= 0, "zipf_exponent", zipf_exponent, "need >= 0")
    _check(n_successors >= 1, "n_successors", n_successors, "need >= 1")
    _check(0 <= p_successor <= 1, "p_successor", p_successor, "need a probability in [0, 1]")
    _check(0 <= p_topic <= 1 - p_successor, "p_topic", p_topic, "need 0 <= p_topic <= 1 - p_successor")
    _check(n_days > 0, "n_days", n_days, "need > 0")
    if n_topics is None:
        n_topics = max(1, n_items // 50)
    _check(1 <= n_topics <= n_items, "n_topics", n_topics, "need 1 <= n_topics <= n_items")

    rng = np.random.default_rng(seed)

    # Internal item k has popularity rank k; external ids are random, unrelated to rank.
    weights = 1.0 / np.arange(1, n_items + 1, dtype=np.float64) ** zipf_exponent
    global_cum = np.cumsum(weights)
    item_ids = rng.choice(900_000_000, size=n_items, replace=False).astype(np.int64) + 100_000_000
    topic = rng.integers(0, n_topics, size=n_items)
    sampler = _ClusterSampler(weights, topic, n_topics)

    def global_sample(size: int) -> np.ndarray:
        u = rng.random(size) * global_cum[-1]
        return np.minimum(np.searchsorted(global_cum, u, side="right"), n_items - 1)

    # Successors of each item: drawn from its topic uniformly (not by popularity, which would
    # concentrate the events on a few heads); a self-loop is replaced by a global draw.
    uniform = _ClusterSampler(np.ones(n_items), topic, n_topics)
    succ = uniform.sample(rng, np.repeat(topic, n_successors)).reshape(n_items, n_successors)
    self_loop = succ == np.arange(n_items)[:, None]
    succ[self_loop] = global_sample(int(self_loop.sum()))
    succ_cum = np.cumsum(0.5 ** np.arange(n_successors))
    succ_cum /= succ_cum[-1]

    # Sessions: topic, length, and the event layout.
    topic_weight = sampler.totals / sampler.totals.sum()
    session_topic = rng.choice(n_topics, size=n_sessions, p=topic_weight)
    extra = rng.geometric(1.0 / (mean_length - 1.0), size=n_sessions) - 1
    lengths = np.minimum(2 + extra, max_length).astype(np.int64)
    offsets = np.zeros(n_sessions + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n_events = int(offsets[-1])
    items = np.empty(n_events, dtype=np.int64)

    # First item: the session's topic most of the time.
    from_topic = rng.random(n_sessions) < 0.7
    first = global_sample(n_sessions)
    first[from_topic] = sampler.sample(rng, session_topic[from_topic])
    items[offsets[:-1]] = first
    current = first
    active = np.arange(n_sessions)
    for t in range(1, int(lengths.max())):
        keep = lengths[active] > t
        active, current = active[keep], current[keep]
        u = rng.random(len(active))
        nxt = np.empty(len(active), dtype=np.int64)
        is_succ = u < p_successor
        is_topic = ~is_succ & (u < p_successor + p_topic)
        is_global = ~(is_succ | is_topic)
        which = np.searchsorted(succ_cum, rng.random(int(is_succ.sum())), side="right")
        nxt[is_succ] = succ[current[is_succ], np.minimum(which, n_successors - 1)]
        nxt[is_topic] = sampler.sample(rng, session_topic[active[is_topic]])
        nxt[is_global] = global_sample(int(is_global.sum()))
        items[offsets[active] + t] = nxt
        current = nxt

    # Times: sorted session starts; strictly increasing integer seconds inside a session.
    span = int(n_days * _SECONDS_PER_DAY)
    starts = start_time + np.sort(rng.integers(0, span, size=n_sessions))
    gaps = 1 + np.floor(rng.exponential(60.0, size=n_events)).astype(np.int64)
    gaps[offsets[:-1]] = 0
    within = np.cumsum(gaps)
    within -= np.repeat(within[offsets[:-1]], lengths)
    times = np.repeat(starts, lengths) + within

    session_ids = np.repeat(np.arange(1, n_sessions + 1, dtype=np.int64), lengths)
    return pd.DataFrame({"SessionId": session_ids, "ItemId": item_ids[items], "Time": times})


def time_split(
    df: pd.DataFrame,
    seconds: float,
    *,
    session_key: str = "SessionId",
    item_key: str = "ItemId",
    time_key: str = "Time",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split by time as the public data sets are (docs/datasets.md): with T the latest time,
    test = sessions that start at or after T - seconds; train = events before T - seconds,
    without sessions left shorter than 2. Test events whose item is not in train are removed,
    then test sessions shorter than 2.

    The rule is datasets.protocol.time_split's (what `gru4rec split` uses on event codes), kept
    here in pandas because it works on any DataFrame, keeps its columns and row order, and adds
    the unknown-item removal; tests/test_synthetic.py checks that the two agree."""
    boundary = df[time_key].max() - seconds
    session_start = df.groupby(session_key, sort=False)[time_key].transform("min")
    test = df[session_start >= boundary]
    train = df[df[time_key] < boundary]
    train = train[train.groupby(session_key, sort=False)[time_key].transform("size") >= 2]
    test = test[test[item_key].isin(train[item_key].unique())]
    test = test[test.groupby(session_key, sort=False)[time_key].transform("size") >= 2]
    return train.reset_index(drop=True), test.reset_index(drop=True)


def write_synthetic(
    out_dir: str | os.PathLike[str],
    *,
    n_sessions: int = DEFAULT_N_SESSIONS,
    n_items: int = DEFAULT_N_ITEMS,
    seed: int = 0,
    test_days: float = 1,
    force: bool = False,
) -> dict[str, Path]:
    """Generate a synthetic data set and write it as the four TSVs of the public data sets
    (``train_full``, ``test``, ``train_tr``, ``train_valid``; TAB-separated with a header).

    test = sessions starting in the last ``test_days`` days; the same rule on train_full gives
    train_tr / train_valid (see `time_split`). Each file is written atomically. Existing files
    are never replaced unless ``force`` (DataError naming the first existing file; nothing is
    written then). Returns ``{name: path}`` with names ``train_full``, ``test``, ``train_tr``,
    ``train_valid``.
    """
    _check(test_days > 0, "test_days", test_days, "need > 0")
    paths = split_paths(out_dir, force)
    frames = split_frames(generate(n_sessions, n_items, seed), test_days, paths, n_sessions)
    write_splits(frames, paths, force)
    return paths


def split_paths(out_dir: str | os.PathLike[str], force: bool, extra: dict[str, str] | None = None) -> dict[str, Path]:
    """``{name: path}`` of the four split files (and of ``extra``: name -> file name) in
    ``out_dir``, checked before anything is generated: DataError when ``out_dir`` is a file, or
    (unless ``force``) naming the first file that exists."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    paths = {name.removesuffix(".tsv"): out / name for name in SPLIT_FILES}
    paths.update({name: out / file for name, file in (extra or {}).items()})
    if not force:
        for path in paths.values():
            if path.exists():
                raise OutputExistsError(path)
    return paths


def split_frames(events: pd.DataFrame, test_days: float, paths: dict[str, Path], n_sessions: int) -> dict[str, pd.DataFrame]:
    """The four splits of ``events``: test = sessions starting in the last ``test_days`` days,
    the same rule on train_full for train_tr / train_valid; DataError naming a split that would
    be empty."""
    seconds = test_days * _SECONDS_PER_DAY
    train_full, test = time_split(events, seconds)
    train_tr, train_valid = time_split(train_full, seconds)
    frames = {"train_full": train_full, "test": test, "train_tr": train_tr, "train_valid": train_valid}
    for name, frame in frames.items():
        if len(frame) == 0:
            raise DataError(
                f"{paths[name]}: the split would be empty (n_sessions={n_sessions}, test_days={test_days}); "
                "use more sessions or fewer test days"
            )
    return frames


def write_splits(frames: dict[str, pd.DataFrame], paths: dict[str, Path], force: bool) -> None:
    """Write each split to its path (atomically, creating the folder)."""
    next(iter(paths.values())).parent.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        write_events(frame, paths[name], force=force)
