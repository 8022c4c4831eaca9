"""The CPUs this process may use, and how busy other processes keep them.

:func:`available_cpus` is the number of CPUs a process here can run on at once: its affinity mask,
capped by a container's CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``;
:func:`cgroup_cpu_limit`). :class:`LoadMeter` tells how many of those CPUs other processes kept busy
since its last look, from ``/proc/stat`` less this process's own CPU time. Both are Linux
readings; elsewhere the first falls back to ``os.cpu_count()`` and the second says None. The
thread count that torch uses is decided from them in :mod:`gru4rec.machine.threads`.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

__all__ = ["LoadMeter", "available_cpus", "cgroup_cpu_limit"]

_MOUNTINFO = Path("/proc/self/mountinfo")
_PROC_CGROUP = Path("/proc/self/cgroup")


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


def _cpus(quota_text: str | None, period_text: str | None) -> float | None:
    """quota / period in CPUs, or None where either is missing, not an integer, or not positive
    (v2's "max", v1's -1: no quota)."""
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v2(directory: Path) -> float | None:
    """CPUs allowed by ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") in one cgroup v2 folder."""
    parts = (_read(directory / "cpu.max") or "").split()
    return _cpus(*parts) if len(parts) == 2 else None


def _quota_v1(directory: Path) -> float | None:
    """CPUs allowed by ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none) in one v1 folder."""
    return _cpus(_read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us"))


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


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(``time.monotonic``, CPU-seconds the CPUs of this process's affinity mask have been busy,
    CPU-seconds this process has used), or None where ``/proc/stat`` cannot be read."""
    try:
        lines = _PROC_STAT.read_text(encoding="ascii").splitlines()
        mask = os.sched_getaffinity(0)
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, UnicodeDecodeError):
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in mask:
            continue
        ticks = rest.split()
        if len(ticks) < 8:
            continue
        # user nice system idle iowait irq softirq steal: all but idle and iowait are work
        busy += sum(int(ticks[i]) for i in (0, 1, 2, 5, 6, 7))
    own = os.times()
    return time.monotonic(), busy / tick, own.user + own.system


_PROC_STAT = Path("/proc/stat")


class LoadMeter:
    """How busy other processes keep this process's CPUs, measured from one look to the next.

    Each meter keeps its own last look (taken when it is made), so that two workloads of one
    process that each ask — a training run's validations, a server worker — measure their own
    windows and share nothing: gru4rec keeps no such reading process-wide. A run's
    :class:`gru4rec.machine.threads.ThreadMemory` holds one.
    """

    def __init__(self) -> None:
        self._mark = _cpu_seconds()
        self._last: float | None = None

    def others_load(self, min_window_s: float = 0.2, *, wait: bool = True) -> float | None:
        """How many CPUs of this process's affinity mask other processes kept busy, on average,
        since the last call (or since the meter was made): the CPUs' busy time from
        ``/proc/stat`` less this process's own CPU time, per second. A window shorter than
        ``min_window_s`` (the counters tick every 10 ms) says nothing: the previous window's
        figure is returned instead, and this window grows on until the next call. Only when there
        is none yet does it wait for the rest (``wait``; else it returns None and the window
        grows on): an evaluation right after the meter was made would else go by no measurement
        (measured: spinning threads beside 2 busy processes, 8x slower); waiting at every call
        cost evaluations of 0.15 s each, run back to back, a quarter of their time. None where
        the counters cannot be read (not Linux)."""
        now = _cpu_seconds()
        if now is None or self._mark is None:
            return None
        short = min_window_s - (now[0] - self._mark[0])
        if short > 0:
            if self._last is not None:
                return self._last
            if not wait:
                return None
            time.sleep(short)
            now = _cpu_seconds()
            if now is None:
                return None
        then, self._mark = self._mark, now
        self._last = max(0.0, ((now[1] - then[1]) - (now[2] - then[2])) / (now[0] - then[0]))
        return self._last
