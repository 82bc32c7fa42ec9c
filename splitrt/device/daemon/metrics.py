"""The daemon's Prometheus face (``GET /metrics`` on 127.0.0.1, served by ``splitrt.transport.promserve``
as the cloud server's is): request latency histogram, requests/failed/fallbacks/switches, current cut,
bandwidth and RTT estimates, clouds up.

``Collector(snapshot, latency)`` is a ``prometheus_client`` collector: each scrape calls ``snapshot()``
for the daemon's counters and runtimes' status and renders them; ``latency`` (``latency_histogram()``,
one child per model) is the library's histogram, observed per successful request."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from splitrt.transport.promserve import family as _family

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ModelStats:
    """One model's request counters (mutated under the daemon's lock; :meth:`copy` to read them)."""

    requests: int = 0
    failed: int = 0
    fallbacks: int = 0

    def copy(self) -> ModelStats:
        return replace(self)


#: model name -> (its counters, its runtime's ``status()``, its cost table's cut ids)
Snapshot = Mapping[str, tuple[ModelStats, Mapping[str, Any], Sequence[str]]]


def latency_histogram() -> Histogram:
    """The end-to-end latency of successful requests, labelled by model (not in the process-wide registry)."""
    return Histogram(
        "splitrt_request_latency_seconds",
        "End-to-end latency of successful requests.",
        ["model"],
        buckets=LATENCY_BUCKETS_S,
        registry=None,
    )


def families(models: Snapshot, in_flight: int) -> Iterator[Metric]:
    """The daemon's metric families but the latency histogram, from one snapshot of its state."""
    C, G = CounterMetricFamily, GaugeMetricFamily
    yield G("splitrt_up", "1 while the daemon serves.", value=1.0)
    yield G("splitrt_in_flight_requests", "Requests being served now.", value=in_flight)
    for name, doc, field in (
        ("splitrt_requests_total", "Requests received through the local API (incl. failed).", "requests"),
        ("splitrt_requests_failed_total", "Requests that returned an error (bad input).", "failed"),
        ("splitrt_fallbacks_total", "Requests whose cloud part ran on the device.", "fallbacks"),
    ):
        yield _family(C, name, doc, ["model"], (((n,), getattr(s, field)) for n, (s, _, _) in models.items()))
    yield _family(
        C,
        "splitrt_plan_switches_total",
        "Changes of plan (cut or codec).",
        ["model"],
        (((n,), float(st.get("switches", 0) or 0)) for n, (_, st, _) in models.items()),
    )
    cuts: list[tuple[Sequence[str], float]] = []
    indices: list[tuple[Sequence[str], float]] = []
    for n, (_, status, ids) in models.items():
        plan = status.get("plan")
        if plan:
            cut = str(plan).split("@")[0]
            cuts.append(((n, str(plan), cut), 1.0))
            indices.append(((n,), float(ids.index(cut)) if cut in ids else -1.0))
    yield _family(
        G, "splitrt_current_cut", "1 for the plan in use (labels: plan, cut).", ["model", "plan", "cut"], cuts
    )
    yield _family(
        G, "splitrt_current_cut_index", "Index of the cut in use (0 = cloud, last = device).", ["model"], indices
    )
    for name, doc, key in (
        ("splitrt_bandwidth_estimate_mbps", "Link bandwidth estimate, Mbit/s.", "bandwidth_mbps"),
        ("splitrt_rtt_estimate_ms", "Link RTT estimate, milliseconds.", "rtt_ms"),
        ("splitrt_link_confidence", "Confidence of the link estimate, 0-1.", "confidence"),
    ):
        yield _family(G, name, doc, ["model"], (((n,), float(st[key])) for n, (_, st, _) in models.items()))
    yield _family(
        G,
        "splitrt_cloud_up",
        "1 when a known cloud is usable.",
        ["model", "cloud"],
        (((n, str(c["address"])), 1.0 if c["up"] else 0.0) for n, (_, st, _) in models.items() for c in st["clouds"]),
    )


class Collector:
    """Renders the daemon on each scrape: ``snapshot() -> (models, in_flight)`` and the latency histogram."""

    def __init__(self, snapshot: Callable[[], tuple[Snapshot, int]], latency: Histogram) -> None:
        self._snapshot = snapshot
        self._latency = latency

    def collect(self) -> Iterator[Metric]:
        models, in_flight = self._snapshot()
        yield from families(models, in_flight)
        yield from self._latency.collect()
