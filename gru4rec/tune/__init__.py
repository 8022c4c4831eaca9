"""Hyperparameter search with Optuna (``gru4rec paropt``, ``python paropt.py``)."""
