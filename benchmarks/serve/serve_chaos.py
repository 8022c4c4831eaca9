"""Chaos check of ``gru4rec serve``'s exactly-once clicks (issue 36): two real replicas on one
real redis-server (append-only file, fsync on every write), clients that retry on the other
replica, a replica killed with ``kill -9`` in the middle of the load and restarted, and Redis
killed with ``kill -9`` and restarted from its append-only file. Every answer is then checked
against ``GRU4Rec.recommend_batch`` of the session's clicks so far: a click lost or applied
twice changes every later answer of its session, and a doubled last click moves the session's
position, which a final resend of each session's last ``seq`` checks (it must be answered
again, identically).

Two phases, each printing one JSON line:

* ``race`` — issue 36's experiment, clicks without ``seq``: for each session click 1 on replica
  A, then clicks 2 and 3 at the same moment on A and B, then click 4 on A. Applied once each,
  click 4's answer is ``recommend([c1, c2, c3, c4])`` or ``recommend([c1, c3, c2, c4])``;
  ``neither_order`` counts the sessions answered otherwise (a lost click).
* ``chaos`` — ``--sessions`` sessions of ``--clicks`` clicks each, ``--concurrency`` clients,
  each click sent with its ``seq`` to alternating replicas; on a connection error, a timeout or a
  503 the client sends the same click to the other replica (the documented retry contract).
  After a quarter of the clicks replica A is killed (``-9``) and started again (it loads while
  the load goes on); after half of them Redis is. ``lost_or_doubled`` counts the sessions with an answer that is not
  ``recommend`` of its clicks, or whose last click is not answered again.

Everything is bounded (a few hundred sessions, seconds of load, a 300 s guard) and every process
is stopped at the end, also on errors. ``--code DIR`` runs the replicas from another checkout
(e.g. the code before issue 36, ``git archive``d to a folder): only the ``race`` phase runs there.

    python -m benchmarks.serve.serve_chaos                        # both phases, a synthetic model built once
    python -m benchmarks.serve.serve_chaos --code /tmp/before --phases race
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: The README's serving model: synthetic data of 5,000 sessions, seed 1.
MODEL_PARAMS = "layers=64,n_sample=256,n_epochs=2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(work: Path) -> Path:
    """The README's synthetic serving model in ``work`` (trained once)."""
    from gru4rec import GRU4Rec
    from gru4rec.datasets.synthetic import generate

    path = work / "chaos_model.safetensors"
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        print("training the synthetic model ...", file=sys.stderr, flush=True)
        GRU4Rec(MODEL_PARAMS, device="cpu", threads=1).fit(generate(n_sessions=5000, seed=1), progress=False).save(path)
    return path


class Redis:
    """A redis-server on a fixed loopback port with an append-only file fsynced on every write."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(binary):
            raise SystemExit("the chaos check needs redis-server (Debian: apt-get install redis-server)")
        self.binary, self.directory, self.port = binary, directory, free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class Replica:
    """``gru4rec serve`` on a fixed loopback port, from the checkout ``code``."""

    def __init__(self, model: Path, state: str, code: Path, threads: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "gru4rec", "serve", str(model.resolve()), "--port", str(self.port), "--device", "cpu",
                    "--state", state, "--threads", str(threads), "--log-interval", "3600"]
        self.env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        self.code = code
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # cwd: `python -m` puts the working folder first on sys.path, before PYTHONPATH.
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_healthy(self, timeout_s: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the replica exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the replica did not come up")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def server_clicks(urls: list[str]) -> dict[str, float]:
    """``gru4rec_serve_clicks_total`` by outcome, summed over the replicas that answer."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total: dict[str, float] = {}
    for url in urls:
        try:
            text = httpx.get(url + "/metrics", timeout=10).text
        except httpx.TransportError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gru4rec_serve_clicks_total":
                    total[sample.labels["outcome"]] = total.get(sample.labels["outcome"], 0.0) + sample.value
    return total


def expected(model: Any, sessions: list[list[Any]], k: int) -> list[list[list[Any]]]:
    """``recommend`` of every prefix of every session: answers[s][t] for clicks[s][: t + 1]."""
    prefixes = [s[: t + 1] for s in sessions for t in range(len(s))]
    recs = model.recommend_batch(prefixes, k=k)
    out, i = [], 0
    for s in sessions:
        out.append([recs[i + t].item_ids.tolist() for t in range(len(s))])
        i += len(s)
    return out


# ------------------------------------------------------------------------------------ the race


async def race(urls: list[str], model: Any, n: int, k: int, seed: int) -> dict[str, Any]:
    import aiohttp

    ids = model.item_map.to_list()
    rng = np.random.default_rng(seed)
    clicks = [[ids[int(i)] for i in rng.choice(len(ids), 4, replace=False)] for _ in range(n)]
    fourth: list[list[Any]] = [[] for _ in range(n)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def click(url: str, s: int, t: int) -> list[Any]:
            async with client.post(f"{url}/v1/sessions/race-{seed}-{s}/events", json={"item": clicks[s][t], "k": k}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"click {t + 1} of session {s}: {r.status} {body}")
                return body["items"]

        async def one(s: int) -> None:
            await click(urls[0], s, 0)
            await asyncio.gather(click(urls[0], s, 1), click(urls[1], s, 2))
            fourth[s] = await click(urls[0], s, 3)

        for start in range(0, n, 16):
            await asyncio.gather(*(one(s) for s in range(start, min(n, start + 16))))
    orders = [[c[0], c[1], c[2], c[3]] for c in clicks] + [[c[0], c[2], c[1], c[3]] for c in clicks]
    want = [r.item_ids.tolist() for r in model.recommend_batch(orders, k=k)]
    neither = sum(fourth[s] not in (want[s], want[n + s]) for s in range(n))
    return {"phase": "race", "sessions": n, "neither_order": neither}


# ----------------------------------------------------------------------------------- the chaos


async def chaos(replicas: list[Replica], redis: Redis, model: Any, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    ids = model.item_map.to_list()
    rng = np.random.default_rng(args.seed)
    sessions = [[ids[int(i)] for i in rng.integers(0, len(ids), args.clicks)] for _ in range(args.sessions)]
    answers: list[list[Any]] = [[None] * args.clicks for _ in sessions]
    total = args.sessions * args.clicks
    done = {"clicks": 0, "retries": 0, "conflicts": 0}
    events: dict[str, float] = {}
    started = time.perf_counter()
    urls = [r.url for r in replicas]
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=args.concurrency * 2)) as client:

        async def send(s: int, t: int, replica: int) -> dict[str, Any]:
            """Click t (1-based) of session s, retried on the other replica until it is answered."""
            for attempt in range(200):
                try:
                    async with client.post(f"{urls[replica]}/v1/sessions/chaos-{s}/events",
                                           json={"item": sessions[s][t - 1], "k": args.k, "seq": t}) as r:
                        body = await r.json()
                        if r.status == 200:
                            return body
                        if r.status == 409:
                            done["conflicts"] += 1
                            raise RuntimeError(f"session {s} click {t}: 409 {body}")
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                done["retries"] += 1
                replica = 1 - replica
                await asyncio.sleep(min(0.5, 0.02 * (attempt + 1)))
            raise RuntimeError(f"session {s} click {t}: no answer after 200 tries")

        next_session = 0

        async def user() -> None:
            nonlocal next_session
            while next_session < len(sessions):
                s = next_session
                next_session += 1
                for t in range(1, args.clicks + 1):
                    answers[s][t - 1] = (await send(s, t, (s + t) % 2))["items"]
                    done["clicks"] += 1
                    await asyncio.sleep(args.think_ms / 1000)  # a visitor reads the answer

        async def havoc() -> None:
            loop = asyncio.get_running_loop()
            while done["clicks"] < total // 4:
                await asyncio.sleep(0.01)
            events["replica_killed_at_click"] = done["clicks"]
            replicas[0].kill()
            await asyncio.sleep(0.3)
            replicas[0].start()
            back = loop.run_in_executor(None, replicas[0].wait_healthy)  # it loads while the load goes on
            while done["clicks"] < total // 2:
                await asyncio.sleep(0.01)
            events["redis_killed_at_click"] = done["clicks"]
            redis.kill()
            await asyncio.sleep(0.5)
            await loop.run_in_executor(None, redis.start)
            events["redis_back_at_click"] = done["clicks"]
            await back
            events["replica_back_at_click"] = done["clicks"]

        chaos_task = asyncio.create_task(havoc())
        await asyncio.wait_for(asyncio.gather(*(user() for _ in range(args.concurrency))), args.guard_s)
        await asyncio.wait_for(chaos_task, args.guard_s)
        elapsed = time.perf_counter() - started
        counts = server_clicks(urls)  # before the resends below (a replica killed with -9 took its counts along)
        # The last click of every session, sent again: answered again, identically (not stepped).
        last_again = await asyncio.gather(*(send(s, args.clicks, s % 2) for s in range(len(sessions))))
    want = expected(model, sessions, args.k)
    wrong = {s for s in range(len(sessions)) if answers[s] != want[s]}
    wrong |= {s for s, body in enumerate(last_again) if body["items"] != answers[s][-1]}
    return {"phase": "chaos", "sessions": len(sessions), "clicks": total, "answers_checked": total,
            "lost_or_doubled": len(wrong), "client_retries": done["retries"], "seconds": round(elapsed, 1),
            "clicks_per_s": round(total / elapsed, 1), **events, "server_counts_during_load": counts,
            "replayed_in_final_resend": server_clicks(urls).get("replayed", 0.0) - counts.get("replayed", 0.0)}


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", nargs="+", choices=("race", "chaos"), default=["race", "chaos"])
    parser.add_argument("--race-sessions", type=int, default=150)
    parser.add_argument("--sessions", type=int, default=300, help="sessions of the chaos phase")
    parser.add_argument("--clicks", type=int, default=8, help="clicks per session of the chaos phase")
    parser.add_argument("--think-ms", type=float, default=100.0, help="a client's pause after each answer (ms)")
    parser.add_argument("--concurrency", type=int, default=32, help="clients at once in the chaos phase")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--request-timeout", type=float, default=5.0, help="a client's timeout per try (s)")
    parser.add_argument("--guard-s", type=float, default=300.0, help="the longest a phase may take")
    parser.add_argument("--threads", type=int, default=1, help="each replica's torch threads")
    parser.add_argument("--model", type=Path, default=None, help="a model file (default: the README's synthetic one)")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "chaos")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout the replicas run (default: this one)")
    args = parser.parse_args(argv)

    from gru4rec import GRU4Rec

    model_path = args.model or build_model(args.work)
    model = GRU4Rec.load(model_path, device="cpu")
    folder = Path(tempfile.mkdtemp(prefix="gru4rec-chaos-"))
    redis = Redis(folder)
    replicas: list[Replica] = []
    failed = False
    try:
        redis.start()
        replicas = [Replica(model_path, redis.url, args.code, args.threads) for _ in range(2)]
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_healthy()
        if "race" in args.phases:
            line = asyncio.run(race([r.url for r in replicas], model, args.race_sessions, args.k, args.seed))
            failed |= line["neither_order"] > 0
            print(json.dumps(line), flush=True)
        if "chaos" in args.phases:
            line = asyncio.run(chaos(replicas, redis, model, args))
            failed |= line["lost_or_doubled"] > 0
            print(json.dumps(line), flush=True)
    finally:
        for replica in replicas:
            replica.stop()
        redis.kill()
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
