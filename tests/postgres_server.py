"""A real PostgreSQL server for the tests: ``initdb`` into a temporary folder, started with
``pg_ctl`` on a free loopback port (and a Unix socket in the same folder), stopped at teardown —
also when a test fails.

PostgreSQL refuses to run as root, and CI runs the tests as root: then the server binaries run as
the unprivileged user ``gru4rec_pg`` (``runuser -u gru4rec_pg --``), created here if it does not
exist and creating it works. Where no server can be had (no binaries, no psycopg, no such user)
the fixture skips with the reason. :func:`temporary_postgres` is the same server for scripts
(``benchmarks/pipeline/paropt_scale.py``).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The unprivileged user that runs the server when the tests run as root.
SERVER_USER = "gru4rec_pg"


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started here; the message says why."""


def _bin_dir() -> Path | None:
    """Where pg_ctl and initdb are: $GRU4REC_TEST_PG_BIN, the newest /usr/lib/postgresql/*/bin, or PATH."""
    if os.environ.get("GRU4REC_TEST_PG_BIN"):
        given = Path(os.environ["GRU4REC_TEST_PG_BIN"])
        return given if (given / "pg_ctl").is_file() and (given / "initdb").is_file() else None
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                        if Path(p).parent.name.isdigit() else 0)
    for folder in reversed(candidates):
        if (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as_prefix() -> tuple[list[str], str | None]:
    """The command prefix that runs the server binaries unprivileged, and the user (None: us)."""
    if os.geteuid() != 0:
        return [], None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER],
            capture_output=True, text=True,
        )
        if created.returncode != 0:
            raise PostgresUnavailable(f"PostgreSQL cannot run as root and creating the user {SERVER_USER} failed: "
                                      f"{created.stderr.strip() or created.returncode}") from None
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", SERVER_USER, "--"], SERVER_USER
    setpriv = shutil.which("setpriv")
    if setpriv:
        user = pwd.getpwnam(SERVER_USER)
        return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"], SERVER_USER
    raise PostgresUnavailable("PostgreSQL cannot run as root and neither runuser nor setpriv is installed")


@dataclass
class PostgresServer:
    """A running server; :meth:`new_database` gives each test a database of its own."""

    port: int
    socket_dir: Path
    superuser: str = "postgres"

    def url(self, database: str, *, password: str | None = None) -> str:
        """A SQLAlchemy URL of ``database`` over TCP (the server trusts loopback connections, so
        any ``password`` is accepted: it tests that printed URLs hide it)."""
        auth = self.superuser + (f":{password}" if password is not None else "")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Create an empty database; returns its name."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.superuser, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return name


@contextmanager
def temporary_postgres(*, fsync: bool = False) -> Iterator[PostgresServer]:
    """Start a server in a temporary folder, yield it, stop it and remove the folder (also on an
    error); raises :class:`PostgresUnavailable` when none can run here. ``fsync=False`` (tests)
    skips flushing commits to disk; a benchmark keeps it as a real server has it."""
    try:
        import psycopg  # noqa: F401 - new_database() needs it
    except ImportError:
        raise PostgresUnavailable("the PostgreSQL tests need psycopg (pip install 'psycopg[binary]')") from None
    bin_dir = _bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; set GRU4REC_TEST_PG_BIN")
    prefix, user = _run_as_prefix()
    folder = Path(tempfile.mkdtemp(prefix="gru4rec-pg-"))
    data = folder / "data"
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"

    def server(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=folder)

    started = False
    try:
        init = server(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {(init.stderr or init.stdout).strip()[-300:]}")
        for _attempt in range(3):  # the free port can be taken between choosing and binding it
            port = _free_port()
            options = (f"-k {folder} -p {port} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'} "
                       "-c max_connections=60")
            start = server(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-o", options,
                           "-w", "-t", "60", "start")
            if start.returncode == 0:
                started = True
                break
        if not started:
            log = (folder / "server.log").read_text(errors="replace")[-500:] if (folder / "server.log").exists() else ""
            raise PostgresUnavailable(f"pg_ctl start failed: {(start.stderr or start.stdout).strip()[-300:]} {log}")
        yield PostgresServer(port=port, socket_dir=folder)
    finally:
        if started:
            server(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", name="postgres")
def postgres_fixture() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the whole test session (skips with the reason when none can run)."""
    try:
        with temporary_postgres() as server:
            yield server
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
