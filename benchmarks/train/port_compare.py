"""Training speed of this package against the official PyTorch port of GRU4Rec, on this machine.

The port is not part of this project (its licence is non-commercial and its code stays out of
ours): fetch it yourself and pass its folder, e.g.

    git clone https://github.com/hidasib/GRU4Rec_PyTorch_Official .port     # .port/ is git-ignored
    python -m benchmarks.train.port_compare --port .port --config rsc15 \\
        --data ../shared/data/rsc15_100k/train_full.tsv --epochs 3 --rounds 2

Each round trains ``--epochs`` epochs with this package (``run.py``) and then with the port, each
in a fresh process with the same number of threads, and reads the per-epoch line both print in
the original's format (``Epoch1 --> loss: … (12.02s) [137.26 mb/s | 4366 e/s]``). Alternating
the two keeps a noisy host from favouring one of them. Prints one JSON line: every epoch's events/s
for both, their medians and the ratio. Run it alone: two torch processes on 2 cores thrash each
other.

Both children inherit this process's environment but for the thread counts, so an OpenMP setting
applies to both: ``OMP_WAIT_POLICY=PASSIVE python -m benchmarks.train.port_compare --threads 2 …`` runs
both with sleeping idle threads — the conditions of issue 39's figures, taken when importing
``gru4rec`` set that variable (docs/speed-history.md, "Against the official port").

The port's epochs include its sample-store redraws (every 4,882 steps), ours include ours; its
one-off initial draw is outside its epoch timer, as our store's is.

With NumPy ≥ 2 and pandas ≥ 3 the port (commit 4e7d236) needs two one-line fixes before it runs:
``torch.tensor(pop[…].values, …)`` where it builds ``P0`` (logq > 0), and
``float(np.sqrt(…))`` for ``sigma`` in ``_init_numpy_weights``; this script says so when it fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.workloads import CONFIGS  # the named configurations of both benchmarks
from gru4rec.config import Config

ROOT = Path(__file__).resolve().parents[2]

EPOCH_LINE = re.compile(r"Epoch(\d+) --> loss: (\S+)\s+\(([\d.]+)s\)\s+\[([\d.]+) mb/s \| (\d+) e/s\]")

# Runs in a fresh interpreter: the port's own training loop on the same file and parameters.
PORT_PROGRAM = """
import sys, json, torch, pandas as pd
sys.path.insert(0, sys.argv[1])
from gru4rec_pytorch import GRU4Rec
params = json.loads(sys.argv[3])
data = pd.read_csv(sys.argv[2], sep='\\t', dtype={'ItemId': str})  # as the port's run.py reads it
GRU4Rec(device=torch.device(sys.argv[4]), **params).fit(data)
"""


def port_params(config: Config, epochs: int) -> dict:
    """The port's constructor arguments for ``config``; SystemExit for what the port cannot do."""
    if config.loss not in ("cross-entropy", "bpr-max") or config.adapt != "adagrad" or config.lmbd or config.grad_cap:
        raise SystemExit("the port trains cross-entropy or bpr-max with adagrad (no lmbd, no grad_cap) only")
    params = dict(
        loss=config.loss, layers=list(config.layers), batch_size=config.batch_size, n_epochs=epochs,
        dropout_p_embed=config.dropout_p_embed, dropout_p_hidden=config.dropout_p_hidden,
        learning_rate=config.learning_rate, momentum=config.momentum, n_sample=config.n_sample,
        sample_alpha=config.sample_alpha, bpreg=config.bpreg, logq=config.logq,
        embedding=config.embedding, constrained_embedding=config.constrained_embedding,
    )
    if config.loss == "bpr-max":  # the port applies ELU with this parameter before bpr-max
        act = config.final_act
        if not act.startswith("elu-"):
            raise SystemExit(f"the port's bpr-max uses final_act elu-A; this configuration has {act!r}")
        params["elu_param"] = float(act.split("-", 1)[1])
    return params


def epochs_of(output: str) -> list[float]:
    return [float(m.group(5)) for m in EPOCH_LINE.finditer(output)]


def run(cmd: list[str], threads: int, what: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads:  # else each its own default (ours: chosen online, gru4rec/machine/threads.py; the port: torch's)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    speeds = epochs_of(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not speeds:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        hint = ""
        if what == "port" and any("Series" in line or "type double" in line for line in tail):
            hint = "\n(the port needs two one-line fixes on NumPy >= 2 / pandas >= 3: see this script's docstring)"
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail) + hint)
    return speeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", required=True, type=Path, help="folder holding the port's gru4rec_pytorch.py")
    parser.add_argument("--config", default="rsc15", help=f"one of {sorted(CONFIGS)}")
    parser.add_argument("--data", required=True, help="training file (TSV: SessionId, ItemId, Time)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both (0: each its own default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both implementations train there)")
    args = parser.parse_args(argv)
    if not (args.port / "gru4rec_pytorch.py").is_file():
        raise SystemExit(f"--port {args.port}: no gru4rec_pytorch.py there")
    if args.config not in CONFIGS:
        raise SystemExit(f"--config must be one of {sorted(CONFIGS)}, got {args.config!r}")
    if not Path(args.data).is_file():
        raise SystemExit(f"--data {args.data}: no such file")
    config = Config.from_file(ROOT / CONFIGS[args.config]).replace(n_epochs=args.epochs)
    data = str(Path(args.data).resolve())
    ours: list[float] = []
    port: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        paramfile = Path(tmp) / "params.json"
        paramfile.write_text(json.dumps(config.to_dict()))
        for _ in range(args.rounds):
            ours += run([sys.executable, "run.py", data, "-pf", str(paramfile), "-d", args.device], args.threads, "this package")
            port += run(
                [
                    sys.executable,
                    "-c",
                    PORT_PROGRAM,
                    str(args.port.resolve()),
                    data,
                    json.dumps(port_params(config, args.epochs)),
                    args.device,
                ],
                args.threads,
                "port",
            )
    result = {
        "config": args.config,
        "data": args.data,
        "device": args.device,
        "threads": args.threads,
        "epochs": args.epochs,
        "rounds": args.rounds,
        "ours_events_per_s": ours,
        "port_events_per_s": port,
        "ours_median": statistics.median(ours),
        "port_median": statistics.median(port),
        "ratio": round(statistics.median(ours) / statistics.median(port), 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
