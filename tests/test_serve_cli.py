"""``gru4rec serve`` / ``python -m gru4rec serve`` and ``uvicorn --factory gru4rec.serve:create_app``
as real processes: the printed URL answers as ``GRU4Rec.recommend`` does, the activity line is
logged, SIGTERM and SIGINT stop the server with exit code 0; bad flags, a missing model and a
taken port are one-line errors."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.cli import main  # noqa: E402
from serve_helpers import free_port, httpx, recommend, train_small  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    model = train_small(seed=3)
    path = tmp_path_factory.mktemp("serve_cli") / "model.pt"
    model.save(path)
    return model, path


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)


def stop(proc: subprocess.Popen[str], sig: int) -> tuple[int, str, str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.communicate()[1][-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("the server did not come up")


@pytest.fixture(name="processes")
def processes_fixture() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:  # whatever the test did: no server outlives it
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("entry,sig", [(["-m", "gru4rec"], signal.SIGTERM), (["-m", "gru4rec.cli"], signal.SIGINT)])
def test_the_serve_command(model_file: tuple[GRU4Rec, Path], processes: list, entry: list[str], sig: int) -> None:
    model, path = model_file
    proc = start([*entry, "serve", str(path), "--port", "0", "--device", "cpu", "--log-interval", "0.3"], environment())
    processes.append(proc)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.startswith(f"Serving {path} at http://127.0.0.1:"), line
    url = line.split(" at ")[1].split()[0]
    wait_healthy(url, proc)
    ids = model.item_map.to_list()
    body = httpx.post(url + "/v1/recommend", json={"items": [ids[4], ids[8]], "k": 5}).json()
    assert body["items"] == recommend(model, [ids[4], ids[8]], 5)[0]
    time.sleep(0.8)  # at least one activity line
    code, _, err = stop(proc, sig)
    assert code == 0, err
    assert f"Received {signal.Signals(sig).name}, shutting down" in err and f"Stopped serving {path}" in err
    assert "requests in the last 0 s" in err and "sessions held" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("target", [["--factory", "gru4rec.serve:create_app"], ["gru4rec.serve:app"]])
def test_uvicorn_runs_the_app_from_environment_variables(model_file: tuple[GRU4Rec, Path], processes: list, target: list[str]) -> None:
    model, path = model_file
    port = free_port()
    env = environment(GRU4REC_MODEL=str(path), GRU4REC_DEVICE="cpu", GRU4REC_MAX_BATCH="16")
    proc = start(["-m", "uvicorn", *target, "--host", "127.0.0.1", "--port", str(port)], env)
    processes.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    assert httpx.get(url + "/v1/model").json()["max_batch"] == 16
    ids = model.item_map.to_list()
    body = httpx.post(url + "/v1/sessions/a/events", json={"item": ids[9], "k": 4}).json()
    assert body["items"] == recommend(model, [ids[9]], 4)[0] and body["new_session"] is True
    code, _, err = stop(proc, signal.SIGTERM)
    assert "Traceback" not in err


def test_serve_errors_are_one_line(model_file: tuple[GRU4Rec, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, path = model_file
    assert main(["serve", str(tmp_path / "missing.pt")]) == 1
    assert capsys.readouterr().err.strip() == f"gru4rec: error: model file not found: {tmp_path / 'missing.pt'}"
    assert main(["serve", str(path), "--max-batch", "0"]) == 2
    assert "argument --max-batch: expected a positive integer, got '0'" in capsys.readouterr().err
    assert main(["serve", str(path), "--state", "mysql://x"]) == 2
    assert capsys.readouterr().err.strip().endswith("state must be 'memory' or a redis:// URL, got 'mysql://x'")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", str(path), "--port", str(port)]) == 1
    assert capsys.readouterr().err.strip() == f"gru4rec: error: cannot listen on 127.0.0.1:{port}: the port is in use"
    assert main(["serve", str(path), "--port", "0", "--state", f"redis://127.0.0.1:{free_port()}/0"]) == 1
    assert "failed on PING" in capsys.readouterr().err


def test_create_app_without_a_model_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from gru4rec.errors import ConfigError, Gru4RecError
    from gru4rec.serve import create_app
    from gru4rec.serve.settings import ServeSettings

    monkeypatch.delenv("GRU4REC_MODEL", raising=False)
    with pytest.raises(Gru4RecError, match="set GRU4REC_MODEL to a model file"):
        create_app()
    with pytest.raises(ConfigError, match=r"GRU4REC_MAX_BATCH='many' is not a number"):
        ServeSettings.from_env({"GRU4REC_MAX_BATCH": "many"})
    with pytest.raises(ConfigError, match=r"max_batch must be at least 1, got 0; scoring must be one of auto, float32, int8"):
        ServeSettings.from_env({"GRU4REC_MAX_BATCH": "0", "GRU4REC_SCORING": "fast"})
    assert ServeSettings.from_env({"GRU4REC_SESSION_TTL_S": "5", "GRU4REC_THREADS": "2"}) == ServeSettings(session_ttl_s=5.0, threads=2)
