"""The adaptive runtime's clouds: the known ones in order of preference, their health and backoff."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from splitrt.device.client.config import DeviceConfig
from splitrt.device.client.remote import Remote
from splitrt.errors import CloudError
from splitrt.plan import observe
from splitrt.plan.queueing import QueueEstimator
from splitrt.transport.base import Transport
from splitrt.transport.wire import LoadInfo

Connect = Callable[[str], Transport]  # a cloud's address -> a new transport to it


@dataclass
class Cloud:
    address: str
    link: Remote  # the transport to it, its model check, one request's round trip
    up: bool = True
    failures: int = 0
    retry_at_s: float = 0.0
    rtt_ms: float | None = None
    last_error: str = ""
    # Its queue as the plan prices it (``plan.queueing``), from its load reports and refusals.
    queue: QueueEstimator = field(default_factory=QueueEstimator)
    # This device's requests on the wire to it, and its worker slots (last report): the balancer
    # prices our own requests ahead of the next one (``plan.balance``).
    inflight: int = 0
    workers: int = 1
    served: int = 0  # requests it answered for this device

    def report(self, load: LoadInfo) -> observe.QueueReport:
        """A load report as its queue estimator takes it; its worker count is kept (the balancer's)."""
        if load.workers >= 1:
            self.workers = load.workers
        return observe.QueueReport(queue_depth=load.queue_depth, workers=load.workers, service_ms=load.service_ms)

    def add_load(self, now_s: float, load: LoadInfo, *, own: bool) -> None:
        """A load report; ``own``: it came in the reply of a request still counted in queue_depth."""
        observe.observe_queue(self.queue, self.report(load), now_s, own=own)


class Clouds(Mapping[str, Cloud]):
    """The known clouds by address, in order of preference, and the requests on the wire to them.

    A refused connection marks a cloud down at once, a timeout only the second time in a row; a down
    cloud is retried after an exponential backoff, on a fresh channel. Every change happens under the
    runtime's lock (shared: the runtime reads clouds and estimators together under it).
    """

    def __init__(
        self,
        graph: Any,
        device_config: DeviceConfig,
        *,
        backoff_initial_s: float,
        backoff_max_s: float,
        lock: threading.RLock,
        connect: Connect | None = None,
    ) -> None:
        self.graph = graph
        self.device_config = device_config
        self.connect = connect
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._lock = lock
        self._by_address: dict[str, Cloud] = {}
        self.inflight = 0  # requests on the wire now: probes wait for an idle link
        # The device's own bandwidth probes on the wire (``time.perf_counter`` spans): a request sent meanwhile
        # queues behind one: a cost of its plan, whose correction learns its mean (``probe_wait_ms``).
        self._probes: deque[tuple[float, float]] = deque(maxlen=8)
        self._probe_since: float | None = None
        # (server address, cut) a request was sent for: that tail is no longer cold (``plan.reserve``)
        self.sent: set[tuple[str, str]] = set()

    def __getitem__(self, address: str) -> Cloud:
        return self._by_address[address]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_address)

    def __len__(self) -> int:
        return len(self._by_address)

    def set(self, addresses: Sequence[str]) -> None:
        """Replace the known clouds; a cloud kept keeps its channel and its health."""
        with self._lock:
            keep = {a: self._by_address[a] for a in addresses if a in self._by_address}
            for a in addresses:
                if a not in keep:
                    keep[a] = Cloud(a, self._link(a))
            for a, c in self._by_address.items():
                if a not in keep:
                    c.link.close()
            self._by_address = dict(keep)

    def _link(self, address: str) -> Remote:
        """A ``Remote`` reaching ``address`` over a new transport: ``connect(address)``, or (None) the
        gRPC (or v2) transport ``Remote`` builds from the config (TLS, token, message limits)."""
        transport = self.connect(address) if self.connect is not None else None
        return Remote(self.graph, address, config=self.device_config, transport=transport)

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                {
                    "address": c.address,
                    "up": c.up,
                    "failures": c.failures,
                    "rtt_ms": c.rtt_ms,
                    "last_error": c.last_error,
                    "served": c.served,
                }
                for c in self._by_address.values()
            ]

    def all(self) -> list[Cloud]:
        with self._lock:
            return list(self._by_address.values())

    def live(self) -> list[Cloud]:
        """Clouds that are up, in the caller's order of preference (the finder ranks by RTT)."""
        with self._lock:
            return [c for c in self._by_address.values() if c.up]

    def admitting(self, now_s: float) -> list[Cloud]:
        """Live clouds, less those whose refusal (queue full: RESOURCE_EXHAUSTED) hint still runs."""
        with self._lock:
            return [c for c in self._by_address.values() if c.up and not c.queue.refused(now_s)]

    def refused(self, cloud: Cloud, now_s: float, exc: CloudError) -> None:
        """The cloud's queue was full: it is alive (not a failure), but out of plans for its hint."""
        with self._lock:
            cloud.failures = 0
            cloud.last_error = f"{exc.code}: {exc}"
            cloud.queue.add_refusal(now_s, retry_after_ms=exc.retry_after_ms)

    def mark_failed(self, cloud: Cloud, now_s: float, exc: CloudError) -> None:
        """A refused connection takes the cloud out at once; a slow answer only the second time in a
        row (a slow link is not a dead cloud: the estimates already price it)."""
        with self._lock:
            cloud.failures += 1
            cloud.last_error = f"{exc.code}: {exc}"
            if exc.code != "UNAVAILABLE" and cloud.failures < 2 and cloud.up:
                return
            cloud.up = False
            delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (cloud.failures - 1))
            cloud.retry_at_s = now_s + delay
            # A fresh channel on the next try (gRPC's own reconnect backoff grows to minutes). The old
            # link is not closed under requests that may still use it: it goes when they drop it.
            cloud.link = self._link(cloud.address)

    def mark_up(self, cloud: Cloud) -> None:
        with self._lock:
            cloud.up = True
            cloud.failures = 0
            cloud.last_error = ""

    def answered(self, cloud: Cloud) -> None:
        """A request came back: "twice in a row" counts from here."""
        with self._lock:
            cloud.failures = 0
            cloud.served += 1

    @contextmanager
    def on_wire(self, cloud: Cloud | None = None) -> Iterator[None]:
        """Count a request as on the wire (to ``cloud``) while the block runs."""
        with self._lock:
            self.inflight += 1
            if cloud is not None:
                cloud.inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self.inflight -= 1
                if cloud is not None:
                    cloud.inflight -= 1

    @contextmanager
    def probing(self, rtt_s: float) -> Iterator[None]:
        """Count a bandwidth probe as on the wire while the block runs, but its last ``rtt_s`` (its reply)."""
        start = time.perf_counter()
        with self._lock:
            self._probe_since = start
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._lock:
                self._probe_since = None
                self._probes.append((start, max(start, end - rtt_s)))

    def probe_wait_ms(self, start: float, end: float) -> float:
        """How much of ``[start, end]`` (``time.perf_counter``) a bandwidth probe of this device was on the wire."""
        with self._lock:
            spans = [*self._probes, *([(self._probe_since, end)] if self._probe_since is not None else [])]
        return 1e3 * sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)

    def close(self) -> None:
        with self._lock:
            for c in self._by_address.values():
                c.link.close()
