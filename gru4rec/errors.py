"""Exceptions a user can act on. The CLI prints them as one line (no traceback)."""


class Gru4RecError(Exception):
    """Base class of every error caused by user input (data, parameters, files)."""


class ConfigError(Gru4RecError, ValueError):
    """Invalid hyperparameters; the message lists every problem at once."""


class DataError(Gru4RecError, ValueError):
    """Bad input data: missing column, NaN id, unparsable time, empty file, ..."""


class ModelFileError(Gru4RecError):
    """A model or checkpoint file that is missing, truncated, corrupt, foreign or of another version."""


class TrainingDivergedError(Gru4RecError, FloatingPointError):
    """The training loss became NaN or infinite."""
