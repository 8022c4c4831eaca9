"""Running a study: :func:`run_study` opens (or creates) the study, adds the ``--add-trials``
exports, queues the ``--enqueue`` parameter files, runs this run's trials in its workers (:mod:`gru4rec.tune.workers`) and writes
what the study holds into ``--out`` (:mod:`gru4rec.tune.reports`,
:mod:`gru4rec.tune.report_files`).

Extending a study is rerunning it: ``-nt N`` runs N more trials (``--total``: until the study
holds N finished ones), and the reports, derived from the study's storage, are replaced.
"""
from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.errors import DataError
from gru4rec.tune._optuna import import_optuna
from gru4rec.tune.enqueue import enqueue, read_enqueued
from gru4rec.tune.final_test import final_test
from gru4rec.tune.report_files import ReportOwner, check_reports, output_paths, write_reports
from gru4rec.tune.reports import (
    StudyReport,
    best_json_text,
    best_param_dict,
    best_py_text,
    summary_data,
    trials_csv_text,
    trials_json_text,
)
from gru4rec.tune.settings import ParoptSettings, metric_label
from gru4rec.tune.space import join_params, trial_param_string
from gru4rec.tune.storage import dashboard_command, has_heartbeat, redact
from gru4rec.tune.study import (
    Prepared,
    find_study,
    make_sampler_pruner,
    n_finished,
    open_study,
    prepare,
    state_counts,
    study_identity,
    study_uid,
)
from gru4rec.tune.trial_import import add_trials, read_trial_records
from gru4rec.tune.workers import MAX_CONSECUTIVE_FAILURES, open_run_storage, read_data, run_workers, set_threads

if TYPE_CHECKING:  # pragma: no cover - typing only
    import optuna

__all__ = ["MAX_CONSECUTIVE_FAILURES", "run_study"]

log = logging.getLogger(__name__)


def _counts_text(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return "no trials"
    return f"{total} trial{'s' if total != 1 else ''} (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")"


def _run_counts(study: optuna.Study, run_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("run") == run_id:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def _log_plan(settings: ParoptSettings, prepared: Prepared, storage: Any, url: str, study: optuna.Study,
              resumed: bool, pruning: bool) -> None:
    what = "Resuming" if resumed else "Starting"
    log.info(f"{what} study {prepared.study_name!r} in {redact(url)}: {_counts_text(state_counts(study))} so far")
    if settings.total:
        plan = f"until the study holds {settings.n_trials} finished trials ({n_finished(study)} now)"
    else:
        # Queued (WAITING) trials are among the ones this run runs.
        held = sum(t.state.name != "WAITING" for t in study.get_trials(deepcopy=False))
        plan = (f"{settings.n_trials} more trial(s) in this run (-nt counts this run's trials; "
                f"the study will hold {held + settings.n_trials})")
    seed = "unseeded" if settings.sampler_seed is None else f"seed {settings.sampler_seed}"
    log.info(f"Running {plan} with {settings.workers} worker(s); objective {metric_label(settings)} "
             f"({settings.eval_mode} ties) on {settings.valid}; pruning {'on' if pruning else 'off'}; TPE sampler {seed}")
    if has_heartbeat(storage):
        log.info(f"Heartbeat every {settings.heartbeat_interval} s: the trial of a worker killed anywhere is run "
                 f"again once silent for {settings.grace_period} s")
    else:
        log.info("This storage has no heartbeat: the trial of a killed local worker is run again, that of a "
                 "process killed elsewhere stays RUNNING")
    log.info(f"Watch it live: {dashboard_command(url)}  (study {prepared.study_name!r})")


class _Outcome:
    """What the study holds after the run, as a :class:`StudyReport` and the reports' contents;
    :meth:`render` reads the study again each time it is called."""

    def __init__(self, settings: ParoptSettings, prepared: Prepared, storage: Any, storage_text: str, run_id: str,
                 problems: list[str], recovered: list[str], wall: float) -> None:
        self.settings, self.prepared, self.storage, self.storage_text = settings, prepared, storage, storage_text
        self.run_id, self.problems, self.recovered, self.wall = run_id, problems, recovered, wall
        self.final: dict[str, Any] | None = None
        self.searched = ""
        self.report = StudyReport(study_name=prepared.study_name, storage=storage_text, counts={})

    def render(self) -> tuple[dict[str, str], dict[str, Any]]:
        """The report files' contents and the summary, from the study as it is now."""
        optuna = import_optuna()
        settings, prepared = self.settings, self.prepared
        study = optuna.load_study(study_name=prepared.study_name, storage=self.storage)
        report = StudyReport(study_name=prepared.study_name, storage=self.storage_text, counts=state_counts(study),
                             run_counts=_run_counts(study, self.run_id), final=self.final,
                             problems=list(self.problems), recovered=list(self.recovered))
        contents = {"trials_csv": trials_csv_text(study, prepared.space),  # every trial, whatever the outcome
                    "trials_json": trials_json_text(study, prepared.space)}
        try:
            best = study.best_trial
        except ValueError:
            best = None
        if best is None:
            report.problems.append("no trial completed")
        else:
            self.searched = trial_param_string(prepared.space, best.params)
            report.best_number, report.best_value = best.number, best.value
            report.best_params = {s.name: s.clean(best.params[s.name]) for s in prepared.space if s.name in best.params}
            report.best_param_string = join_params(settings.fixed, self.searched)
            params = best_param_dict(prepared.base, settings.fixed, prepared.space, self.searched)
            header = (
                f"Best parameters of Optuna study {prepared.study_name!r}: trial {best.number}, "
                f"{metric_label(settings)}={best.value:.6f} on {settings.valid} (gru4rec paropt)"
            )
            contents.update(best_json=best_json_text(params), best_py=best_py_text(params, header))
        self.report = report
        return contents, summary_data(settings, report, self.wall)


def _resume_hint(settings: ParoptSettings, finished_before: int) -> str:
    """What to run after an interrupted run (the study keeps every finished trial)."""
    if settings.total:
        return (f"interrupted; the study keeps its finished trials: rerun the same command to continue "
                f"until it holds {settings.n_trials}")
    target = finished_before + settings.n_trials
    return (f"interrupted; the study keeps its finished trials: rerun with '-nt {target} --total' to finish this "
            f"run's plan ({target} finished trials in the study); the same command would run {settings.n_trials} more")


def run_study(settings: ParoptSettings, *, sampler: Any = None, pruner: Any = None) -> StudyReport:
    """Run this run's trials of a study (creating it, or extending it), then write its reports;
    see :mod:`gru4rec.tune`.

    ``sampler``/``pruner`` replace the defaults (TPE seeded per trial; median pruner or, with
    ``settings.pruning=False``, none) in every worker; with ``workers > 1`` they must pickle.
    Raises Gru4RecError subclasses for invalid settings, data or storage, and
    :class:`~gru4rec.tune.report_files.ReportConflict` (before any trial) when ``--out`` holds
    files that are not this study's reports.
    """
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING if settings.verbose else optuna.logging.ERROR)
    prepared = prepare(settings)
    queued = [read_enqueued(path, prepared.space, prepared.base, settings.fixed) for path in settings.enqueue]
    for path in settings.add_trials:  # an unreadable export fails now, before a study is created
        read_trial_records(path)
    # Missing data fails now, before a study is created for it.
    for label, data_file in (("TRAIN", settings.train), ("VALID", settings.valid), ("--final-test", settings.final_test),
                             ("--item-features", settings.item_features)):
        if data_file is not None and not Path(data_file).is_file():
            raise DataError(f"{label} {data_file}: file not found")
    if settings.item_features is not None:
        # Read once as every trial's fit will: a bad table is one error naming its column or
        # line now, not a failed trial each time.
        from gru4rec.items.table import read_item_table

        read_item_table(settings.item_features, item_key=prepared.keys["item_key"], types=settings.item_types)

    storage, url = open_run_storage(settings, prepared)
    paths = output_paths(settings.out, prepared.study_name)
    existing = find_study(storage, prepared.study_name)
    # Refuse before the study is touched if --out holds another study's (or a user's) files.
    existing_uid = study_uid(existing) if existing is not None else None
    check_reports(paths, ReportOwner(prepared.study_name, redact(url), existing_uid), settings.force)
    # Create (or check) the study once here, so that the workers never race to create it.
    default_sampler, default_pruner = make_sampler_pruner(settings)
    study, resumed = open_study(storage, prepared.study_name, study_identity(settings, prepared),
                                sampler or default_sampler, pruner or default_pruner)
    owner = ReportOwner(prepared.study_name, redact(url), study_uid(study))
    for path in settings.add_trials:
        add_trials(study, path, prepared.space)
    enqueue(study, queued)
    _log_plan(settings, prepared, storage, url, study, resumed, settings.pruning or pruner is not None)

    run_id = uuid.uuid4().hex[:12]
    finished_before = n_finished(study)
    frames: dict[str, Any] = {}  # TRAIN and VALID as worker 0 read them, reused by the final test
    start = time.perf_counter()
    try:
        problems, recovered = run_workers(settings, prepared, run_id, storage, sampler, pruner, frames)
    except KeyboardInterrupt:
        log.warning(_resume_hint(settings, finished_before))
        raise
    wall = time.perf_counter() - start

    outcome = _Outcome(settings, prepared, storage, redact(url), run_id, problems, recovered, wall)
    # Rendered under the reports' lock: of several processes writing into one --out, the last
    # one writes what the study holds then.
    files = write_reports(paths, owner, outcome.render, settings.force)
    report = outcome.report
    report.files = files
    log.info(f"This run: {_counts_text(report.run_counts)} in {wall:.1f} s; "
             f"study {prepared.study_name!r}: {_counts_text(report.counts)}")
    if report.best_number is None:
        log.info("No trial completed: no best parameters.")
    else:
        log.info(f"Best trial {report.best_number}: {metric_label(settings)}={report.best_value:.6f} ({settings.eval_mode} ties)")
        log.info(f"Best parameters: {report.best_param_string}")
        if settings.final_test is not None:
            set_threads(settings)
            config = prepared.base.replace_from_string(outcome.searched)
            if not frames:  # worker 0 ran no trial here (e.g. the study was already complete)
                frames["train"], frames["valid"] = read_data(settings, prepared.keys)
            final = final_test(settings, config, prepared.keys, frames["train"], frames["valid"])
            outcome.final = {"best_trial": report.best_number, **final}
            files = write_reports(paths, owner, outcome.render, settings.force)
            report = outcome.report
            report.files = files

    log.info("Wrote " + ", ".join(report.files.values()))
    for problem in report.problems:
        log.warning(problem)
    return report
