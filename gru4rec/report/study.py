"""Figures and the best-trials table of an Optuna study (one made by ``gru4rec paropt``), drawn
by Optuna's own matplotlib visualisation (``optuna.visualization.matplotlib``):

* ``history`` — the optimisation history (every trial's value and the best so far);
* ``importances`` — parameter importances (Optuna's default evaluator);
* ``parallel`` — parallel coordinates of the parameters and the value;
* ``slice`` — the value against each parameter: drawn here, one panel per parameter in rows
  of three (Optuna's puts every parameter in one row, which squeezes seven parameters into
  strips with unreadable labels).

A figure Optuna cannot draw for this study (e.g. importances before two trials completed) is
left out with the reason, instead of failing the report.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from gru4rec.errors import Gru4RecError
from gru4rec.report.mpl import require_matplotlib
from gru4rec.tune._optuna import import_optuna

__all__ = [
    "BEST_COLOUR",
    "FIGURE_SIZE",
    "IMPORTANCE_MIN_TRIALS",
    "STUDY_FIGURES",
    "StudyFigure",
    "best_trials",
    "find_summary",
    "load_study",
    "paropt_objective",
    "study_figures",
]

#: The study figures: name -> (title, the optuna.visualization.matplotlib function).
STUDY_FIGURES = {
    "history": ("Optimisation history", "plot_optimization_history"),
    "importances": ("Parameter importances", "plot_param_importances"),
    "parallel": ("Parallel coordinates", "plot_parallel_coordinate"),
    "slice": ("Slices: the value against each parameter", "slice_grid"),
}


#: Inches of the figures Optuna draws (pyplot's default is 6.4 × 4.8: too tight for the
#: parallel coordinates of seven parameters).
FIGURE_SIZE = (12.0, 5.0)


#: Completed trials below which the importances carry a caveat: Optuna's evaluator fits a random
#: forest of the value on the parameters, and on a handful of points its ranking is mostly noise
#: (a rule of thumb, not a measured threshold).
IMPORTANCE_MIN_TRIALS = 20

#: The best trial's mark in the slice figure: a red that stands out against white (contrast
#: 4.5:1) and against the blues of the other trials.
BEST_COLOUR = "#c0392b"


class StudyFigure:
    """One study figure: its name and title, and the matplotlib Figure or why there is none."""

    def __init__(self, name: str, title: str, figure: Any = None, reason: str | None = None) -> None:
        self.name, self.title, self.figure, self.reason = name, title, figure, reason


def load_study(storage: str, study_name: str | None = None) -> Any:
    """Open the study ``study_name`` in ``storage`` (a URL or path as ``paropt --storage`` takes
    it) for reading; None: the storage's only study. A storage file that does not exist, a study
    that is not in the storage, or no name for a storage of several studies is an error naming
    what is there."""
    optuna = import_optuna()
    from gru4rec.tune.storage import open_storage, redact, resolve_storage_url

    resolved = resolve_storage_url(storage, Path("."))
    for prefix in ("sqlite:///", "journal:"):
        if resolved.startswith(prefix):
            path = Path(resolved[len(prefix):].removeprefix("//"))
            if not path.is_file():  # opening it would create an empty storage
                raise Gru4RecError(f"study storage {path} not found")
    opened, url = open_storage(resolved)
    if study_name is None:
        names = sorted(optuna.get_all_study_names(opened))
        if len(names) != 1:
            held = f"it holds {len(names)} studies: {', '.join(names)}" if names else "it holds no study"
            raise Gru4RecError(f"which study of {redact(url)}? {held}; pass --study-name NAME")
        study_name = names[0]
    try:
        return optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        names = sorted(optuna.get_all_study_names(opened))
        raise Gru4RecError(
            f"no study {study_name!r} in {redact(url)}; it holds: {', '.join(names) or 'no study'}"
        ) from None


def paropt_objective(study: Any) -> dict[str, Any] | None:
    """What a study made by ``gru4rec paropt`` maximises, as it recorded it: ``metric``,
    ``cutoff``, ``eval_mode`` (ties), ``valid`` and ``train`` (the files); None for another study."""
    from gru4rec.tune.study import STUDY_OBJECTIVE_ATTR

    recorded = study.user_attrs.get(STUDY_OBJECTIVE_ATTR)
    return recorded if isinstance(recorded, dict) and "metric" in recorded else None


def find_summary(storage: str, study: Any) -> tuple[Path, dict[str, Any]] | None:
    """``STUDY.summary.json`` of ``study`` (the best parameter string, the final test) where
    ``paropt`` leaves it by default: beside a storage file (``--out`` holds both); only one
    whose recorded owner is this very study (its id) counts. None when there is none (a
    database storage, reports written to another ``--out``)."""
    import json

    from gru4rec.tune.report_files import output_paths
    from gru4rec.tune.storage import resolve_storage_url
    from gru4rec.tune.study import study_uid

    resolved = resolve_storage_url(storage, Path("."))
    folder = next((Path(resolved[len(prefix):].removeprefix("//")).parent
                   for prefix in ("sqlite:///", "journal:") if resolved.startswith(prefix)), None)
    if folder is None:
        return None
    path = output_paths(folder, study.study_name)["summary"]
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    owner = summary.get("owner") if isinstance(summary, dict) else None
    uid = study_uid(study)
    if not isinstance(owner, dict) or uid is None or owner.get("study_uid") != uid:
        return None
    return path, summary


#: Panels per row of the slice figure, and each panel's size in inches.
SLICE_COLUMNS, SLICE_PANEL = 3, (4.2, 3.2)


def slice_grid(study: Any, complete: list[Any]) -> Any:
    """The objective against each parameter, one panel per parameter, :data:`SLICE_COLUMNS` to a
    row; a point per completed trial, darker for later trials, the best one a star in
    :data:`BEST_COLOUR`; log axes for log-scale parameters."""
    import math

    import numpy as np

    from gru4rec.report.mpl import new_figure

    names = sorted({p for t in complete for p in t.params})
    columns = max(1, min(SLICE_COLUMNS, len(names)))
    rows = max(1, math.ceil(len(names) / columns))
    fig = new_figure(SLICE_PANEL[0] * columns, SLICE_PANEL[1] * rows)
    axes = list(fig.subplots(rows, columns, squeeze=False).flat)
    from matplotlib.colors import ListedColormap

    target = study.metric_names[0] if getattr(study, "metric_names", None) else "objective value"
    # Blues without its lightest third: the first trials (and a 2-trial study's best) were drawn
    # white on white.
    blues = ListedColormap(require_matplotlib().colormaps["Blues"](np.linspace(0.35, 1.0, 256)))
    best = best_trials(study, n=1)
    best_number = best[0]["number"] if best else None
    for ax, name in zip(axes, names):
        trials = [t for t in complete if name in t.params]
        values = [t.params[name] for t in trials]
        if any(isinstance(v, (str, bool)) or v is None for v in values):
            values = [str(v) for v in values]  # categorical: one column per choice
        points = ax.scatter(values, [t.value for t in trials], c=[t.number for t in trials], cmap=blues,
                            vmin=min(t.number for t in complete), vmax=max(t.number for t in complete),
                            edgecolors="#555", linewidths=0.5, s=30)
        chosen = [(v, t.value) for v, t in zip(values, trials) if t.number == best_number]
        if chosen:
            ax.scatter([chosen[0][0]], [chosen[0][1]], marker="*", s=160, color=BEST_COLOUR, edgecolors="#222",
                       linewidths=0.6, zorder=3, label=f"best: trial {best_number}")
            ax.legend(fontsize="x-small", loc="lower right")
        distribution = trials[0].distributions.get(name) if trials else None
        if getattr(distribution, "log", False):
            ax.set_xscale("log")
        ax.set(xlabel=name, ylabel=target)
        ax.grid(alpha=0.3)
    panels = fig.axes[:len(names)]
    for ax in fig.axes[len(names):]:  # the last row's empty places
        ax.set_visible(False)
    if names:
        fig.colorbar(points, ax=panels, label="trial number", shrink=0.8)
    return fig


def study_figures(study: Any) -> list[StudyFigure]:
    """The figures of :data:`STUDY_FIGURES` for ``study`` (the matplotlib Figures Optuna drew)."""
    optuna = import_optuna()
    matplotlib = require_matplotlib()
    import matplotlib.pyplot as plt  # Optuna draws through pyplot
    from optuna.visualization import matplotlib as ovm

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    out = []
    for name, (title, function) in STUDY_FIGURES.items():
        if not complete:
            out.append(StudyFigure(name, title, reason="no trial has completed yet"))
            continue
        try:
            # Optuna lays its figures out for pyplot's default size; give it room to do so.
            with warnings.catch_warnings(), matplotlib.rc_context({"figure.figsize": FIGURE_SIZE}):
                warnings.simplefilter("ignore")  # ExperimentalWarning on every call
                drawn = slice_grid(study, complete) if function == "slice_grid" else getattr(ovm, function)(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            out.append(StudyFigure(name, title, reason=f"it cannot be drawn for this study: {exc}"))
            continue
        # Optuna returns Axes (one or an array of them), drawn through pyplot; slice_grid a Figure.
        figure = drawn if hasattr(drawn, "savefig") else (drawn.flat[0] if hasattr(drawn, "flat") else drawn).figure
        plt.close(figure)  # keep the Figure, drop it from pyplot's registry (a no-op for ours)
        out.append(StudyFigure(name, title, figure))
    return out


def best_trials(study: Any, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` best completed trials, best first: number, value, params, epochs, seconds."""
    optuna = import_optuna()
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    complete.sort(key=lambda t: t.value, reverse=maximize)
    return [
        {
            "number": t.number,
            "value": t.value,
            "params": dict(t.params),
            "epochs": t.user_attrs.get("epochs"),
            "seconds": t.user_attrs.get("seconds"),
        }
        for t in complete[:n]
    ]
