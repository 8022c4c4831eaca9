"""Reports you can look at: figures of training runs (from run folders, ``--run-dir``) and of
Optuna studies, in one self-contained HTML file with the PNGs beside it.

=============  ===============================================================================
``runs``       training curves, Recall/MRR against k, the breakdowns — matplotlib Figures
``study``      a study's figures through ``optuna.visualization.matplotlib``, its best trials
``html``       the self-contained page (base64-embedded PNGs, numbers readable back)
``build``      :func:`write_report`, what ``gru4rec report`` runs
``mpl``        matplotlib imported on first use (``pip install 'gru4rec[report]'``)
=============  ===============================================================================
"""
from __future__ import annotations

from typing import Any

__all__ = ["write_report"]


def __getattr__(name: str) -> Any:
    if name == "write_report":  # imported on first use: `import gru4rec.report` needs no matplotlib
        from gru4rec.report.build import write_report

        return write_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
