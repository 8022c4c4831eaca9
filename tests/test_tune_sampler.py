"""Tests of gru4rec.tune.sampler: the TPE sampler seeded per trial proposes the same trials for the
same command, never repeats a trial's draws when a study is extended, and does not depend on how a
study's trials were split into runs."""
from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from gru4rec.tune import parse_paramspace  # noqa: E402
from gru4rec.tune.sampler import PerTrialSeededTPE, trial_seed  # noqa: E402
from tune_helpers import SPACE_LINES  # noqa: E402

SPACE = parse_paramspace("\n".join(SPACE_LINES))


def _objective(trial: optuna.trial.Trial) -> float:
    # A deterministic value of the parameters, so that TPE's model-based trials (after its 10
    # random start-up trials) see the same history in every study.
    params = {spec.name: spec.suggest(trial) for spec in SPACE}
    return -abs(params["learning_rate"] - 0.1) - abs(params["layers"] - 16) / 100 - params["momentum"]


def _params(runs: list[int], seed: int | None = 42, storage: object = None) -> list[dict[str, object]]:
    """The trials' parameters of a study run in ``runs`` (trials per run), each run with a new
    sampler as a rerun of the same command has."""
    name = "s"
    for n in runs:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=PerTrialSeededTPE(seed),
                                    load_if_exists=True)
        study.optimize(_objective, n_trials=n)
    return [t.params for t in study.get_trials()]


def test_the_same_command_proposes_the_same_trials_and_reruns_never_repeat_one() -> None:
    one_go = _params([14], storage=optuna.storages.InMemoryStorage())
    assert one_go == _params([14], storage=optuna.storages.InMemoryStorage())  # same seed, same trials
    # Extending a study three times gives the trials of one run of the same length: trial n's
    # draws depend on (seed, n) and the history only, not on which run drew them.
    assert _params([4, 4, 6], storage=optuna.storages.InMemoryStorage()) == one_go
    # The random start-up trials do not repeat each other (a once-seeded sampler restarted by a
    # rerun would draw trial 0's parameters again for trial 4).
    startup = [tuple(sorted(p.items())) for p in one_go[:10]]
    assert len(set(startup)) == len(startup)
    # Another seed gives other trials; no seed gives unseeded ones.
    assert _params([4], seed=7, storage=optuna.storages.InMemoryStorage()) != one_go[:4]
    assert _params([4], seed=None, storage=optuna.storages.InMemoryStorage()) != one_go[:4]


def test_trial_seeds_are_mixed() -> None:
    # Nearby seeds and trial numbers give unrelated generator seeds (SeedSequence of both).
    import numpy as np

    assert trial_seed(42, 0) == int(np.random.SeedSequence([42, 0]).generate_state(1)[0])
    seeds = {trial_seed(s, n) for s in range(5) for n in range(5)}
    assert len(seeds) == 25


def test_the_sampler_pickles_for_spawned_workers() -> None:
    import pickle

    sampler = pickle.loads(pickle.dumps(PerTrialSeededTPE(3)))
    assert isinstance(sampler, PerTrialSeededTPE) and sampler.seed == 3
