"""``python -m gru4rec``: the ``gru4rec`` command without the installed console script."""
import sys

from gru4rec.cli import main

sys.exit(main())
