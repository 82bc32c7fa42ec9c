"""The daemon's Prometheus face (``GET /metrics`` on 127.0.0.1, text format 0.0.4 rendered by
``splitrt.transport.promtext``, which the cloud server's metrics share): request latency histogram,
requests/failed/fallbacks/switches, current cut, bandwidth and RTT estimates, clouds up."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any

from splitrt.transport import promtext

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ModelStats:
    """One model's request counters (mutated under the daemon's lock; :meth:`copy` to read them)."""

    requests: int = 0
    failed: int = 0
    fallbacks: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    latency_sum_s: float = 0.0
    latency_count: int = 0

    def observe(self, seconds: float) -> None:
        for i, b in enumerate(LATENCY_BUCKETS_S):
            if seconds <= b:
                self.buckets[i] += 1
        self.latency_sum_s += seconds
        self.latency_count += 1

    def copy(self) -> ModelStats:
        return replace(self, buckets=list(self.buckets))


#: model name -> (its counters, its runtime's ``status()``, its cost table's cut ids)
Snapshot = Mapping[str, tuple[ModelStats, Mapping[str, Any], Sequence[str]]]


def render(models: Snapshot, in_flight: int) -> str:
    """Prometheus text exposition format (0.0.4)."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, dict[str, str], float]]) -> None:
        promtext.family(lines, name, kind, help_text, samples)

    family("splitrt_up", "gauge", "1 while the daemon serves.", [("", {}, 1.0)])
    family("splitrt_in_flight_requests", "gauge", "Requests being served now.", [("", {}, float(in_flight))])
    family(
        "splitrt_requests_total",
        "counter",
        "Requests received through the local API (incl. failed).",
        [("", {"model": n}, float(s.requests)) for n, (s, _, _) in models.items()],
    )
    family(
        "splitrt_requests_failed_total",
        "counter",
        "Requests that returned an error (bad input).",
        [("", {"model": n}, float(s.failed)) for n, (s, _, _) in models.items()],
    )
    family(
        "splitrt_fallbacks_total",
        "counter",
        "Requests whose cloud part ran on the device.",
        [("", {"model": n}, float(s.fallbacks)) for n, (s, _, _) in models.items()],
    )
    family(
        "splitrt_plan_switches_total",
        "counter",
        "Changes of plan (cut or codec).",
        [("", {"model": n}, float(st.get("switches", 0) or 0)) for n, (_, st, _) in models.items()],
    )
    hist: list[tuple[str, dict[str, str], float]] = []
    for n, (s, _, _) in models.items():
        for b, c in zip(LATENCY_BUCKETS_S, s.buckets, strict=True):
            hist.append(("_bucket", {"model": n, "le": promtext.num(b)}, float(c)))
        hist.append(("_bucket", {"model": n, "le": "+Inf"}, float(s.latency_count)))
        hist.append(("_sum", {"model": n}, s.latency_sum_s))
        hist.append(("_count", {"model": n}, float(s.latency_count)))
    family("splitrt_request_latency_seconds", "histogram", "End-to-end latency of successful requests.", hist)
    cut_samples = []
    index_samples = []
    for n, (_, status, ids) in models.items():
        plan = status.get("plan")
        if plan:
            cut = str(plan).split("@")[0]
            cut_samples.append(("", {"model": n, "plan": str(plan), "cut": cut}, 1.0))
            index_samples.append(("", {"model": n}, float(ids.index(cut)) if cut in ids else -1.0))
    family("splitrt_current_cut", "gauge", "1 for the plan in use (labels: plan, cut).", cut_samples)
    family("splitrt_current_cut_index", "gauge", "Index of the cut in use (0 = cloud, last = device).", index_samples)
    family(
        "splitrt_bandwidth_estimate_mbps",
        "gauge",
        "Link bandwidth estimate, Mbit/s.",
        [("", {"model": n}, float(st["bandwidth_mbps"])) for n, (_, st, _) in models.items()],
    )
    family(
        "splitrt_rtt_estimate_ms",
        "gauge",
        "Link RTT estimate, milliseconds.",
        [("", {"model": n}, float(st["rtt_ms"])) for n, (_, st, _) in models.items()],
    )
    family(
        "splitrt_link_confidence",
        "gauge",
        "Confidence of the link estimate, 0-1.",
        [("", {"model": n}, float(st["confidence"])) for n, (_, st, _) in models.items()],
    )
    family(
        "splitrt_cloud_up",
        "gauge",
        "1 when a known cloud is usable.",
        [
            ("", {"model": n, "cloud": str(c["address"])}, 1.0 if c["up"] else 0.0)
            for n, (_, st, _) in models.items()
            for c in st["clouds"]
        ],
    )
    return "\n".join(lines) + "\n"


def http_server(host: str, port: int, text: Callable[[], str]) -> ThreadingHTTPServer:
    return promtext.http_server(host, port, text)
