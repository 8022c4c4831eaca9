"""How many threads torch (and the fused CPU kernels, which share its OpenMP runtime) should use.

torch's own default is the number of CPUs in the process's affinity mask; inside a container
with a CPU quota (cgroup ``cpu.max``, or ``cpu.cfs_quota_us`` in cgroup v1) that can be many
more threads than the process may run at once, and every OpenMP barrier of a training step then
waits for threads the kernel is not scheduling: training runs many times slower. The default
here is the number of CPUs this process may actually use — the affinity mask, capped by the
cgroup quota — or ``OMP_NUM_THREADS`` when the user set it.

That default cannot know about *other* processes. What makes it collapse when something else
keeps a core busy is the OpenMP runtime's default wait policy: an idle thread spins on its core
for a while before sleeping, so on a busy machine the spinning threads take the cores the
working ones need, and an epoch runs 10-30 times slower. :func:`prefer_passive_waits` (called
when ``gru4rec`` is imported) makes idle threads sleep at once instead, which keeps the default
thread count close to ``threads=1`` under contention (benchmarks/README.md, "Threads under
contention").
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["WAIT_POLICY_ENV", "available_cpus", "cgroup_cpu_limit", "default_threads", "prefer_passive_waits",
           "set_threads", "using_threads"]

log = logging.getLogger(__name__)

#: The OpenMP runtime's wait policy, read once when the runtime loads (with torch).
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"

_MOUNTINFO = Path("/proc/self/mountinfo")
_PROC_CGROUP = Path("/proc/self/cgroup")


def prefer_passive_waits() -> None:
    """Make OpenMP threads sleep when idle (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a
    policy. It takes effect only when torch has not been loaded yet (the runtime reads the variable
    once); processes started from this one (paropt's workers) inherit it."""
    os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")


def _affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where there is no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _quota_v2(directory: Path) -> float | None:
    """CPUs allowed by ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") in one cgroup v2 folder."""
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(directory: Path) -> float | None:
    """CPUs allowed by ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none) in one v1 folder."""
    quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_mounts(mountinfo: Path) -> list[tuple[str, Path, Path]]:
    """(version, mount point, root of the mount inside the hierarchy) of every cgroup2 mount and
    every v1 mount with the ``cpu`` controller."""
    text = _read(mountinfo)
    mounts: list[tuple[str, Path, Path]] = []
    for line in (text or "").splitlines():
        # id parent major:minor root mount-point options [optional fields] - fstype source super-options
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype = Path(fields[3]), Path(fields[4]), tail[0]
        if fstype == "cgroup2":
            mounts.append(("v2", point, root))
        elif fstype == "cgroup" and "cpu" in tail[2].split(","):
            mounts.append(("v1", point, root))
    return mounts


def _own_cgroups(proc_cgroup: Path) -> dict[str, Path]:
    """This process's cgroup path in the v2 hierarchy ("v2") and in the v1 ``cpu`` one ("v1")."""
    paths: dict[str, Path] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths["v2"] = Path(path)
        elif "cpu" in controllers.split(","):
            paths["v1"] = Path(path)
    return paths


def cgroup_cpu_limit(*, mountinfo: str | os.PathLike[str] | None = None,
                     proc_cgroup: str | os.PathLike[str] | None = None) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. 2.5), or None when there is none.

    The limit of a cgroup and of every cgroup above it applies, so the smallest quota from the
    process's own cgroup up to the root of its mount counts (cgroup v2 ``cpu.max`` and v1
    ``cpu.cfs_quota_us``). ``mountinfo`` and ``proc_cgroup`` default to this process's
    ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (tests point them at fake files)."""
    own = _own_cgroups(Path(proc_cgroup) if proc_cgroup is not None else _PROC_CGROUP)
    limits: list[float] = []
    for version, point, root in _cgroup_mounts(Path(mountinfo) if mountinfo is not None else _MOUNTINFO):
        path = own.get(version)
        if path is None:
            continue
        try:
            relative = path.relative_to(root)
        except ValueError:  # the process's cgroup is outside this mount's view: the mount root is ours
            relative = Path()
        directory = point / relative
        if not directory.is_dir():
            directory = point
        read = _quota_v2 if version == "v2" else _quota_v1
        while True:
            quota = read(directory)
            if quota is not None:
                limits.append(quota)
            if directory == point or point not in directory.parents:
                break
            directory = directory.parent
    return min(limits) if limits else None


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota
    (rounded up: a quota of 1.5 CPUs keeps 2 threads busy part of the time)."""
    cpus = _affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    return max(1, cpus)


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is set to a positive integer, else :func:`available_cpus`."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return available_cpus()


def set_threads(threads: int | None = None) -> int:
    """Make torch use ``threads`` threads (None: :func:`default_threads`); returns the number."""
    import torch

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    n = default_threads() if threads is None else threads
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    log.debug("torch uses %d thread(s) (%d CPU(s) available to this process)", n, available_cpus())
    return n


@contextlib.contextmanager
def using_threads(threads: int | None = None) -> Iterator[int]:
    """:func:`set_threads` for the duration of a ``with`` block, then torch's previous setting."""
    import torch

    before = torch.get_num_threads()
    try:
        yield set_threads(threads)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
