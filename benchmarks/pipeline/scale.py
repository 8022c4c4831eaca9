"""Issue 28's scale measurement: every user-facing command on a large synthetic catalogue.

Runs the commands users run — ``gru4rec synth``, ``train``, ``evaluate``, ``recommend`` (on two
session counts), ``export`` and ``serve`` with live sessions — each in its own child process, and
prints one Markdown table (stage | sessions | wall s | s per 1k sessions | peak RSS MB | RSS above
model MB), a few checks, and writes every figure to ``--json``. The full size of the issue
(1M-item catalogue, ≥ 120k training sessions, recommend on 10k and 100k sessions, serve 1,000
live sessions):

    OMP_NUM_THREADS=1 python -m benchmarks.pipeline.scale --json results/scale.json

and a quick look at small sizes (seconds):

    python -m benchmarks.pipeline.scale --n-items 2000 --sessions 300 --eval-sessions 50 \\
        --recommend-sessions 100,200 --serve-sessions 20 --work /tmp/scale-small --force

**Peak RSS, per stage.** Every command is its own process, reaped with ``os.wait4``: the
``ru_maxrss`` that wait4 returns is the high-water mark of the resident set of that one process
(Linux: the maximum over it and any children it reaped itself — e.g. the C compiler that builds
the CPU kernels on first use, far smaller than a torch process), never of another stage.
(``getrusage(RUSAGE_CHILDREN)`` deltas do not work: its ru_maxrss is the maximum over all
children reaped so far, so a smaller later stage would not show.) One trap: Linux starts the
ru_maxrss of a process that execs at the resident set of the process it was forked (or
vforked) from, so a command started directly by this script would report at least this
script's own peak (pandas and the data frames included). Each command is therefore forked by
a small launcher (``LAUNCHER``: ``python -I -S``, ≈10 MB), which reaps it and reports its
ru_maxrss, exit code and wall time. For ``serve``, the figure is the server's ``VmHWM`` from
``/proc/PID/status``, read after the last answer and before it is stopped (its ru_maxrss at
exit is kept in the JSON as a cross-check).

**The model's footprint** is the peak RSS of ``gru4rec recommend`` on a file with one session:
a process that imports torch and the package, loads the model and scores one session against
the whole catalogue. "RSS above model" is a stage's peak RSS minus that figure: what the stage
needs for its input, its output and its working memory (filled for the stages that run after
the model-only run: evaluate, recommend, export, serve; it can be slightly negative for a stage
that never scores the catalogue, e.g. the item-embedding export). The issue's target: ``recommend`` on
100k sessions within 2 GB (2,048 MB) above the model, and recommend's memory not growing with
the number of sessions (the 10k and 100k rows side by side).

**Wall time** is from the start of the process to its exit (Python and torch start-up, reading
the model and the input included: what a user waits for), except for ``serve``: from the first
click sent to the last answer (start-up to ``/healthz`` is in the JSON as ``startup_s``).
"s per 1k sessions" is the wall time divided by the stage's sessions, times 1,000.

**The data.** ``gru4rec synth`` writes the synthetic data set (30 days of sessions; test = the
sessions that start in the last ``--test-days`` days). The script sizes ``--n-sessions`` and
``--test-days`` so that train_full holds at least ``--sessions`` sessions and test at least
``--eval-sessions`` and ``--serve-sessions`` (test events of items unseen in training are
dropped by the generator, so the test share is planned with a margin), and checks the counts.
Then, with pandas: the evaluation file is the first ``--eval-sessions`` sessions of test.tsv,
the recommend inputs are the first N sessions of train_full.tsv (N from
``--recommend-sessions``), the serving sessions are the first ``--serve-sessions`` of test.tsv.
The model holds the items seen in train_full, which for a Zipf-shaped catalogue is fewer than
``--n-items``: both counts are reported.

**Stages** (``--stages``, default all, in this order): synth, train (``--train-params``,
default one epoch of 100 units, 2,048 samples, batch 64; the model file's size is reported),
evaluate (``-m 20``), recommend (the model-only run first, then each N), export (each format
of ``--export-formats`` in its own process; ONNX is skipped with a reason when onnx or
onnxscript is not installed), serve (``gru4rec serve`` on 127.0.0.1, a port the server picks;
every session's clicks sent one after the other to ``/v1/sessions/ID/events``, sessions in
parallel on ``--serve-concurrency`` threads with keep-alive connections; latency per request
median and p99; the sessions the server holds are read from ``/metrics``; the server is
always stopped with SIGTERM, also on error).

**Safety on a shared machine.** Every child runs with ``OMP_NUM_THREADS=--threads`` and, where
the command has the option, ``--threads``; a child whose resident set passes ``--rss-limit-mb``
(default: 80 % of the memory available at the start) is killed and its row says so, instead
of the kernel's OOM killer picking a process. The work folder (default ``.bench/scale``,
ignored by git) must be empty, or be an earlier work folder of this script with ``--force``
(its files are replaced) or ``--reuse`` (its synthetic data — when made with the same sizes —
and, without the train stage, its model are kept).
"""
from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORK = ROOT / ".bench" / "scale"
STAGES = ("synth", "train", "evaluate", "recommend", "export", "serve")
EXPORT_FORMATS = ("onnx", "item-embeddings", "session-embeddings")
DEFAULT_TRAIN_PARAMS = "layers=100,n_sample=2048,batch_size=64,n_epochs=1"
SYNTH_DAYS = 30  # the generator's span (gru4rec.datasets.synthetic.generate's n_days)
PLAN_FILE = "scale-plan.json"
#: What this script writes into its work folder (nothing else is removed with --force).
OWNED = (PLAN_FILE, "data", "model.safetensors", "inputs", "outputs", "exports", "logs")
TARGET_ABOVE_MODEL_MB = 2048.0


# ------------------------------------------------------------------------------ child processes


def gru4rec_command() -> list[str]:
    """The ``gru4rec`` console script of this interpreter's environment (or ``python -m gru4rec``)."""
    script = Path(sys.executable).with_name("gru4rec")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gru4rec"]


def proc_status_kb(pid: int, key: str) -> int | None:
    """A ``kB`` field (VmRSS, VmHWM) of /proc/PID/status; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


#: The launcher between this script and a command (run as ``python -I -S -c LAUNCHER REPORT CMD...``,
#: ≈10 MB resident): it forks and execs CMD, forwards SIGTERM/SIGINT/SIGHUP to it, reaps it with
#: os.wait4 and writes to REPORT one line per fact: CMD's pid (at once), then its ru_maxrss (kB),
#: its exit code (negative: killed by that signal) and its wall time from fork to exit (s).
LAUNCHER = r"""
import os, signal, sys, time
report, argv, pid = sys.argv[1], sys.argv[2:], None
def forward(signum, frame):
    if pid:
        os.kill(pid, signum)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, forward)
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"scale.py: cannot run {argv[0]}: {exc}\n".encode())
    os._exit(127)
with open(report, "w") as fh:
    fh.write(f"{pid}\n")
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
code = os.waitstatus_to_exitcode(status)
with open(report, "a") as fh:
    fh.write(f"{usage.ru_maxrss}\n{code}\n{wall!r}\n")
sys.exit(code if code >= 0 else 128 - code)
"""


class Child:
    """One command in a grandchild process: this script starts the small LAUNCHER, which forks
    and execs the command, reaps it with ``os.wait4`` and reports its exit code, wall time and
    ru_maxrss. (Linux seeds the ru_maxrss of a process that execs with the resident set of the
    process it was forked from — for a direct child of this script, this script's own, pandas
    and all — so the command is forked from the small launcher instead.) A watchdog kills the
    command when its VmRSS passes the limit or its time runs out. Signals go through a pidfd
    where the platform has one, so a reaped pid is never signalled."""

    def __init__(self, name: str, cmd: list[str], *, env: dict[str, str], logs: Path,
                 rss_limit_kb: int | None, timeout_s: float | None) -> None:
        self.name, self.cmd = name, cmd
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = logs / f"{name}.out", logs / f"{name}.err"
        self.report = logs / f"{name}.rusage"
        self.report.unlink(missing_ok=True)
        self.rss_limit_kb, self.timeout_s = rss_limit_kb, timeout_s
        self.killed: str | None = None
        self.rc: int | None = None
        self.maxrss_kb = 0
        self.wall_s = 0.0
        self.done = threading.Event()
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.lock = threading.Lock()
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.start = time.perf_counter()
            self.launcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, str(self.report), *cmd],
                                             stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        threading.Thread(target=self._reap, daemon=True).start()
        self._pid_of_command()
        threading.Thread(target=self._watch, daemon=True).start()

    def _lines(self) -> list[str]:
        try:
            return self.report.read_text().split()
        except FileNotFoundError:
            return []

    def _pid_of_command(self) -> None:
        """The command's pid from the report's first line (and a pidfd on it)."""
        while not self.done.is_set():
            lines = self._lines()
            if lines:
                with self.lock:
                    self.pid = int(lines[0])
                    if hasattr(os, "pidfd_open"):
                        try:
                            self.pidfd = os.pidfd_open(self.pid)
                        except ProcessLookupError:  # already gone (and reaped by the launcher)
                            self.pidfd = None
                return
            time.sleep(0.005)

    def _reap(self) -> None:
        launcher_rc = self.launcher.wait()
        lines = self._lines()
        if len(lines) == 4:
            self.maxrss_kb, self.rc, self.wall_s = int(lines[1]), int(lines[2]), float(lines[3])
        else:  # the launcher itself failed
            self.rc, self.wall_s = launcher_rc if launcher_rc else 1, time.perf_counter() - self.start
        with self.lock:
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
            self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(0.05):
            rss = proc_status_kb(self.pid, "VmRSS") if self.pid else None
            if self.rss_limit_kb and rss and rss > self.rss_limit_kb:
                self.killed = f"killed by scale.py: RSS {rss / 1024:.0f} MB passed --rss-limit-mb {self.rss_limit_kb / 1024:.0f}"
            elif self.timeout_s and time.perf_counter() - self.start > self.timeout_s:
                self.killed = f"killed by scale.py: running longer than --timeout {self.timeout_s:.0f} s"
            if self.killed:
                self.signal(signal.SIGKILL)
                return

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the command (not to the launcher), unless it is gone."""
        with self.lock:
            if self.done.is_set() or self.pid is None:
                return
            try:
                if self.pidfd is not None:
                    signal.pidfd_send_signal(self.pidfd, sig)
                elif not hasattr(os, "pidfd_open"):
                    os.kill(self.pid, sig)
            except (ProcessLookupError, OSError):
                pass

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; returns once the command has exited."""
        if self.done.is_set():
            return
        self.signal(signal.SIGTERM)
        if not self.wait(grace_s):
            self.signal(signal.SIGKILL)
            self.wait()

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr_tail(self, lines: int = 5) -> str:
        return "\n".join(self.err_path.read_text(errors="replace").strip().splitlines()[-lines:])


@dataclass
class Row:
    """One line of the table (and of the JSON's ``stages``)."""

    stage: str
    sessions: int | None
    wall_s: float | None = None
    peak_rss_mb: float | None = None
    above_model_mb: float | None = None
    ok: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def s_per_1k(self) -> float | None:
        if self.wall_s is None or not self.sessions:
            return None
        return self.wall_s / self.sessions * 1000.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["s_per_1k_sessions"] = self.s_per_1k
        return out


class Bench:
    """The run: arguments, the work folder's paths, the rows so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work: Path = args.work
        self.data = self.work / "data"
        self.model = self.work / "model.safetensors"
        self.inputs, self.outputs = self.work / "inputs", self.work / "outputs"
        self.exports, self.logs = self.work / "exports", self.work / "logs"
        self.rows: list[Row] = []
        self.facts: dict[str, Any] = {}
        self.model_mb: float | None = None
        self.env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        self.base = gru4rec_command()

    def log(self, text: str) -> None:
        print(f"[scale] {text}", file=sys.stderr, flush=True)

    def child(self, name: str, args: list[str]) -> Child:
        self.log(f"{name}: gru4rec {' '.join(args)}")
        return Child(name, self.base + args, env=self.env, logs=self.logs,
                     rss_limit_kb=int(self.args.rss_limit_mb * 1024) if self.args.rss_limit_mb else None,
                     timeout_s=self.args.timeout)

    def run(self, name: str, args: list[str], sessions: int | None, *, above_model: bool = True) -> tuple[Row, Child]:
        """Run one command to its end; its row is appended to the table."""
        proc = self.child(name, args)
        proc.wait()
        row = Row(name, sessions, wall_s=proc.wall_s, peak_rss_mb=proc.maxrss_kb / 1024)
        if proc.rc != 0:
            row.ok = False
            row.note = proc.killed or f"exit code {proc.rc}: {proc.stderr_tail(2)}"
        if above_model and self.model_mb is not None and row.peak_rss_mb is not None:
            row.above_model_mb = row.peak_rss_mb - self.model_mb
        self.rows.append(row)
        self.log(f"{name}: {row.wall_s:.2f} s, peak RSS {row.peak_rss_mb:.0f} MB{'' if row.ok else ' — ' + row.note}")
        return row, proc

    def device_args(self) -> list[str]:
        return ["-d", self.args.device]

    def thread_args(self) -> list[str]:
        return ["--threads", str(self.args.threads)]


# ----------------------------------------------------------------------------------- the data


def synth_plan(train_sessions: int, test_sessions: int) -> tuple[int, float]:
    """``(n_sessions, test_days)`` for ``gru4rec synth``: sessions start uniformly over 30 days
    and test takes those of the last ``test_days``; test sessions lose the events of items unseen
    in training (at 1M items about a quarter of the sessions drop out), hence the margin."""
    share = min(0.5, 1.5 * test_sessions / (train_sessions + test_sessions))
    test_days = round(SYNTH_DAYS * share, 3)
    n_sessions = math.ceil(train_sessions / (1.0 - share) * 1.05) + 20
    return n_sessions, test_days


def read_events(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t")


def first_sessions(events: pd.DataFrame, n: int) -> pd.DataFrame:
    """The events of the first ``n`` sessions in file order (session ids grow with start time)."""
    ids = events["SessionId"].unique()[:n]
    return events[events["SessionId"].isin(ids)]


def write_tsv(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, sep="\t", index=False)
    return path


# ------------------------------------------------------------------------------------ stages


def stage_synth(b: Bench) -> None:
    a = b.args
    need_test = max(a.eval_sessions, a.serve_sessions if "serve" in a.stages else 0)
    n_sessions, test_days = synth_plan(a.sessions, need_test)
    if a.synth_sessions:
        n_sessions = a.synth_sessions
    if a.test_days:
        test_days = a.test_days
    plan = {"n_items": a.n_items, "n_sessions": n_sessions, "test_days": test_days, "seed": a.seed}
    plan_path = b.work / PLAN_FILE
    if a.reuse and plan_path.exists() and (b.data / "train_full.tsv").exists():
        old = json.loads(plan_path.read_text()).get("synth")
        if old != plan:
            raise SystemExit(f"--reuse: {b.work} holds synthetic data made with {old}, not {plan}; use --force")
        b.log(f"synth: reusing {b.data} ({plan})")
        b.rows.append(Row("synth", n_sessions, note="reused (--reuse)"))
    else:
        b.run("synth", ["synth", str(b.data), "--n-items", str(a.n_items), "--n-sessions", str(n_sessions),
                        "--test-days", str(test_days), "--seed", str(a.seed), "-f"], n_sessions, above_model=False)
        plan_path.write_text(json.dumps({"synth": plan}, indent=1))
    b.facts["synth"] = plan


def load_data(b: Bench) -> None:
    """Counts of the synthetic files and the derived input files (evaluate, recommend, serve)."""
    a = b.args
    train_path, test_path = b.data / "train_full.tsv", b.data / "test.tsv"
    if not train_path.exists():
        raise SystemExit(f"{train_path} is missing: run the synth stage (--stages synth,...)")
    train, test = read_events(train_path), read_events(test_path)
    n_train, n_test = train["SessionId"].nunique(), test["SessionId"].nunique()
    b.facts["data"] = {"catalogue_items": a.n_items, "train_sessions": int(n_train), "train_events": len(train),
                       "train_items": int(train["ItemId"].nunique()), "test_sessions": int(n_test), "test_events": len(test)}
    short = []
    if n_train < max(a.recommend_sessions):
        short.append(f"train_full has {n_train} sessions, recommend needs {max(a.recommend_sessions)}")
    if n_train < a.sessions:
        short.append(f"train_full has {n_train} sessions, --sessions asks for {a.sessions}")
    if n_test < a.eval_sessions or ("serve" in a.stages and n_test < a.serve_sessions):
        short.append(f"test has {n_test} sessions, evaluate needs {a.eval_sessions}, serve {a.serve_sessions}")
    if short:
        raise SystemExit("not enough synthetic sessions: " + "; ".join(short) + " (raise --synth-sessions or --test-days)")
    b.eval_file = write_tsv(first_sessions(test, a.eval_sessions), b.inputs / f"eval_{a.eval_sessions}.tsv")
    b.rec_files = {n: write_tsv(first_sessions(train, n), b.inputs / f"recommend_{n}.tsv") for n in a.recommend_sessions}
    b.one_file = write_tsv(first_sessions(train, 1), b.inputs / "recommend_1.tsv")
    serve = first_sessions(test, a.serve_sessions)
    b.outputs.mkdir(parents=True, exist_ok=True)
    b.serve_sessions = [(int(sid), [int(i) for i in group["ItemId"]]) for sid, group in serve.groupby("SessionId", sort=False)]


def stage_train(b: Bench) -> None:
    a = b.args
    n = b.facts["data"]["train_sessions"]
    row, _ = b.run("train", ["train", str(b.data / "train_full.tsv"), "-ps", a.train_params, "--save", str(b.model),
                             "-f", *b.thread_args(), *b.device_args()], n, above_model=False)
    if row.ok:
        row.extra["model_bytes"] = b.model.stat().st_size


def model_info(b: Bench) -> None:
    """The model's item count and layers (``gru4rec info --json``) and file size."""
    out = subprocess.run(b.base + ["info", "--json", str(b.model)], capture_output=True, text=True, env=b.env, check=True)
    info = json.loads(out.stdout)
    b.facts["model"] = {"path": str(b.model), "bytes": b.model.stat().st_size, "n_items": info["n_items"],
                        "layers": info["config"]["layers"],
                        "parameters": sum(math.prod(t["shape"]) for name, t in info["tensors"].items()
                                          if t["dtype"] == "float32")}


def stage_model_footprint(b: Bench) -> None:
    a = b.args
    row, _ = b.run("model only (1 session)", ["recommend", str(b.model), "-i", str(b.one_file),
                                              "-o", str(b.outputs / "recs_1.tsv"), "-k", str(a.k), "-f",
                                              *b.thread_args(), *b.device_args()], 1, above_model=False)
    if row.ok:
        b.model_mb = row.peak_rss_mb
        row.above_model_mb = 0.0


def stage_evaluate(b: Bench) -> None:
    row, proc = b.run("evaluate", ["evaluate", str(b.model), "-t", str(b.eval_file), "-m", "20",
                                   *b.thread_args(), *b.device_args()], b.args.eval_sessions)
    found = re.search(r"Recall@20:\s*([0-9.]+)\s+MRR@20:\s*([0-9.]+)", proc.stdout())
    if found:
        row.extra.update(recall_20=float(found.group(1)), mrr_20=float(found.group(2)))


def stage_recommend(b: Bench) -> None:
    a = b.args
    for n, path in b.rec_files.items():
        out = b.outputs / f"recs_{n}.tsv"
        row, _ = b.run(f"recommend {n:,}", ["recommend", str(b.model), "-i", str(path), "-o", str(out), "-k", str(a.k),
                                            "-f", *b.thread_args(), *b.device_args()], n)
        row.extra["input"] = str(path)
        if row.ok:
            row.extra.update(output=str(out), output_bytes=out.stat().st_size)


def stage_export(b: Bench) -> None:
    for fmt in b.args.export_formats:
        if fmt == "onnx":
            missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
            if missing:
                note = f"skipped: {', '.join(missing)} not installed (pip install 'gru4rec[export]')"
                b.log(f"export onnx: {note}")
                b.rows.append(Row("export onnx", None, ok=True, note=note))
                continue
            target, args, sessions = b.exports / "step.onnx", ["--onnx", str(b.exports / "step.onnx")], None
        elif fmt == "item-embeddings":
            target, sessions = b.exports / "items.npy", None
            args = ["--item-embeddings", str(target)]
        else:
            target, sessions = b.exports / "sessions.npy", b.args.eval_sessions
            args = ["--session-embeddings", str(b.eval_file), str(target)]
        b.exports.mkdir(parents=True, exist_ok=True)
        # gru4rec export has no --threads: OMP_NUM_THREADS in its environment holds it to --threads
        row, _ = b.run(f"export {fmt}", ["export", str(b.model), *args, "-f", *b.device_args()], sessions)
        if row.ok:
            row.extra["bytes"] = target.stat().st_size + (Path(str(target) + ".json").stat().st_size if fmt == "onnx" else 0)


class Client:
    """Keep-alive HTTP/1.1 connections to the server, one per thread; per-request latencies."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.local = threading.local()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        start = time.perf_counter()
        try:
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.HTTPException):
            conn.close()
            self.local.conn = None
            raise
        elapsed = time.perf_counter() - start
        return resp.status, (data, elapsed)

    def session(self, sid: int, items: list[int], k: int) -> int:
        """Every click of one session, one after the other; the number of good answers."""
        good = 0
        for item in items:
            try:
                status, (data, elapsed) = self.request("POST", f"/v1/sessions/bench-{sid}/events", {"item": item, "k": k})
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                with self.lock:
                    self.errors.append(f"session {sid}: {exc!r}")
                continue
            with self.lock:
                self.latencies.append(elapsed)
            answer = json.loads(data) if status == 200 else None
            if answer is not None and len(answer.get("items", ())) == k:
                good += 1
            else:
                with self.lock:
                    self.errors.append(f"session {sid}: HTTP {status} {data[:200]!r}")
        return good


def serve_url(proc: Child, deadline: float) -> tuple[str, int]:
    """The address from the server's ``Serving MODEL at http://HOST:PORT`` line."""
    while time.perf_counter() < deadline:
        found = re.search(r"at http://\[?([^\]/\s]+?)\]?:(\d+)", proc.stdout())
        if found:
            return found.group(1), int(found.group(2))
        if proc.done.is_set():
            raise RuntimeError(f"gru4rec serve exited with code {proc.rc}: {proc.stderr_tail(3)}")
        time.sleep(0.05)
    raise RuntimeError("gru4rec serve printed no URL in time")


def stage_serve(b: Bench) -> None:
    a = b.args
    sessions = b.serve_sessions
    row = Row("serve", len(sessions))
    proc = b.child("serve", ["serve", str(b.model), "--host", "127.0.0.1", "--port", "0", "--log-interval", "3600",
                             *b.thread_args(), *b.device_args()])
    try:
        host, port = serve_url(proc, time.perf_counter() + a.serve_startup_timeout)
        client = Client(host, port)
        deadline = time.perf_counter() + a.serve_startup_timeout
        while True:
            try:
                if client.request("GET", "/healthz")[0] == 200:
                    break
            except (ConnectionError, http.client.HTTPException, OSError):
                pass
            if proc.done.is_set() or time.perf_counter() > deadline:
                raise RuntimeError(f"gru4rec serve did not answer /healthz: {proc.stderr_tail(3)}")
            time.sleep(0.1)
        startup = time.perf_counter() - proc.start
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=a.serve_concurrency) as pool:
            good = sum(pool.map(lambda s: client.session(s[0], s[1], a.k), sessions))
        row.wall_s = time.perf_counter() - start
        status, (metrics, _) = client.request("GET", "/metrics")
        held = re.search(rb"^gru4rec_serve_sessions\s+([0-9.e+]+)", metrics, re.M) if status == 200 else None
        hwm = proc_status_kb(proc.pid, "VmHWM") if proc.pid else None
        lat = np.asarray(client.latencies) * 1000.0
        clicks = sum(len(items) for _, items in sessions)
        row.extra.update(startup_s=startup, requests=clicks, good_answers=good, errors=len(client.errors),
                         first_errors=client.errors[:3], concurrency=a.serve_concurrency,
                         sessions_held=int(float(held.group(1))) if held else None,
                         latency_ms_p50=float(np.percentile(lat, 50)) if len(lat) else None,
                         latency_ms_p99=float(np.percentile(lat, 99)) if len(lat) else None,
                         requests_per_s=clicks / row.wall_s if row.wall_s else None)
        if hwm is not None:
            row.peak_rss_mb = hwm / 1024
        if client.errors:
            row.ok, row.note = False, f"{len(client.errors)} failed request(s): {client.errors[0]}"
    except Exception as exc:  # the row says what went wrong; the server is stopped below
        row.ok, row.note = False, f"{type(exc).__name__}: {exc}"
    finally:
        proc.stop()
        row.extra["exit_code"] = proc.rc
        row.extra["maxrss_at_exit_mb"] = proc.maxrss_kb / 1024
        if proc.killed:
            row.ok, row.note = False, proc.killed
    if row.peak_rss_mb is not None and b.model_mb is not None:
        row.above_model_mb = row.peak_rss_mb - b.model_mb
    b.rows.append(row)
    b.log(f"serve: {row.wall_s or 0:.2f} s for {len(sessions)} sessions, VmHWM {row.peak_rss_mb or 0:.0f} MB"
          f"{'' if row.ok else ' — ' + row.note}")


# ------------------------------------------------------------------------------------- output


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(rows: list[Row]) -> str:
    lines = ["| stage | sessions | wall s | s per 1k sessions | peak RSS MB | RSS above model MB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        stage = r.stage if r.ok else f"{r.stage} **failed**"
        if r.note:
            note = r.note.splitlines()[0]
            stage += f" ({note[:117] + '...' if len(note) > 120 else note})"
        lines.append(f"| {stage} | {'—' if r.sessions is None else f'{r.sessions:,}'} | {fmt(r.wall_s, 2)} | "
                     f"{fmt(r.s_per_1k, 2)} | {fmt(r.peak_rss_mb, 0)} | {fmt(r.above_model_mb, 0)} |")
    return "\n".join(lines)


def checks(b: Bench) -> list[str]:
    """The issue's two memory statements, as measured."""
    out = []
    recs = [r for r in b.rows if r.stage.startswith("recommend ") and r.ok and r.peak_rss_mb is not None]
    if len(recs) >= 2:
        lo, hi = min(recs, key=lambda r: r.sessions or 0), max(recs, key=lambda r: r.sessions or 0)
        out.append(f"recommend memory, {hi.sessions:,} against {lo.sessions:,} sessions: {hi.peak_rss_mb - lo.peak_rss_mb:+,.0f} MB "
                   f"({hi.peak_rss_mb / lo.peak_rss_mb:.2f}× the peak for {hi.sessions / lo.sessions:.0f}× the sessions)")
    for r in recs:
        if r.above_model_mb is not None:
            verdict = "within" if r.above_model_mb <= TARGET_ABOVE_MODEL_MB else "NOT within"
            out.append(f"recommend {r.sessions:,} sessions: {r.above_model_mb:,.0f} MB above the model, {verdict} "
                       f"the issue's {TARGET_ABOVE_MODEL_MB:,.0f} MB")
    failed = [r for r in b.rows if r.stage.startswith("recommend ") and not r.ok]
    for r in failed:
        out.append(f"{r.stage}: failed ({r.note})")
    return out


def host_facts() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# -------------------------------------------------------------------------------- the work folder


def prepare_work(args: argparse.Namespace) -> None:
    work: Path = args.work
    if work.resolve().is_relative_to(ROOT.resolve()):
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", str(work)], capture_output=True)
        if ignored.returncode != 0:
            raise SystemExit(f"--work {work} is inside the repository and not ignored by git: choose another folder")
    if work.exists() and not work.is_dir():
        raise SystemExit(f"--work {work} is a file")
    content = sorted(p.name for p in work.iterdir()) if work.exists() else []
    if content:
        if not (args.force or args.reuse):
            raise SystemExit(f"--work {work} is not empty: pass --force to replace its files or --reuse to keep its data")
        strangers = [name for name in content if name not in OWNED]
        if strangers or PLAN_FILE not in content:
            raise SystemExit(f"--work {work} is not a work folder of scale.py (it holds {', '.join(strangers[:5]) or 'no ' + PLAN_FILE}): "
                             "refusing to replace its files")
        if args.force:
            for name in content:
                path = work / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / PLAN_FILE).exists():
        (work / PLAN_FILE).write_text("{}")


def default_rss_limit_mb() -> float | None:
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) / 1024
    except OSError:
        return None
    return None if available is None else round(0.8 * available)


def int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v.replace("_", "")) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def name_list(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(choices)}")
        return [c for c in choices if c in names]  # always in pipeline order
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (benchmarks/pipeline/scale.py) for what is measured and how.")
    p.add_argument("--stages", type=name_list(STAGES), default=list(STAGES), help=f"comma-separated, of {','.join(STAGES)} (default: all)")
    p.add_argument("--n-items", type=int, default=1_000_000, help="synthetic catalogue size (default 1,000,000)")
    p.add_argument("--sessions", type=int, default=120_000, help="training sessions at least (default 120,000)")
    p.add_argument("--eval-sessions", type=int, default=10_000, help="sessions of the evaluation file (default 10,000)")
    p.add_argument("--recommend-sessions", type=int_list, default=[10_000, 100_000], help="recommend input sizes (default 10000,100000)")
    p.add_argument("--serve-sessions", type=int, default=1_000, help="live sessions sent to gru4rec serve (default 1,000)")
    p.add_argument("--serve-concurrency", type=int, default=8, help="sessions sent in parallel (default 8)")
    p.add_argument("--serve-startup-timeout", type=float, default=600.0, help="seconds for the server to answer /healthz")
    p.add_argument("--synth-sessions", type=int, default=None, help="gru4rec synth --n-sessions (default: planned from the sizes)")
    p.add_argument("--test-days", type=float, default=None, help="gru4rec synth --test-days (default: planned from the sizes)")
    p.add_argument("--seed", type=int, default=1, help="gru4rec synth --seed (default 1)")
    p.add_argument("--train-params", default=DEFAULT_TRAIN_PARAMS, help=f"gru4rec train -ps (default {DEFAULT_TRAIN_PARAMS})")
    p.add_argument("--export-formats", type=name_list(EXPORT_FORMATS), default=list(EXPORT_FORMATS),
                   help=f"comma-separated, of {','.join(EXPORT_FORMATS)} (default: all)")
    p.add_argument("-k", type=int, default=20, help="items per recommendation (recommend, serve; default 20)")
    p.add_argument("--threads", type=int, default=1, help="threads of every command (--threads and OMP_NUM_THREADS; default 1)")
    p.add_argument("--device", default="cpu", help="-d of every command that takes it (default cpu)")
    p.add_argument(
        "--work", type=Path, default=DEFAULT_WORK, help=f"work folder (default {DEFAULT_WORK.relative_to(ROOT)}, ignored by git)"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--force", action="store_true", help="replace the files of an earlier run in --work")
    what.add_argument("--reuse", action="store_true", help="keep the synthetic data (same sizes) and, without the train stage, the model")
    p.add_argument("--rss-limit-mb", type=float, default=default_rss_limit_mb(),
                   help="kill a command whose RSS passes this (default: 80%% of MemAvailable now; 0: no limit)")
    p.add_argument("--timeout", type=float, default=None, help="kill a command running longer than this many seconds")
    p.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    args = p.parse_args(argv)
    for name in ("n_items", "sessions", "eval_sessions", "serve_sessions", "serve_concurrency", "k", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if max(args.recommend_sessions) > args.sessions:
        p.error(f"--recommend-sessions up to {max(args.recommend_sessions)} needs --sessions at least that large")
    return args


def pipeline(b: Bench) -> None:
    """The requested stages in order; the model-only run before the stages that use the model."""
    stages = b.args.stages
    needs_model = [s for s in stages if s in ("evaluate", "recommend", "export", "serve")]
    if "synth" in stages:
        stage_synth(b)
    if set(stages) - {"synth"}:
        load_data(b)
    if "train" in stages:
        stage_train(b)
        if not b.rows[-1].ok:
            raise SystemExit("training failed: no model to measure")
    if needs_model:
        if not b.model.exists():
            raise SystemExit(f"{b.model} is missing: run the train stage")
        model_info(b)
        stage_model_footprint(b)
        for name, fn in (("evaluate", stage_evaluate), ("recommend", stage_recommend), ("export", stage_export),
                         ("serve", stage_serve)):
            if name in stages:
                fn(b)
    elif b.model.exists() and "train" in stages:
        model_info(b)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_work(args)
    b = Bench(args)
    try:
        pipeline(b)
    except SystemExit as exc:  # a stage cannot go on (missing or too little data, no model): say so in the table
        if not isinstance(exc.code, str):
            raise
        b.log(exc.code)
        b.rows.append(Row("aborted", None, ok=False, note=exc.code))
    notes = checks(b)
    data, model = b.facts.get("data", {}), b.facts.get("model", {})
    print(f"Catalogue {args.n_items:,} items; train_full {data.get('train_sessions', 0):,} sessions "
          f"({data.get('train_events', 0):,} events, {data.get('train_items', 0):,} items); model "
          f"{model.get('n_items', 0):,} items × {model.get('layers')}, {model.get('bytes', 0) / 2**20:,.1f} MiB; "
          f"threads {args.threads}")
    print()
    print(table(b.rows))
    serve = next((r for r in b.rows if r.stage == "serve" and r.wall_s), None)
    if serve:
        e = serve.extra
        print(f"\nserve: {e['requests']:,} clicks of {serve.sessions:,} sessions at concurrency {e['concurrency']}: "
              f"{fmt(e['requests_per_s'], 0)} clicks/s, latency p50 {fmt(e['latency_ms_p50'], 2)} ms, "
              f"p99 {fmt(e['latency_ms_p99'], 2)} ms; sessions held {e['sessions_held']}")
    for line in notes:
        print(f"- {line}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"host": host_facts(), "args": {k: (str(v) if isinstance(v, Path) else v)
                                                                        for k, v in vars(args).items()},
                                         **b.facts, "model_only_rss_mb": b.model_mb, "checks": notes,
                                         "stages": [r.as_json() for r in b.rows]}, indent=1))
    return 0 if all(r.ok for r in b.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
