"""The default sampler: Optuna's TPE, seeded per trial.

A sampler seeded once per process would repeat itself: a rerun of the same command (extending a
study) would draw the very random start-up trials of the first run again, and two machines
started with the same command would draw the same ones. :class:`PerTrialSeededTPE` instead gives
trial *n* a TPE sampler whose generator is seeded with ``(seed, n)``: the same command on a new
study proposes the same trials (with one worker), and no two trials of a study draw the same
random numbers, whichever worker or machine runs them.

Unlike the other modules of :mod:`gru4rec.tune`, this one imports Optuna when it is imported
(its class derives from Optuna's ``BaseSampler``); :func:`gru4rec.tune.study.make_sampler_pruner`
imports it only when a study is made.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gru4rec.tune._optuna import import_optuna

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

__all__ = ["PerTrialSeededTPE", "trial_seed"]


def trial_seed(seed: int, number: int) -> int:
    """The generator seed of trial ``number`` (mixed, so that nearby seeds and numbers give
    unrelated streams)."""
    import numpy as np

    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, number]).generate_state(1)[0])


_optuna = import_optuna()
_BaseSampler: Any = _optuna.samplers.BaseSampler  # optuna is optional: typed as Any


class PerTrialSeededTPE(_BaseSampler):
    """Optuna's ``TPESampler`` (default settings) with a fresh generator seeded per trial
    (:func:`trial_seed`); ``seed=None`` draws unseeded. Picklable, for spawned workers."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._current = self._tpe(None)

    def _tpe(self, number: int | None) -> Any:
        seed = None if self.seed is None or number is None else trial_seed(self.seed, number)
        return _optuna.samplers.TPESampler(seed=seed)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        # Optuna calls this before anything of the trial is sampled.
        self._current = self._tpe(trial.number)
        self._current.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, Any]:
        return self._current.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        return self._current.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str, param_distribution: Any
    ) -> Any:
        return self._current.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: optuna.trial.TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._current.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Nothing to do: every trial is seeded from its number."""
