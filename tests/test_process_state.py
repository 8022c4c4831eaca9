"""Issue 48 part 3: ``import gru4rec; GRU4Rec(...).fit()`` leaves the process as it found it — torch's
thread count, the environment, glibc's allocator (no ``mallopt``, no ``madvise``) and no thread-choice
memory left behind or shared with another thread — while the package's own command lines ask for
the allocator tuning. Each check runs in a fresh interpreter: the test process itself may have
been tuned by a command line called in-process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Installed before gru4rec is imported: every libc function that a ctypes library handle hands
#: out under these names is recorded (the seam: gru4rec reaches glibc through ctypes only).
_RECORD_LIBC = """
import ctypes, json, os, sys
libc_calls = []
_Real = ctypes.CDLL
class _Recording(_Real):
    def __getattr__(self, name):
        if name in ("mallopt", "madvise"):
            libc_calls.append(name)
        return super().__getattr__(name)
ctypes.CDLL = _Recording
"""

_FIT = _RECORD_LIBC + """
import threading
import torch
state = lambda: {"threads": torch.get_num_threads(), "environ": dict(os.environ)}
before = state()
import gru4rec
from gru4rec import GRU4Rec, evaluate
from gru4rec.machine import threads
from gru4rec.datasets.synthetic import generate
from gru4rec.kernels import memory
events = generate(n_sessions=200, n_items=30, seed=1)
sessions = events["SessionId"].unique()
valid = events[events["SessionId"].isin(sessions[150:])]
events = events[events["SessionId"].isin(sessions[:150])]
during, elsewhere = [], []
def epoch(info):  # during the run: its decision is there; another thread of the program sees none
    during.append(threads.last_decision("training") is not None)
    t = threading.Thread(target=lambda: elsewhere.append(threads.last_decision("training") is None))
    t.start(); t.join()
model = GRU4Rec("layers=8,n_sample=16,n_epochs=2,batch_size=8,sample_store_size=160", device="cpu")
model.fit(events, valid=valid, progress=False, callback=epoch)
evaluate(model, events)
after = state()
print(json.dumps({"libc_calls": libc_calls, "same_threads": before["threads"] == after["threads"],
                  "environ_changed": sorted(k for k in set(before["environ"]) | set(after["environ"])
                                            if before["environ"].get(k) != after["environ"].get(k)),
                  "decision_after": threads.last_decision("training") is not None, "fixed_after": threads.threads_fixed(),
                  "tuning_asked": memory._done is not None,
                  "during": during, "elsewhere": elsewhere}))
"""


def _run(code: str, *args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GRU4REC_MALLOPT", "GRU4REC_HUGE_PAGES")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and madvise are Linux's")
def test_fit_leaves_the_process_as_it_found_it() -> None:
    seen = _run(_FIT)
    assert seen["libc_calls"] == []  # no mallopt, no madvise: the allocator is as the program left it
    assert seen["same_threads"] is True
    assert seen["environ_changed"] == []
    assert seen["tuning_asked"] is False
    # the thread choices' memory lived in the run: there during each epoch, gone after, never in another thread
    assert seen["during"] == [True, True] and seen["elsewhere"] == [True, True]
    assert seen["decision_after"] is False and seen["fixed_after"] is None


_CLI = _RECORD_LIBC + """
from gru4rec.cli import main, run_py_main
from gru4rec.kernels import memory
import contextlib, io
which = sys.argv[1]
with contextlib.redirect_stdout(io.StringIO()):
    if which == "called":  # a program calling the command line with its arguments: a library use
        main([])
    elif which == "process":  # the process's own command line (console script, python -m gru4rec)
        sys.argv = ["gru4rec"]
        main()
    elif which == "run.py":
        sys.argv = ["run.py", "--help"]
        try:
            run_py_main()
        except SystemExit:
            pass
print(json.dumps({"libc_calls": libc_calls, "tuning_asked": memory._done is not None}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
@pytest.mark.parametrize(("which", "tuned"), [("called", False), ("process", True), ("run.py", True)])
def test_only_the_packages_own_command_line_processes_tune_the_allocator(which: str, tuned: bool) -> None:
    seen = _run(_CLI, which)
    assert seen["tuning_asked"] is tuned
    assert ("mallopt" in seen["libc_calls"]) is tuned  # type: ignore[operator]
