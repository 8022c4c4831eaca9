"""The HTTP service: a FastAPI app over one model, its session store and its micro-batcher.

Routes (every error is ``{"error": "one line"}`` with a 4xx status, or 503 when the server
cannot take the request now; see the README's "Serve it" section):

* ``POST /v1/recommend`` ``{"items": [...], "k": 20, "exclude_seen": false}`` — stateless: the
  session's clicks so far, oldest first;
* ``POST /v1/sessions/{session_id}/events`` ``{"item": ..., "k": 20, "exclude_seen": false,
  "seq": n}`` — one click; the session's state stays on the server (``"new_session": true`` when
  it was not held: a new, evicted or expired session starts fresh). With ``seq`` (the click's
  position, 1 for the first) a retry is safe: the session's last click sent again gets the same
  answer without a step, a position out of line a 409 with ``"expected_seq"``;
* ``DELETE /v1/sessions/{session_id}`` — end a session;
* ``GET /healthz``, ``GET /v1/model``, ``GET /metrics`` (Prometheus text format).

Answers: ``{"items": [...], "scores": [...], "unknown": [...], "fallback": false}``; a session
without a known item gets the most popular items with ``"fallback": true`` and
``"scores": null``. They equal ``GRU4Rec.recommend`` on the same clicks. An id sent as a string
of digits is the item of a catalogue of integer ids (and an integer the string id of a catalogue
of strings: :func:`~gru4rec.serve.schema.catalogue_ids`); a session whose every click is an
unknown id is counted (``gru4rec_serve_unknown_sessions_total``) and logged at WARNING, once per
log interval.

With an access token (:attr:`ServeSettings.token` / ``token_file``) the ``/v1`` routes need
``Authorization: Bearer TOKEN`` (:class:`~gru4rec.serve.middleware.BearerToken`).

A model served from a file is reloaded on SIGHUP, and with ``watch_s`` when the file is
replaced (:mod:`gru4rec.serve.reload`): the routes always use the batcher's current engine.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import signal
import time
import weakref
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gru4rec.errors import Gru4RecError
from gru4rec.inference import Answer, Engine
from gru4rec.machine.threads import online_choice
from gru4rec.recommender import GRU4Rec
from gru4rec.serve.batcher import Job, JobResult, MicroBatcher, Overloaded, SeqMismatch, ShuttingDown, StateConflict
from gru4rec.serve.metrics import CONTENT_TYPE, ServeMetrics
from gru4rec.serve.middleware import BearerToken, BodyLimit, RequestMetrics
from gru4rec.serve.reload import ModelReloader, read_model_file
from gru4rec.serve.schema import ApiError, IdKind, catalogue_ids, check_session_id, id_kind, parse_event, parse_json, parse_recommend
from gru4rec.serve.settings import ServeSettings
from gru4rec.serve.state import StoreUnavailable, open_store

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException
    from starlette.routing import Match, Route
except ImportError as exc:  # pragma: no cover - the serve extra installs it
    raise ImportError("gru4rec serve needs fastapi and uvicorn: pip install 'gru4rec[serve]'") from exc

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _weights_digest(model: GRU4Rec) -> str:
    """A checksum of a model that has no file: its weights and item ids (the catalogue's: with
    item attributes, a new cold item changes the model served)."""
    net, item_map = model.net, model.catalogue
    assert net is not None and item_map is not None  # the app serves fitted models only
    digest = hashlib.sha256()
    for name, tensor in sorted(net.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(repr(item_map.to_list()).encode())
    return digest.hexdigest()


def _answer(engine: Engine, answer: Answer, unknown: list[Any]) -> dict[str, Any]:
    ids = engine.item_ids
    return {
        "items": [ids[i] for i in answer.items.tolist()],
        "scores": None if answer.scores is None else answer.scores.tolist(),
        "unknown": unknown,
        "fallback": answer.fallback,
    }


_KIND_WORDS = {"int": "integers", "str": "strings", "mixed": "integers and strings"}


def _catalogue_words(engine: Engine, kind: IdKind) -> str:
    """What a model's item ids look like, for the warning about unknown ids."""
    ids = engine.item_ids
    return f"{_KIND_WORDS[kind]} such as {ids[0]!r:.40}" if ids else _KIND_WORDS[kind]


def _repeat_boost(engine: Engine) -> dict[str, float] | None:
    """The model's repeat-aware scoring (its config's ``repeat_weight``/``repeat_decay``), or
    None when it has none (weight 0, or a model without the fields)."""
    config = engine.model.config
    weight = float(getattr(config, "repeat_weight", 0.0) or 0.0)
    if weight <= 0:
        return None
    return {"weight": weight, "decay": float(getattr(config, "repeat_decay", 1.0))}


def _boost_text(engine: Engine) -> str:
    boost = _repeat_boost(engine)
    return "" if boost is None else f", repeat boost weight {boost['weight']:g} decay {boost['decay']:g}"


class _Route(Route):
    """A plain Starlette route that puts itself in the request's scope as FastAPI's routes do, so
    that the request metrics count it by its template."""

    def matches(self, scope: Any) -> tuple[Match, MutableMapping[str, Any]]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


def freeze_startup_objects() -> None:
    """Move every object alive now (the imported libraries, the model, the item map: ~235,000 at
    the DIGINETICA size) out of the garbage collector's reach. A full collection otherwise scans
    them all — about 100 ms, every few thousand requests — and every request in flight waits for
    it: that was the whole p99 tail under load. Requests allocate little that lives on, so what
    is collected afterwards stays small."""
    gc.collect()
    gc.freeze()


def create_app(model: str | os.PathLike[str] | GRU4Rec | None = None, settings: ServeSettings | None = None) -> FastAPI:
    """The app for ``model`` (a model file or a loaded ``GRU4Rec``) with ``settings``.

    Without arguments — as ``uvicorn --factory gru4rec.serve:create_app`` calls it — everything
    comes from ``GRU4REC_*`` environment variables (``GRU4REC_MODEL`` is the model file), see
    :class:`ServeSettings`. The model is loaded here, so that a bad file fails at start-up.
    """
    settings = settings if settings is not None else ServeSettings.from_env()
    token = settings.access_token()  # first: a bad token file fails before the model loads
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    if model is None:
        if settings.model is None:
            raise Gru4RecError("no model to serve: give create_app(model=...) or set GRU4REC_MODEL to a model file")
        model = settings.model
    # Each engine's kind of ids (int, str), found once when it is built, not on a request.
    kinds: weakref.WeakKeyDictionary[Engine, IdKind] = weakref.WeakKeyDictionary()

    def engine_for(loaded: GRU4Rec, checksum: str, file: str | None) -> Engine:
        built = Engine(loaded, scoring=settings.scoring, candidates=settings.candidates, int8_max_batch=settings.int8_max_batch,
                       checksum=checksum, file=file)
        kinds[built] = id_kind(built.catalogue.ids)
        return built

    def as_read(engine: Engine, ids: list[Any]) -> list[Any]:
        """``ids`` read as the catalogue's ids (integers or strings)."""
        return catalogue_ids(ids, kinds.get(engine) or kinds.setdefault(engine, id_kind(engine.catalogue.ids)))

    def index_of(engine: Engine, ids: list[Any]) -> tuple[np.ndarray, list[Any]]:
        """The known item indices of ``ids`` read as the catalogue's ids, and the unknown ids as sent."""
        read = as_read(engine, ids)
        known, unknown = engine.index_of(read)
        if unknown and read != ids:  # name the unknown ones as the client sent them
            missing = set(unknown)
            unknown = [sent for sent, as_read in zip(ids, read) if as_read in missing]
        return known, unknown

    def known_times(engine: Engine, ids: list[Any], times: list[float] | None, n_known: int) -> np.ndarray:
        """The times of the ``n_known`` known ones of ``ids`` (as :func:`index_of` keeps them):
        ``times``' entries, or the clock at the request's arrival for every click when it has none."""
        if times is None:
            return np.full(n_known, time.time())
        return np.asarray(times, dtype=np.float64)[engine.known(as_read(engine, ids))]

    if isinstance(model, GRU4Rec):
        loaded, model_file, checksum = model, None, _weights_digest(model)
    else:
        model_file = Path(model)
        loaded, checksum = read_model_file(model_file, settings.device)
    engine = engine_for(loaded, checksum, None if model_file is None else str(model_file))
    store = open_store(settings.state, max_sessions=settings.max_sessions, ttl_s=settings.session_ttl_s, namespace=checksum[:16])
    metrics = ServeMetrics(store.size, lambda: dict(store.evictions), lambda: dict(batcher.engine.topk.counts),
                           lambda: dict(batcher.counts))
    threads = None  # --threads fixes the count; else the worker chooses it from the batches' times (gru4rec/machine/threads.py)
    if settings.threads is None and engine.device.type == "cpu":
        threads = online_choice("serving", trial_steps=50, warmup_steps=2)
    batcher = MicroBatcher(engine, store, max_batch=settings.max_batch, window_s=settings.batch_window_ms / 1000,
                           max_queue=settings.max_queue, on_batch=metrics.batch_size.observe, threads=threads)
    reloader = ModelReloader(model_file, batcher, settings, engine_for) if model_file is not None else None
    log.info("Serving %s: %d items, layers %s, on %s, scoring %s%s, sessions in %s%s", model_file or "a model in memory",
             engine.n_items, engine.sizes, engine.device, engine.topk.name, _boost_text(engine), store.kind,
             ", access token required on /v1" if token else "")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        freeze_startup_objects()
        batcher.start()
        if reloader is not None:
            try:  # only where signals can be had: the main thread's loop, not Windows
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.request)
            except (AttributeError, NotImplementedError, RuntimeError, ValueError):
                log.debug("no SIGHUP handler here: reload with the watch (watch_s) instead")
            if settings.watch_s > 0:
                reloader.start_watching(settings.watch_s)

        async def log_activity() -> None:
            while True:
                await asyncio.sleep(settings.log_interval_s)
                log.info("%s", metrics.activity_line(settings.log_interval_s))
                engine = batcher.engine
                unknown_line = metrics.unknown_line(settings.log_interval_s, _catalogue_words(engine, kinds.get(engine, "mixed")))
                if unknown_line is not None:
                    log.warning("%s", unknown_line)
                if reloader is not None and reloader.stale is not None:
                    log.warning("Stale model file: %s. The server keeps serving sha256 %s from memory, but a restart "
                                "would load the file on disk: put a good model file in its place (docs/serving.md)",
                                reloader.stale, batcher.engine.checksum[:12])

        task = asyncio.create_task(log_activity())
        try:
            yield
        finally:
            task.cancel()
            if reloader is not None:
                reloader.stop()
                with contextlib.suppress(AttributeError, NotImplementedError, RuntimeError, ValueError):
                    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            batcher.stop()
            store.close()

    app = FastAPI(title="gru4rec", summary="GRU4Rec next-item recommendations for live sessions",
                  lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store, app.state.batcher, app.state.settings, app.state.reloader = store, batcher, settings, reloader

    async def run(job: Job) -> JobResult:
        try:
            future = batcher.submit(job)
        except (Overloaded, ShuttingDown) as exc:
            raise ApiError(503, str(exc)) from None
        try:
            return await asyncio.wrap_future(future)
        except (StoreUnavailable, ShuttingDown, StateConflict) as exc:
            raise ApiError(503, str(exc)) from None
        except SeqMismatch as exc:
            raise ApiError(409, str(exc), expected_seq=exc.expected) from None

    # The three per-click routes are plain Starlette routes of the FastAPI app: they read their
    # own body, so FastAPI's per-request dependency solving would only cost time (~40 % of the
    # app's own time per request, measured). Middleware and error handlers apply as to any route.
    async def recommend(request: Request) -> JSONResponse:
        engine = batcher.engine  # the model now; the batch may run on a newer one (Job.engine)
        body = parse_recommend(parse_json(await request.body()), n_items=engine.n_items, max_items=settings.max_items)
        known, unknown = index_of(engine, body.items)
        times = known_times(engine, body.items, body.times, len(known)) if engine.click_context else None
        result = await run(Job("recommend", None, known, body.k, body.exclude_seen, engine=engine, times=times))
        assert result.answer is not None and result.engine is not None
        if result.answer.fallback:
            metrics.fallbacks.inc()
            if body.items:  # clicks, none of them known: not an empty session
                metrics.unknown_session("recommend", unknown)
        return JSONResponse(_answer(result.engine, result.answer, unknown))

    async def event(request: Request) -> JSONResponse:
        session_id = check_session_id(request.path_params["session_id"])
        engine = batcher.engine
        body = parse_event(parse_json(await request.body()), n_items=engine.n_items)
        known, unknown = index_of(engine, [body.item])
        # The click's time: its own, else the clock at its arrival (a model with click context reads it).
        times = np.full(len(known), time.time() if body.time is None else body.time) if engine.click_context else None
        result = await run(Job("event", session_id, known, body.k, body.exclude_seen, engine=engine, seq=body.seq, times=times))
        assert result.answer is not None and result.engine is not None
        if result.answer.fallback and not result.replayed:  # an event's session has a click: all of them unknown
            metrics.fallbacks.inc()
            metrics.unknown_session("event", unknown)
        payload = _answer(result.engine, result.answer, unknown)
        payload.update(session_id=session_id, new_session=result.new_session)
        if body.seq is not None:
            payload["seq"] = body.seq
        return JSONResponse(payload)

    async def end_session(request: Request) -> JSONResponse:
        session_id = check_session_id(request.path_params["session_id"])
        result = await run(Job("delete", session_id))
        return JSONResponse({"session_id": session_id, "deleted": result.existed})

    app.router.routes += [
        _Route("/v1/recommend", recommend, methods=["POST"]),
        _Route("/v1/sessions/{session_id}/events", event, methods=["POST"]),
        _Route("/v1/sessions/{session_id}", end_session, methods=["DELETE"]),
    ]

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        try:
            await asyncio.to_thread(store.ping)
        except StoreUnavailable as exc:
            raise ApiError(503, str(exc)) from None
        stale = None if reloader is None else reloader.stale
        health: dict[str, Any] = {"status": "ok", "waiting": batcher.waiting, "stale": stale is not None}
        if stale is not None:
            health["stale_reason"] = stale
        return JSONResponse(health)

    @app.get("/v1/model")
    async def model_info() -> JSONResponse:
        engine = batcher.engine
        return JSONResponse({
            "file": engine.file,
            "sha256": engine.checksum,
            "n_items": engine.n_items,
            "layers": engine.sizes,
            "epochs_trained": getattr(engine.model, "epochs_trained", None),
            "config": engine.model.config.to_dict(),
            "reloads": None if reloader is None else {"done": reloader.reloads, "refused": reloader.refused},
            "stale": reloader is not None and reloader.stale is not None,
            "stale_reason": None if reloader is None else reloader.stale,
            "repeat_boost": _repeat_boost(engine),
            "device": str(engine.device),
            "scoring": engine.topk.name,
            "state": store.kind,
            "max_batch": settings.max_batch,
        })

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message, **exc.fields}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no such route: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"method {request.method} is not allowed on {request.url.path}" + (f" (allowed: {allowed})" if allowed else "")
        else:
            message = str(exc.detail)
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %r", request.method, request.url.path, exc, exc_info=exc)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if token:
        app.add_middleware(BearerToken, token=token)  # outside the body limit: no body is read without the token
    app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: it also times refused bodies
    return app
