"""``python -m gru4rec.tune``: the same command as ``python paropt.py`` and ``gru4rec paropt``."""
import sys

from gru4rec.tune.cli import main

sys.exit(main())
