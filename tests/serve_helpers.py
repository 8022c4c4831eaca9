"""Shared by the serving tests (tests/test_serve_*.py): small trained models, a real
``redis-server`` on a free loopback port (plain, or TLS only with certificates made here by the
``openssl`` command), and a real uvicorn server in a thread.

Every server listens on 127.0.0.1 only and is stopped at the end of its ``with`` block or
fixture, also when the test fails.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi", reason="the serving tests need the serve extra: pip install 'gru4rec[serve]'")
httpx = pytest.importorskip("httpx", reason="the serving tests need httpx")
uvicorn = pytest.importorskip("uvicorn", reason="the serving tests need uvicorn")

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.datasets.synthetic import generate  # noqa: E402

REDIS_SERVER = os.environ.get("GRU4REC_TEST_REDIS_SERVER") or shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)

#: Two layers, so that the state kept between clicks is more than the last layer's output.
SMALL = "layers=24/16,batch_size=16,n_sample=32,n_epochs=1,sample_store_size=2000,dropout_p_hidden=0.0"


def train_small(n_items: int = 300, seed: int = 1, *, string_ids: bool = False, id_prefix: str = "item-") -> GRU4Rec:
    """A GRU4Rec trained for one epoch on synthetic sessions (a second on one thread); with
    ``string_ids`` its ids are strings, ``id_prefix`` and the synthetic integer id."""
    events = generate(n_sessions=400, n_items=n_items, seed=seed)
    if string_ids:
        events["ItemId"] = id_prefix + events["ItemId"].astype(str)
    return GRU4Rec(SMALL, device="cpu").fit(events, progress=False)


def recommend(model: GRU4Rec, items: list[Any], k: int, exclude_seen: bool = False) -> tuple[list[Any], list[float] | None]:
    """``GRU4Rec.recommend`` as the server answers it: ids, and scores (None for the fallback)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown items are expected in these sessions
        recs = model.recommend(items, k=k, exclude_seen=exclude_seen)
    if recs.fallback:  # popular items, no model scores (NaN in the Python API)
        return recs.item_ids.tolist(), None
    finite = np.isfinite(recs.scores)  # exclude_seen leaves -inf where fewer than k items remain
    return recs.item_ids[finite].tolist(), recs.scores[finite].tolist()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


OPENSSL = shutil.which("openssl")

#: The extensions of the test certificates: what Python's ssl module (and redis-server's OpenSSL)
#: accept from a real CA — key identifiers, key usage, the server's address as a subjectAltName.
_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = IP:127.0.0.1, DNS:localhost
[misnamed]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = DNS:another-host.invalid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


@dataclass(frozen=True)
class TlsFiles:
    """Certificates and keys (PEM files) for a TLS Redis, made by :func:`make_tls_files`.

    ``ca`` is the authority the client trusts; ``server``/``client`` are signed by it (the
    server's for 127.0.0.1 and localhost); ``rogue`` is a server certificate for 127.0.0.1 signed
    by another authority, ``misnamed`` one signed by ``ca`` for another host. Each pair is
    (certificate, key)."""

    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    rogue: tuple[Path, Path]
    misnamed: tuple[Path, Path]


def make_tls_files(directory: Path) -> TlsFiles:
    """Make a test CA and the certificates of :class:`TlsFiles` in ``directory`` with the
    ``openssl`` command (P-256 keys, valid two days); skips without it."""
    if OPENSSL is None:
        pytest.skip("the Redis TLS tests make their certificates with the openssl command, which is not installed")
    config = directory / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)
    key_options = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        done = subprocess.run([OPENSSL, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")

    def authority(name: str) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        run("req", "-config", str(config), "-x509", "-new", *key_options, "-keyout", str(key), "-out", str(cert),
            "-days", "2", "-subj", f"/CN=gru4rec test {name}", "-extensions", "ca")
        return cert, key

    def signed(name: str, by: tuple[Path, Path], extensions: str, serial: int) -> tuple[Path, Path]:
        cert, key, request = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
        run("req", "-config", str(config), "-new", *key_options, "-keyout", str(key), "-out", str(request),
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", str(request), "-CA", str(by[0]), "-CAkey", str(by[1]), "-set_serial", str(serial),
            "-days", "2", "-out", str(cert), "-extfile", str(config), "-extensions", extensions)
        return cert, key

    ca, other_ca = authority("ca"), authority("other-ca")
    return TlsFiles(ca=ca[0], server=signed("server", ca, "server", 2), client=signed("client", ca, "client", 3),
                    rogue=signed("rogue", other_ca, "server", 4), misnamed=signed("misnamed", ca, "misnamed", 5))


def tls_query(tls: TlsFiles, *, ca: bool = True, client: bool = True, **more: str) -> str:
    """The query of a ``rediss://`` URL as a user writes it: the CA to check the server with
    (``ssl_ca_certs``) and this client's certificate (``ssl_certfile``/``ssl_keyfile``)."""
    params: dict[str, str] = {}
    if ca:
        params.update(ssl_cert_reqs="required", ssl_ca_certs=str(tls.ca))
    if client:
        params.update(ssl_certfile=str(tls.client[0]), ssl_keyfile=str(tls.client[1]))
    params.update(more)
    return urlencode(params, safe="/")


class RedisProcess:
    """A real redis-server on a loopback port in ``directory``: with ``password`` it requires
    one, with ``aof`` it keeps an append-only file fsynced on every write, so that a restart
    (:meth:`kill` then :meth:`start`, same port and folder) comes back with every write.

    With ``tls`` it speaks TLS only (``--port 0``) with the certificate ``tls_as`` of the files
    (``server``, ``rogue``, ``misnamed``: :class:`TlsFiles`) and requires a client certificate
    signed by their CA (Redis's default, ``tls-auth-clients yes``); it skips the test when this
    redis-server was built without TLS."""

    def __init__(self, directory: Path, *, password: str | None = None, aof: bool = False,
                 tls: TlsFiles | None = None, tls_as: str = "server") -> None:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
        self.directory, self.password, self.aof, self.tls, self.tls_as = directory, password, aof, tls, tls_as
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        auth = ["--requirepass", self.password] if self.password else []
        ports = ["--port", str(self.port)]
        client_tls: dict[str, Any] = {}
        if self.tls is not None:
            cert, key = getattr(self.tls, self.tls_as)
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                     "--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "yes"]
            # Only to see it answer: the tests check the server's certificate themselves.
            client_tls = {"ssl": True, "ssl_cert_reqs": "none", "ssl_certfile": str(self.tls.client[0]),
                          "ssl_keyfile": str(self.tls.client[1])}
        log = self.directory / f"redis-{self.port}.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [REDIS_SERVER, *ports, "--bind", "127.0.0.1", "--save", "", *persistence, *auth,
                 "--dir", str(self.directory)], stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **client_tls)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    said = log.read_text(errors="replace").strip().splitlines()[-3:]
                    if self.tls is not None and self.proc.poll() is not None and any("tls" in line.lower() for line in said):
                        pytest.skip(f"this redis-server cannot serve TLS: {' / '.join(said)}")
                    raise RuntimeError(f"redis-server did not start (exit code {self.proc.poll()}): {' / '.join(said)}") from None
                time.sleep(0.05)
            except redis.ResponseError:  # loading its append-only file
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        """``kill -9``: no shutdown, nothing saved but what the append-only file holds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def redis_process(tmp_path: Path, *, password: str | None = None, aof: bool = False,
                  tls: TlsFiles | None = None, tls_as: str = "server") -> Iterator[RedisProcess]:
    """A started :class:`RedisProcess`, stopped on exit."""
    server = RedisProcess(tmp_path, password=password, aof=aof, tls=tls, tls_as=tls_as)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def redis_server(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on a free loopback port (no persistence), stopped on exit; its URL."""
    with redis_process(tmp_path) as server:
        yield server.url


torch.set_num_threads(1)
