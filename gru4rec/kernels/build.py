"""Building the fused CPU kernels: ``cpu_kernels.c`` with ``cpu_step.c`` (the one-call training
step; ``cpu_kernels.h`` between them), and ``int8_scores.c`` for serving, are compiled on
first use with the system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into a cache
(``$GRU4REC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gru4rec`` or ``~/.cache/gru4rec``), keyed by the sources,
the flags, the compiler and the CPU, so that a build is reused until one of them
changes. :mod:`gru4rec.kernels.cpu` loads the library.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from gru4rec.kernels.cpu_features import cpu_flags
from gru4rec.kernels.switches import cache_dir_override

__all__ = ["KernelBuildError", "build_library", "kernel_cache_dir"]

#: The fused CPU kernels' files: the ``.c`` ones are compiled into one library, all are hashed.
_SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_kernels.c", "cpu_step.c", "cpu_kernels.h"))
#: Compiler flag sets tried in order: the first that builds is used (a compiler without OpenMP,
#: such as Apple clang, still builds the single-threaded kernels).
_FLAG_SETS = (
    ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"],
    ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"],
    ["-O3", "-fno-math-errno", "-fno-trapping-math", "-fopenmp-simd"],
    ["-O3", "-fno-math-errno", "-fno-trapping-math"],
)


class KernelBuildError(RuntimeError):
    """The kernels could not be compiled or loaded."""


def kernel_cache_dir() -> Path:
    """Where built kernels are kept: ``$GRU4REC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gru4rec``
    or ``~/.cache/gru4rec``."""
    override = cache_dir_override()
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gru4rec"


def build_library(cache_dir: Path | None = None, compiler: str | None = None, *, sources: tuple[Path, ...] = _SOURCES,
                  flag_sets: tuple[list[str], ...] | None = None) -> Path:
    """The shared library of ``sources`` (default the fused CPU kernels; named after the first) in
    the cache, compiled unless the cache has this build. ``flag_sets`` replaces the flag sets tried (the tests build the
    kernels' other instruction-set paths this way). Raises :class:`KernelBuildError` saying why
    when it cannot."""
    flag_sets = _FLAG_SETS if flag_sets is None else flag_sets
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise KernelBuildError("no C compiler found: set CC")
    cache = Path(cache_dir) if cache_dir is not None else kernel_cache_dir()
    parts = [*(path.read_bytes() for path in sources), repr(flag_sets).encode(), cc.encode(), platform.machine().encode(),
             cpu_flags().encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = cache / f"{sources[0].stem}-{key}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KernelBuildError(f"cannot create the kernel cache {cache}: {exc.strerror}") from None
        _compile(cc, cache, [path for path in sources if path.suffix == ".c"], target, flag_sets)
    return target


def _compile(cc: str, cache: Path, sources: list[Path], target: Path, flag_sets: tuple[list[str], ...]) -> None:
    """Compile into a private file next to ``target``, then rename it into place (atomic: a
    concurrent process sees either no file or a whole one)."""
    errors = []
    for flags in flag_sets:
        try:
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=".build-", suffix=".so")
        except OSError as exc:
            raise KernelBuildError(f"cannot write to the kernel cache {cache}: {exc.strerror}") from None
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *flags, "-fPIC", "-shared", *map(str, sources), "-o", tmp, "-lm"],
                capture_output=True, text=True, timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            os.unlink(tmp)
            raise KernelBuildError(f"cannot run the C compiler {cc!r}: {exc}") from None
        if done.returncode == 0:
            os.replace(tmp, target)
            return
        os.unlink(tmp)
        errors.append(f"{cc} {' '.join(flags)}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    raise KernelBuildError("; ".join(errors))
