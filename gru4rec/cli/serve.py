"""``gru4rec serve MODEL``: the HTTP service (:mod:`gru4rec.serve`) on uvicorn, until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from gru4rec.cli.common import DEVICE_FLAG, EXIT_OK, Flag, add_flags, flag, positive_int
from gru4rec.cli.console import result
from gru4rec.errors import Gru4RecError
from gru4rec.serve.settings import ServeSettings

__all__ = ["DESCRIPTION", "FLAGS", "ServeCommand", "add_arguments", "run"]

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Serve next-item recommendations over HTTP (FastAPI on uvicorn).\n\n"
    "  POST /v1/recommend                  {\"items\": [...], \"k\": 20, \"exclude_seen\": false}\n"
    "  POST /v1/sessions/ID/events         {\"item\": ..., \"k\": 20, \"seq\": n}  (state kept on the server;\n"
    "                                      seq, optional: the click's position, makes a retry safe)\n"
    "  DELETE /v1/sessions/ID              end a session\n"
    "  GET /healthz, /v1/model, /metrics   health, the model, Prometheus metrics\n\n"
    "Prints the URL, logs one line per minute (requests, p50/p99, sessions held) and stops\n"
    "cleanly on Ctrl-C or SIGTERM. On SIGHUP (or with --watch, when MODEL is replaced) it loads\n"
    "MODEL again, checks it and switches to it between two batches; a file that fails the\n"
    "checks is refused with a log line. Needs the serve extra: pip install 'gru4rec[serve]'.\n\n"
    "Access: with an access token in GRU4REC_TOKEN or a file (--token-file), the /v1 routes need\n"
    "'Authorization: Bearer TOKEN' (401 without it); /healthz and /metrics stay open. An address\n"
    "other than loopback without a token is refused unless --insecure says so."
)


_SCORING = "scoring (every choice gives the same answers)"
_LIMITS = "limits and resources"


def _nonnegative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return value


#: The flags of the server's settings (:class:`~gru4rec.serve.settings.ServeSettings`, a class of
#: the library, which never imports the command line), by field name: each field's name, type and
#: default are the flag's; ``token`` is no flag (GRU4REC_TOKEN only: a command line is public).
FLAGS: dict[str, Flag | None] = {
    "model": Flag((), "a model file saved by train --save", metavar="MODEL"),
    "watch_s": Flag(("--watch",), "reload MODEL when the file is replaced (checked every SECONDS, default 1); "
                    "without it, reload on SIGHUP only", type=_nonnegative_float, nargs="?", const=1.0, metavar="SECONDS"),
    "device": DEVICE_FLAG,
    "state": Flag(("--state",), "where sessions live: in this process (default) or in Redis, shared by replicas "
                  "(redis://:PASSWORD@HOST:PORT/DB, rediss:// for TLS); also GRU4REC_STATE, which keeps a "
                  "password out of the process list", metavar="memory|redis://HOST:PORT/DB"),
    "token": None,
    "token_file": Flag(("--token-file",), "a file whose first line is the access token the /v1 routes require as "
                       "'Authorization: Bearer TOKEN' (or set GRU4REC_TOKEN; never the token itself on the command line)",
                       metavar="PATH", group="access"),
    "max_sessions": Flag(("--max-sessions",), "memory store: sessions held at most, least recently used out first "
                         "(default: 1000000)", type=positive_int, group="sessions"),
    "session_ttl_s": Flag(("--session-ttl",), "a session is dropped this long after its last click (default: 1800)",
                          type=_nonnegative_float, metavar="SECONDS", group="sessions"),
    "max_batch": Flag(("--max-batch",), "most requests in one batch; 1 turns batching off (default: 64)",
                      type=positive_int, group="micro-batching"),
    "batch_window_ms": Flag(("--batch-window-ms",), "how long a batch waits for more requests after its first "
                            "(default: 0, it takes what arrived while the previous batch ran)",
                            type=_nonnegative_float, group="micro-batching"),
    "max_queue": Flag(("--max-queue",), "requests waiting beyond this get 503 (default: 4096)", type=positive_int,
                      group="micro-batching"),
    "scoring": Flag(("--scoring",), "auto: int8 candidates with a certified exact top-k on the CPU, float32 on a GPU "
                    "(default: auto)", choices=("auto", "float32", "int8"), group=_SCORING),
    "candidates": Flag(("--candidates",), "int8 candidates per row (default: 128)", type=positive_int, group=_SCORING),
    "int8_max_batch": Flag(("--int8-max-batch",), "batches larger than this are scored in float32 (default: 64)",
                           type=positive_int, group=_SCORING),
    "max_body_bytes": Flag(("--max-body-bytes",), "larger request bodies get 413 (default: 65536)", type=positive_int,
                           group=_LIMITS),
    "max_items": Flag(("--max-items",), "most items in one stateless request (default: 1000)", type=positive_int,
                      group=_LIMITS),
    "threads": Flag(("--threads",), "torch threads, exactly (default: chosen while serving between 1 and torch's count, "
                    "from the batches' times)", type=positive_int, group=_LIMITS),
    "log_interval_s": Flag(("--log-interval",), "seconds between activity lines (default: 60)", type=float,
                           metavar="SECONDS", group=_LIMITS),
}


@dataclass(frozen=True)
class ServeCommand(ServeSettings):
    """The settings of ``gru4rec serve``: the server's (:data:`FLAGS`) and where it listens."""

    host: str = flag("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    port: int = flag("--port", default=8000, type=_port, help="port (default: 8000; 0 picks a free one)")
    insecure: bool = flag("--insecure", default=False, action="store_true", group="access",
                          help="listen on an address other than loopback without an access token (anyone who reaches "
                               "the port can read, change and delete every session)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``gru4rec serve`` (:class:`ServeCommand`)."""
    add_flags(parser, ServeCommand, FLAGS)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int, *, open_to_all: bool) -> socket.socket:
    """The listening socket, bound before the server starts (so the URL printed is the real one).
    An address other than loopback is refused unless ``open_to_all`` (a token, or --insecure)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Gru4RecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    if not open_to_all and not _is_loopback(str(address[0])):
        raise Gru4RecError(
            f"--host {host} listens beyond this machine without an access token: anyone who reaches the port could "
            "read, change and delete every session. Set GRU4REC_TOKEN or --token-file FILE (the /v1 routes then need "
            "'Authorization: Bearer TOKEN'), or pass --insecure if something in front of the server checks access")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise Gru4RecError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.listen(2048)
    return sock


def run(args: ServeCommand) -> int:
    """Run ``gru4rec serve``: load the model, listen, serve until a signal."""
    try:
        import uvicorn

        from gru4rec.serve.app import create_app
    except ImportError as exc:
        raise ImportError(f"gru4rec serve needs fastapi and uvicorn ({exc}): pip install 'gru4rec[serve]'") from exc

    if args.model is None or not os.path.exists(args.model):
        raise FileNotFoundError(2, "model file not found", args.model)
    # The server's own settings (not where it listens), with what the environment adds.
    settings = ServeSettings(**{f.name: getattr(args, f.name) for f in fields(ServeSettings)}).replace(
        state=_state(args.state), token=os.environ.get("GRU4REC_TOKEN") or None)
    token = settings.access_token()  # a bad token file fails before the port is taken
    sock = _listen(args.host, args.port, open_to_all=bool(token) or args.insecure)  # a taken port fails before the model loads
    try:
        app = create_app(args.model, settings)
    except ValueError as exc:  # e.g. --scoring int8 where it cannot run
        sock.close()
        raise Gru4RecError(str(exc)) from exc
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = _server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    result(f"Serving {args.model} at http://{shown}:{port} (Ctrl-C to stop)")
    server.run(sockets=[sock])
    log.info("Stopped serving %s", args.model)
    return EXIT_OK


def _state(flag: str) -> str:
    """``--state``, or ``GRU4REC_STATE`` when the flag keeps its default (a Redis password in
    the environment stays out of ``ps``)."""
    if flag != "memory":
        return flag
    return os.environ.get("GRU4REC_STATE") or flag


def _server(config: Any) -> Any:
    """uvicorn's server, stopping on SIGINT/SIGTERM with exit code 0 (uvicorn itself re-raises
    the signal after its graceful shutdown, which would end the process by the signal)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield  # signals can only be handled on the main thread
                return

            def stop(signum: int, frame: Any) -> None:
                if self.should_exit:  # a second signal: do not wait for open connections
                    self.force_exit = True
                self.should_exit = True
                log.info("Received %s, shutting down", signal.Signals(signum).name)

            previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)
