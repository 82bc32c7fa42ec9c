"""What the server counts about its requests, for devices (service times in every ``Load``, the retry
hint of a refusal) and for operators (Prometheus text on ``--metrics-port``).

``ServerStats.observe`` is called once per Infer request or stream frame with its outcome: requests and
errors by gRPC status code, histograms of the tail's run time and of the server-side total, and the
smoothed service time per request (all models and cuts: what a queued request waits behind) and per
model and cut (``Status`` segments). The text is rendered by ``splitrt.transport.promtext``, as the
device daemon's is.

- Metrics (``cloud.metrics``): ``ServerConfig(metrics_port=None | 0 | N, metrics_host="127.0.0.1")`` serves
  Prometheus text (``render(server)``) on ``CloudServer.metrics_url`` from ``start()`` to ``stop()`` (the
  ``listening`` event names it; a taken port is ``ConfigError`` before gRPC serves); ``splitrt serve
  --metrics-port N``. ``CloudServer.stats`` (``ServerStats``): ``.observe(...)`` per request, ``.service_ms()``,
  ``.segment_service_ms(sha, cut)``, ``.errors()``, ``.refused``, ``.retry_after_ms(queue_depth=, workers=)``.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING

from splitrt.plan.queueing import expected_wait_ms
from splitrt.transport import promtext

if TYPE_CHECKING:
    from splitrt.cloud.server import CloudServer

#: Histogram buckets, seconds (1 ms .. 10 s).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# EWMA weight of one request's tail time: ~10 requests of memory, so a model switch shows within a
# second at tens of requests/s while one slow request does not double the figure.
SERVICE_ALPHA = 0.1
# A refusal's hint never says "now" (clients retrying at once collide again) nor "in minutes".
MIN_RETRY_AFTER_MS = 5.0
MAX_RETRY_AFTER_MS = 10_000.0


class _Ewma:
    def __init__(self) -> None:
        self.value = 0.0
        self.n = 0

    def add(self, x: float) -> None:
        # The first samples average plainly, so the figure is not anchored at the first request
        # (which may have paid for a session's first run).
        self.n += 1
        self.value += (x - self.value) * max(SERVICE_ALPHA, 1.0 / self.n)


class ServerStats:
    """Thread-safe counters of one server's requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_code: Counter[str] = Counter()
        self.refused = 0  # queue full
        self.tail_hist = promtext.Histogram(LATENCY_BUCKETS_S)
        self.total_hist = promtext.Histogram(LATENCY_BUCKETS_S)
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
        """When a refused request may come back: when the requests held now would be through (the
        expected wait of a request arriving now, ``plan.queueing``), so a retry is admitted and does
        not wait long; before any request is served, one service time is unknown: the floor."""
        wait = expected_wait_ms(queue_depth=queue_depth, workers=workers, service_ms=self.service_ms())
        return round(min(MAX_RETRY_AFTER_MS, max(MIN_RETRY_AFTER_MS, wait)), 1)


def render(server: CloudServer) -> str:
    """The server's metrics in Prometheus text format 0.0.4."""
    st = server.stats
    load = server.load()
    with st._lock:
        by_code = dict(st.by_code)
        refused = st.refused
        hists = [st.tail_hist.samples(), st.total_hist.samples()]
    lines: list[str] = []
    fam = promtext.family
    fam(lines, "splitrt_cloud_up", "gauge", "1 while the server serves.", [("", {}, 1.0)])
    fam(
        lines,
        "splitrt_cloud_requests_total",
        "counter",
        "Infer requests and stream frames answered, by gRPC status code.",
        [("", {"code": c}, float(n)) for c, n in sorted(by_code.items())],
    )
    fam(
        lines,
        "splitrt_cloud_errors_total",
        "counter",
        "Infer requests and stream frames answered with an error, by gRPC status code.",
        [("", {"code": c}, float(n)) for c, n in sorted(by_code.items()) if c != "OK"],
    )
    fam(
        lines,
        "splitrt_cloud_refused_total",
        "counter",
        "Requests refused because the queue was full (RESOURCE_EXHAUSTED with a retry hint).",
        [("", {}, float(refused))],
    )
    fam(
        lines,
        "splitrt_cloud_queue_depth",
        "gauge",
        "Requests admitted and not finished (waiting + running).",
        [("", {}, float(load.queue_depth))],
    )
    fam(lines, "splitrt_cloud_running", "gauge", "Requests running a tail now.", [("", {}, float(load.running))])
    fam(lines, "splitrt_cloud_workers", "gauge", "Tail worker slots.", [("", {}, float(load.workers))])
    fam(
        lines,
        "splitrt_cloud_max_queue",
        "gauge",
        "Requests that may wait beyond the workers.",
        [("", {}, float(load.max_queue))],
    )
    fam(
        lines,
        "splitrt_cloud_service_ms",
        "gauge",
        "Smoothed tail time per request, milliseconds.",
        [("", {}, load.service_ms)],
    )
    fam(lines, "splitrt_cloud_cpu_percent", "gauge", "Host CPU utilisation, percent.", [("", {}, load.cpu_percent)])
    fam(lines, "splitrt_cloud_tail_seconds", "histogram", "Time a tail session ran, per successful request.", hists[0])
    fam(
        lines,
        "splitrt_cloud_request_seconds",
        "histogram",
        "Server-side time of a request (queue included), every outcome.",
        hists[1],
    )
    tails = server.tails
    fam(
        lines,
        "splitrt_cloud_segment_cache_hits_total",
        "counter",
        "Tail lookups answered by a cached session.",
        [("", {}, float(tails.cache_hits))],
    )
    fam(
        lines,
        "splitrt_cloud_segment_cache_misses_total",
        "counter",
        "Tail lookups that built a session.",
        [("", {}, float(tails.cache_misses))],
    )
    fam(
        lines,
        "splitrt_cloud_segment_hits_total",
        "counter",
        "Requests served by each cached tail session.",
        [("", {"model": sha[:16], "cut": cut}, float(h)) for sha, cut, h in tails.snapshot()],
    )
    fam(
        lines,
        "splitrt_cloud_served_total",
        "counter",
        "Requests served successfully.",
        [("", {}, float(server.served))],
    )
    _door(lines, server)
    return "\n".join(lines) + "\n"


def _door(lines: list[str], server: CloudServer) -> None:
    """The front door's counters: every call by method and code, lanes, refusals, throttled peers."""
    snap = server.door.snapshot()
    fam = promtext.family
    fam(
        lines,
        "splitrt_cloud_calls_total",
        "counter",
        "gRPC calls finished, every method, by status code (refusals at the front door included).",
        [("", {"method": m, "code": c}, float(n)) for (m, c), n in sorted(snap["calls"].items())],
    )
    fam(
        lines,
        "splitrt_cloud_lane_calls",
        "gauge",
        "Calls inside each lane now.",
        [("", {"lane": k}, float(v)) for k, v in sorted(snap["inside"].items())],
    )
    fam(
        lines,
        "splitrt_cloud_lane_capacity",
        "gauge",
        "Calls each lane admits at once.",
        [("", {"lane": k}, float(v)) for k, v in sorted(snap["caps"].items())],
    )
    fam(
        lines,
        "splitrt_cloud_door_refused_total",
        "counter",
        "Calls refused or ended by the front door, by reason (unauthenticated, throttled, lane:<lane> full, timeout).",
        [("", {"reason": k}, float(v)) for k, v in sorted(snap["refused"].items())],
    )
    fam(
        lines,
        "splitrt_cloud_connections_shed_total",
        "counter",
        "Idle connections shut down near the connection cap (oldest first).",
        [("", {}, float(snap["shed"]))],
    )
    fam(
        lines,
        "splitrt_cloud_throttled_peers",
        "gauge",
        "Peer addresses waiting after failed authentications.",
        [("", {}, float(snap["waiting_peers"]))],
    )


def metrics_http(server: CloudServer, host: str, port: int) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``render(server)`` on ``http://host:port/metrics`` (a daemon thread); returns (httpd, url)."""
    httpd = promtext.http_server(host, port, lambda: render(server))
    return httpd, promtext.serve_in_thread(httpd, name="splitrt-cloud-metrics")
