"""Reading model files of format version 1 (gru4rec before safetensors); nothing writes them any more.

A version-1 file is a ``torch.save`` archive (a zip) of one plain dict, the *envelope*::

    {"format": "gru4rec",          # tells a gru4rec file from any other torch file
     "version": 1,
     "writer": "0.1.0",            # gru4rec version that wrote it (for messages only)
     "meta_json": "{...}",         # the metadata as a JSON string (config, item map, ...)
     "meta_crc32": int,            # CRC-32 of meta_json (UTF-8)
     "tensors": {name: Tensor},    # CPU tensors, contiguous, no shared storage
     "crc32": {name: int}}         # CRC-32 of each tensor's raw bytes

It is read with ``torch.load(weights_only=True)``, whose unpickler accepts only tensors and
builtin containers, so a file can never run code on load; the CRC-32s catch the flipped bytes
that the zip container itself does not. :mod:`gru4rec.formats.checkpoint` detects the format by content
and calls :func:`version_of`, judges the version (for both formats alike), then :func:`read`.
"""
from __future__ import annotations

import json
import pickle
import zipfile
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gru4rec.errors import ModelFileError

__all__ = ["ZIP_MAGIC", "V1File", "version_of", "read"]

#: The first bytes of every zip archive, hence of every version-1 file.
ZIP_MAGIC = b"PK\x03\x04"
_FORMAT_NAME = "gru4rec"
_ENVELOPE_KEYS = ("format", "version", "meta_json", "meta_crc32", "tensors", "crc32")


class V1File(NamedTuple):
    """What a version-1 file holds, checksums verified (the version is checked by the caller)."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    version: int
    writer: str


def _crc(t: torch.Tensor) -> int:
    """CRC-32 of a tensor's raw bytes, as version 1 stored it."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return zlib.crc32(b"")
    return zlib.crc32(flat.view(torch.uint8).numpy().data)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else "no details"


def _is_foreign_zip(path: Path) -> bool:
    """A readable zip without torch's ``<archive>/data.pkl`` record (a damaged one is not "foreign")."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return not any(n.endswith("/data.pkl") for n in names)


def _envelope(path: Path) -> dict[str, Any]:
    """The unpickled envelope, structurally checked; every failure is a ModelFileError."""
    if _is_foreign_zip(path):
        raise ModelFileError(f"{path} is not a gru4rec model file (it is a zip archive of other data)")
    try:
        # A file object, not the path: torch.load picks a reader by the name's extension
        # (safetensors for '.safetensors'), and the content has been recognised already.
        with open(path, "rb") as fh:
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
    if not isinstance(obj, dict) or obj.get("format") != _FORMAT_NAME:
        raise ModelFileError(
            f"{path} is a PyTorch file but not a gru4rec model file (no gru4rec format marker)"
        )
    return obj


def version_of(path: Path) -> tuple[int, str, dict[str, Any]]:
    """``(version, writer, envelope)`` of a version-1 file; the version is not judged here."""
    env = _envelope(path)
    version = env.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ModelFileError(f"model file {path} is corrupt: invalid format version {version!r}")
    return version, str(env.get("writer", "unknown")), env


def read(path: Path, env: dict[str, Any]) -> V1File:
    """The tensors and metadata of the envelope ``env`` read from ``path``, every checksum verified."""
    missing = [k for k in _ENVELOPE_KEYS if k not in env]
    if missing:
        raise ModelFileError(f"model file {path} is corrupt: missing {', '.join(missing)}")
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
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ModelFileError(f"model file {path} is corrupt: entry {name!r} is not a tensor")
        if _crc(t) != crcs[name]:
            raise ModelFileError(
                f"model file {path} is corrupt: checksum mismatch in tensor {name!r} "
                "(the file was damaged after it was written)"
            )
    return V1File(dict(tensors), meta, int(env["version"]), str(env.get("writer", "unknown")))
