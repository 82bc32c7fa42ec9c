"""What the server counts about its requests, for devices (service times in every ``Load``, the retry
hint of a refusal) and for operators: ``collect`` renders it, the load and the front door's counters on
each scrape (a ``prometheus_client`` collector), ``metrics_http`` serves ``GET /metrics``.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from splitrt.plan.queueing import expected_wait_ms
from splitrt.transport import promserve
from splitrt.transport.promserve import family as _family

if TYPE_CHECKING:
    from splitrt.cloud.guard.door import FrontDoor
    from splitrt.cloud.models.tails import TailCache
    from splitrt.transport import splitrt_pb2 as pb

#: Histogram buckets, seconds (1 ms .. 10 s).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# EWMA weight of one request's tail time: ~10 requests of memory.
SERVICE_ALPHA = 0.1
# A refusal's hint never says "now" (clients retrying at once collide again) nor "in minutes".
MIN_RETRY_AFTER_MS = 5.0
MAX_RETRY_AFTER_MS = 10_000.0


class _Ewma:
    def __init__(self) -> None:
        self.value = 0.0
        self.n = 0

    def add(self, x: float) -> None:
        # The first samples average plainly: the first request may have paid for a session's first run.
        self.n += 1
        self.value += (x - self.value) * max(SERVICE_ALPHA, 1.0 / self.n)


class ServerStats:
    """Thread-safe counters of one server's requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_code: Counter[str] = Counter()
        self.refused = 0  # queue full
        # registry=None: one pair per server, not the process-wide registry.
        self.tail_hist = Histogram(
            "splitrt_cloud_tail_seconds",
            "Time a tail session ran, per successful request.",
            buckets=LATENCY_BUCKETS_S,
            registry=None,
        )
        self.total_hist = Histogram(
            "splitrt_cloud_request_seconds",
            "Server-side time of a request (queue included), every outcome.",
            buckets=LATENCY_BUCKETS_S,
            registry=None,
        )
        self._service = _Ewma()
        self._by_segment: dict[tuple[str, str], _Ewma] = {}

    def observe(
        self,
        *,
        code: str,
        model_sha256: str,
        cut_id: str,
        total_ms: float,
        tail_ms: float | None = None,
        queue_full: bool = False,
    ) -> None:
        with self._lock:
            self.by_code[code] += 1
            self.refused += int(queue_full)
            self.total_hist.observe(total_ms / 1e3)
            if tail_ms is not None and math.isfinite(tail_ms) and tail_ms >= 0:
                self.tail_hist.observe(tail_ms / 1e3)
                self._service.add(tail_ms)
                seg = self._by_segment.get((model_sha256, cut_id))
                if seg is None and len(self._by_segment) < 4096:  # bounded: ids come from clients
                    seg = self._by_segment[(model_sha256, cut_id)] = _Ewma()
                if seg is not None:
                    seg.add(tail_ms)

    def service_ms(self) -> float:
        with self._lock:
            return self._service.value

    def segment_service_ms(self, model_sha256: str, cut_id: str) -> float:
        with self._lock:
            seg = self._by_segment.get((model_sha256, cut_id))
            return 0.0 if seg is None else seg.value

    def errors(self) -> dict[str, int]:
        with self._lock:
            return {code: n for code, n in sorted(self.by_code.items()) if code != "OK"}

    def retry_after_ms(self, *, queue_depth: int, workers: int) -> float:
        """When a refused request may come back: the expected wait of one arriving now (``plan.queueing``),
        within ``MIN_RETRY_AFTER_MS`` .. ``MAX_RETRY_AFTER_MS``."""
        wait = expected_wait_ms(queue_depth=queue_depth, workers=workers, service_ms=self.service_ms())
        return round(min(MAX_RETRY_AFTER_MS, max(MIN_RETRY_AFTER_MS, wait)), 1)


class Scraped(Protocol):
    """What a scrape reads of a server."""

    stats: ServerStats
    tails: TailCache
    door: FrontDoor

    @property
    def served(self) -> int: ...

    def load(self) -> pb.Load: ...


def collect(server: Scraped) -> Iterator[Metric]:
    """The server's metric families, read from its state now."""
    st, load, tails = server.stats, server.load(), server.tails
    with st._lock:
        by_code, refused = sorted(st.by_code.items()), st.refused
    yield from _families(
        (G, "up", "1 while the server serves.", 1.0),
        (
            C,
            "requests_total",
            "Infer requests and stream frames answered, by gRPC status code.",
            _rows("code", by_code),
        ),
        (
            C,
            "errors_total",
            "Infer requests and stream frames answered with an error, by gRPC status code.",
            _rows("code", [(c, n) for c, n in by_code if c != "OK"]),
        ),
        (
            C,
            "refused_total",
            "Requests refused because the queue was full (RESOURCE_EXHAUSTED with a retry hint).",
            refused,
        ),
        (G, "queue_depth", "Requests admitted and not finished (waiting + running).", load.queue_depth),
        (G, "running", "Requests running a tail now.", load.running),
        (G, "workers", "Tail worker slots.", load.workers),
        (G, "max_queue", "Requests that may wait beyond the workers.", load.max_queue),
        (G, "service_ms", "Smoothed tail time per request, milliseconds.", load.service_ms),
        (G, "cpu_percent", "Host CPU utilisation, percent.", load.cpu_percent),
    )
    yield from st.tail_hist.collect()
    yield from st.total_hist.collect()
    hits = [((sha[:16], cut), h) for sha, cut, h in tails.snapshot()]
    snap = server.door.snapshot()
    yield from _families(
        (C, "segment_cache_hits_total", "Tail lookups answered by a cached session.", tails.cache_hits),
        (C, "segment_cache_misses_total", "Tail lookups that built a session.", tails.cache_misses),
        (C, "segment_hits_total", "Requests served by each cached tail session.", (["model", "cut"], hits)),
        (C, "served_total", "Requests served successfully.", server.served),
        (
            C,
            "calls_total",
            "gRPC calls finished, every method, by status code (refusals at the front door included).",
            (["method", "code"], sorted(snap["calls"].items())),
        ),
        (G, "lane_calls", "Calls inside each lane now.", _rows("lane", snap["inside"].items())),
        (G, "lane_capacity", "Calls each lane admits at once.", _rows("lane", snap["caps"].items())),
        (
            C,
            "door_refused_total",
            "Calls refused or ended by the front door, by reason "
            "(unauthenticated, throttled, lane:<lane> full, timeout).",
            _rows("reason", snap["refused"].items()),
        ),
        (G, "throttled_peers", "Peer addresses waiting after failed authentications.", snap["waiting_peers"]),
    )


C, G = CounterMetricFamily, GaugeMetricFamily
_Rows = tuple[list[str], Any]


def _rows(label: str, items: Iterable[tuple[str, float]]) -> _Rows:
    return [label], [((k,), v) for k, v in sorted(items)]


def _families(
    *specs: tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, float | _Rows],
) -> Iterator[Metric]:
    """``splitrt_cloud_<name>`` families: a value, or (label names, ``(label values, value)`` rows)."""
    for kind, name, doc, value in specs:
        if isinstance(value, tuple):
            yield _family(kind, f"splitrt_cloud_{name}", doc, value[0], value[1])
        else:
            yield kind(f"splitrt_cloud_{name}", doc, value=value)


class _Collector:
    def __init__(self, server: Scraped) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        return collect(self._server)


def registry(server: Scraped) -> CollectorRegistry:
    """A registry of one collector that renders ``server`` on each scrape."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(server))
    return reg


def render(server: Scraped) -> str:
    """The server's metrics in Prometheus text format 0.0.4."""
    return generate_latest(registry(server)).decode()


def metrics_http(server: Scraped, host: str, port: int) -> tuple[WSGIServer, str]:
    """Serve the server's metrics on ``http://host:port/metrics`` (a daemon thread); returns (httpd, url)."""
    return promserve.serve(registry(server), host, port, name="splitrt-cloud-metrics")
