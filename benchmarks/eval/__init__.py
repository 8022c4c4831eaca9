"""Evaluation speed: predictions per second by batch size and device."""
