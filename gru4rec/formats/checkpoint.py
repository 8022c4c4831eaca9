"""Model files and training checkpoints: named tensors + JSON metadata in one safetensors file.

Format version 2 (written by this release) is a plain `safetensors <https://huggingface.co/docs/safetensors>`_
file — readable without gru4rec from Python, Rust or JavaScript, memory-mappable, and free of
code on load. The tensors are its body; its ``__metadata__`` (a string -> string map) holds one
JSON document per entry::

    format          "gru4rec"                    tells a gru4rec file from any other safetensors file
    format_version  2
    writer          "0.1.0"                      the gru4rec version that wrote it (for messages only)
    checksums       {"algorithm": "sha256",
                     "tensors": {name: hex},     SHA-256 of each tensor's raw bytes
                     "header": hex}              SHA-256 of every tensor's dtype and shape and of
                                                 every other metadata entry, as stored
    <key>           <value>                      one entry per key of the ``meta`` dict given to
                                                 save_file: a model has kind, config, item_ids,
                                                 epochs_trained; a training checkpoint its own

so ``{k: json.loads(v) for k, v in safe_open(path, "np").metadata().items()}`` reads it all.
safetensors itself rejects a truncated file or a header that does not describe the body
exactly; the checksums turn a flipped byte anywhere else (a tensor, a name, a metadata value)
into a clear error instead of a model that quietly recommends garbage.

Format version 1 (``torch.save`` envelopes, :mod:`gru4rec.formats.checkpoint_v1`) is still read. The
format is recognised by the file's first bytes, never by its name. Writes go to a temporary
file in the target folder, are fsync'ed and renamed over the target (:func:`gru4rec.files.atomic_write`),
so a crash leaves the old file or the new one, never half of one.

The model files (:mod:`gru4rec.formats.model_file`: what a model file holds) and the resume checkpoints
of training both use :func:`save_file` / :func:`load_file` (and :func:`read_meta` for the
metadata alone); neither needs anything else from this module.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file as write_safetensors

from gru4rec.errors import ModelFileError, OutputExistsError
from gru4rec.files import atomic_write, check_output_path
from gru4rec.formats import checkpoint_v1

__all__ = [
    "MODEL_SUFFIX",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "save_file",
    "load_file",
    "read_meta",
    "file_info",
]

MODEL_SUFFIX = ".safetensors"  # the one default extension of model files and checkpoints (loading detects the format by content)
FORMAT_NAME = "gru4rec"
#: Version of the file layout written by this release (2: safetensors).
FORMAT_VERSION = 2
#: Versions this release can read (1: the torch.save envelope of gru4rec 0.1).
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2)
#: Metadata entries the format itself uses; ``meta`` keys may not take these names.
RESERVED_KEYS: tuple[str, ...] = ("format", "format_version", "writer", "checksums")

# safetensors refuses to read a header over 100 MB (the metadata, mostly the item ids, counts).
_MAX_HEADER_BYTES = 100_000_000
_CONTAINERS = {1: "torch.save zip", 2: "safetensors"}


class _Loaded(NamedTuple):
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    version: int
    writer: str


def _package_version() -> str:
    try:
        from gru4rec import __version__

        return str(__version__)
    except Exception:  # pragma: no cover - only when the package is half-installed
        return "unknown"


def _json_default(obj: Any) -> Any:
    """Make numpy scalars/arrays, paths and sets JSON-serialisable; reject anything else."""
    import numpy as np

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


def _to_json(key: str, value: Any) -> str:
    # allow_nan=False: NaN/Infinity are not JSON and other readers of the file would choke.
    try:
        return json.dumps(value, default=_json_default, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except ValueError as exc:
        raise TypeError(f"model metadata {key!r} is not valid JSON: {exc}") from exc


def _sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes (any dtype, including bfloat16 and bool)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(flat.view(torch.uint8).numpy().data).hexdigest()


def _header_digest(tensors: Mapping[str, torch.Tensor], entries: Mapping[str, str]) -> str:
    """SHA-256 over what the body's checksums do not cover: the tensors' names, dtypes and
    shapes and every metadata entry except ``checksums`` itself, in a canonical form."""
    described = {
        "tensors": {name: [str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in tensors.items()},
        "metadata": {k: v for k, v in entries.items() if k != "checksums"},
    }
    text = json.dumps(described, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


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
        # clone() gives each entry its own compact storage: safetensors refuses tensors that
        # share memory, and a view must not drag its whole storage into the file.
        out[name] = t.detach().to("cpu").contiguous().clone()
    return out


def _metadata_entries(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, str]:
    """The safetensors ``__metadata__`` of a file holding ``tensors`` and ``meta``."""
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    entries = {"format": _to_json("format", FORMAT_NAME), "format_version": _to_json("format_version", FORMAT_VERSION),
               "writer": _to_json("writer", _package_version())}
    for key, value in meta.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise TypeError(f"metadata key {key!r} is reserved for the file format itself")
        entries[key] = _to_json(key, value)
    checksums = {"algorithm": "sha256", "tensors": {name: _sha256(t) for name, t in tensors.items()},
                 "header": _header_digest(tensors, entries)}
    entries["checksums"] = _to_json("checksums", checksums)
    size = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in entries.items())
    if size > _MAX_HEADER_BYTES * 0.95:  # JSON escaping in the header adds a little more
        largest = max(entries, key=lambda k: len(entries[k]))
        raise ModelFileError(
            f"the model's metadata is {size / 1e6:.0f} MB (mostly {largest!r}); a safetensors header "
            f"holds at most {_MAX_HEADER_BYTES / 1e6:.0f} MB"
        )
    return entries


def save_file(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``tensors`` and the JSON-serialisable ``meta`` to ``path`` atomically (format 2).

    Tensors are stored as contiguous CPU copies. ``meta`` maps string keys (not one of
    :data:`RESERVED_KEYS`) to dicts, lists, strings, numbers, booleans or None (numpy
    scalars/arrays and paths are converted).

    Raises:
        OutputPathError: ``path`` cannot be written (:func:`gru4rec.files.check_output_path`;
            :class:`~gru4rec.errors.OutputExistsError` when it exists and ``overwrite`` is False).
        ModelFileError: the write failed.
        TypeError: a tensor is not a dense Tensor, or ``meta`` is not JSON-serialisable.

    Returns:
        The path written.
    """
    path = Path(path)
    prepared = _prepare_tensors(tensors)
    entries = _metadata_entries(prepared, meta)
    check_output_path(path, "model file", overwrite, argument="overwrite")
    directory = path.parent if str(path.parent) else Path(".")

    started = False

    def write(tmp: Path) -> None:
        nonlocal started
        started = True
        write_safetensors(prepared, str(tmp), metadata=entries)
        _fsync(tmp, os.O_RDONLY)

    try:
        atomic_write(path, write, overwrite=overwrite)
        _fsync(directory, os.O_RDONLY, best_effort=True)
    except FileExistsError as exc:  # the file appeared since the check above
        raise OutputExistsError(path, "model file", "overwrite") from exc
    except OSError as exc:
        if not started:
            raise ModelFileError(
                f"cannot write model file {path}: directory {directory} is not writable ({exc.strerror})"
            ) from exc
        raise ModelFileError(f"cannot write model file {path}: {exc.strerror or exc}") from exc
    except SafetensorError as exc:  # how safetensors reports a failed write (e.g. a full disk)
        raise ModelFileError(f"cannot write model file {path}: {_first_line(exc)}") from exc
    return path


def _fsync(path: Path, flags: int, *, best_effort: bool = False) -> None:
    """Persist a file's data or a directory's entries (the rename); a directory may not open
    on every platform, hence ``best_effort``."""
    try:
        fd = os.open(path, flags)
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not best_effort:
            raise
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ reading


def _sniff(path: Path) -> int:
    """The format version family of ``path`` by its first bytes (1: zip, 2: safetensors), or a
    ModelFileError saying what the file is instead."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a model file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if not head:
        raise ModelFileError(f"model file {path} is empty (truncated or not written completely)")
    if head.startswith(checkpoint_v1.ZIP_MAGIC):
        return 1
    text = _looks_like_text(head)
    if len(head) > 8 and head[8:9] == b"{":
        # A safetensors file: an 8-byte little-endian header length, then the JSON header.
        (header_len,) = struct.unpack("<Q", head[:8])
        if 8 + header_len <= size:
            return 2
        if not text:  # the length of a real header has zero bytes; a text file's has none
            raise ModelFileError(
                f"model file {path} is truncated or corrupt and cannot be read (its header "
                f"claims {header_len:,} bytes, the file has {size:,})"
            )
    if text:
        raise ModelFileError(f"{path} is not a gru4rec model file (it is a text file)")
    if size < 9:
        raise ModelFileError(f"{path} is not a gru4rec model file (only {size} bytes: truncated?)")
    raise ModelFileError(f"{path} is not a gru4rec model file (it is an unknown binary format)")


def _looks_like_text(chunk: bytes) -> bool:
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


def _check_version(path: Path, version: int, writer: str, readable: tuple[int, ...]) -> None:
    """Accept ``version`` if this container carries it; else say whether to upgrade or re-save."""
    if version in readable:
        return
    supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
    if version > max(SUPPORTED_VERSIONS):
        age, hint = "newer", "upgrade gru4rec to read it"
    elif version < min(SUPPORTED_VERSIONS):
        age, hint = "older", "re-save it with the gru4rec release that wrote it, or retrain"
    else:
        raise ModelFileError(f"model file {path} is corrupt: format version {version} in a {_CONTAINERS[readable[0]]} file")
    raise ModelFileError(
        f"model file {path} has format version {version} (written by gru4rec {writer}), "
        f"{age} than this gru4rec {_package_version()} reads (format version {supported}); {hint}"
    )


def _corrupt(path: Path, what: str) -> ModelFileError:
    return ModelFileError(f"model file {path} is corrupt: {what} (the file was damaged after it was written)")


def _read_safetensors(path: Path) -> _Loaded:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            entries = fh.metadata() or {}
            if entries.get("format") != json.dumps(FORMAT_NAME):
                raise ModelFileError(
                    f"{path} is a safetensors file but not a gru4rec model file (no gru4rec format marker)"
                )
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError) as exc:
        raise ModelFileError(
            f"model file {path} is truncated or corrupt and cannot be read "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    try:
        decoded = {key: json.loads(value) for key, value in entries.items()}
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"a metadata entry is not JSON ({exc})") from exc
    version, writer = decoded.get("format_version"), decoded.get("writer", "unknown")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _corrupt(path, f"invalid format version {version!r}")
    _check_version(path, version, str(writer), (2,))
    checksums = decoded.get("checksums")
    if not isinstance(checksums, dict) or checksums.get("algorithm") != "sha256" \
            or not isinstance(checksums.get("tensors"), dict):
        raise _corrupt(path, "the checksums are missing or unreadable")
    if checksums.get("header") != _header_digest(tensors, entries):
        raise _corrupt(path, "header checksum mismatch (a tensor's name, dtype or shape, or the metadata, changed)")
    if set(checksums["tensors"]) != set(tensors):
        raise _corrupt(path, "tensor list and checksums disagree")
    for name, t in tensors.items():
        if _sha256(t) != checksums["tensors"][name]:
            raise _corrupt(path, f"checksum mismatch in tensor {name!r}")
    meta = {k: v for k, v in decoded.items() if k not in RESERVED_KEYS}
    return _Loaded(tensors, meta, version, str(writer))


def _load(path: Path) -> _Loaded:
    if _sniff(path) == 2:
        return _read_safetensors(path)
    version, writer, env = checkpoint_v1.version_of(path)
    _check_version(path, version, writer, (1,))
    old = checkpoint_v1.read(path, env)
    return _Loaded(old.tensors, old.meta, old.version, old.writer)


def load_file(
    path: str | os.PathLike[str],
    *,
    map_location: str | torch.device = "cpu",
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a file written by :func:`save_file` (format 2) or by gru4rec 0.1 (format 1).

    Never executes code from the file; every checksum is verified before a tensor is moved to
    ``map_location``.

    Raises:
        ModelFileError: the file is missing, empty, truncated, corrupt (checksum mismatch),
            not a gru4rec file, or of a format version this release cannot read.

    Returns:
        ``(tensors, meta)``: a dict of name -> Tensor on ``map_location`` and the metadata dict.
    """
    loaded = _load(Path(path))
    device = torch.device(map_location)
    tensors = loaded.tensors if device.type == "cpu" else {n: t.to(device) for n, t in loaded.tensors.items()}
    return tensors, loaded.meta


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata dict of a file written by :func:`save_file`, without reading its tensors
    (a format-2 file's header only; a format-1 file is read whole). The checksums are not
    verified here: :func:`load_file` verifies them when the tensors are read.

    Raises ModelFileError as :func:`load_file` does for a missing, truncated or foreign file or
    an unreadable format version."""
    path = Path(path)
    if _sniff(path) != 2:
        return _load(path).meta
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            entries = fh.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, OverflowError) as exc:
        raise ModelFileError(
            f"model file {path} is truncated or corrupt and cannot be read ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    if entries.get("format") != json.dumps(FORMAT_NAME):
        raise ModelFileError(f"{path} is a safetensors file but not a gru4rec model file (no gru4rec format marker)")
    try:
        decoded = {key: json.loads(value) for key, value in entries.items()}
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"a metadata entry is not JSON ({exc})") from exc
    version = decoded.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _corrupt(path, f"invalid format version {version!r}")
    _check_version(path, version, str(decoded.get("writer", "unknown")), (2,))
    return {k: v for k, v in decoded.items() if k not in RESERVED_KEYS}


def file_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Describe a model file without interpreting its metadata.

    Returns a dict with ``format_version``, ``container`` (``"safetensors"``, or ``"torch.save zip"``
    for format 1), ``writer`` (gru4rec version that wrote it), ``size_bytes``, ``tensors``
    (name -> {"shape", "dtype"}) and ``meta``. Raises ModelFileError like :func:`load_file`
    (the checksums are verified too).
    """
    path = Path(path)
    loaded = _load(path)
    return {
        "format_version": loaded.version,
        "container": _CONTAINERS[loaded.version],
        "writer": loaded.writer,
        "size_bytes": path.stat().st_size,
        "tensors": {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                    for n, t in loaded.tensors.items()},
        "meta": loaded.meta,
    }
