"""Hyperparameter optimisation with Optuna: resumable, parallel and distributed.

The original GRU4Rec tuned its published settings with Optuna, one trial at a time, each trial a
``run.py`` subprocess whose printed metric was parsed, the study kept in memory. Here:

* trials run in-process through the Python API (``GRU4Rec(config).fit(...)`` and ``evaluate``);
  each worker process reads TRAIN and VALID once and reuses the frames in all of its trials;
* the study lives in an Optuna storage named by a URL (``--storage`` or the environment variable
  ``GRU4REC_OPTUNA_STORAGE``: SQLite, PostgreSQL or any SQLAlchemy URL, or ``journal:PATH`` for
  Optuna's journal file), by default a SQLite file ``paropt.db`` in the output folder; the same
  ``--study-name`` (the default name is derived from the search space and the training file)
  continues the study, so extending a study — finished or killed — is rerunning its command;
* several worker processes share one study through that storage, Optuna's own distributed
  mode: ``--workers W`` starts W local processes, and processes on other machines join by
  running the same command with the same ``--storage`` URL (e.g. PostgreSQL) and study name;
* no trial is lost to a killed worker: the parent of a killed local worker marks its trial FAIL,
  queues it again and replaces the worker; on RDB storages the heartbeat does the same for a
  process killed anywhere (``--heartbeat-interval``, ``--grace-period``);
* ``--enqueue PARAMFILE`` queues known-good parameters (the published best) as the first trials;
* the TPE sampler is seeded (``--seed``, default 42) per trial: trial n draws from (seed, n);
* after every epoch the validation metric is reported to Optuna so that a median pruner stops
  hopeless trials (``--no-pruning`` to disable);
* a trial that fails (the loss diverges to NaN, out of memory, an invalid combination of
  parameters) is recorded as FAIL with its reason in the trial's user attribute
  ``fail_reason``, and the study goes on;
* at the end the best parameters are printed as a ready ``-ps`` string and written as parameter
  files (JSON and the original's ``OrderedDict`` .py form); all trials are exported to CSV and
  JSON; optionally the best configuration is trained on TRAIN+VALID and evaluated on a test file.

Search spaces are the original's JSON-lines format, one parameter per line
(:mod:`gru4rec.tune.space`)::

    {"name": "layers", "dtype": "int", "values": [64, 512], "step": 32}
    {"name": "learning_rate", "dtype": "float", "values": [0.01, 0.25], "step": 0.005}
    {"name": "final_act", "dtype": "categorical", "values": ["elu-0.5", "elu-1", "linear"]}

Trial counting (``-nt N``): by default, as in the original, N is the number of trials this run
starts (failed and pruned ones included, a trial queued again after its worker died counted
once), split over its ``--workers``; the run prints both its own and the study's counts. With ``--total`` N is the
size the study should reach: the run stops once the study holds N finished trials (COMPLETE or
PRUNED), so a resumed run only runs the missing ones; failed trials do not count. Concurrent
workers check the count after each trial, so with W workers the study can end up to W-1 trials
past N (Optuna's ``MaxTrialsCallback`` semantics).

Pruning: after epoch e the validation metric is reported as step e-1; the median pruner
(``--prune-startup`` completed trials first, default 5; ``--prune-warmup`` epochs exempt, default
1, so the first check is after epoch 2) stops a trial whose value is below the median of the
earlier trials at that step. The last epoch is never pruned: its value is the trial's result.
With ``--no-pruning`` the metric is only measured once, after the last epoch.

Files in ``--out`` (STUDY = the study name): ``STUDY.best.json`` and ``STUDY.best.py`` (the fixed
and the best searched parameters, readable with ``-pf``), ``STUDY.trials.csv`` and
``STUDY.trials.json`` (every trial: state, value, parameters, per-epoch values, fail reasons),
``STUDY.summary.json`` (owner, counts, best trial, final test), and ``paropt.db`` when the
storage is the default. They are derived from the study's storage, so a rerun of the same study
replaces them; files of another study or storage, or a user's own files, are never replaced
without ``--force`` (:mod:`~gru4rec.tune.report_files`). Every process that runs ``paropt``
writes these at its end, so with several machines the last one to finish has them all.
``STUDY.trials.json`` also carries a study to another machine: ``--add-trials`` it there and the
study continues (:mod:`~gru4rec.tune.trial_import`).

The package, one concern per module: :mod:`~gru4rec.tune.space` (search spaces),
:mod:`~gru4rec.tune.settings` (:class:`ParoptSettings`), :mod:`~gru4rec.tune.storage` (storage
URLs, heartbeats), :mod:`~gru4rec.tune.study` (creating, checking and resuming a study),
:mod:`~gru4rec.tune.sampler` (the per-trial seeded TPE), :mod:`~gru4rec.tune.enqueue`
(``--enqueue``), :mod:`~gru4rec.tune.trial_import` (``--add-trials``),
:mod:`~gru4rec.tune.objective` (one trial), :mod:`~gru4rec.tune.workers` (the
worker processes, recovering killed ones), :mod:`~gru4rec.tune.runner` (:func:`run_study`),
:mod:`~gru4rec.tune.reports` (the reports' contents), :mod:`~gru4rec.tune.report_files` (their
files and owner) and :mod:`~gru4rec.tune.final_test`. The command line is
:mod:`gru4rec.cli.paropt` (``gru4rec paropt``, ``paropt.py``, ``python -m gru4rec.cli.paropt``):
the package never imports it. None of the modules imports Optuna or torch before it is used, so
importing this package is cheap.
"""
from __future__ import annotations

from gru4rec.tune.report_files import ReportConflict, output_paths
from gru4rec.tune.reports import StudyReport, best_param_dict
from gru4rec.tune.runner import MAX_CONSECUTIVE_FAILURES, run_study
from gru4rec.tune.settings import DEFAULT_OUT, ParoptSettings
from gru4rec.tune.space import ParamSpec, check_paramspace, load_paramspace, parse_paramspace, trial_param_string
from gru4rec.tune.storage import STORAGE_ENV, open_storage
from gru4rec.tune.study import default_study_name

__all__ = [
    "ParamSpec",
    "ParoptSettings",
    "StudyReport",
    "ReportConflict",
    "parse_paramspace",
    "load_paramspace",
    "check_paramspace",
    "trial_param_string",
    "open_storage",
    "default_study_name",
    "run_study",
    "output_paths",
    "best_param_dict",
    "STORAGE_ENV",
    "DEFAULT_OUT",
    "MAX_CONSECUTIVE_FAILURES",
]
