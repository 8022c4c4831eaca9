"""``gru4rec report``: the figures (matplotlib Figure objects inspected before they are saved),
the self-contained HTML (its numbers parsed back and compared with the run folders), the PNGs,
a study's figures through Optuna's own visualisation, and the errors."""
from __future__ import annotations

import base64
import json
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("matplotlib")

from gru4rec.cli import main
from gru4rec.report import runs as figures
from gru4rec.report.build import planned_files, write_report
from gru4rec.tracking.runs import read_run

TINY = "layers=8,n_sample=16,batch_size=8,sample_store_size=1600"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two training runs (other learning rates and epochs) with validation and a test set."""
    from gru4rec.datasets.synthetic import write_synthetic

    data = write_synthetic(tmp_path_factory.mktemp("synthetic"), n_sessions=200, n_items=40, seed=3, test_days=6)
    d = tmp_path_factory.mktemp("runs")
    torch.set_num_threads(1)
    for name, params in (("fast", "n_epochs=3,learning_rate=0.2"), ("slow", "n_epochs=2,learning_rate=0.05")):
        assert main(["-q", "train", str(data["train_tr"]), "-ps", f"{TINY},{params}", "--valid", str(data["train_valid"]),
                     "--valid-metric", "mrr@10", "-t", str(data["test"]), "-m", "10", "-d", "cpu", "--run-dir", str(d / name)]) == 0
    return [read_run(d / "fast"), read_run(d / "slow")]


class Tables(HTMLParser):
    """Every table of a page: its attributes and its rows of (text, data-value) cells; every image source."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict[str, Any]] = []
        self.images: list[str] = []
        self._cell: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self.tables.append({"attrs": a, "rows": []})
        elif tag == "tr" and self.tables:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = {"value": a.get("data-value"), "text": ""}
        elif tag == "img":
            self.images.append(a["src"] or "")

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1]["rows"][-1].append(self._cell)
            self._cell = None


def test_training_curves_figure(two_runs: list[dict[str, Any]]) -> None:
    fig = figures.training_curves(two_runs)
    loss, valid, speed = fig.axes
    assert len(fig.axes) == 3
    for ax, value in ((loss, lambda e: e["loss"]), (speed, lambda e: e["events_per_s"]), (valid, lambda e: e["valid"]["mrr@10"])):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["fast", "slow"]
        for line, run in zip(lines, two_runs):
            assert list(line.get_xdata()) == [e["epoch"] for e in run["epochs"]]
            assert list(line.get_ydata()) == [value(e) for e in run["epochs"]]
    assert valid.get_ylabel() == "mrr@10"
    # One circle per run at its best epoch.
    marks = [c.get_offsets().tolist()[0] for c in valid.collections]
    for mark, run in zip(marks, two_runs):
        best = run["epochs"][-1]["best_epoch"]
        assert mark == [best, run["epochs"][best - 1]["valid"]["mrr@10"]]


def test_metrics_at_k_figure(two_runs: list[dict[str, Any]]) -> None:
    fig = figures.metrics_at_k(two_runs)
    assert [ax.get_title() for ax in fig.axes] == ["Recall@k", "MRR@k"]
    for ax, metric in zip(fig.axes, ("recall", "mrr")):
        assert len(ax.get_lines()) == 2
        for line, run in zip(ax.get_lines(), two_runs):
            (result,) = run["metrics"].values()
            ks = sorted(int(k) for k in result[metric])
            assert list(line.get_xdata()) == ks and len(ks) > 5
            assert list(line.get_ydata()) == [result[metric][str(k)] for k in ks]


@pytest.mark.parametrize("kind", ["session_length", "popularity"])
def test_breakdown_figure(two_runs: list[dict[str, Any]], kind: str) -> None:
    fig = figures.breakdown_figure(two_runs, kind)
    assert len(fig.axes) == 2 and figures.breakdown_cutoff(two_runs) == 10  # the runs' -m cutoff
    for ax, metric in zip(fig.axes, ("recall", "mrr")):
        assert len(ax.containers) == 2  # one bar series per run
        for bars, run in zip(ax.containers, two_runs):
            (result,) = run["metrics"].values()
            groups = result["breakdown"][kind]
            assert [b.get_height() for b in bars] == [g[metric]["10"] or 0.0 for g in groups]
        assert len(ax.get_xticklabels()) == (7 if kind == "session_length" else 10)


def test_the_html_report_is_self_contained_and_its_numbers_are_the_runs(two_runs: list[dict[str, Any]], tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    capsys.readouterr()
    assert main(["report", two_runs[0]["path"], two_runs[1]["path"], "-o", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    expected = [out] + [tmp_path / f"report.{n}.png" for n in ("training", "metrics_at_k", "session_length", "popularity")]
    assert printed == [str(p) for p in expected] and all(p.is_file() for p in expected)
    page = out.read_text(encoding="utf-8")
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing to fetch: every image is embedded
    parsed = Tables()
    parsed.feed(page)
    # The embedded images are the PNGs beside the page.
    assert [base64.b64decode(src.split(",", 1)[1]) for src in parsed.images] == [p.read_bytes() for p in expected[1:]]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in expected[1:])

    epoch_tables = {t["attrs"]["data-run"]: t["rows"] for t in parsed.tables if t["attrs"].get("class") == "epochs"}
    assert set(epoch_tables) == {"fast", "slow"}
    for run in two_runs:
        header, *rows = epoch_tables[run["name"]]
        names = [c["text"] for c in header]
        assert names[:5] == ["epoch", "loss", "seconds", "mb/s", "events/s"] and "valid mrr@10" in names
        assert len(rows) == len(run["epochs"])
        for row, epoch in zip(rows, run["epochs"]):
            values = [c["value"] for c in row]
            assert int(values[0]) == epoch["epoch"]
            assert [float(v) for v in values[1:5]] == [epoch["loss"], epoch["seconds"], epoch["mb_per_s"], epoch["events_per_s"]]
            assert float(values[names.index("valid mrr@10")]) == epoch["valid"]["mrr@10"]
    (metrics,) = [t["rows"] for t in parsed.tables if t["attrs"].get("class") == "metrics"]
    (result,) = two_runs[0]["metrics"].values()
    first = {int(r[2]["value"]): float(r[3]["value"]) for r in metrics[1:] if r[0]["text"] == "fast"}
    assert first == {int(k): v for k, v in result["recall"].items()}
    breakdowns = {t["attrs"]["data-kind"]: t["rows"] for t in parsed.tables if t["attrs"].get("class") == "breakdown"}
    rows = [r for r in breakdowns["popularity"][1:] if r[0]["text"] == "slow"]
    (slow,) = two_runs[1]["metrics"].values()
    assert [int(r[3]["value"]) for r in rows] == [g["n_predictions"] for g in slow["breakdown"]["popularity"]]

    # Made again over its own files without --force (issue 50 item 6: the hint after evaluate
    # sends the user to the same command); a user's own page or figure of those names needs --force.
    assert main(["report", two_runs[0]["path"], "-o", str(out)]) == 0, capsys.readouterr().err
    assert "<title>gru4rec report: fast</title>" in out.read_text(encoding="utf-8")
    for mine in (out, expected[1]):
        saved = mine.read_bytes()
        mine.write_bytes(b"\x89PNG\r\n\x1a\n my own" if mine.suffix == ".png" else b"<html>my notes</html>")
        capsys.readouterr()
        assert main(["report", two_runs[0]["path"], "-o", str(out)]) == 1
        assert f"{mine} already exists; pass --force" in capsys.readouterr().err
        assert main(["report", two_runs[0]["path"], "-o", str(out), "--force"]) == 0
        assert mine.read_bytes() == saved  # the same report again
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "other.html")]) == 1
    assert "run folder" in capsys.readouterr().err and not (tmp_path / "other.html").exists()


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """A real (tiny) Optuna study in SQLite: a quadratic with two parameters, 12 trials."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{tmp_path_factory.mktemp('study') / 'study.db'}"
    s = optuna.create_study(study_name="quad", storage=url, direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    s.optimize(lambda t: -(t.suggest_float("learning_rate", 0.01, 0.5) - 0.2) ** 2 - 0.01 * t.suggest_int("layers", 8, 64), n_trials=12)
    return url, s


def test_study_figures_and_best_trials(study: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gru4rec.report.study import best_trials, study_figures

    url, s = study
    figs = {f.name: f for f in study_figures(s)}
    assert list(figs) == ["history", "importances", "parallel", "slice"] and all(f.figure is not None for f in figs.values())
    history = figs["history"].figure.axes[0]
    values = sorted(round(float(v), 12) for v in history.collections[0].get_offsets()[:, 1])
    assert values == sorted(round(t.value, 12) for t in s.trials)  # one point per trial
    assert len(figs["slice"].figure.axes) >= 2  # one panel per parameter
    best = best_trials(s, n=3)
    assert [t["number"] for t in best] == [t.number for t in sorted(s.trials, key=lambda t: -t.value)[:3]]

    out = tmp_path / "study.html"
    capsys.readouterr()
    assert main(["report", "--study", url, "--study-name", "quad", "-o", str(out)]) == 0
    assert [Path(p).name for p in capsys.readouterr().out.split()] == [p.name for p in planned_files(out, runs=False, study=True)]
    parsed = Tables()
    parsed.feed(out.read_text(encoding="utf-8"))
    assert len(parsed.images) == 4
    (table,) = [t["rows"] for t in parsed.tables if t["attrs"].get("class") == "best-trials"]
    assert [int(r[0]["value"]) for r in table[1:]] == [t["number"] for t in best_trials(s)]
    assert [float(r[1]["value"]) for r in table[1:]] == [t["value"] for t in best_trials(s)]


def test_study_errors(study: tuple[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = study
    capsys.readouterr()
    assert main(["report", "--study", url, "--study-name", "other", "-o", str(tmp_path / "a.html")]) == 1
    err = capsys.readouterr().err
    assert "no study 'other'" in err and "it holds: quad" in err
    missing = tmp_path / "missing.db"
    assert main(["report", "--study", str(missing), "--study-name", "quad", "-o", str(tmp_path / "b.html")]) == 1
    assert "not found" in capsys.readouterr().err and not missing.exists()  # no empty database was created
    assert main(["report", "--study-name", "quad", "-o", str(tmp_path / "c.html")]) == 2
    assert main(["report", "-o", str(tmp_path / "d.html")]) == 2
    # No name: the storage's only study; with two, the error lists them.
    capsys.readouterr()
    assert main(["-q", "report", "--study", url, "-o", str(tmp_path / "e.html")]) == 0
    assert "Study quad" in (tmp_path / "e.html").read_text()
    optuna = pytest.importorskip("optuna")
    two = tmp_path / "two.db"
    shutil.copy(url.removeprefix("sqlite:///"), two)
    optuna.create_study(study_name="second", storage=f"sqlite:///{two}")
    assert main(["report", "--study", str(two), "-o", str(tmp_path / "f.html")]) == 1
    err = capsys.readouterr().err
    assert "it holds 2 studies: quad, second; pass --study-name NAME" in err and not (tmp_path / "f.html").exists()


def test_a_study_without_a_completed_trial_is_reported_without_figures(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    url = f"sqlite:///{tmp_path / 'none.db'}"
    s = optuna.create_study(study_name="none", storage=url, direction="maximize")

    def pruned(trial: Any) -> float:
        trial.suggest_float("x", 0, 1)
        raise optuna.TrialPruned()

    s.optimize(pruned, n_trials=2)
    files = write_report([], tmp_path / "none.html", study_storage=url, study_name="none")
    page = files[0].read_text(encoding="utf-8")
    assert files == [tmp_path / "none.html"]  # no PNG
    assert "2 trials: 2 PRUNED" in page and page.count("Not drawn: no trial has completed yet") == 4


def test_without_matplotlib_the_error_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    capsys.readouterr()
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 1
    assert "pip install 'gru4rec[report]'" in capsys.readouterr().err


def test_report_json_round_trip_of_a_run(two_runs: list[dict[str, Any]]) -> None:
    """read_run gives back exactly what the files hold."""
    run = two_runs[0]
    lines = (Path(run["path"]) / "epochs.jsonl").read_text().splitlines()
    assert run["epochs"] == [json.loads(line) for line in lines]


def test_the_breakdown_cutoff_is_the_largest_one_asked_for() -> None:
    def fake(cutoffs: list[int], ks: list[int]) -> dict[str, Any]:
        return {"config": {"cutoffs": cutoffs}, "metrics": {"t": {"recall": {str(k): 0.0 for k in ks}}}}

    assert figures.breakdown_cutoff([fake([1, 5, 20], [1, 5, 10, 20, 50])]) == 20  # not 1: Recall@1 = MRR@1
    assert figures.breakdown_cutoff([fake([5], [1, 5, 10]), fake([10], [1, 5, 10])]) == 10
    assert figures.breakdown_cutoff([fake([], [1, 5, 20, 50])]) == 20
    assert figures.breakdown_cutoff([fake([7], [7]), fake([8], [8])]) is None


def test_metrics_sort_by_their_cutoff_as_a_number() -> None:
    keys = ["mrr@1", "mrr@10", "mrr@20", "mrr@5", "recall@5", "recall@10"]
    assert sorted(keys, key=figures.metric_order) == ["mrr@1", "mrr@5", "mrr@10", "mrr@20", "recall@5", "recall@10"]


def test_losses_of_different_scale_are_drawn_relative_to_their_first_epoch(two_runs: list[dict[str, Any]]) -> None:
    import copy

    runs = copy.deepcopy(two_runs)
    assert not figures.losses_differ_in_scale(runs)  # the same loss: drawn as it is (test above)
    for e in runs[1]["epochs"]:
        e["loss"] = e["loss"] / 25  # as BPR-max (~0.4) beside cross-entropy (~10)
    assert figures.losses_differ_in_scale(runs)
    loss_axis = figures.training_curves(runs).axes[0]
    for line, run in zip(loss_axis.get_lines(), runs):
        first = run["epochs"][0]["loss"]
        assert list(line.get_ydata()) == pytest.approx([e["loss"] / first for e in run["epochs"]], rel=1e-12)
    assert "epoch-1" in loss_axis.get_ylabel()


def test_the_slice_figure_has_a_readable_panel_per_parameter(study: tuple[str, Any]) -> None:
    optuna = pytest.importorskip("optuna")
    from gru4rec.report.study import SLICE_COLUMNS, SLICE_PANEL, slice_grid

    _, s = study
    complete = [t for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE]
    fig = slice_grid(s, complete)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_xlabel() in ("layers", "learning_rate")]
    assert sorted(ax.get_xlabel() for ax in panels) == ["layers", "learning_rate"]
    for ax in panels:
        name = ax.get_xlabel()
        points = sorted(map(tuple, ax.collections[0].get_offsets().tolist()))
        expected = sorted((float(t.params[name]), float(t.value)) for t in complete)
        assert [x for p in points for x in p] == pytest.approx([x for p in expected for x in p], rel=1e-12)
    # Each panel keeps its size however many parameters there are: rows of SLICE_COLUMNS.
    seven = [optuna.trial.create_trial(params={f"p{i}": float(j) for i in range(7)}, value=float(j),
                                       distributions={f"p{i}": optuna.distributions.FloatDistribution(0, 10) for i in range(7)})
             for j in range(4)]
    big = slice_grid(s, seven)
    width, height = big.get_size_inches()
    assert (width, height) == pytest.approx((SLICE_PANEL[0] * SLICE_COLUMNS, SLICE_PANEL[1] * 3))


def test_wide_tables_scroll_inside_the_page(two_runs: list[dict[str, Any]], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    write_report([r["path"] for r in two_runs], out)
    text = out.read_text()
    assert text.count('<div class="table"><table') == text.count("<table") > 0 and "overflow-x: auto" in text
    epoch_tables = [t for t in text.split("<table")[1:] if "<th>valid " in t]
    assert len(epoch_tables) == 2
    for table in epoch_tables:
        headers = re.findall(r"<th>valid (\w+@\d+)</th>", table)
        assert len(headers) > 1 and headers == sorted(headers, key=figures.metric_order)


def test_evaluate_on_a_run_folders_model_fills_its_test_panels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """train --run-dir without -t, then gru4rec evaluate of the folder's model: the figures the
    report draws are that evaluation's (issue 37: the README's report was half empty)."""
    from gru4rec import GRU4Rec, evaluate
    from gru4rec.datasets.synthetic import write_synthetic
    from gru4rec.tracking.runs import RUN_CUTOFFS

    data = write_synthetic(tmp_path / "data", n_sessions=200, n_items=40, seed=3, test_days=6)
    run = tmp_path / "run"
    assert main(["-q", "train", str(data["train_tr"]), "-ps", f"{TINY},n_epochs=1", "-d", "cpu", "--run-dir", str(run)]) == 0
    empty = figures.metrics_at_k([read_run(run)])
    assert "gru4rec evaluate RUN/model.safetensors -t TEST" in empty.axes[0].texts[0].get_text()
    model = run / "model.safetensors"
    assert main(["evaluate", str(model), "-t", str(data["test"]), "-m", "5", "-e", "conservative", "-d", "cpu"]) == 0
    assert f"Recorded the test metrics in {run / 'metrics.json'}" in capsys.readouterr().err
    (entry,) = read_run(run)["metrics"].values()
    want = evaluate(GRU4Rec.load(model, device="cpu"), data["test"], cutoffs=RUN_CUTOFFS, mode="conservative")
    assert entry["mode"] == "conservative" and entry["breakdown"] is not None
    assert {int(k): v for k, v in entry["mrr"].items()} == pytest.approx({k: float(want.mrr[k]) for k in RUN_CUTOFFS}, abs=1e-12)
    fig = figures.metrics_at_k([read_run(run)])
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == [entry["mrr"][str(k)] for k in RUN_CUTOFFS]
    # Again on the same file: its entry is replaced (and said so; a change of ties is said even
    # with -q); with a repeat boost nothing is recorded.
    assert main(["evaluate", str(model), "-t", str(data["test"]), "-m", "5", "-e", "conservative", "-d", "cpu"]) == 0
    err = capsys.readouterr().err
    assert f", replacing the earlier ones of {data['test']}" in err and "ties figures" not in err
    assert main(["-q", "evaluate", str(model), "-t", str(data["test"]), "-d", "cpu"]) == 0
    err = capsys.readouterr().err
    assert f"the conservative-ties figures of {data['test']} were replaced by standard-ties ones (-e conservative" in err
    assert read_run(run)["metrics"][str(data["test"])]["mode"] == "standard"
    assert main(["evaluate", str(model), "-t", str(data["test"]), "--repeat-weight", "1", "-d", "cpu"]) == 0
    assert "Not recorded in the run folder" in capsys.readouterr().err
    assert read_run(run)["metrics"][str(data["test"])]["mode"] == "standard"


def _contrast_with_white(rgba: Any) -> float:
    """WCAG contrast ratio of a colour against white (1: invisible, 21: black)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(float(c)) for c in rgba[:3])
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


@pytest.fixture(scope="module")
def paropt_study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real 2-trial study of gru4rec paropt with a final test, its storage and its summary."""
    pytest.importorskip("optuna")
    from gru4rec.datasets.synthetic import write_synthetic

    data = write_synthetic(tmp_path_factory.mktemp("paropt_data"), n_sessions=200, n_items=40, seed=3, test_days=6)
    space = tmp_path_factory.mktemp("space") / "space.json"
    space.write_text('{"name": "learning_rate", "dtype": "float", "values": [0.05, 0.2], "step": 0.05}\n'
                     '{"name": "layers", "dtype": "int", "values": [8, 16], "step": 8}\n')
    out = tmp_path_factory.mktemp("paropt")
    torch.set_num_threads(1)
    assert main(["-q", "paropt", str(data["train_tr"]), str(data["train_valid"]), "-opf", str(space),
                 "-fp", "n_sample=16,n_epochs=1,batch_size=8,sample_store_size=1600", "-nt", "2", "-pm", "mrr", "-m", "10",
                 "-e", "conservative", "--threads", "1", "-d", "cpu", "--out", str(out), "--study-name", "tiny",
                 "--final-test", str(data["test"]), "-fm", "5", "10"]) == 0
    return {"url": f"sqlite:///{out / 'paropt.db'}", "out": out,
            "summary": json.loads((out / "tiny.summary.json").read_text(encoding="utf-8"))}


def test_the_study_report_names_its_objective_best_parameters_and_final_test(
    paropt_study: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50 item 6: what the study maximised, the best parameter string and the final test
    (as paropt's STUDY.summary.json holds them), and a caveat on the importances of 2 trials."""
    out = paropt_study["out"] / "study.html"
    assert main(["report", "--study", paropt_study["url"], "-o", str(out)]) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    summary = paropt_study["summary"]
    objective = summary["objective"]
    assert (objective["metric"], objective["cutoff"], objective["eval_mode"]) == ("mrr", 10, "conservative")
    (said,) = re.findall(r'<p class="objective">(.*?)</p>', page)
    assert "<b>MRR@10</b>" in said and "conservative ties" in said and f"<code>{objective['valid']}</code>" in said
    (best,) = re.findall(r'<code class="best-params">(.*?)</code>', page)
    assert best == summary["best_param_string"] and "learning_rate=" in best and "n_sample=16" in best
    parsed = Tables()
    parsed.feed(page)
    (final,) = [t["rows"] for t in parsed.tables if t["attrs"].get("class") == "final-test"]
    assert {int(r[0]["value"]): (float(r[1]["value"]), float(r[2]["value"])) for r in final[1:]} == {
        int(k): (summary["final_test"]["recall"][k], summary["final_test"]["mrr"][k]) for k in ("5", "10")}
    assert re.search(r'<p class="caveat">Caveat: only 2 completed trials\.', page)
    # Made again over its own files, as after any change of the study.
    assert main(["report", "--study", paropt_study["url"], "-o", str(out)]) == 0


def test_the_best_trial_stands_out_in_the_slice_figure(paropt_study: dict[str, Any], study: tuple[str, Any]) -> None:
    """The best trial was drawn in the lightest blue of the trial-number scale when it came first:
    white on white. It is now a star of its own colour, and no trial's point is near-white."""
    from gru4rec.report.study import best_trials, load_study, study_figures

    for s in (load_study(paropt_study["url"]), study[1]):
        (slice_fig,) = [f.figure for f in study_figures(s) if f.name == "slice"]
        best = best_trials(s, n=1)[0]
        for ax in slice_fig.axes[:len(best["params"])]:
            stars = [c for c in ax.collections if c.get_label() == f"best: trial {best['number']}"]
            assert len(stars) == 1, [c.get_label() for c in ax.collections]
            assert _contrast_with_white(stars[0].get_facecolors()[0]) >= 4.5
            assert float(stars[0].get_offsets()[0][1]) == pytest.approx(best["value"])
            points = ax.collections[0]
            colours = points.cmap(points.norm(points.get_array()))
            assert min(_contrast_with_white(c) for c in colours) >= 1.5  # the old scale started at 1.04
