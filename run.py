#!/usr/bin/env python
"""The original GRU4Rec command line, flag-compatible, over the gru4rec package.

    python run.py PATH (-ps STR | -pf FILE | -l) [-s MODEL] [-t TEST ...] [-m 1 5 10 20]
                  [-e standard|conservative|median|tiebreaking] [-ss SIZE] [-g MODULE]
                  [-d DEVICE] [-ik/-sk/-tk COLUMN] [-pm recall|mrr] [-lpm]

Run ``python run.py --help`` for every option; the same code backs ``gru4rec train``.
"""
import sys
from pathlib import Path

if __name__ == "__main__":
    # Let a plain checkout work without 'pip install -e .'.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gru4rec.cli import run_py_main

    sys.exit(run_py_main())
