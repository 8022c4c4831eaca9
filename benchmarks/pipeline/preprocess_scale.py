"""Peak memory and time of a public-data-set pipeline on a large synthetic raw file.

Synthesises YOOCHOOSE-format raw files (`yoochoose-clicks.dat` + `yoochoose-test.dat`,
header-less `SessionId,Timestamp,ItemId,Category`, ISO-8601 UTC timestamps) with a realistic
shape — 183 days, session ids increasing with time, geometric session lengths (mean ~3.6),
Zipf-like item popularity over ~53k items, ~10 % consecutive repeats, a quarter of the sessions
in the test file — then runs the pipeline in a fresh child process and reports, as JSON, its
wall time and peak resident memory (the child's ru_maxrss; the generator is not counted).

    python -m benchmarks.pipeline.preprocess_scale --rows 30000000 --workdir /tmp/pp_scale
    python -m benchmarks.pipeline.preprocess_scale --rows 3000000 --dataset rsc15

The raw files are kept in --workdir and reused when they already have the requested size.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

START = np.datetime64("2014-04-01T00:00:00", "ms")
SPAN_MS = 183 * 86_400_000
N_ITEMS = 52_739


def _write_rows(fh, session: np.ndarray, t_ms: np.ndarray, item: np.ndarray) -> None:
    stamps = np.datetime_as_string(START + t_ms.astype("timedelta64[ms]"), unit="ms", timezone="UTC")
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        table = pa.table({"s": session, "t": stamps, "i": item, "c": np.zeros(len(item), np.int8)})
        pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    except ImportError:
        pd.DataFrame({"s": session, "t": stamps, "i": item, "c": 0}).to_csv(fh, header=False, index=False)


def synthesise(rows: int, folder: Path, seed: int = 0) -> dict[str, int]:
    """Write the two raw files with about `rows` clicks in all (±0.1 %); returns rows per file."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    mean_len = 3.6
    n_sessions = int(rows / mean_len)
    starts = np.sort(rng.integers(0, SPAN_MS, n_sessions))  # ids increase with time, as in the real file
    popularity = 1.0 / (np.arange(N_ITEMS) + 10.0) ** 0.9
    popularity /= popularity.sum()
    counts = {"yoochoose-clicks.dat": 0, "yoochoose-test.dat": 0}
    files = {name: open(folder / f".{name}.tmp", "wb") for name in counts}
    written = 0
    try:
        for lo in range(0, n_sessions, 250_000):
            hi = min(lo + 250_000, n_sessions)
            n = hi - lo
            length = rng.geometric(1.0 / mean_len, n)  # the total is about `rows`, not exact
            total = int(length.sum())
            session = np.repeat(np.arange(lo + 1, hi + 1, dtype=np.int64), length)
            first = np.r_[0, np.cumsum(length)[:-1]]
            gaps = rng.exponential(90_000.0, total).astype(np.int64) + 1_000
            gaps[first] = 0
            offset = np.cumsum(gaps)
            offset -= np.repeat(offset[first], length)
            t_ms = np.repeat(starts[lo:hi], length) + offset
            item = rng.choice(N_ITEMS, total, p=popularity)
            repeat = rng.random(total) < 0.1
            repeat[first] = False
            # a repeat copies the latest non-repeat item (never across sessions: firsts are not repeats)
            src = np.where(repeat, 0, np.arange(total))
            np.maximum.accumulate(src, out=src)
            item = item[src] + 214_500_000
            in_test = np.repeat(rng.random(n) < 0.25, length)
            for name, mask in (("yoochoose-clicks.dat", ~in_test), ("yoochoose-test.dat", in_test)):
                _write_rows(files[name], session[mask], t_ms[mask], item[mask])
                counts[name] += int(mask.sum())
            written += total
            print(f"synthesised {written:,} rows", file=sys.stderr, flush=True)
    finally:
        for fh in files.values():
            fh.close()
    for name in counts:
        os.replace(folder / f".{name}.tmp", folder / name)
    (folder / "rows.json").write_text(json.dumps({"rows": rows, "seed": seed, "files": counts}))
    return counts


CHILD = """
import json, sys, time
from gru4rec.datasets import preprocess
t0 = time.perf_counter()
stats = preprocess(sys.argv[1], sys.argv[2:-1], sys.argv[-1], force=True, progress=True)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "stats": stats[["file", "events", "sessions", "items"]].to_dict(orient="records")}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000_000, help="raw clicks to synthesise (default 30M)")
    parser.add_argument("--dataset", choices=["yoochoose", "rsc15"], default="yoochoose")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gru4rec_preprocess_scale"))
    parser.add_argument("--format", dest="fmt", choices=["tsv", "parquet"], default="tsv")
    args = parser.parse_args(argv)

    raw_dir = args.workdir / "raw"
    meta = raw_dir / "rows.json"
    t0 = time.perf_counter()
    if meta.exists() and json.loads(meta.read_text()).get("rows") == args.rows:
        counts = json.loads(meta.read_text())["files"]
        gen_seconds = 0.0
    else:
        counts = synthesise(args.rows, raw_dir)
        gen_seconds = time.perf_counter() - t0
    raws = [raw_dir / "yoochoose-clicks.dat"]
    if args.dataset == "yoochoose":
        raws.append(raw_dir / "yoochoose-test.dat")
    out = args.workdir / f"out_{args.dataset}_{args.fmt}"
    code = CHILD if args.fmt == "tsv" else CHILD.replace("force=True", "force=True, fmt='parquet'")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t1 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code, args.dataset, *map(str, raws), str(out)],
        capture_output=True, text=True, env=env,
    )
    wall = time.perf_counter() - t1
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    raw_rows = sum(counts[p.name] for p in raws)
    report = {
        "dataset": args.dataset,
        "format": args.fmt,
        "raw_rows": raw_rows,
        "raw_bytes": sum(p.stat().st_size for p in raws),
        "generate_seconds": round(gen_seconds, 1),
        "pipeline_seconds": round(child["seconds"], 1),
        "process_wall_seconds": round(wall, 1),
        "raw_rows_per_second": round(raw_rows / child["seconds"]),
        "peak_rss_mb": round(peak_kb / 1024),
        "peak_rss_bytes_per_raw_row": round(peak_kb * 1024 / raw_rows, 1),
        "stats": child["stats"],
        # the child's progress lines are log records on its stdout, before the JSON line
        "progress_tail": proc.stdout.strip().splitlines()[-13:-1],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "pandas": pd.__version__,
                    "numpy": np.__version__},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
