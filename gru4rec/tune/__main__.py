"""``python -m gru4rec.tune``: the same command as ``python paropt.py`` and ``gru4rec paropt``."""
import sys

from gru4rec.cli.paropt import main

sys.exit(main())
