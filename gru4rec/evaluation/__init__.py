"""Next-item evaluation over the full catalogue: the loop (evaluator), its schedule and the metrics."""
from gru4rec.evaluation.evaluator import evaluate, evaluate_boosts, evaluate_sessions
from gru4rec.evaluation.metrics import TIE_MODES, EvalResult

__all__ = ["TIE_MODES", "EvalResult", "evaluate", "evaluate_boosts", "evaluate_sessions"]
