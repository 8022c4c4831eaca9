"""Thread counts (gru4rec/machine/threads.py): the CPUs this process may use, from a patched affinity
mask and fake cgroup v1/v2 files; ``GRU4Rec(threads=)`` and ``--threads`` on the commands."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gru4rec import GRU4Rec
from gru4rec.cli import main
from gru4rec.datasets.synthetic import generate, write_synthetic
from gru4rec.errors import Gru4RecError
from gru4rec.machine import cpus, threads
from gru4rec.training.trainer import Trainer

TINY = "layers=8,n_sample=16,n_epochs=1,batch_size=8,sample_store_size=160"


def fake_cgroups(tmp_path: Path, *, mounts: list[str], own: list[str], files: dict[str, str]) -> dict[str, Path]:
    """A mountinfo and a /proc/self/cgroup file, and the cgroup files under ``tmp_path``."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("".join(f"{30 + i} 23 0:{40 + i} {m}\n" for i, m in enumerate(mounts)))
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("\n".join(own) + "\n")
    return {"mountinfo": mountinfo, "proc_cgroup": cgroup}


def test_cgroup_v2_quota_is_the_smallest_on_the_way_to_the_root(tmp_path: Path) -> None:
    mount = f"/ {tmp_path}/cg rw,nosuid - cgroup2 cgroup2 rw"
    paths = fake_cgroups(tmp_path, mounts=[mount], own=["0::/job/step"],
                         files={"cg/job/step/cpu.max": "150000 100000", "cg/job/cpu.max": "max 100000"})
    assert cpus.cgroup_cpu_limit(**paths) == 1.5
    (tmp_path / "cg/job/cpu.max").write_text("50000 100000\n")  # the parent's limit is stricter
    assert cpus.cgroup_cpu_limit(**paths) == 0.5
    (tmp_path / "cg/job/cpu.max").write_text("max 100000\n")
    (tmp_path / "cg/job/step/cpu.max").write_text("max 100000\n")
    assert cpus.cgroup_cpu_limit(**paths) is None


def test_cgroup_v2_in_a_namespace_and_outside_the_mounts_view(tmp_path: Path) -> None:
    # A container: the mount's root is the container's cgroup /kube/pod, the process is in /kube/pod/app.
    mount = f"/kube/pod {tmp_path}/cg rw - cgroup2 cgroup2 rw"
    paths = fake_cgroups(tmp_path, mounts=[mount], own=["0::/kube/pod/app"],
                         files={"cg/app/cpu.max": "max 100000", "cg/cpu.max": "200000 100000"})
    assert cpus.cgroup_cpu_limit(**paths) == 2.0
    # /proc/self/cgroup says "/" (cgroup namespace): the mount's root is the process's cgroup.
    paths["proc_cgroup"].write_text("0::/\n")
    assert cpus.cgroup_cpu_limit(**paths) == 2.0


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    mounts = [f"/ {tmp_path}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
              f"/ {tmp_path}/memory rw - cgroup cgroup rw,memory"]
    paths = fake_cgroups(tmp_path, mounts=mounts, own=["5:memory:/x", "4:cpu,cpuacct:/docker/abc"],
                         files={"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000",
                                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
                                "memory/x/cpu.cfs_quota_us": "100000"})  # another controller's folder: not read
    assert cpus.cgroup_cpu_limit(**paths) == 3.0
    (tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_cpu_limit(**paths) is None


def test_no_cgroup_or_unreadable_files(tmp_path: Path) -> None:
    assert cpus.cgroup_cpu_limit(mountinfo=tmp_path / "none", proc_cgroup=tmp_path / "none") is None
    mount = f"/ {tmp_path}/cg rw - cgroup2 cgroup2 rw"
    paths = fake_cgroups(tmp_path, mounts=[mount, "garbage line"], own=["0::/a", "nonsense"],
                         files={"cg/a/cpu.max": "lots 100000"})
    assert cpus.cgroup_cpu_limit(**paths) is None


@pytest.mark.parametrize("affinity, quota, want", [(8, None, 8), (8, 2.5, 3), (8, 16.0, 8), (8, 0.2, 1), (1, 4.0, 1), (4, 2.0, 2)])
def test_available_cpus_is_the_affinity_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch,
                                                           affinity: int, quota: float | None, want: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda **kw: quota)
    assert threads.available_cpus() == want


def test_available_cpus_reads_the_real_files_through_the_module_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount = f"/ {tmp_path}/cg rw - cgroup2 cgroup2 rw"
    paths = fake_cgroups(tmp_path, mounts=[mount], own=["0::/"], files={"cg/cpu.max": "100000 100000"})
    monkeypatch.setattr(cpus, "_MOUNTINFO", paths["mountinfo"])
    monkeypatch.setattr(cpus, "_PROC_CGROUP", paths["proc_cgroup"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert threads.available_cpus() == 1


def test_default_threads_honours_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 6)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    for value in ("", "0", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert threads.default_threads() == 6
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads.default_threads() == 6


def test_using_threads_sets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    with threads.using_threads(2) as n:
        assert n == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    monkeypatch.setattr(threads, "default_threads", lambda: 3)
    with threads.using_threads(None) as n:
        assert n == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            threads.set_threads(bad)  # type: ignore[arg-type]


def test_using_threads_is_one_run_with_its_own_memory() -> None:
    """A block of using_threads is a run: its ThreadMemory is current inside only; a nested block is
    a stage of the same run (its fixed count for the block only); ``memory=`` enters a run again."""
    assert threads.current_memory() is None
    with threads.using_threads(None):
        run = threads.current_memory()
        assert run is not None and run.fixed is None
        with threads.using_threads(1):
            assert threads.current_memory() is run and run.fixed == 1 and threads.threads_fixed() == 1
        assert run.fixed is None
    assert threads.current_memory() is None
    with threads.using_threads(None):
        assert threads.current_memory() is not run  # a new run: nothing carried over
    with threads.using_threads(None, memory=run):
        assert threads.current_memory() is run
    assert threads.current_memory() is None


def record_threads_in_training(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    original = Trainer.train_step

    def train_step(self: Trainer, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return seen


def test_fit_trains_with_the_models_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_threads_in_training(monkeypatch)
    events = generate(n_sessions=60, n_items=20, seed=1)
    before = torch.get_num_threads()
    GRU4Rec(TINY, device="cpu", threads=2).fit(events, progress=False)
    assert seen and set(seen) == {2} and torch.get_num_threads() == before
    seen.clear()
    monkeypatch.setattr(threads, "default_threads", lambda: 3)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    GRU4Rec(TINY, device="cpu").fit(events, progress=False)
    assert seen[0] == 1 and set(seen) <= {1, 3}  # chosen online between 1 and 3 (tests/test_thread_choice.py)
    with pytest.raises(Gru4RecError, match="threads must be a positive integer"):
        GRU4Rec(TINY, threads=0)


def test_threads_flag_on_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gru4rec.evaluation as evaluation
    from gru4rec.cli import run_py_main

    data = write_synthetic(tmp_path / "d", n_sessions=80, n_items=20, seed=2, test_days=6)
    seen = record_threads_in_training(monkeypatch)
    model = tmp_path / "m.safetensors"
    before = torch.get_num_threads()
    assert main(["train", str(data["train_full"]), "-ps", TINY, "--threads", "2", "--save", str(model), "-q"]) == 0
    assert set(seen) == {2} and torch.get_num_threads() == before
    seen.clear()
    assert run_py_main([str(data["train_full"]), "-ps", TINY, "--threads", "3"]) == 0
    assert set(seen) == {3}
    seen.clear()
    monkeypatch.setattr(threads, "default_threads", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["demo", "--n-sessions", "60", "-ps", TINY, "-q"]) == 0  # no flag: the default, chosen online
    assert seen[0] == 1 and set(seen) <= {1, 4}

    evaluated: list[int] = []
    real = evaluation.evaluate

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        evaluated.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    assert main(["evaluate", str(model), "-t", str(data["test"]), "--threads", "2", "-q"]) == 0
    assert main(["baseline", "pop", str(data["train_full"]), "-t", str(data["test"]), "--threads", "3", "-q"]) == 0
    assert evaluated == [2, 3] and torch.get_num_threads() == before
    capsys.readouterr()
    assert main(["evaluate", str(model), "-t", str(data["test"]), "--threads", "0"]) == 2
    assert "expected a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_importing_gru4rec_leaves_the_openmp_wait_policy_alone(given: str | None) -> None:
    # The runtime's own policy (spin, then sleep) is the fastest on a quiet machine; a busy one is
    # handled by choosing the thread count online (ThreadChoice), not by making every wait sleep.
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = "import os, sys, gru4rec; print('torch' in sys.modules, os.environ.get('OMP_WAIT_POLICY', '-'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", given or "-"]


def test_one_and_two_threads_train_the_same_model(tmp_path: Path) -> None:
    # What docs/install.md says: the thread count does not change the arithmetic (same losses,
    # same weights to float32 precision), measured here on 1 and 2 threads at a size where the
    # kernels' and BLAS's loops are split between the threads.
    data = write_synthetic(tmp_path / "d", n_sessions=1500, seed=3)
    params = "loss=cross-entropy,layers=48,n_sample=128,n_epochs=2,batch_size=32,logq=1.0"
    losses: dict[int, list[float]] = {}
    weights: dict[int, dict[str, torch.Tensor]] = {}
    for n in (1, 2):
        seen: list[float] = []
        model = GRU4Rec(params, device="cpu", threads=n).fit(data["train_full"], callback=lambda info, seen=seen: seen.append(info.loss),
                                                            progress=False)
        losses[n] = seen
        weights[n] = {k: v.detach().clone() for k, v in model.net.state_dict().items()}
    assert losses[1] == pytest.approx(losses[2], rel=1e-6, abs=0)
    for name, tensor in weights[1].items():
        torch.testing.assert_close(tensor, weights[2][name], msg=name)
