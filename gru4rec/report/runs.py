"""Figures of training runs, from run folders read with :func:`gru4rec.tracking.runs.read_run`: one run or
several overlaid (one line, or one bar group, per run).

* :func:`training_curves` — three axes against the epoch: the training loss, the validation
  metric that chose the best epoch (the best epoch marked), and events per second;
* :func:`metrics_at_k` — two axes: Recall@k and MRR@k of the final test evaluation against k
  (one line per run and test file);
* :func:`breakdown_figure` — two axes: Recall@K and MRR@K per group of a breakdown (by session
  length or by target-popularity decile), grouped bars, one colour per run.

Every function returns a ``matplotlib.figure.Figure`` (not shown, not saved): the report saves
it, a notebook displays it, a test inspects its axes and lines.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gru4rec.report.mpl import new_figure

__all__ = [
    "losses_differ_in_scale",
    "metric_order",
    "BREAKDOWNS",
    "breakdown_cutoff",
    "breakdown_figure",
    "evaluations",
    "metrics_at_k",
    "training_curves",
    "valid_metric",
]

#: The breakdown kinds: key in metrics.json -> (title, x-axis label).
BREAKDOWNS = {
    "session_length": ("session length", "test session length (events)"),
    "popularity": ("target popularity", "target popularity decile (1 = the 10 % most popular items)"),
}


#: What fills a run's empty test panels (both commands write the run folder's metrics.json).
_FILL_TEST = "(gru4rec evaluate RUN/model.safetensors -t TEST,\nor train with -t TEST)"

def valid_metric(run: dict[str, Any]) -> str | None:
    """The run's validation metric (e.g. ``'recall@20'``), or None without validation."""
    config = run.get("config") or {}
    if config.get("valid_metric"):
        return str(config["valid_metric"])
    for epoch in run["epochs"]:
        if epoch.get("valid"):
            return next(iter(epoch["valid"]))
    return None


def evaluations(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(test file, its metrics)`` for every test file in the run's metrics.json."""
    return list((run.get("metrics") or {}).items())


def losses_differ_in_scale(runs: Sequence[dict[str, Any]]) -> bool:
    """Whether the runs' epoch-1 losses differ by more than a factor of 3 (different loss
    functions): the loss panel then shows each run's loss relative to its first epoch."""
    firsts = [abs(r["epochs"][0]["loss"]) for r in runs if r["epochs"] and r["epochs"][0].get("loss")]
    return len(firsts) > 1 and max(firsts) > 3 * min(firsts)


def metric_order(key: str) -> tuple[str, int, str]:
    """Sort key of a metric name such as ``mrr@10``: by metric, then by the cutoff as a number
    (``mrr@5`` before ``mrr@10``, which text order gets wrong)."""
    name, _, cutoff = key.partition("@")
    return (name, int(cutoff), key) if cutoff.isdigit() else (name, 0, key)


def training_curves(runs: Sequence[dict[str, Any]]) -> Any:
    """Loss, validation metric and events/s per epoch, one line per run (the loss relative to
    epoch 1 when the runs' losses differ in scale: :func:`losses_differ_in_scale`)."""
    fig = new_figure(13, 3.6)
    ax_loss, ax_valid, ax_speed = fig.subplots(1, 3)
    metrics = {valid_metric(r) for r in runs} - {None}
    relative = losses_differ_in_scale(runs)
    for run in runs:
        epochs = run["epochs"]
        x = [e["epoch"] for e in epochs]
        losses = [e["loss"] for e in epochs]
        if relative and losses and losses[0]:
            losses = [value / losses[0] for value in losses]
        ax_loss.plot(x, losses, marker="o", label=run["name"])
        ax_speed.plot(x, [e["events_per_s"] for e in epochs], marker="o", label=run["name"])
        metric = valid_metric(run)
        scored = [e for e in epochs if e.get("valid") and metric in e["valid"]]
        if scored:
            line = ax_valid.plot([e["epoch"] for e in scored], [e["valid"][metric] for e in scored], marker="o",
                                 label=run["name"] if len(metrics) < 2 else f"{run['name']} ({metric})")[0]
            best = scored[-1].get("best_epoch")
            chosen = [e for e in scored if e["epoch"] == best]
            if chosen:  # a scatter, not a line: the axes keep one line per run
                ax_valid.scatter([best], [chosen[0]["valid"][metric]], s=120, facecolors="none",
                                 edgecolors=line.get_color(), linewidths=2, zorder=3)
    if relative:  # cross-entropy (~10) beside BPR-max (~0.4): on one scale one would be a flat line
        ax_loss.set(title="training loss ÷ its epoch-1 value", xlabel="epoch", ylabel="loss / epoch-1 loss")
    else:
        ax_loss.set(title="training loss", xlabel="epoch", ylabel="loss")
    ax_valid.set(title="validation (circle: best epoch)", xlabel="epoch",
                 ylabel=next(iter(metrics)) if len(metrics) == 1 else "metric")
    if not metrics:
        ax_valid.text(0.5, 0.5, "no validation\n(train with --valid)", ha="center", va="center", transform=ax_valid.transAxes)
    ax_speed.set(title="training speed", xlabel="epoch", ylabel="events / s")
    for ax in (ax_loss, ax_valid, ax_speed):
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize="small")
        ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def metrics_at_k(runs: Sequence[dict[str, Any]]) -> Any:
    """Recall@k and MRR@k against k of every run's test evaluation."""
    fig = new_figure(10, 3.6)
    ax_recall, ax_mrr = fig.subplots(1, 2)
    many_files = any(len(evaluations(r)) > 1 for r in runs)
    for run in runs:
        for test, result in evaluations(run):
            label = f"{run['name']}: {test}" if many_files else run["name"]
            ks = sorted(int(k) for k in result["recall"])
            ax_recall.plot(ks, [result["recall"][str(k)] for k in ks], marker="o", label=label)
            ax_mrr.plot(ks, [result["mrr"][str(k)] for k in ks], marker="o", label=label)
    ax_recall.set(title="Recall@k", xlabel="k", ylabel="recall")
    ax_mrr.set(title="MRR@k", xlabel="k", ylabel="MRR")
    for ax in (ax_recall, ax_mrr):
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no test evaluation\n" + _FILL_TEST, ha="center", va="center", transform=ax.transAxes)
    return fig


def breakdown_cutoff(runs: Sequence[dict[str, Any]]) -> int | None:
    """The cutoff K the breakdown figures show: the largest cutoff the runs were given (-m) that
    every run's evaluation has (Recall@1 would equal MRR@1); else 20, else the largest cutoff
    they all have."""
    common: set[int] | None = None
    for run in runs:
        for _, result in evaluations(run):
            ks = {int(k) for k in result["recall"]}
            common = ks if common is None else common & ks
    if not common:
        return None
    asked = {int(c) for run in runs for c in ((run.get("config") or {}).get("cutoffs") or [])} & common
    if asked:
        return max(asked)
    return 20 if 20 in common else max(common)


def breakdown_figure(runs: Sequence[dict[str, Any]], kind: str, cutoff: int | None = None) -> Any:
    """Recall@K and MRR@K per group of the breakdown ``kind`` (``'session_length'`` or
    ``'popularity'``), one bar per run and test file in every group; ``cutoff``: K (default
    :func:`breakdown_cutoff`). The tick labels give each group's number of predictions (of the
    first run)."""
    if kind not in BREAKDOWNS:
        raise ValueError(f"kind: expected one of {', '.join(BREAKDOWNS)}, got {kind!r}")
    k = cutoff if cutoff is not None else breakdown_cutoff(runs)
    fig = new_figure(11, 3.8)
    ax_recall, ax_mrr = fig.subplots(1, 2)
    series = [(f"{run['name']}: {test}" if len(evaluations(run)) > 1 else run["name"], result["breakdown"][kind])
              for run in runs for test, result in evaluations(run) if result.get("breakdown")]
    if k is None or not series:
        for ax in (ax_recall, ax_mrr):
            ax.text(0.5, 0.5, "no breakdown\n" + _FILL_TEST, ha="center", va="center", transform=ax.transAxes)
        return fig
    labels = [g["label"] for g in series[0][1]]
    width = 0.8 / len(series)
    for i, (name, groups) in enumerate(series):
        x = [j + (i - (len(series) - 1) / 2) * width for j in range(len(groups))]
        ax_recall.bar(x, [g["recall"].get(str(k)) or 0.0 for g in groups], width, label=name)
        ax_mrr.bar(x, [g["mrr"].get(str(k)) or 0.0 for g in groups], width, label=name)
    ticks = [f"{label}\nn={g['n_predictions']}" for label, g in zip(labels, series[0][1])]
    for ax, metric in ((ax_recall, "Recall"), (ax_mrr, "MRR")):
        ax.set_xticks(range(len(labels)), ticks, fontsize="x-small")
        title, xlabel = BREAKDOWNS[kind]
        ax.set(title=f"{metric}@{k} by {title}", xlabel=xlabel, ylabel=f"{metric}@{k}")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize="small")
    return fig
