"""Training speed: the step and whole epochs, threads, the official port, daily retraining."""
