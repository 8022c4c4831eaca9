"""What the server measures: Prometheus metrics for ``GET /metrics`` and the one-line log.

One :class:`ServeMetrics` per app, on its own registry (several apps in one process, as in the
tests, do not share counters):

* ``gru4rec_serve_requests_total{route,method,status}`` and
  ``gru4rec_serve_request_seconds{route}`` (histogram) — every HTTP request, by route template;
* ``gru4rec_serve_batch_size`` (histogram) — requests per micro-batch;
* ``gru4rec_serve_sessions`` — sessions held (memory store only: Redis is shared);
* ``gru4rec_serve_session_evictions_total{reason}`` — sessions dropped for the cap or the TTL;
* ``gru4rec_serve_scored_rows_total{path}`` — rows scored with a certified int8 top-k or in float32;
* ``gru4rec_serve_popularity_fallbacks_total`` — answers for sessions without a known item;
* ``gru4rec_serve_unknown_sessions_total{route}`` — of those, the answers to sessions that have
  clicks, every one an unknown item id (a client sending ids the model does not know gets
  popularity for everyone; :meth:`ServeMetrics.unknown_line` says so in the log);
* ``gru4rec_serve_clicks_total{outcome}`` — clicks answered again from the stored answer
  (``replayed``: a retry with the ``seq`` already applied), runs refused by the state's
  compare-and-set and run again (``retried``: another replica wrote the session meanwhile), and
  clicks given up after too many refusals (``gave_up``: a 503).

:meth:`ServeMetrics.activity_line` gives the line logged once a minute: requests, p50/p99 of the
period's latencies and the sessions held; :meth:`ServeMetrics.unknown_line` the warning logged
with it when a session of only unknown ids was answered in the period.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["ServeMetrics", "CONTENT_TYPE"]

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE
except ImportError as exc:  # pragma: no cover - the serve extra installs it
    raise ImportError("gru4rec serve needs prometheus-client: pip install 'gru4rec[serve]'") from exc

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _StateCollector:
    """Reads the store's and the scorer's counters when scraped (they keep plain ints)."""

    def __init__(self, sessions: Callable[[], int | None], evictions: Callable[[], dict[str, int]],
                 scored: Callable[[], dict[str, int]], clicks: Callable[[], dict[str, int]]) -> None:
        self._sessions, self._evictions, self._scored, self._clicks = sessions, evictions, scored, clicks

    def collect(self) -> Iterator[object]:
        held = self._sessions()
        if held is not None:
            yield GaugeMetricFamily("gru4rec_serve_sessions", "Sessions held by this process", value=held)
        evictions = CounterMetricFamily("gru4rec_serve_session_evictions", "Sessions dropped by the store", labels=["reason"])
        for reason, n in self._evictions().items():
            evictions.add_metric([reason], n)
        yield evictions
        scored = CounterMetricFamily("gru4rec_serve_scored_rows", "Rows scored, by path", labels=["path"])
        for path, n in self._scored().items():
            scored.add_metric([path], n)
        yield scored
        clicks = CounterMetricFamily("gru4rec_serve_clicks", "Clicks not simply applied once, by outcome", labels=["outcome"])
        for outcome, n in self._clicks().items():
            clicks.add_metric([outcome], n)
        yield clicks


class ServeMetrics:
    """The app's metrics (see the module docstring)."""

    def __init__(self, sessions: Callable[[], int | None], evictions: Callable[[], dict[str, int]],
                 scored: Callable[[], dict[str, int]], clicks: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("gru4rec_serve_requests", "HTTP requests", ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("gru4rec_serve_request_seconds", "HTTP request latency", ["route"],
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("gru4rec_serve_batch_size", "Requests per micro-batch", buckets=_BATCH_BUCKETS,
                                    registry=self.registry)
        self.fallbacks = Counter("gru4rec_serve_popularity_fallbacks", "Answers from the popularity fallback",
                                 registry=self.registry)
        self.unknown_sessions = Counter("gru4rec_serve_unknown_sessions",
                                        "Answers (popularity) to sessions whose every click is an unknown item id",
                                        ["route"], registry=self.registry)
        # prometheus_client types register() for its own Collector class; it only calls collect().
        self.registry.register(_StateCollector(sessions, evictions, scored, clicks))  # type: ignore[arg-type]  # duck-typed collector
        self._sessions = sessions
        self._period: list[float] = []
        self._unknown_period = 0
        self._unknown_example: Any = None
        self._lock = threading.Lock()

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """One finished HTTP request."""
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)
        with self._lock:
            self._period.append(seconds)

    def unknown_session(self, route: str, unknown: list[Any]) -> None:
        """An answer to a session whose every click is an unknown item id (``unknown``: this
        request's ids, the last of which is kept as the period's example)."""
        self.unknown_sessions.labels(route).inc()
        with self._lock:
            self._unknown_period += 1
            if unknown:
                self._unknown_example = unknown[-1]

    def unknown_line(self, period_s: float, catalogue: str) -> str | None:
        """The warning for the period since the last call (and start a new period), None when
        no session of only unknown ids was answered in it; ``catalogue`` says what the model's
        ids look like."""
        with self._lock:
            n, example = self._unknown_period, self._unknown_example
            self._unknown_period, self._unknown_example = 0, None
        if not n:
            return None
        shown = "" if example is None else f", e.g. {example!r:.60}"
        return (f"{n} answer(s) in the last {period_s:.0f} s went to sessions whose every item id is unknown to the model"
                f"{shown}: they got the popular items (\"fallback\": true, the ids in \"unknown\"). The model's item ids "
                f"are {catalogue}; check the ids the client sends (gru4rec_serve_unknown_sessions_total counts them)")

    def render(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)

    def activity_line(self, period_s: float) -> str:
        """The log line for the period since the last call (and start a new period)."""
        with self._lock:
            period, self._period = self._period, []
        held = self._sessions()
        sessions = f", {held} sessions held" if held is not None else ""
        if not period:
            return f"0 requests in the last {period_s:.0f} s{sessions}"
        p50, p99 = np.percentile(np.asarray(period) * 1e3, [50, 99])
        return (f"{len(period)} requests in the last {period_s:.0f} s ({len(period) / period_s:.1f}/s), "
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms{sessions}")
