"""Run folders: everything one training run leaves behind, in one folder that ``gru4rec report``
reads back.

=====================  =====================================================================
``command.txt``        the command that repeats the run (shell-quoted; ``--threads N`` added when not
                       given), after a comment with the folder it ran in
``config.json``        the hyperparameters (``config``) and how the run was made: device, precision,
                       threads, the data files, validation settings, versions, start time
``epochs.jsonl``       one JSON object per epoch: ``epoch``, ``loss``, ``seconds``, ``mb_per_s``,
                       ``events_per_s``, ``peak_host_mb`` (the process's peak resident memory),
                       ``peak_device_mb`` (CUDA: peak allocated by torch; null elsewhere), ``threads``
                       (the training's thread count at the epoch's end and how it was set:
                       ``{'threads': 2, 'chosen': 'online', 'ms': {'1': 1.9, '2': 1.4}}``, the ms per
                       step measured at each count; ``'fixed'`` by ``--threads``; absent on a GPU) and,
                       when validating, ``valid`` (``{'recall@20': ..., ...}``) and ``best_epoch``
``metrics.json``       the final evaluation of every test file, breakdowns included (the payload of
                       ``--metrics-json``); ``gru4rec evaluate`` of the folder's model adds its test
                       files (:func:`run_folder_of`, :meth:`RunFolder.add_metrics`)
``model.safetensors``  the trained model (:meth:`gru4rec.GRU4Rec.save`)
=====================  =====================================================================

Every file is written atomically (:func:`gru4rec.files.atomic_write`); ``epochs.jsonl`` is
rewritten whole after every epoch, so it is complete up to the last finished epoch even when the
run is killed. A folder that already holds files is refused unless ``force`` (checked by
:meth:`RunFolder.check` before training starts); with ``force`` the files above are replaced and
any other file in the folder is left alone.
"""
from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gru4rec.errors import Gru4RecError
from gru4rec.files import atomic_write
from gru4rec.machine.threads import last_decision

if TYPE_CHECKING:  # typing only: the run folder reads these objects' fields
    from gru4rec.evaluation.metrics import EvalResult
    from gru4rec.fitting import EpochInfo

__all__ = [
    "COMMAND_FILE", "CONFIG_FILE", "EPOCHS_FILE", "METRICS_FILE", "MODEL_FILE", "REPORTED_METRICS", "RUN_CUTOFFS",
    "RunFolder", "epoch_record", "metrics_entry", "read_run", "run_folder_of",
]

COMMAND_FILE = "command.txt"
CONFIG_FILE = "config.json"
EPOCHS_FILE = "epochs.jsonl"
METRICS_FILE = "metrics.json"
MODEL_FILE = "model.safetensors"  # "model" + checkpoint.MODEL_SUFFIX, written out: importing this module loads no torch (tested)
_OURS = (COMMAND_FILE, CONFIG_FILE, EPOCHS_FILE, METRICS_FILE, MODEL_FILE)
#: A run folder's final evaluation also covers these cutoffs (in metrics.json, not in the printed
#: lines), so that the report can draw Recall@k and MRR@k against k.
RUN_CUTOFFS = (1, 2, 3, 5, 10, 15, 20, 25, 30, 40, 50)


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a value is written as null."""
    return value if value is not None and math.isfinite(value) else None


def epoch_record(info: EpochInfo) -> dict[str, Any]:
    """The JSON object of one epoch (one line of ``epochs.jsonl``)."""
    record: dict[str, Any] = {
        "epoch": info.epoch,
        "loss": _finite(info.loss),
        "seconds": _finite(info.seconds),
        "mb_per_s": _finite(info.mb_per_s),
        "events_per_s": _finite(info.events_per_s),
        "peak_host_mb": round(info.peak_host_mb, 1),
        "peak_device_mb": None if info.peak_device_mb is None else round(info.peak_device_mb, 1),
    }
    on_cpu = str(getattr(info.model, "device", "cpu")).startswith("cpu")
    threads = last_decision("training") if on_cpu else None  # the CPU's choice (gru4rec/machine/threads.py)
    if threads is not None:
        record["threads"] = threads.as_dict()
    if info.valid is not None:
        record["valid"] = {k: _finite(v) for k, v in info.valid.items()}
        record["best_epoch"] = info.best_epoch
    return record


#: The metrics of a metrics.json entry, each a {cutoff: value} table of the evaluation result.
REPORTED_METRICS = ("recall", "mrr", "ndcg", "coverage", "popularity")


def metrics_entry(result: EvalResult, *, seconds: float | None = None) -> dict[str, Any]:
    """One test file's entry of ``metrics.json`` / ``--metrics-json``: mode, counts, seconds,
    ``{metric: {cutoff: value}}`` for every metric the evaluation computed, and the breakdown."""
    return {
        "mode": result.mode,
        "n_predictions": int(result.n_predictions),
        "n_dropped_events": int(result.n_dropped_events),
        "seconds": result.seconds if seconds is None else seconds,
        **{metric: {str(c): float(v) for c, v in getattr(result, metric).items()} for metric in REPORTED_METRICS
           if getattr(result, metric)},
        "breakdown": result.breakdown.to_dict() if result.breakdown is not None else None,
    }


def _write_text(path: Path, text: str) -> None:
    try:
        atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OSError as exc:
        raise Gru4RecError(f"cannot write {path}: {exc.strerror or exc}") from exc


class RunFolder:
    """One run's folder. :meth:`check` before any work, :meth:`start` when training starts, then
    the instance is a ``fit`` callback (one line of ``epochs.jsonl`` per epoch);
    :meth:`write_metrics` and :attr:`model_path` for the end of the run."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.epochs: list[dict[str, Any]] = []

    @property
    def model_path(self) -> Path:
        """Where the run's model is saved."""
        return self.path / MODEL_FILE

    def check(self, *, force: bool) -> None:
        """Refuse a run folder that cannot be used: a file in its place, an unwritable or
        uncreatable folder, or one that already holds files (unless ``force``)."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise Gru4RecError(f"run folder {p} is a file, not a folder")
        if p.is_dir():
            if any(p.iterdir()) and not force:
                raise Gru4RecError(f"run folder {p} is not empty; choose a new folder or use --force to replace its run files")
            if not os.access(p, os.W_OK | os.X_OK):
                raise Gru4RecError(f"run folder {p} is not writable")
            return
        parent = next((a for a in p.absolute().parents if a.exists()), None)
        if parent is not None and not parent.is_dir():
            raise Gru4RecError(f"cannot create run folder {p}: {parent} is a file")
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            raise Gru4RecError(f"cannot create run folder {p}: {parent} is not writable")

    def start(self, command: Sequence[str], config: Mapping[str, Any]) -> None:
        """Create the folder, write ``command.txt`` and ``config.json``, and remove the run files
        of an earlier run there (only reached with ``force``, see :meth:`check`)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Gru4RecError(f"cannot create run folder {self.path}: {exc.strerror or exc}") from exc
        for name in _OURS:
            (self.path / name).unlink(missing_ok=True)
        self.epochs = []
        _write_text(self.path / COMMAND_FILE, f"# run in {Path.cwd()}\n{shlex.join(command)}\n")
        _write_text(self.path / CONFIG_FILE, json.dumps(dict(config), indent=2) + "\n")

    def __call__(self, info: EpochInfo) -> None:
        """Record one epoch (``fit`` callback)."""
        self.epochs.append(epoch_record(info))
        _write_text(self.path / EPOCHS_FILE, "".join(json.dumps(e) + "\n" for e in self.epochs))

    def write_metrics(self, payload: Mapping[str, Any]) -> None:
        """Write ``metrics.json`` (the final evaluation)."""
        _write_text(self.path / METRICS_FILE, json.dumps(dict(payload), indent=2) + "\n")

    def add_metrics(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Add test files' entries to ``metrics.json`` (a later evaluation of the run's model):
        the entries of other test files stay, those of the same files are replaced; returns the
        replaced entries by test file."""
        current = read_run(self.path)["metrics"] or {}
        if not isinstance(current, dict):
            raise Gru4RecError(f"{self.path / METRICS_FILE} does not hold a JSON object of test files")
        replaced = {name: current[name] for name in payload if name in current}
        self.write_metrics({**current, **payload})
        return replaced


def run_folder_of(model_path: str | os.PathLike[str]) -> RunFolder | None:
    """The run folder whose model ``model_path`` is (``DIR/model.safetensors`` beside the
    folder's ``config.json``), or None."""
    p = Path(model_path)
    if p.name != MODEL_FILE or not (p.parent / CONFIG_FILE).is_file():
        return None
    return RunFolder(p.parent)


def read_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run folder read back: ``{'path', 'name', 'config', 'command', 'epochs', 'metrics'}``
    (``config``/``metrics`` None and ``epochs`` empty where the file is missing). A path that is
    not a run folder (none of the files) is an error naming it."""
    p = Path(path)
    if not p.is_dir():
        raise Gru4RecError(f"run folder {p} not found")
    if not any((p / name).exists() for name in (CONFIG_FILE, EPOCHS_FILE, METRICS_FILE)):
        raise Gru4RecError(f"{p} is not a run folder (no {CONFIG_FILE}, {EPOCHS_FILE} or {METRICS_FILE}; make one with --run-dir)")

    def load_json(name: str) -> Any:
        f = p / name
        if not f.exists():
            return None
        try:
            return json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise Gru4RecError(f"{f} cannot be read as JSON: {exc}") from exc

    epochs = []
    if (p / EPOCHS_FILE).exists():
        for number, line in enumerate((p / EPOCHS_FILE).read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    epochs.append(json.loads(line))
                except ValueError as exc:
                    raise Gru4RecError(f"{p / EPOCHS_FILE} line {number} is not JSON: {exc}") from exc
    command = (p / COMMAND_FILE).read_text(encoding="utf-8").splitlines()[-1] if (p / COMMAND_FILE).exists() else None
    return {
        "path": str(p),
        "name": p.name or str(p),
        "config": load_json(CONFIG_FILE),
        "command": command,
        "epochs": epochs,
        "metrics": load_json(METRICS_FILE),
    }
