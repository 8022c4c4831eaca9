"""``gru4rec report``: run folders and/or an Optuna study -> one HTML file (images embedded)
and the PNGs beside it (:func:`gru4rec.report.build.write_report`)."""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from gru4rec.cli.common import EXIT_OK, FORCE_FLAG, UsageError, add_flags, flag, flag_field
from gru4rec.cli.console import result

__all__ = ["DESCRIPTION", "ReportSettings", "add_arguments", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = """\
Make a report you can look at, as one self-contained HTML file (open it in any browser) with
every figure also written as a PNG beside it (REPORT.<figure>.png).

For run folders (gru4rec train ... --run-dir DIR; several are overlaid): training curves (loss,
validation metric, events/s per epoch), Recall@k and MRR@k against k on the test set, and the
test evaluation broken down by session length and by target-item popularity decile, with the
numbers in tables. For a study (gru4rec paropt): its objective (metric, cutoff, ties, validation
file), the best parameter string and the final test (from STUDY.summary.json beside the storage),
Optuna's optimisation history, parameter importances, parallel coordinates and slices, and the
best trials. A report made again replaces its own files; any other file needs --force.

  gru4rec report runs/a runs/b -o report.html
  gru4rec report --study sqlite:///runs/paropt/paropt.db -o study.html   # --study-name NAME: one of several

Needs matplotlib (pip install 'gru4rec[report]'); a study also needs optuna ('gru4rec[tune]')."""


@dataclass(frozen=True)
class ReportSettings:
    """The settings of ``gru4rec report``: a field per flag, declared with it."""

    run_dirs: list[str] = flag(metavar="RUN_DIR", nargs="*", default_factory=list,
                               help="run folders written by train/run.py --run-dir (several are overlaid)")
    output: str = flag("-o", "--output", metavar="REPORT.html", default="report.html",
                       help="the HTML file to write; the PNGs go beside it (default: report.html)")
    study: str | None = flag("--study", metavar="URL", default=None,
                             help="an Optuna storage as paropt --storage takes it (sqlite:///PATH, postgresql://..., "
                                  "journal:PATH or a file path)")
    study_name: str | None = flag("--study-name", metavar="NAME", default=None,
                                  help="the study in --study to report on (default: its only study)")
    dpi: int = flag("--dpi", type=int, default=100, help="resolution of the PNGs (default: 100)")
    force: bool = flag_field(FORCE_FLAG, False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec report`` (:class:`ReportSettings`)."""
    add_flags(parser, ReportSettings)


def run(args: ReportSettings) -> int:
    """Run ``gru4rec report``."""
    if not args.run_dirs and args.study is None:
        raise UsageError("give run folders (RUN_DIR ...) and/or --study URL")
    if args.study is None and args.study_name is not None:
        raise UsageError("--study-name NAME needs --study URL (the storage that holds it)")
    if not 20 <= args.dpi <= 600:
        raise UsageError(f"--dpi must lie in [20, 600], got {args.dpi}")
    from gru4rec.report.mpl import require_matplotlib

    require_matplotlib().use("Agg")  # this process draws files only; Optuna's figures go through pyplot
    from gru4rec.report.build import write_report

    files = write_report(args.run_dirs, args.output, study_storage=args.study, study_name=args.study_name,
                         force=args.force, dpi=args.dpi)
    log.info("Open %s in a browser", files[0])
    for path in files:
        result(str(path))
    return EXIT_OK
