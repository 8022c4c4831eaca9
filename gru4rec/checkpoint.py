"""Safe single-file model format: named tensors + JSON metadata, written atomically.

A file is a ``torch.save`` archive of one plain dict (the *envelope*)::

    {"format": "gru4rec",          # tells a gru4rec file from any other torch file
     "version": FORMAT_VERSION,    # layout of the envelope and of the meta the model writes
     "writer": "0.1.0",            # gru4rec version that wrote it (for messages only)
     "meta_json": "{...}",         # the metadata as a JSON string (config, item map, ...)
     "meta_crc32": int,            # CRC-32 of meta_json (UTF-8)
     "tensors": {name: Tensor},    # CPU tensors, contiguous, no shared storage
     "crc32": {name: int}}         # CRC-32 of each tensor's raw bytes

Why this shape:

* Loading uses ``torch.load(weights_only=True)``: the unpickler accepts only tensors and
  builtin containers/scalars, so a file can never run code on load. The metadata travels as a
  JSON *string* so that its structure is ours to validate, not the unpickler's.
* The zip container of ``torch.save`` detects truncation but not flipped bytes inside a tensor
  record; the per-tensor CRC-32s make silent corruption a clear error instead of a model that
  quietly recommends garbage.
* Writes go to a temporary file in the target folder, are fsync'ed and then renamed over the
  target, so a crash leaves either the old file or the new one, never half of one.

The model (``GRU4Rec.save/load``) and the resume checkpoints of training both use
:func:`save_file` / :func:`load_file`; neither needs anything else from this module.
"""
from __future__ import annotations

import json
import os
import pickle
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gru4rec.errors import ModelFileError
from gru4rec.files import atomic_write

MODEL_SUFFIX = ".safetensors"  # the one default extension of model files and checkpoints (loading detects the format by content)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "save_file",
    "load_file",
    "file_info",
]

FORMAT_NAME = "gru4rec"
#: Version of the file layout written by this release.
FORMAT_VERSION = 1
#: Versions this release can read (a future release may add migrations for older ones here).
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)

_ZIP_MAGIC = b"PK\x03\x04"
_ENVELOPE_KEYS = ("format", "version", "meta_json", "meta_crc32", "tensors", "crc32")


def _package_version() -> str:
    try:
        from gru4rec import __version__

        return str(__version__)
    except Exception:  # pragma: no cover - only when the package is half-installed
        return "unknown"


def _json_default(obj: Any) -> Any:
    """Make numpy scalars/arrays, paths and sets JSON-serialisable; reject anything else."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a hard dependency
        np = None  # type: ignore[assignment]
    if np is not None:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(
        f"model metadata must be JSON-serialisable; got {type(obj).__name__} "
        "(put tensors into the tensors dict instead)"
    )


def _raw_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a buffer (any dtype, including bfloat16 and bool)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(_raw_bytes(t))


def _prepare_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a dict of name -> Tensor, got {type(tensors).__name__}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{name!r}] is a {type(t).__name__}, not a torch.Tensor")
        if t.is_sparse or t.layout != torch.strided:
            raise TypeError(f"tensors[{name!r}] must be a dense (strided) tensor")
        # clone() gives each entry its own compact storage: torch.save would otherwise write
        # the whole storage behind a view, and two names sharing memory would load as one.
        out[name] = t.detach().to("cpu").contiguous().clone()
    return out


def save_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``tensors`` and the JSON-serialisable ``meta`` to ``path`` atomically.

    Tensors are stored as contiguous CPU copies. ``meta`` may hold dicts, lists, strings,
    numbers, booleans and None (numpy scalars/arrays and paths are converted).

    Raises:
        ModelFileError: ``path`` exists and ``overwrite`` is False; ``path`` is a directory;
            the directory does not exist or is not writable; the write failed.
        TypeError: a tensor is not a dense Tensor, or ``meta`` is not JSON-serialisable.

    Returns:
        The path written.
    """
    path = Path(path)
    prepared = _prepare_tensors(tensors)
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    # allow_nan=False: NaN/Infinity are not JSON and other readers of the file would choke.
    try:
        meta_json = json.dumps(dict(meta), default=_json_default, allow_nan=False, ensure_ascii=False)
    except ValueError as exc:
        raise TypeError(f"model metadata is not valid JSON: {exc}") from exc
    envelope = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "writer": _package_version(),
        "meta_json": meta_json,
        "meta_crc32": zlib.crc32(meta_json.encode("utf-8")),
        "tensors": prepared,
        "crc32": {name: _crc(t) for name, t in prepared.items()},
    }

    if path.is_dir():
        raise ModelFileError(f"cannot write model file {path}: it is a directory")
    if path.exists() and not overwrite:
        raise ModelFileError(f"refusing to overwrite existing file {path} (use overwrite/--force)")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ModelFileError(f"cannot write model file {path}: directory {directory} does not exist")

    started = False

    def write(tmp: Path) -> None:
        nonlocal started
        started = True
        with open(tmp, "wb") as fh:
            torch.save(envelope, fh)
            fh.flush()
            os.fsync(fh.fileno())

    try:
        atomic_write(path, write, overwrite=overwrite)
        _fsync_directory(directory)
    except FileExistsError as exc:  # the file appeared since the check above
        raise ModelFileError(f"refusing to overwrite existing file {path} (use overwrite/--force)") from exc
    except OSError as exc:
        if not started:
            raise ModelFileError(
                f"cannot write model file {path}: directory {directory} is not writable ({exc.strerror})"
            ) from exc
        raise ModelFileError(f"cannot write model file {path}: {exc.strerror or exc}") from exc
    return path


def _fsync_directory(directory: Path) -> None:
    """Persist the rename itself (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_envelope(path: Path) -> dict[str, Any]:
    """Load and structurally validate the envelope; every failure is a ModelFileError."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a model file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if not head:
        raise ModelFileError(f"model file {path} is empty (truncated or not written completely)")
    if head != _ZIP_MAGIC:
        kind = "a text file" if _looks_like_text(path) else "an unknown binary format"
        raise ModelFileError(f"{path} is not a gru4rec model file (it is {kind})")
    if _is_foreign_zip(path):
        raise ModelFileError(f"{path} is not a gru4rec model file (it is a zip archive of other data)")
    try:
        with open(path, "rb") as fh:  # a file object: torch.load would hand a *.safetensors path to safetensors
            obj = torch.load(fh, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():
            raise ModelFileError(
                f"model file {path} is truncated or corrupt and cannot be read "
                f"(UnpicklingError: {_first_line(exc)})"
            ) from exc
        # weights_only refused a Python object: no gru4rec file ever contains one.
        raise ModelFileError(
            f"{path} is not a gru4rec model file: it contains Python objects that a model "
            "file never holds; refusing to load it"
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as exc:
        raise ModelFileError(
            f"model file {path} is truncated or corrupt and cannot be read "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise ModelFileError(
            f"{path} is a PyTorch file but not a gru4rec model file (no gru4rec format marker)"
        )
    version = obj.get("version")
    writer = obj.get("writer", "unknown")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ModelFileError(f"model file {path} is corrupt: invalid format version {version!r}")
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        if version > max(SUPPORTED_VERSIONS):
            hint = "upgrade gru4rec to read it"
            age = "newer"
        else:
            hint = "re-save it with the gru4rec release that wrote it, or retrain"
            age = "older"
        raise ModelFileError(
            f"model file {path} has format version {version} (written by gru4rec {writer}), "
            f"{age} than this gru4rec {_package_version()} reads (format version {supported}); {hint}"
        )
    missing = [k for k in _ENVELOPE_KEYS if k not in obj]
    if missing:
        raise ModelFileError(f"model file {path} is corrupt: missing {', '.join(missing)}")
    return obj


def _is_foreign_zip(path: Path) -> bool:
    """A readable zip without torch's ``<archive>/data.pkl`` record (a damaged one is not "foreign")."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return not any(n.endswith("/data.pkl") for n in names)


def _looks_like_text(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            chunk = fh.read(4096)
    except OSError:
        return False
    if b"\0" in chunk:
        return False
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the chunk boundary is still text.
        return exc.start >= len(chunk) - 3
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else "no details"


def load_file(
    path: str | os.PathLike[str],
    *,
    map_location: str | torch.device = "cpu",
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a file written by :func:`save_file`; never executes code from the file.

    Every tensor's checksum is verified before it is moved to ``map_location``.

    Raises:
        ModelFileError: the file is missing, empty, truncated, corrupt (checksum mismatch),
            not a gru4rec file, or of a format version this release cannot read.

    Returns:
        ``(tensors, meta)``: a dict of name -> Tensor on ``map_location`` and the metadata dict.
    """
    tensors, meta, _ = _load(Path(path), map_location)
    return tensors, meta


def _load(
    path: Path, map_location: str | torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    env = _read_envelope(path)
    meta_json, tensors, crcs = env["meta_json"], env["tensors"], env["crc32"]
    if not isinstance(meta_json, str) or not isinstance(tensors, dict) or not isinstance(crcs, dict):
        raise ModelFileError(f"model file {path} is corrupt: unexpected envelope types")
    if zlib.crc32(meta_json.encode("utf-8")) != env["meta_crc32"]:
        raise ModelFileError(f"model file {path} is corrupt: metadata checksum mismatch")
    try:
        meta = json.loads(meta_json)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"model file {path} is corrupt: metadata is not JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelFileError(f"model file {path} is corrupt: metadata is not a JSON object")
    if set(tensors) != set(crcs):
        raise ModelFileError(f"model file {path} is corrupt: tensor list and checksums disagree")
    device = torch.device(map_location)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ModelFileError(f"model file {path} is corrupt: entry {name!r} is not a tensor")
        if _crc(t) != crcs[name]:
            raise ModelFileError(
                f"model file {path} is corrupt: checksum mismatch in tensor {name!r} "
                "(the file was damaged after it was written)"
            )
        out[name] = t if device.type == "cpu" else t.to(device)
    return out, meta, env


def file_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe a model file without interpreting its metadata.

    Returns a dict with ``format_version``, ``writer`` (gru4rec version that wrote it),
    ``size_bytes``, ``tensors`` (name -> {"shape", "dtype"}) and ``meta``. Raises
    ModelFileError like :func:`load_file` (the checksums are verified too).
    """
    path = Path(path)
    tensors, meta, env = _load(path, "cpu")
    return {
        "format_version": env["version"],
        "writer": str(env.get("writer", "unknown")),
        "size_bytes": path.stat().st_size,
        "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                    for n, t in tensors.items()},
        "meta": meta,
    }
