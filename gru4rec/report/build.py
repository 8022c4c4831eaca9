"""``write_report``: run folders and/or an Optuna study -> one self-contained HTML file, with
every figure also written as a PNG beside it (``<name>.<figure>.png``).

What the report holds, for the runs (one or several, overlaid):

1. the runs: command line, changed hyperparameters, device, precision, threads, best epoch;
2. training curves (loss, validation metric, events/s per epoch) and every run's epoch table;
3. Recall@k and MRR@k against k on the test set, and their table;
4. the test evaluation by session length and by target-item popularity decile, and their tables;

and for a study: the trial counts, the objective (metric, cutoff, ties, validation file), the
best parameter string and the final test of paropt's ``STUDY.summary.json``, Optuna's
optimisation history, parameter importances (with a caveat below
:data:`~gru4rec.report.study.IMPORTANCE_MIN_TRIALS` completed trials), parallel coordinates and
slices, and the table of the best trials.
"""
from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gru4rec.errors import Gru4RecError
from gru4rec.files import atomic_write, check_output_path
from gru4rec.report import runs as run_figures
from gru4rec.report.html import document, figure_html, is_report_page, table_html
from gru4rec.report.mpl import is_report_png, png_bytes, require_matplotlib

__all__ = ["RUN_FIGURES", "planned_files", "write_report"]

#: The PNGs of the runs' part: file suffix -> title.
RUN_FIGURES = {
    "training": "Training curves",
    "metrics_at_k": "Recall@k and MRR@k on the test set",
    "session_length": "By session length",
    "popularity": "By target-item popularity",
}


def planned_files(out: str | os.PathLike[str], *, runs: bool, study: bool) -> list[Path]:
    """Every file :func:`write_report` writes for ``out`` (the HTML first)."""
    from gru4rec.report.study import STUDY_FIGURES

    out = Path(out)
    names = (list(RUN_FIGURES) if runs else []) + ([f"study_{n}" for n in STUDY_FIGURES] if study else [])
    return [out] + [out.with_name(f"{out.stem}.{n}.png") for n in names]


def _head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of ``path`` (empty when it is not a readable file)."""
    try:
        with path.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _check_outputs(files: Sequence[Path], force: bool) -> None:
    """The report's files can be written: each is free, or ``force``, or a file an earlier
    ``gru4rec report`` wrote there (the report in a run folder is made again after ``evaluate``
    records new test figures: refusing its own files sent the user to ``--force`` for nothing).
    Each file is judged by its own mark (:func:`is_report_page`, :func:`is_report_png`), so
    that a user's file of the same name is still refused."""
    if files[0].suffix.lower() not in (".html", ".htm"):
        raise Gru4RecError(f"report file {files[0]} should end in .html")
    own_page = is_report_page(_head(files[0]).decode("utf-8", errors="replace"))
    for f in files:
        ours = own_page if f == files[0] else is_report_png(_head(f), beside_report=own_page)
        check_output_path(f, "report file" if f == files[0] else "report figure", force or ours, argument="force")


def _num(value: Any) -> Any:
    return value if isinstance(value, (int, float)) or value is None else str(value)


def _run_sections(runs: Sequence[dict[str, Any]], pngs: dict[str, bytes], dpi: int) -> list[str]:
    figures = {
        "training": run_figures.training_curves(runs),
        "metrics_at_k": run_figures.metrics_at_k(runs),
        "session_length": run_figures.breakdown_figure(runs, "session_length"),
        "popularity": run_figures.breakdown_figure(runs, "popularity"),
    }
    for name, fig in figures.items():
        pngs[name] = png_bytes(fig, dpi)
    body = ["<h2>Runs</h2>"]
    rows = []
    for run in runs:
        cfg = run.get("config") or {}
        best = next((e.get("best_epoch") for e in reversed(run["epochs"]) if e.get("best_epoch") is not None), None)
        rows.append([run["name"], cfg.get("param_string"), cfg.get("device"), cfg.get("precision"), cfg.get("threads"),
                     len(run["epochs"]), run_figures.valid_metric(run), best, cfg.get("early_stop")])
    body.append(table_html(["run", "hyperparameters (changed)", "device", "precision", "threads", "epochs",
                            "validation metric", "best epoch", "early stop"], rows, css_class="runs"))
    for run in runs:
        if run.get("command"):
            body.append(f"<p><b>{html.escape(run['name'])}</b>: <code>{html.escape(run['command'])}</code></p>")

    body += ["<h2>Training curves</h2>", figure_html(pngs["training"], RUN_FIGURES["training"])]
    for run in runs:
        metric_keys = sorted({k for e in run["epochs"] for k in (e.get("valid") or {})}, key=run_figures.metric_order)
        headers = ["epoch", "loss", "seconds", "mb/s", "events/s", "peak host MB", "peak device MB"] + [f"valid {k}" for k in metric_keys]
        rows = [[e["epoch"], e["loss"], e["seconds"], e["mb_per_s"], e["events_per_s"], e.get("peak_host_mb"), e.get("peak_device_mb")]
                + [(e.get("valid") or {}).get(k) for k in metric_keys] for e in run["epochs"]]
        body.append(f"<h3>{html.escape(run['name'])}</h3>")
        body.append(table_html(headers, rows, css_class="epochs", data={"run": run["name"]}))

    body += ["<h2>Test metrics</h2>", figure_html(pngs["metrics_at_k"], RUN_FIGURES["metrics_at_k"])]
    rows = []
    for run in runs:
        for test, result in run_figures.evaluations(run):
            for k in sorted(int(c) for c in result["recall"]):
                rows.append(
                    [run["name"], test, k] + [result.get(m, {}).get(str(k)) for m in ("recall", "mrr", "ndcg", "coverage", "popularity")]
                )
    body.append(table_html(["run", "test", "k", "Recall@k", "MRR@k", "NDCG@k", "Coverage@k", "Popularity@k"], rows, css_class="metrics"))

    cutoff = run_figures.breakdown_cutoff(runs)
    for kind in ("session_length", "popularity"):
        body += [f"<h2>{RUN_FIGURES[kind]}</h2>", figure_html(pngs[kind], RUN_FIGURES[kind])]
        if cutoff is None:
            continue
        rows = []
        for run in runs:
            for test, result in run_figures.evaluations(run):
                for g in (result.get("breakdown") or {}).get(kind, []):
                    extra = [g.get("n_items"), g.get("min_support"), g.get("max_support")] if kind == "popularity" else []
                    rows.append(
                        [run["name"], test, g["label"], g["n_predictions"], g["recall"].get(str(cutoff)), g["mrr"].get(str(cutoff))] + extra
                    )
        extra_headers = ["items", "min support", "max support"] if kind == "popularity" else []
        label = "decile" if kind == "popularity" else "session length"
        body.append(table_html(["run", "test", label, "predictions", f"Recall@{cutoff}", f"MRR@{cutoff}"] + extra_headers, rows,
                               css_class="breakdown", data={"kind": kind}))
    return body


def _objective_html(study: Any) -> str:
    """What the study maximises: metric, cutoff, ties and validation file (paropt records them)."""
    from gru4rec.report.study import paropt_objective

    objective = paropt_objective(study)
    direction = "maximises" if study.direction.name == "MAXIMIZE" else "minimises"
    if objective is None:
        return f'<p class="objective">Objective: the study {direction} its value (not a gru4rec paropt study: no metric recorded).</p>'
    metric = f"{'MRR' if objective['metric'] == 'mrr' else 'Recall'}@{objective['cutoff']}"
    return (f'<p class="objective">Objective: the study {direction} <b>{html.escape(metric)}</b> with '
            f"{html.escape(str(objective.get('eval_mode')))} ties on the validation file "
            f"<code>{html.escape(str(objective.get('valid')))}</code>, each trial trained on "
            f"<code>{html.escape(str(objective.get('train')))}</code>.</p>")


def _summary_html(study: Any, storage: str) -> list[str]:
    """The best parameter string and the final test of ``STUDY.summary.json`` (paropt's), or why
    they are not shown."""
    from gru4rec.report.study import find_summary, paropt_objective

    if paropt_objective(study) is None:  # only paropt writes a summary
        return []
    found = find_summary(storage, study)
    if found is None:
        return ['<p class="note">No STUDY.summary.json of this study beside its storage (paropt writes it into '
                "--out): the best parameter string and the final test are not shown.</p>"]
    path, summary = found
    body = [f'<h3>Best parameters and final test</h3><p class="note">From <code>{html.escape(str(path))}</code>.</p>']
    if summary.get("best_param_string"):
        body.append(f"<p>Best trial {html.escape(str(summary.get('best_trial')))}: "
                    f'<code class="best-params">{html.escape(str(summary["best_param_string"]))}</code> '
                    "(train with <code>-ps</code>, or <code>-pf</code> the STUDY.best.py beside it)</p>")
    final = summary.get("final_test")
    if isinstance(final, dict) and isinstance(final.get("recall"), dict):
        cutoffs = sorted(final["recall"], key=int)
        body.append(f"<p>Final test (the best trial's parameters trained on TRAIN+VALID, evaluated on "
                    f"<code>{html.escape(str(final.get('test', '')))}</code>, {html.escape(str(final.get('eval_mode', '')))} ties):</p>")
        body.append(table_html(["k", "Recall@k", "MRR@k"],
                               [[int(k), final["recall"][k], (final.get("mrr") or {}).get(k)] for k in cutoffs],
                               css_class="final-test"))
    else:
        body.append('<p class="note">No final test was run (paropt --final-test TEST).</p>')
    return body


def _study_sections(study: Any, storage: str, pngs: dict[str, bytes], dpi: int) -> list[str]:
    from gru4rec.report.study import IMPORTANCE_MIN_TRIALS, best_trials, study_figures

    counts: dict[str, int] = {}
    for t in study.trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    counts_text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    body = [f"<h2>Study {html.escape(study.study_name)}</h2>", f"<p>{len(study.trials)} trials: {html.escape(counts_text)}.</p>",
            _objective_html(study), *_summary_html(study, storage)]
    complete = counts.get("COMPLETE", 0)
    for fig in study_figures(study):
        body.append(f"<h3>{html.escape(fig.title)}</h3>")
        if fig.figure is None:
            body.append(f'<p class="note">Not drawn: {html.escape(str(fig.reason))}</p>')
            continue
        if fig.name == "importances" and complete < IMPORTANCE_MIN_TRIALS:
            body.append(f'<p class="caveat">Caveat: only {complete} completed trial{"s" if complete != 1 else ""}. '
                        f"Importances are estimated from the trials themselves; below about {IMPORTANCE_MIN_TRIALS} "
                        "they say little about the parameters.</p>")
        pngs[f"study_{fig.name}"] = png_bytes(fig.figure, dpi)
        body.append(figure_html(pngs[f"study_{fig.name}"], fig.title))
    best = best_trials(study)
    names = sorted({p for t in best for p in t["params"]})
    body.append("<h3>Best trials</h3>")
    body.append(table_html(["trial", "value", "epochs", "seconds"] + names,
                           [[t["number"], t["value"], t["epochs"], t["seconds"]] + [_num(t["params"].get(n)) for n in names] for t in best],
                           css_class="best-trials"))
    return body


def _bytes_writer(data: bytes) -> Callable[[Path], object]:
    """A writer for :func:`atomic_write` of ``data``."""
    return lambda tmp: tmp.write_bytes(data)


def write_report(
    run_dirs: Sequence[str | os.PathLike[str]] = (),
    out: str | os.PathLike[str] = "report.html",
    *,
    study_storage: str | None = None,
    study_name: str | None = None,
    force: bool = False,
    dpi: int = 100,
) -> list[Path]:
    """Write the report of ``run_dirs`` and/or the study ``study_name`` in ``study_storage`` to
    ``out`` (HTML) and the PNGs beside it; returns the files written (the HTML first).
    ``study_name`` may be None when the storage holds one study.

    Everything is checked first (the run folders and the study are read, the output files are
    free, an earlier report's own, or ``force``), so that nothing is written when one input is wrong."""
    require_matplotlib()
    if not run_dirs and study_storage is None:
        raise Gru4RecError("nothing to report: give run folders and/or --study URL")
    if study_storage is None and study_name is not None:
        raise Gru4RecError("--study-name NAME needs --study URL (the storage that holds it)")
    from gru4rec.tracking.runs import read_run

    files = planned_files(out, runs=bool(run_dirs), study=study_storage is not None)
    _check_outputs(files, force)
    runs = [read_run(d) for d in run_dirs]
    names = [r["name"] for r in runs]
    for run in runs:  # two folders with the same name (a/run, b/run): tell them apart
        if names.count(run["name"]) > 1:
            run["name"] = run["path"]
    study = None
    if study_storage is not None:
        from gru4rec.report.study import load_study

        study = load_study(study_storage, study_name)
        study_name = study.study_name

    pngs: dict[str, bytes] = {}
    body: list[str] = []
    if runs:
        body += _run_sections(runs, pngs, dpi)
    if study is not None:
        assert study_storage is not None
        body += _study_sections(study, study_storage, pngs, dpi)
    title = "gru4rec report: " + ", ".join([r["name"] for r in runs] + ([f"study {study_name}"] if study is not None else []))
    page = document(title, body)

    written = []
    for path in files[1:]:
        name = path.name[len(files[0].stem) + 1 : -len(".png")]
        if name in pngs:
            atomic_write(path, _bytes_writer(pngs[name]))
            written.append(path)
    atomic_write(files[0], lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return [files[0]] + written
