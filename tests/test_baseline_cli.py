"""``gru4rec baseline pop|spop|itemknn``: its printed metrics and --metrics-json against a
hand-computed case, a brute-force count of ranks, and the Python API (gru4rec.baselines +
evaluate) on the same files."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.baselines import ItemKNN, Pop, SessionPop
from gru4rec.cli import main
from gru4rec.evaluation.evaluator import evaluate

torch.set_num_threads(1)

METRIC = "Recall@{c}: {r:.6f} MRR@{c}: {m:.6f}"


def write(path: Path, sessions: list[list[int]], first_id: int = 1) -> Path:
    rows = [(first_id + s, item, 100 * s + p) for s, items in enumerate(sessions) for p, item in enumerate(items)]
    pd.DataFrame(rows, columns=["SessionId", "ItemId", "Time"]).to_csv(path, sep="\t", index=False)
    return path


def run(argv: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def metric_table(out: str) -> dict[int, tuple[float, float]]:
    table = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0].startswith("Recall@"):
            table[int(words[0][7:-1])] = (float(words[1]), float(words[3]))
    return table


@pytest.fixture()
def tiny(tmp_path: Path) -> dict[str, Path]:
    # Training counts: item 3 four times, item 2 twice, items 1, 4, 5 once.
    train = write(tmp_path / "train.tsv", [[1, 2, 3], [2, 3, 4], [3, 3, 5]])
    # Predictions: 3 -> 2, 2 -> 1, 5 -> 4.
    test = write(tmp_path / "test.tsv", [[3, 2, 1], [5, 4]], first_id=10)
    return {"train": train, "test": test}


def test_pop_by_hand(tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Scores are the counts 4, 2, 1, 1, 1. Target 2 (count 2): rank 2 in both modes. Targets 1
    # and 4 (count 1, tied with two others): rank 3 (standard) or 5 (conservative).
    want = {
        "standard": {1: (0.0, 0.0), 3: (1.0, (1 / 2 + 1 / 3 + 1 / 3) / 3), 5: (1.0, (1 / 2 + 1 / 3 + 1 / 3) / 3)},
        "conservative": {1: (0.0, 0.0), 3: (1 / 3, 1 / 6), 5: (1.0, (1 / 2 + 1 / 5 + 1 / 5) / 3)},
    }
    for mode, table in want.items():
        report = tmp_path / f"{mode}.json"
        code, out, err = run(["baseline", "pop", tiny["train"], "-t", tiny["test"], "-m", 1, 3, 5, "-e", mode,
                              "--metrics-json", report, "-d", "cpu"], capsys)
        assert code == 0, err
        lines = [line for line in out.splitlines() if line.startswith("Recall@")]
        assert [line.split(" NDCG@")[0] for line in lines] == [METRIC.format(c=c, r=r, m=m) for c, (r, m) in table.items()]
        metrics = json.loads(report.read_text())[str(tiny["test"])]
        assert metrics["mode"] == mode and metrics["n_predictions"] == 3
        for c, (r, m) in table.items():
            assert metrics["recall"][str(c)] == pytest.approx(r, abs=1e-12)
            assert metrics["mrr"][str(c)] == pytest.approx(m, abs=1e-12)
        # Everyone gets the same list: coverage@c = c / 5 items.
        assert metrics["coverage"]["3"] == pytest.approx(3 / 5)


def brute_force_ranks(train: list[list[int]], test: list[list[int]], kind: str, mode: str) -> np.ndarray:
    """Rank of every target by counting, for pop (training counts) and spop (session counts
    first, training counts among equal ones)."""
    counts = Counter(i for s in train for i in s)
    items = sorted(counts)
    ranks = []
    for session in test:
        session = [i for i in session if i in counts]
        seen: Counter[int] = Counter()
        for prev, target in zip(session[:-1], session[1:]):
            seen[prev] += 1
            score = {i: (seen[i] if kind == "spop" else 0, counts[i]) for i in items}  # compared as pairs
            higher = sum(score[i] > score[target] for i in items)
            equal = sum(score[i] == score[target] for i in items)
            ranks.append(higher + 1 if mode == "standard" else higher + equal)
    return np.asarray(ranks, dtype=np.float64)


@pytest.mark.parametrize("kind", ["pop", "spop"])
@pytest.mark.parametrize("mode", ["standard", "conservative"])
def test_pop_and_spop_against_a_brute_force_count(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   kind: str, mode: str) -> None:
    rng = np.random.default_rng(11)
    train = [list(rng.integers(1, 30, rng.integers(2, 7))) for _ in range(80)]
    test = [list(rng.integers(1, 34, rng.integers(2, 7))) for _ in range(25)]  # 30-33 are unknown
    paths = write(tmp_path / "tr.tsv", train), write(tmp_path / "te.tsv", test, first_id=1000)
    code, out, err = run(["baseline", kind, paths[0], "-t", paths[1], "-m", 1, 5, 10, "-e", mode, "-d", "cpu"], capsys)
    assert code == 0, err
    r = brute_force_ranks(train, test, kind, mode)
    want = {c: (float(np.mean(r <= c)), float(np.mean(np.where(r <= c, 1 / r, 0.0)))) for c in (1, 5, 10)}
    got = metric_table(out)
    for c in want:
        assert got[c] == pytest.approx(want[c], abs=6e-7), c  # printed with 6 decimals


@pytest.mark.parametrize("kind, flags, api", [
    ("pop", [], lambda: Pop()),
    ("spop", [], lambda: SessionPop()),
    ("itemknn", [], lambda: ItemKNN()),
    ("itemknn", ["--neighbors", "3", "--lambda", "0", "--alpha", "0.3"], lambda: ItemKNN(n_neighbors=3, lmbd=0.0, alpha=0.3)),
])
def test_the_command_reports_what_the_python_api_computes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           kind: str, flags: list[str], api) -> None:
    from gru4rec.datasets.synthetic import write_synthetic

    data = write_synthetic(tmp_path / "d", n_sessions=200, n_items=50, seed=4, test_days=6)
    report = tmp_path / "m.json"
    code, out, err = run(["baseline", kind, data["train_full"], "-t", data["test"], "-m", 1, 5, 20,
                          "-e", "conservative", "--metrics-json", report, "-d", "cpu", *flags], capsys)
    assert code == 0, err
    expected = evaluate(api().fit(data["train_full"]), data["test"], cutoffs=(1, 5, 20), mode="conservative")
    metrics = json.loads(report.read_text())[str(data["test"])]
    for c in (1, 5, 20):
        for name in ("recall", "mrr", "ndcg", "coverage", "popularity"):
            assert metrics[name][str(c)] == getattr(expected, name)[c], (name, c)
    assert metric_table(out) == {c: (round(expected.recall[c], 6), round(expected.mrr[c], 6)) for c in (1, 5, 20)}


def test_baseline_errors(tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["baseline", "pop", tiny["train"], "-t", tiny["test"], "--neighbors", 5], capsys)
    assert code == 2 and "gru4rec: error: --neighbors: only with itemknn" in err
    code, _, err = run(["baseline", "pop", tiny["train"]], capsys)
    assert code == 2 and "-t/--test" in err
    code, _, err = run(["baseline", "knn", tiny["train"], "-t", tiny["test"]], capsys)
    assert code == 2 and "invalid choice: 'knn'" in err
    code, _, err = run(["baseline", "itemknn", tiny["train"], "-t", tiny["test"], "--alpha", 2], capsys)
    assert code == 2 and "[0, 1]" in err
    code, _, err = run(["baseline", "pop", tmp_path / "missing.tsv", "-t", tiny["test"]], capsys)
    assert code == 1 and "missing.tsv" in err and "Traceback" not in err
    kept = tmp_path / "kept.json"
    kept.write_text("mine")
    code, _, err = run(["baseline", "pop", tiny["train"], "-t", tiny["test"], "--metrics-json", kept], capsys)
    assert code == 2 and "--force" in err and kept.read_text() == "mine"
