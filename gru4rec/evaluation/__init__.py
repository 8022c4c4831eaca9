"""Next-item evaluation over the full catalogue."""
from gru4rec.evaluation.evaluator import TIE_MODES, EvalResult, evaluate, evaluate_sessions

__all__ = ["TIE_MODES", "EvalResult", "evaluate", "evaluate_sessions"]
