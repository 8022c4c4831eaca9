"""What the intents studies say about tuning (issue 51, point 2): parameter importances and the
best value found against the number of trials, from committed Optuna journals.

    python -m experiments.intents_limit.study_analysis \\
        results/studies/synthetic_intents_capacity.journal results/studies/synthetic_intents_capacity_xe.journal \\
        --png results/synthetic_intents_studies.best_so_far.png --json results/synthetic_intents_studies.analysis.json

Importances are Optuna's default evaluator (PED-ANOVA in Optuna 5; fANOVA needs scikit-learn)
over two sets of trials: the finished ones (their objective), and every trial that reported
epoch ``--epoch`` (its validation value then: pruned trials count too, so there are more of
them, but an early value favours fast starters). A parameter with no effect on the objective
(``bpreg`` with cross-entropy) scoring high is the noise floor of the estimate. Writes the
importances and the curves as JSON, and the curves as a PNG (matplotlib).
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from gru4rec.files import atomic_write


def load(journal: Path) -> optuna.Study:
    """The only study of a journal file."""
    storage = JournalStorage(JournalFileBackend(str(journal)))
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if len(names) != 1:
        raise ValueError(f"{journal}: expected one study, found {names}")
    return optuna.load_study(study_name=names[0], storage=storage)


def best_so_far(trials: Sequence[optuna.trial.FrozenTrial]) -> list[float | None]:
    """After each trial (by number), the best objective among the finished trials so far (None
    before the first); pruned and failed trials add no value."""
    out: list[float | None] = []
    best: float | None = None
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == TrialState.COMPLETE and t.value is not None and (best is None or t.value > best):
            best = t.value
        out.append(best)
    return out


def importances(study: optuna.Study, epoch: int | None) -> dict[str, float]:
    """Importances over the finished trials (``epoch`` None) or over every trial's validation
    value at ``epoch`` (1-based, as paropt reports it at step epoch - 1 or epoch)."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    if epoch is None:
        chosen = [t for t in trials if t.state == TrialState.COMPLETE]
    else:
        chosen = []
        for t in trials:
            steps = sorted(t.intermediate_values)
            if len(steps) >= epoch:
                chosen.append(optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                        value=t.intermediate_values[steps[epoch - 1]]))
    if len(chosen) < 2:
        return {}
    tmp = optuna.create_study(direction=study.direction)
    tmp.add_trials(chosen)
    return {k: round(float(v), 4) for k, v in optuna.importance.get_param_importances(tmp).items()}


def main(argv: Sequence[str] | None = None) -> None:
    """Analyse the journals given; write --json and --png."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("journals", nargs="+", type=Path)
    ap.add_argument("--epoch", type=int, default=2, help="the early epoch whose values all trials share")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    report: dict[str, Any] = {}
    for journal in args.journals:
        study = load(journal)
        trials = study.get_trials(deepcopy=False)
        counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
        report[study.study_name] = {
            "journal": str(journal),
            "counts": {k: v for k, v in counts.items() if v},
            "best_so_far": best_so_far(trials),
            "importances_complete": importances(study, None),
            f"importances_epoch{args.epoch}": importances(study, args.epoch),
        }
    atomic_write(args.json, lambda tmp: tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8"))
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name, r in report.items():
            ys = [math.nan if v is None else v for v in r["best_so_far"]]
            ax.step(range(1, len(ys) + 1), ys, where="post", label=name)
        ax.set_xlabel("trials started (pruned ones included)")
        ax.set_ylabel("best validation MRR@20 so far")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        atomic_write(args.png, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
        plt.close(fig)


if __name__ == "__main__":
    main()
