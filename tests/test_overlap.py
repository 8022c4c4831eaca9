"""The leak check (gru4rec/data/overlap.py): the share of an evaluation set's transitions
(session id, previous item -> item) that occur in the training data, counted against a
brute-force set of tuples; the bounded fingerprint, its file form, and the warnings of fit,
evaluate, the CLI and paropt."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gru4rec import GRU4Rec, evaluate
from gru4rec.data.overlap import (
    MAX_KEPT,
    TrainingFingerprint,
    checked_once,
    paired_sessions,
    transition_hashes,
    warn_overlap,
)
from gru4rec.errors import DataLeakWarning

TINY = "loss=cross-entropy,layers=8,batch_size=8,n_sample=8,n_epochs=1,seed=3"


def random_events(n_sessions: int, seed: int, first_id: int = 0, n_items: int = 40) -> pd.DataFrame:
    """Sessions of 1-7 clicks over ``n_items`` items, session ids from ``first_id``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 8, n_sessions)
    sessions = np.repeat(np.arange(first_id, first_id + n_sessions), lengths)
    return pd.DataFrame({"SessionId": sessions, "ItemId": rng.integers(0, n_items, len(sessions)) * 7 + 1000,
                         "Time": np.arange(len(sessions), dtype=np.int64)})


def brute_force(train: pd.DataFrame, evaluation: pd.DataFrame) -> tuple[int, int]:
    """(shared, all) targets of ``evaluation`` by Python tuples; unknown items dropped first."""
    def transitions(df: pd.DataFrame) -> list[tuple[int, int, int]]:
        out = []
        for sid, group in df.sort_values(["SessionId", "Time"], kind="stable").groupby("SessionId"):
            items = group["ItemId"].tolist()
            out += [(sid, a, b) for a, b in zip(items, items[1:])]
        return out

    known = set(train["ItemId"])
    seen = set(transitions(train))
    targets = transitions(evaluation[evaluation["ItemId"].isin(known)])
    return sum(t in seen for t in targets), len(targets)


@pytest.fixture
def leak_records() -> Iterator[list[logging.LogRecord]]:
    """The DataLeakWarning records of the gru4rec logger while the test runs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record) if isinstance(record.msg, DataLeakWarning) else None  # type: ignore[method-assign]
    logger = logging.getLogger("gru4rec")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def mixed(train: pd.DataFrame) -> pd.DataFrame:
    """An evaluation set: 30 training sessions copied, 2 cut short, one id reused for other
    clicks, and 40 new sessions (new ids) — with an item unknown to training in one copy."""
    ids = train["SessionId"].unique()
    copied = train[train["SessionId"].isin(ids[:30])]
    cut = train[train["SessionId"].isin(ids[30:32])].groupby("SessionId").head(3)
    reused = random_events(1, seed=9, first_id=int(ids[40]))
    new = random_events(40, seed=10, first_id=10_000)
    unknown = pd.DataFrame({"SessionId": [ids[0]], "ItemId": [999_999], "Time": [10**6]})
    return pd.concat([copied, cut, reused, new, unknown], ignore_index=True)


def test_the_share_is_the_brute_force_count() -> None:
    train = random_events(300, seed=1)
    evaluation = mixed(train)
    train_sessions, eval_sessions, n_dropped = paired_sessions(train, evaluation)
    found = TrainingFingerprint.of(train_sessions).overlap(eval_sessions)
    shared, total = brute_force(train, evaluation)
    assert n_dropped == 1
    assert found.exact and (found.n_shared, found.n_targets) == (shared, total)
    assert 0.2 < found.share < 0.8  # both kinds of sessions are there


def test_disjoint_data_share_nothing(leak_records: list[logging.LogRecord]) -> None:
    train = random_events(300, seed=1)
    evaluation = random_events(100, seed=2, first_id=5_000)
    train_sessions, eval_sessions, _ = paired_sessions(train, evaluation)
    found = warn_overlap(TrainingFingerprint.of(train_sessions), eval_sessions, "the test")
    assert found is not None and found.n_shared == 0 and found.n_targets == brute_force(train, evaluation)[1]
    assert leak_records == []


def test_a_bounded_fingerprint_estimates_the_share_from_a_deterministic_sample() -> None:
    train = random_events(3_000, seed=4, n_items=500)
    evaluation = mixed(train)
    train_sessions, eval_sessions, _ = paired_sessions(train, evaluation)
    full = TrainingFingerprint.of(train_sessions)
    small = TrainingFingerprint.of(train_sessions, limit=2_000)
    assert len(small.hashes) == 2_000 and small.threshold < full.threshold
    # The kept hashes are the smallest distinct ones, the same whatever the order of the data.
    assert np.array_equal(small.hashes, np.unique(transition_hashes(train_sessions))[:2_000])
    found = small.overlap(eval_sessions)
    assert not found.exact and 0 < found.n_checked < found.n_targets
    # The estimate is the exact share among the checked transitions...
    hashes = transition_hashes(eval_sessions)
    checked = hashes[hashes <= np.uint64(small.threshold)]
    assert found.n_shared == int(np.isin(checked, transition_hashes(train_sessions)).sum())
    # ... and near the share among all.
    shared, total = brute_force(train, evaluation)
    assert abs(found.share - shared / total) < 0.15


def test_merging_two_fingerprints_is_the_fingerprint_of_both() -> None:
    a, b = random_events(2_000, seed=5, n_items=300), random_events(2_000, seed=6, first_id=50_000, n_items=300)
    both, sa, _ = paired_sessions(pd.concat([a, b]), a)  # one item map for the three
    _, sb, _ = paired_sessions(pd.concat([a, b]), b)
    merged = TrainingFingerprint.of(sa, limit=1_000).merged(TrainingFingerprint.of(sb, limit=1_000), limit=1_000)
    direct = TrainingFingerprint.of(both, limit=1_000)
    assert np.array_equal(merged.hashes, direct.hashes) and merged.threshold == direct.threshold


def test_the_file_form_round_trips_and_is_bounded() -> None:
    fingerprint = TrainingFingerprint.of(paired_sessions(random_events(300, seed=1), random_events(5, seed=2))[0])
    back = TrainingFingerprint.from_meta(fingerprint.to_meta())
    assert back is not None and np.array_equal(back.hashes, fingerprint.hashes) and back.threshold == fingerprint.threshold
    assert TrainingFingerprint.from_meta(None) is None
    assert MAX_KEPT * 8 * 4 // 3 < 800_000  # the base64 of the hashes in a model file's header


def test_fit_and_evaluate_warn_on_a_leak_once_each(tmp_path: Path, leak_records: list[logging.LogRecord]) -> None:
    train = random_events(300, seed=1)
    evaluation = mixed(train)
    shared, total = brute_force(train, evaluation)
    model = GRU4Rec(TINY, device="cpu").fit(train, valid=evaluation, progress=False)
    assert len(leak_records) == 1
    assert f"{shared / total:.1%} of the prediction targets of the validation data" in leak_records[0].getMessage()
    assert f"{shared:,} of {total:,}" in leak_records[0].getMessage()
    model.save(tmp_path / "m.safetensors")
    loaded = GRU4Rec.load(tmp_path / "m.safetensors", device="cpu")
    evaluation.to_csv(tmp_path / "test.tsv", sep="\t", index=False)
    evaluate(loaded, tmp_path / "test.tsv")
    assert len(leak_records) == 2 and str(tmp_path / "test.tsv") in leak_records[1].getMessage()
    evaluate(loaded, random_events(50, seed=3, first_id=90_000))  # disjoint: quiet
    with checked_once():
        evaluate(loaded, evaluation)  # checked by the caller
    assert len(leak_records) == 2


def test_a_model_file_without_the_fingerprint_loads_and_says_nothing(tmp_path: Path, leak_records: list[logging.LogRecord]) -> None:
    train = random_events(300, seed=1)
    model = GRU4Rec(TINY, device="cpu").fit(train, progress=False)
    model.train_fingerprint = None  # as a file written before the fingerprint was kept
    model.save(tmp_path / "old.safetensors")
    loaded = GRU4Rec.load(tmp_path / "old.safetensors", device="cpu")
    assert loaded.train_fingerprint is None
    evaluate(loaded, train)
    assert leak_records == []


def test_a_warm_start_remembers_the_first_days_sessions(leak_records: list[logging.LogRecord]) -> None:
    day1, day2 = random_events(200, seed=1), random_events(200, seed=2, first_id=1_000)
    model = GRU4Rec(TINY, device="cpu").fit(day1, progress=False)
    warm = GRU4Rec(TINY, device="cpu").fit(day2, init_from=model, progress=False)
    evaluate(warm, day1)
    assert len(leak_records) == 1 and "100.0%" in leak_records[0].getMessage()


def test_paropt_warns_once_per_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("optuna")
    from gru4rec.cli.paropt import main
    from tune_helpers import FIXED

    train = random_events(300, seed=1)
    train.to_csv(tmp_path / "train.tsv", sep="\t", index=False)
    space = tmp_path / "space.json"
    space.write_text('{"name": "layers", "dtype": "int", "values": [8, 16], "step": 8}\n')
    # VALID is TRAIN's first sessions: every target is a training transition.
    train[train["SessionId"] < 100].to_csv(tmp_path / "valid.tsv", sep="\t", index=False)
    code = main([str(tmp_path / "train.tsv"), str(tmp_path / "valid.tsv"), "-opf", str(space), "-fp", FIXED,
                 "-pm", "mrr", "--threads", "1", "-nt", "2", "--no-pruning", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 0
    assert f"100.0% of the prediction targets of VALID {tmp_path / 'valid.tsv'}" in err
    assert err.count("of the prediction targets of") == 1, err  # not again in each trial's evaluations


def test_the_command_lines_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec import cli

    train = random_events(300, seed=1)
    leak = train[train["SessionId"] < 100]
    shared, total = brute_force(train, leak)
    for name, frame in (("train", train), ("leak", leak), ("new", random_events(60, seed=2, first_id=5_000))):
        frame.to_csv(tmp_path / f"{name}.tsv", sep="\t", index=False)
    line = f"gru4rec: warning: 100.0% of the prediction targets of {{}} (session id, previous item -> item; {shared:,} of {total:,})"
    model = tmp_path / "m.safetensors"
    assert cli.main(["train", str(tmp_path / "train.tsv"), "-ps", TINY, "--valid", str(tmp_path / "leak.tsv"), "-s", str(model)]) == 0
    assert line.format(f"the validation data {tmp_path / 'leak.tsv'}") in capsys.readouterr().err
    assert cli.main(["evaluate", str(model), "-t", str(tmp_path / "leak.tsv"), str(tmp_path / "new.tsv")]) == 0
    err = capsys.readouterr().err
    assert line.format(tmp_path / "leak.tsv") in err and err.count("prediction targets of") == 1
    # The tie mode is named where the metric lines start (issue 37: every published figure is conservative).
    assert f"Evaluating on {tmp_path / 'new.tsv'}: Recall@K, MRR@K, ... with standard ties (published figures use -e conservative)" in err
    from gru4rec.cli import run_py_main

    assert run_py_main([str(tmp_path / "train.tsv"), "-ps", TINY, "-t", str(tmp_path / "leak.tsv")]) == 0
    assert f"100.0% of the prediction targets of {tmp_path / 'leak.tsv'}" in capsys.readouterr().err


def test_chunks_give_the_same_fingerprint_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    import gru4rec.data.overlap as overlap

    train = random_events(3_000, seed=4, n_items=500)
    train_sessions, eval_sessions, _ = paired_sessions(train, mixed(train))
    whole, whole_small = TrainingFingerprint.of(train_sessions), TrainingFingerprint.of(train_sessions, limit=2_000)
    counts = (whole.overlap(eval_sessions), whole_small.overlap(eval_sessions))
    monkeypatch.setattr(overlap, "CHUNK_EVENTS", 97)  # many chunks, cut between sessions
    assert len(list(overlap._chunks(train_sessions))) > 50
    for one, limit in ((whole, MAX_KEPT), (whole_small, 2_000)):
        chunked = TrainingFingerprint.of(train_sessions, limit=limit)
        assert np.array_equal(chunked.hashes, one.hashes) and chunked.threshold == one.threshold
    assert (whole.overlap(eval_sessions), whole_small.overlap(eval_sessions)) == counts
