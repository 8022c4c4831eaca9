"""Exceptions a user can act on. The CLI prints them as one line (no traceback)."""


class Gru4RecError(Exception):
    """Base class of every error caused by user input (data, parameters, files)."""


class ConfigError(Gru4RecError, ValueError):
    """Invalid hyperparameters; the message lists every problem at once."""


class DataError(Gru4RecError, ValueError):
    """Bad input data: missing column, NaN id, unparsable time, empty file, ..."""


class ModelFileError(Gru4RecError):
    """A model or checkpoint file that is missing, truncated, corrupt, foreign or of another version."""


class NotFittedError(Gru4RecError):
    """A model asked for recommendations, scores, an evaluation or an export before it was fitted
    (or loaded); raised by :func:`gru4rec.inference.require_fitted`, the one check."""


class TrainingDivergedError(Gru4RecError, FloatingPointError):
    """The training loss became NaN or infinite."""


class LossExplodedWarning(RuntimeWarning):
    """The epoch loss exploded: above three times the untrained level (:mod:`gru4rec.training.loop`,
    :func:`~gru4rec.training.loop.exploded`). Training goes on; ``paropt`` stops such a trial."""


class DataLeakWarning(UserWarning):
    """Validation or test data that share their sessions with the training data: the message of
    the WARNING record that :func:`gru4rec.data.overlap.warn_overlap` logs (a handler or filter
    of the ``gru4rec`` logger recognises it by ``isinstance(record.msg, DataLeakWarning)``)."""


class OutputPathError(Gru4RecError):
    """An output path that could not be written (checked before any work starts)."""


class OutputExistsError(OutputPathError, DataError):
    """An output file that exists and is replaced only on request: ``argument=True`` in Python
    (``force``, ``overwrite``), ``--force`` on the command line (an ``argument`` that starts with
    a dash is a flag; the CLI words an API's message its own way, :meth:`message`)."""

    def __init__(self, path: object, what: str = "", argument: str = "force") -> None:
        #: The existing file, what it is ("ONNX file", "" for a plain path) and the switch.
        self.path, self.what, self.argument = str(path), what, argument
        super().__init__(self.message(argument if argument.startswith("-") else f"{argument}=True"))

    def message(self, how: str) -> str:
        """The message with ``how`` as the way to replace the file (``force=True``, ``--force``)."""
        name = f"{self.what} {self.path}" if self.what else self.path
        return f"{name} already exists; pass {how} to replace it"


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT (Ctrl-C) or SIGTERM at a step boundary, after writing a
    checkpoint. A KeyboardInterrupt, so that code that handles Ctrl-C handles this too."""

    def __init__(self, signal_name: str, signal_number: int, checkpoint: str) -> None:
        super().__init__(f"{signal_name}: training stopped; checkpoint written to {checkpoint}")
        #: "SIGINT" or "SIGTERM".
        self.signal_name = signal_name
        #: Its number (the conventional exit code is 128 + this).
        self.signal_number = signal_number
        #: The checkpoint file that resumes the run.
        self.checkpoint = checkpoint
