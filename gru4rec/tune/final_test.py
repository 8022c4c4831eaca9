"""The final test (``--final-test TEST``): the best configuration trained on TRAIN+VALID and
evaluated on a test file at the ``-fm`` cutoffs, as the original's published figures were made.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from gru4rec.tune.settings import ParoptSettings

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd

    from gru4rec.config import Config

__all__ = ["final_test"]

log = logging.getLogger(__name__)


def final_test(
    settings: ParoptSettings, config: Config, keys: dict[str, str], train: pd.DataFrame, valid: pd.DataFrame
) -> dict[str, Any]:
    """Train ``config`` on ``train`` + ``valid`` (TRAIN and VALID as read with the column ``keys``)
    and evaluate it on ``settings.final_test`` at the ``-fm`` cutoffs; logs the metric lines and
    returns them as the summary's ``final_test`` entry."""
    import pandas as pd

    from gru4rec.data.events import read_events
    from gru4rec.evaluation.evaluator import evaluate
    from gru4rec.recommender import GRU4Rec

    if settings.final_test is None:
        raise ValueError("final_test needs settings.final_test (the test file)")
    test = read_events(settings.final_test, **keys)
    shared = set(train[keys["session_key"]].unique()) & set(valid[keys["session_key"]].unique())
    if shared:
        log.warning(f"{len(shared)} session ids occur in both TRAIN and VALID; "
                    "they are merged into one session each for the final training")
    full = pd.concat([train, valid], ignore_index=True)
    log.info(f"Final training on TRAIN+VALID ({len(full)} events) with the best parameters ...")
    start = time.perf_counter()
    model = GRU4Rec(config, device=settings.device, precision=settings.precision,
                    threads=settings.trial_threads()).fit(full, **settings.attribute_options())
    train_s = time.perf_counter() - start
    cutoffs = tuple(sorted(set(settings.final_measure)))
    result = evaluate(model, test, cutoffs=cutoffs, mode=settings.eval_mode)
    for c in cutoffs:
        log.info(f"Recall@{c}: {result.recall[c]:.6f} MRR@{c}: {result.mrr[c]:.6f}")
    return {
        "test": str(settings.final_test),
        "eval_mode": settings.eval_mode,
        "recall": {str(c): float(result.recall[c]) for c in cutoffs},
        "mrr": {str(c): float(result.mrr[c]) for c in cutoffs},
        "n_predictions": int(getattr(result, "n_predictions", 0)),
        "train_seconds": round(train_s, 3),
    }
