"""Load test of ``gru4rec serve``: a real server process on loopback, driven by a closed-loop
load generator (aiohttp, asyncio) with sessions replayed from an event file.

For each setting — micro-batching on (``--max-batch 64``) and off (``--max-batch 1``), stateful
clicks (``POST /v1/sessions/{id}/events``, one session's clicks one after the other) and
stateless requests (``POST /v1/recommend`` with the session's clicks so far), at each
concurrency — it runs until ``--requests`` answers or ``--seconds`` have passed (whichever comes
first; the first ``--warmup`` answers are not counted) and prints one JSON line: p50/p95/p99
latency (ms), requests/s, the server's mean batch size and the share of rows whose top-k the
int8 path certified. With ``--repeats R`` every setting runs R times; the last lines are the
medians. Everything is bounded and stops by itself; the server is stopped at the end, also on
errors.

The model: ``--model FILE``, or (by default) a synthetic one of the DIGINETICA configuration's
size (43,097 items, 512 units, the published diginetica parameters, one epoch on synthetic
sessions, with short filler sessions so that every one of the 43,097 items occurs), built once
into ``--work``. The sessions: ``--sessions FILE`` (session, item, time
columns), or the synthetic test sessions written next to the synthetic model.

Scale-out: ``--replicas N`` starts N servers per setting, and the load generator sends each
request to the next replica in turn (a round-robin load balancer without stickiness: a
session's clicks alternate between replicas); ``--state redis`` starts a throwaway redis-server
(loopback, no persistence) that they share (or give a ``redis://`` URL). ``--code DIR`` runs the
servers from another checkout (e.g. an older commit ``git archive``d to a folder), to compare
before and after a change with the same load generator.

Threads under contention: ``--threads 0`` leaves the thread count to the server (chosen online,
gru4rec/machine/threads.py), ``--wait-policy PASSIVE`` sets the servers' ``OMP_WAIT_POLICY``, and
``--busy N`` runs N processes that spin on a core each beside them while the load runs.

    python -m benchmarks.serve.serve_load --repeats 3
    python -m benchmarks.serve.serve_load --replicas 2 --state redis --modes stateful --batching on --concurrency 32
    python -m benchmarks.serve.serve_load --model digi.pt --sessions ../shared/data/diginetica_srgnn/test.tsv
    python -m benchmarks.serve.serve_load --modes stateful --batching on --concurrency 32 --threads 0 --busy 1
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

DIGINETICA_ITEMS = 43_097
PARAMS = ROOT / "paramfiles" / "diginetica_bprmax_shared_512_best.py"


# ----------------------------------------------------------------------------- model, sessions


def synthetic_model(work: Path, n_sessions: int) -> tuple[Path, Path]:
    """The synthetic DIGINETICA-size model and its test sessions in ``work`` (built once)."""
    from gru4rec import Config, GRU4Rec
    from gru4rec.data.events import write_events
    from gru4rec.datasets.synthetic import generate, time_split

    model_path, test_path = work / "serve_model.pt", work / "serve_sessions.tsv"
    if model_path.exists() and test_path.exists():
        return model_path, test_path
    work.mkdir(parents=True, exist_ok=True)
    events = generate(n_sessions=n_sessions, n_items=DIGINETICA_ITEMS, seed=5)
    train, test = time_split(events, 86_400)
    train = _fill_catalogue(train, DIGINETICA_ITEMS)
    print(f"training the synthetic model on {len(train):,} events (one epoch) ...", file=sys.stderr, flush=True)
    config = Config.from_file(PARAMS).replace(n_epochs=1)
    GRU4Rec(config, device="cpu").fit(train, progress=False).save(model_path, overwrite=True)
    write_events(test, test_path, force=True)
    return model_path, test_path


def _fill_catalogue(train: Any, n_items: int) -> Any:
    """Add two-click sessions of new items until the training data has ``n_items`` distinct items:
    the synthetic popularity tail leaves many of the generator's items unclicked, and the model's
    size (its item matrix) is the point here."""
    import pandas as pd

    missing = n_items - train["ItemId"].nunique()
    if missing <= 0:
        return train
    ids = np.arange(missing, dtype=np.int64) + int(train["ItemId"].max()) + 1
    partner = train["ItemId"].sample(missing, replace=True, random_state=0).to_numpy()
    sessions = np.arange(missing, dtype=np.int64) + int(train["SessionId"].max()) + 1
    t0 = int(train["Time"].min())
    filler = pd.DataFrame({"SessionId": np.repeat(sessions, 2), "ItemId": np.column_stack([partner, ids]).ravel(),
                           "Time": np.repeat(t0 + np.arange(missing), 2) + np.tile([0, 1], missing)})
    return pd.concat([train, filler.astype(train.dtypes.to_dict())], ignore_index=True)


def read_sessions(path: Path, limit: int) -> list[list[Any]]:
    """Sessions of at least two clicks, in file order, as lists of item ids (plain Python)."""
    from gru4rec.data.events import read_events

    events = read_events(path, session_key="SessionId", item_key="ItemId", time_key="Time")
    events = events.sort_values(["SessionId", "Time"], kind="stable")
    sessions = [s for s in events.groupby("SessionId", sort=False)["ItemId"].agg(list).tolist() if len(s) >= 2]
    return [[v.item() if hasattr(v, "item") else v for v in s] for s in sessions[:limit]]


# --------------------------------------------------------------------------------- the server


def _spin() -> None:
    """A busy process beside the servers (``--busy``)."""
    while True:
        pass


def start_server(model: Path, max_batch: int, threads: int, extra: list[str], device: str = "cpu", *,
                 state: str = "memory", code: Path = ROOT, wait_policy: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """A ``gru4rec serve`` process and its URL; ``threads`` 0: no ``--threads`` (the server's
    default, chosen online), ``wait_policy``: its ``OMP_WAIT_POLICY`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(code) + os.pathsep + os.environ.get("PYTHONPATH", "")
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    cmd = [sys.executable, "-m", "gru4rec", "serve", str(Path(model).resolve()), "--port", "0", "--device", device, "--state", state,
           "--max-batch", str(max_batch), *(["--threads", str(threads)] if threads else []), "--log-interval", "3600", *extra]
    # cwd: `python -m` puts the working folder first on sys.path, before PYTHONPATH.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=code)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if " at http://" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0]


def redis_binary() -> str | None:
    """The redis-server executable, or None where it is not installed."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    return binary if os.path.exists(binary) else None


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    """A throwaway redis-server on a free loopback port (no persistence): process, URL, folder."""
    binary = redis_binary()
    if binary is None:
        raise SystemExit("--state redis needs redis-server (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="gru4rec-load-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0", folder


def server_counters(urls: list[str]) -> dict[str, float]:
    """Batch-size sum/count and rows per scoring path from /metrics, summed over ``urls``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
            for sample in family.samples:
                if sample.name in ("gru4rec_serve_batch_size_sum", "gru4rec_serve_batch_size_count"):
                    counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
                elif sample.name == "gru4rec_serve_scored_rows_total":
                    key = f"rows_{sample.labels['path']}"
                    counters[key] = counters.get(key, 0.0) + sample.value
    return counters


# ------------------------------------------------------------------------------ load generator


def summarize(latencies_s: list[float], elapsed_s: float) -> dict[str, float]:
    """Percentiles in ms and the rate of counted answers."""
    ms = np.asarray(latencies_s) * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99]) if len(ms) else (float("nan"),) * 3
    return {"p50_ms": round(float(p50), 2), "p95_ms": round(float(p95), 2), "p99_ms": round(float(p99), 2),
            "requests_per_s": round(len(ms) / elapsed_s, 1) if elapsed_s > 0 else float("nan")}


def requests_of(session: list[Any], mode: str, sid: str) -> list[tuple[str, dict[str, Any]]]:
    """The requests that replay one session: one click each (stateful) or each prefix (stateless)."""
    if mode == "stateful":
        return [(f"/v1/sessions/{sid}/events", {"item": item, "k": 20}) for item in session]
    return [("/v1/recommend", {"items": session[: t + 1], "k": 20}) for t in range(len(session))]


async def closed_loop(urls: list[str], mode: str, sessions: list[list[Any]], concurrency: int, max_requests: int,
                      max_seconds: float, warmup: int, tag: str) -> dict[str, float]:
    """``concurrency`` virtual users, each replaying whole sessions, each sending its next
    request when the previous answer came (closed loop), to the replicas ``urls`` in turn.
    aiohttp, not httpx: httpx's async client costs ~10 ms per request at concurrency 32 here and
    would measure itself."""
    try:
        import aiohttp
    except ImportError as exc:
        raise SystemExit("the load generator needs aiohttp: pip install aiohttp") from exc

    latencies: list[float] = []
    answered, errors, next_session = 0, 0, 0
    started = time.perf_counter()
    deadline = started + max_seconds
    counting_since: float | None = None
    connector = aiohttp.TCPConnector(limit=concurrency * len(urls))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def user(u: int) -> None:
            nonlocal answered, errors, next_session, counting_since
            sent = u  # this user's requests go to the replicas in turn
            while answered < max_requests + warmup and time.perf_counter() < deadline:
                s = next_session % len(sessions)
                next_session += 1
                sid = f"{tag}-{u}-{s}"
                for path, body in requests_of(sessions[s], mode, sid):
                    t0 = time.perf_counter()
                    url = urls[sent % len(urls)]
                    sent += 1
                    async with client.post(url + path, json=body) as r:
                        await r.read()
                        ok = r.status == 200
                    dt = time.perf_counter() - t0
                    errors += not ok
                    answered += 1
                    if answered == warmup:
                        counting_since = time.perf_counter()
                    elif answered > warmup:
                        latencies.append(dt)
                    if answered >= max_requests + warmup or time.perf_counter() >= deadline:
                        return
                if mode == "stateful":
                    async with client.delete(f"{urls[sent % len(urls)]}/v1/sessions/{sid}") as r:
                        await r.read()

        await asyncio.gather(*(user(u) for u in range(concurrency)))
    elapsed = time.perf_counter() - (counting_since if counting_since is not None else started)
    return {**summarize(latencies, elapsed), "requests": len(latencies), "errors": errors}


def _event_loop_run(coroutine: Any) -> Any:
    """Run the load generator on uvloop where it is installed (the serve extra brings it): the
    client's own CPU time per request is part of what the shared cores spend."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def measured_run(urls: list[str], mode: str, sessions: list[list[Any]], concurrency: int, args: argparse.Namespace,
                 tag: str) -> dict[str, Any]:
    """One closed-loop run, with the servers' mean batch size and int8-certified share during it."""
    before = server_counters(urls)
    run = _event_loop_run(closed_loop(urls, mode, sessions, concurrency, args.requests, args.seconds, args.warmup, tag))
    after = server_counters(urls)

    def grown(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    batches, rows = grown("gru4rec_serve_batch_size_count"), grown("gru4rec_serve_batch_size_sum")
    certified, scored = grown("rows_certified"), grown("rows_certified") + grown("rows_float32")
    return {**run, "mean_batch": round(rows / batches, 2) if batches else None,
            "int8_certified_share": round(certified / scored, 3) if scored else None}


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a model file (default: the synthetic DIGINETICA-size one)")
    parser.add_argument("--sessions", type=Path, default=None, help="events to replay (default: the synthetic test sessions)")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "serve", help="where the synthetic model is kept")
    parser.add_argument("--synthetic-sessions", type=int, default=20_000, help="training sessions of the synthetic model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--modes", nargs="+", choices=("stateful", "stateless"), default=["stateful", "stateless"])
    parser.add_argument("--batching", nargs="+", choices=("on", "off"), default=["on", "off"])
    parser.add_argument("--requests", type=int, default=1500, help="answers counted per run (at most)")
    parser.add_argument("--seconds", type=float, default=20.0, help="longest run")
    parser.add_argument("--warmup", type=int, default=50, help="answers not counted at the start of a run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting; the medians are printed last")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (0: its default, chosen online)")
    parser.add_argument("--wait-policy", default=None, help="OMP_WAIT_POLICY of the servers (default: unset)")
    parser.add_argument("--busy", type=int, default=0, help="processes that spin on a core each beside the servers")
    parser.add_argument("--device", default="cpu", help="the server's device (cpu, cuda, ...)")
    parser.add_argument("--server-args", default="", help="more flags for gru4rec serve (e.g. '--scoring float32')")
    parser.add_argument("--max-sessions", type=int, default=2000, help="sessions replayed (cycled)")
    parser.add_argument("--replicas", type=int, default=1, help="servers per setting, sent requests in turn")
    parser.add_argument("--state", default="memory", help="memory, redis (a throwaway redis-server) or a redis:// URL")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout the servers run (default: this one)")
    args = parser.parse_args(argv)

    if args.model is None:
        model, default_sessions = synthetic_model(args.work, args.synthetic_sessions)
    else:
        model, default_sessions = args.model, None
    sessions_file = args.sessions or default_sessions
    if sessions_file is None:
        parser.error("--sessions is needed with --model")
    sessions = read_sessions(sessions_file, args.max_sessions)
    # The load generator's own full garbage collections (numpy, pandas, aiohttp: ~40 ms each)
    # would stall every request in flight and be measured as the server's latency.
    gc.collect()
    gc.freeze()
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    servers: dict[str, list[tuple[subprocess.Popen[str], str]]] = {}
    spinners: list[multiprocessing.Process] = []
    redis: tuple[subprocess.Popen[bytes], str, str] | None = None
    state = args.state
    try:
        if state == "redis":
            redis = start_redis()
            state = redis[1]
        # All servers stay up, and each setting runs with batching on and off back to back, so
        # that a ratio compares runs a few seconds apart on this shared machine.
        for batching in args.batching:
            servers[batching] = [start_server(model, 64 if batching == "on" else 1, args.threads, args.server_args.split(),
                                              args.device, state=state, code=args.code, wait_policy=args.wait_policy)
                                 for _ in range(args.replicas)]
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
        for spinner in spinners:
            spinner.start()
        for repeat in range(args.repeats):
            for mode in args.modes:
                for c in args.concurrency:
                    for batching, started in servers.items():
                        urls = [url for _, url in started]
                        line = {"mode": mode, "batching": batching, "concurrency": c, "repeat": repeat,
                                "replicas": args.replicas, "state": "redis" if state.startswith("redis") else state,
                                **measured_run(urls, mode, sessions, c, args, tag=f"{batching}{repeat}{c}")}
                        results.setdefault((mode, batching, c), []).append(line)
                        print(json.dumps(line), flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
        for started in servers.values():
            for proc, _ in started:
                proc.terminate()
                proc.wait(30)
        if redis is not None:
            redis[0].terminate()
            redis[0].wait(30)
            shutil.rmtree(redis[2], ignore_errors=True)
    if args.repeats > 1:
        for (mode, batching, c), lines in results.items():
            med = {key: round(statistics.median(line[key] for line in lines), 2)
                   for key in ("p50_ms", "p95_ms", "p99_ms", "requests_per_s", "mean_batch") if lines[0][key] is not None}
            print(json.dumps({"median_of": len(lines), "mode": mode, "batching": batching, "concurrency": c, **med}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
