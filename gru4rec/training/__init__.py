"""Training: the session-parallel schedule, negative sampling, the losses, the optimiser, the
step and the epoch loop (see docs/design.md for the reading order)."""
