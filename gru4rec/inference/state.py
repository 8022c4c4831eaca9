"""A live session's state between clicks (what serving keeps per session, in memory or Redis)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["SessionState"]


@dataclass
class SessionState:
    """One live session: ``hidden`` (float32, every state tensor of the model's
    :meth:`~gru4rec.inference.SessionModel.init_state` concatenated along its row) is None until
    the session has a known item; ``seen`` holds its known item indices in click order."""

    hidden: np.ndarray | None = None
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    #: The time (unix seconds) of the session's last known click, for a model with click context
    #: (the next click's gap is measured from it); None for a plain model or before a click.
    last_time: float | None = None
