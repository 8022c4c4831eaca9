"""Helpers of the command-line tests (tests/test_cli.py, tests/test_run_py.py, ...): running
``gru4rec`` in-process, reading the metric lines it prints, a brute-force reference of those
metrics, and the one-line error every failed command ends with."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from gru4rec.cli import main

TINY = "layers=8,n_sample=16,n_epochs=2,batch_size=8,sample_store_size=1600,learning_rate=0.1"
CUTOFFS = (1, 5, 10)
METRIC_LINE = re.compile(r"^Recall@(\d+): ([0-9.]+) MRR@(\d+): ([0-9.]+)")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def parse_metrics(text: str) -> list[dict[int, tuple[float, float]]]:
    """Metric blocks in order (one per test file): {cutoff: (recall, mrr)}."""
    blocks: list[dict[int, tuple[float, float]]] = []
    current: dict[int, tuple[float, float]] = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if not m:
            continue
        c = int(m.group(1))
        if c in current:
            blocks.append(current)
            current = {}
        current[c] = (float(m.group(2)), float(m.group(4)))
    if current:
        blocks.append(current)
    return blocks


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    errors = [line for line in lines if line.startswith("gru4rec: error: ")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def brute_force(model: Any, test: pd.DataFrame, cutoffs: tuple[int, ...], mode: str) -> dict[int, tuple[float, float]]:
    """Per-event reference: zero state per session, rank the target among all N raw scores."""
    cfg = model.config
    net = model.net
    net.eval()
    index = {item: i for i, item in enumerate(model.item_map.to_list())}
    test = test.sort_values([cfg.session_key, cfg.time_key], kind="stable")
    ranks: list[float] = []
    with torch.no_grad():
        for _, items in test.groupby(cfg.session_key, sort=False)[cfg.item_key]:
            known = [index[i] for i in items if i in index]
            hidden = net.init_hidden(1)
            for prev, target in zip(known[:-1], known[1:]):
                out = net.step(torch.tensor([prev], device=net.Wy.device), hidden)
                scores = net.score_all(out)[0].double().cpu().numpy()
                t = scores[target]
                higher, equal = int((scores > t).sum()), int((scores == t).sum())
                ranks.append(higher + 1 if mode == "standard" else float(higher + equal))
    r = np.asarray(ranks, dtype=np.float64)
    return {c: (float(np.mean(r <= c)), float(np.mean(np.where(r <= c, 1.0 / r, 0.0)))) for c in cutoffs}


def assert_metrics_close(got: dict[int, tuple[float, float]], want: dict[int, tuple[float, float]]) -> None:
    assert set(got) == set(want)
    for c in want:
        # printed with 6 decimals
        assert got[c][0] == pytest.approx(want[c][0], abs=1.5e-6), c
        assert got[c][1] == pytest.approx(want[c][1], abs=1.5e-6), c
