"""The report files in ``--out``: where they go, whose they are, and replacing them without ever
losing a file that is not this study's.

A study's reports are derived from its storage, so a rerun of the same study (extending it)
replaces them. ``STUDY.summary.json`` records their owner — the study's name, its storage URL
(password redacted) and the study's id (:func:`gru4rec.tune.study.study_uid`, the same whatever
URL reaches the storage) — and the SHA-256 of every other report file it wrote. Without
``--force`` a file is replaced only when that summary belongs to this very study and lists the
file as it is now; a file of another study or storage, one that no summary lists (a user's own
file) and one changed since paropt wrote it are left alone, and :class:`ReportConflict` names
each with its owner.

Writing is two-phase, so that a process killed half-way never leaves files that no summary
vouches for: first the summary with both the old and the new digests, then the other files, then
the summary with the new digests only. Several processes writing into one ``--out`` (separate
commands on one study) take turns through a lock file ``.STUDY.lock``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gru4rec.errors import Gru4RecError
from gru4rec.files import atomic_write

__all__ = ["ReportConflict", "ReportOwner", "check_reports", "output_paths", "write_reports"]

#: The report files by key; the summary is the one that records the owner and the others.
_SUFFIXES = {
    "best_json": ".best.json",
    "best_py": ".best.py",
    "trials_csv": ".trials.csv",
    "trials_json": ".trials.json",
    "summary": ".summary.json",
}


class ReportConflict(Gru4RecError):
    """Report files in ``--out`` that a run must not replace (another study's, a user's own)."""


@dataclass(frozen=True)
class ReportOwner:
    """The study a run's reports belong to."""

    study_name: str
    storage: str
    """Storage URL, password redacted."""
    study_uid: str | None
    """The study's id; None for a study that does not exist yet."""

    def describe(self) -> str:
        """``study 'S' in URL`` for messages."""
        return f"study {self.study_name!r} in {self.storage}"

    def to_json(self) -> dict[str, Any]:
        """The owner as the summary records it."""
        return {"study_name": self.study_name, "storage": self.storage, "study_uid": self.study_uid}


def _safe_file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "study"


def output_paths(out: str | os.PathLike[str], study_name: str) -> dict[str, Path]:
    """The files a run writes into ``out`` for ``study_name``."""
    stem = _safe_file_stem(study_name)
    return {key: Path(out) / f"{stem}{suffix}" for key, suffix in _SUFFIXES.items()}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        return _digest(path.read_bytes())
    except OSError:
        return None


def _read_summary(path: Path) -> dict[str, Any] | None:
    """The summary's JSON object, or None when the file is missing or is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _recorded_owner(summary: Mapping[str, Any] | None) -> ReportOwner | None:
    owner = summary.get("owner") if summary is not None else None
    if not isinstance(owner, dict) or not isinstance(owner.get("study_name"), str):
        return None
    return ReportOwner(str(owner["study_name"]), str(owner.get("storage", "?")), owner.get("study_uid"))


def _recorded_digests(summary: Mapping[str, Any] | None, key: str) -> list[str]:
    files = summary.get("files") if summary is not None else None
    entry = files.get(key) if isinstance(files, dict) else None
    digests = entry.get("sha256") if isinstance(entry, dict) else None
    return [d for d in digests if isinstance(d, str)] if isinstance(digests, list) else []


def _conflicts(paths: Mapping[str, Path], owner: ReportOwner) -> list[str]:
    """Why each existing report file is not this study's to replace (empty: all are)."""
    existing = {key: path for key, path in paths.items() if path.exists()}
    if not existing:
        return []
    summary_path = paths["summary"]
    summary = _read_summary(summary_path) if "summary" in existing else None
    recorded = _recorded_owner(summary)
    if "summary" in existing and recorded is None:
        return [f"{summary_path} is not a paropt summary that names its study"]
    if recorded is not None and (owner.study_uid is None or recorded.study_uid != owner.study_uid):
        this = f"this run's {'new ' if owner.study_uid is None else ''}{owner.describe()}"
        return [f"the reports {', '.join(str(p) for p in existing.values())} belong to {recorded.describe()}, not to {this}"]
    problems = []
    for key, path in existing.items():
        if key == "summary":
            continue
        listed = _recorded_digests(summary, key)
        if recorded is None or not listed:
            problems.append(f"{path} is not a report of this study (no {summary_path.name} lists it)")
        elif _file_digest(path) not in listed:
            problems.append(f"{path} was changed after paropt wrote it")
    return problems


def check_reports(paths: Mapping[str, Path], owner: ReportOwner, force: bool, *, after_run: bool = False) -> None:
    """Raise :class:`ReportConflict` unless every existing file of ``paths`` is a report of
    ``owner``'s study as paropt wrote it (or ``force``). ``after_run`` words the message for a
    run whose trials are done."""
    if force:
        return
    problems = _conflicts(paths, owner)
    if not problems:
        return
    outcome = ("the study's trials are in its storage, but its reports were not written"
               if after_run else "no trial was run")
    raise ReportConflict(
        f"{'; '.join(problems)}. Nothing was overwritten and {outcome}: use another --out or "
        "--study-name, move those files away, or pass --force to replace them"
    )


@contextlib.contextmanager
def _locked(paths: Mapping[str, Path]) -> Iterator[None]:
    """Hold the lock file of the reports while the block runs (one writer at a time)."""
    summary = paths["summary"]
    lock = summary.with_name(f".{summary.name.removesuffix(_SUFFIXES['summary'])}.lock")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock, writes are still atomic per file
        yield
        return
    with open(lock, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_reports(
    paths: Mapping[str, Path],
    owner: ReportOwner,
    render: Callable[[], tuple[Mapping[str, str], Mapping[str, Any]]],
    force: bool,
) -> dict[str, str]:
    """Write the report files that ``render()`` returns — ``(contents, summary)``: the text of
    each file by key of ``paths``, and the summary's JSON object, to which the owner and the
    files' digests are added; returns the files written by key.

    ``render`` runs under the lock, so that of several processes the last one writes the newest
    state; and the files are checked again there (:func:`check_reports`): another process may
    have written into ``--out`` while the trials ran.
    """
    summary_path = paths["summary"]
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(paths):
        check_reports(paths, owner, force, after_run=True)
        contents, summary = render()
        encoded = {key: text.encode("utf-8") for key, text in contents.items()}
        previous = _read_summary(summary_path)
        final: dict[str, dict[str, Any]] = {}
        staged: dict[str, dict[str, Any]] = {}
        for key, path in paths.items():
            if key == "summary":
                continue
            if key in encoded:
                new = _digest(encoded[key])
                old = _file_digest(path) if path.exists() else None
                final[key] = {"file": path.name, "sha256": [new]}
                staged[key] = {"file": path.name, "sha256": [new] + ([old] if old and old != new else [])}
            elif path.exists() and getattr(_recorded_owner(previous), "study_uid", None) == owner.study_uid:
                # A report this run does not rewrite stays listed (and so stays this study's).
                kept = {"file": path.name, "sha256": _recorded_digests(previous, key)}
                final[key] = staged[key] = kept

        def summary_text(files: dict[str, dict[str, Any]]) -> bytes:
            document = {"owner": owner.to_json(), **summary, "files": files}
            return (json.dumps(document, indent=1, allow_nan=False) + "\n").encode("utf-8")

        _write(summary_path, summary_text(staged))
        for key, data in encoded.items():
            _write(paths[key], data)
        _write(summary_path, summary_text(final))
    return {**{key: str(paths[key]) for key in encoded}, "summary": str(summary_path)}
