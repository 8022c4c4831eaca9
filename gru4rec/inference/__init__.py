"""Running a trained session model: the :class:`SessionModel` protocol, the session state, the
chunked :class:`Engine` (steps, scores, exclusions, top-k) and its scorers.

Everything that asks a model for recommendations, scores or states — the ``GRU4Rec`` methods,
``gru4rec recommend``, the HTTP server — goes through :class:`Engine` (the evaluator through the
same protocol and repeat boost); see
:mod:`gru4rec.inference.engine` for how it runs and docs/design.md for why.
"""
from gru4rec.inference.clicks import Clicks
from gru4rec.inference.engine import DEFAULT_CHUNK_BYTES, Answer, Engine, TopKChunk, Work
from gru4rec.inference.protocol import SessionModel, catalogue_of, catalogue_support, check_session_model, require_fitted, uses_context
from gru4rec.inference.scoring import SCORING_CHOICES, CertifiedTopK, Float32TopK, TopK, TopKResult, make_topk
from gru4rec.inference.state import SessionState

__all__ = [
    "Answer", "CertifiedTopK", "Clicks", "DEFAULT_CHUNK_BYTES", "Engine", "Float32TopK", "SCORING_CHOICES", "SessionModel",
    "SessionState", "TopK", "TopKChunk", "TopKResult", "Work", "catalogue_of", "catalogue_support",
    "check_session_model", "make_topk", "require_fitted", "uses_context",
]
