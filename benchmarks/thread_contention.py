"""Training speed by thread count when other processes keep the CPUs busy.

    python benchmarks/thread_contention.py                 # 3 repeats, busy load = the CPUs available
    python benchmarks/thread_contention.py --repeats 5 --busy 0 1 2

Every measurement is a fresh process (the OpenMP runtime reads its settings when it loads) that
trains ``--epochs`` epochs of the synthetic data set with the demo's settings and prints the
seconds of ``fit``. Variants: ``threads=1``; the default thread count (the CPUs this process may
use) with gru4rec's default wait policy (``OMP_WAIT_POLICY=PASSIVE``, set when gru4rec is
imported: idle threads sleep at once); the default thread count with the OpenMP runtime's own
policy (torch imported before gru4rec: idle threads spin a while before sleeping). Each
runs beside ``--busy`` processes that spin on a core each (0 = a quiet machine), and the
variants' repeats are interleaved so that a drifting load disturbs all alike. Printed: one JSON
line per measurement, then per load the median seconds of each variant and its ratio to
``--threads 1``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gru4rec.cli.synth import DEMO_PARAMS  # noqa: E402
from gru4rec.threads import available_cpus  # noqa: E402

#: One training run, in its own process: prints the seconds of fit.
_CHILD = """
import sys, time
if sys.argv[4] == "runtime":
    import torch  # loads the OpenMP runtime before gru4rec can choose its wait policy
from gru4rec import Config, GRU4Rec
threads = None if sys.argv[2] == "default" else int(sys.argv[2])
config = Config.from_string(sys.argv[3])
model = GRU4Rec(config, device="cpu", threads=threads)
start = time.perf_counter()
model.fit(sys.argv[1], progress=False)
print(time.perf_counter() - start)
"""


def _spin() -> None:
    while True:
        pass


def _variants(cpus: int) -> dict[str, tuple[str, str]]:
    """name -> (threads argument, wait policy: 'gru4rec' (passive, set on import) or 'runtime')."""
    return {
        "threads=1": ("1", "gru4rec"),
        f"{cpus} threads, idle threads sleep (the default)": ("default", "gru4rec"),
        f"{cpus} threads, OpenMP's own wait policy (spin)": ("default", "runtime"),
    }


def _run(train: Path, threads: str, policy: str, params: str, timeout: float) -> float | None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(ROOT)
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(train), threads, params, policy], env=env, capture_output=True,
                             text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Measure and print."""
    cpus = available_cpus()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, cpus], help="busy processes beside training")
    parser.add_argument("--n-sessions", type=int, default=4000, help="synthetic sessions (train_full)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as timed out")
    args = parser.parse_args()

    from gru4rec.datasets.synthetic import write_synthetic

    params = DEMO_PARAMS.replace("n_epochs=5", f"n_epochs={args.epochs}")
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_synthetic(Path(tmp), n_sessions=args.n_sessions, seed=1, force=True)
        train = Path(paths["train_full"]) if isinstance(paths, dict) else Path(tmp) / "train_full.tsv"
        _run(train, "1", "gru4rec", params, args.timeout)  # compile the CPU kernels once, outside the timings
        summary: dict[int, dict[str, list[float | None]]] = {}
        for busy in args.busy:
            spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
            for p in spinners:
                p.start()
            time.sleep(0.5)
            try:
                times: dict[str, list[float | None]] = {name: [] for name in _variants(cpus)}
                for repeat in range(args.repeats):
                    for name, (threads, policy) in _variants(cpus).items():
                        seconds = _run(train, threads, policy, params, args.timeout)
                        times[name].append(seconds)
                        print(json.dumps({"busy": busy, "variant": name, "repeat": repeat, "seconds": seconds}), flush=True)
                summary[busy] = times
            finally:
                for p in spinners:
                    p.terminate()
                    p.join()
    print(f"\n{cpus} CPU(s) available; median seconds of {args.epochs} epoch(s), {args.n_sessions} synthetic sessions "
          f"({args.repeats} repeats; a timed-out run counts as {args.timeout:.0f} s)")
    for busy, times in summary.items():
        medians = {name: statistics.median(t if t is not None else args.timeout for t in ts) for name, ts in times.items()}
        base = medians["threads=1"]
        print(f"busy processes: {busy}")
        for name, m in medians.items():
            print(f"  {name:50s} {m:8.2f} s  ×{m / base:5.2f} of threads=1")


if __name__ == "__main__":
    main()
