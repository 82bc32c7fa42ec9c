"""The adaptive runtime's background prober: every ``prober_interval_s`` a device-load sample, and
``Probe`` RPCs that keep the link estimate fresh while real transfers are stale and bring a failed
cloud back once its backoff is over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import psutil

from splitrt.device.runtime import hops
from splitrt.device.runtime.clouds import Cloud, Clouds
from splitrt.device.runtime.config import RuntimeConfig
from splitrt.errors import CloudError
from splitrt.plan import observe
from splitrt.plan.netmon import LinkEstimator, LoadEstimator
from splitrt.plan.observe import IDLE_WAIT_ROUNDS

__all__ = ["IDLE_WAIT_ROUNDS", "Prober", "slow_start_after_idle"]


def slow_start_after_idle(path: str = "/proc/sys/net/ipv4/tcp_slow_start_after_idle") -> bool:
    """Whether this network namespace's TCP restarts an idle connection from its initial window."""
    try:
        with open(path) as f:
            return f.read().strip() != "0"
    except OSError:
        return True  # unknown (not Linux, or /proc hidden): assume the default, restart


class Probed(Protocol):
    """What the prober reads of its runtime (``runtime.AdaptiveDevice``), afresh on every round."""

    config: RuntimeConfig
    clock: Callable[[], float]
    link: LinkEstimator
    load: LoadEstimator
    hops: hops.Hops
    last_reply_s: float | None
    pace: observe.RequestPace


class Prober:
    """Probes ``clouds`` for the runtime ``dev``, under the runtime's ``lock``. The runtime's clock,
    config and estimators are read through ``dev`` on every round, not kept: the rig swaps ``dev.load``
    after construction. ``after_round`` runs after each round of the background thread."""

    def __init__(self, dev: Probed, clouds: Clouds, *, lock: threading.RLock, after_round: Callable[[], None]) -> None:
        self.dev = dev
        self.clouds = clouds
        self._lock = lock
        self._after_round = after_round
        self._state = observe.ProbeState()  # the probe schedule's (rounds waited for an idle link)
        pairs = dev.config.bandwidth_probe_pairs
        self.pairs = slow_start_after_idle() if pairs is None else pairs
        self._proc = psutil.Process()
        psutil.cpu_percent(None)  # prime: the first call always returns 0
        self._proc.cpu_percent(None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="splitrt-prober", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def kick(self) -> None:
        """A reply came: the link is idle until the next request, so a due probe goes out now (a round of
        probes only, ``probe_clouds``; the load keeps its interval's samples)."""
        self._wake.set()

    def _loop(self) -> None:
        interval_s = self.dev.config.prober_interval_s
        due_s = time.monotonic() + interval_s  # the rounds' own timer (``dev.clock`` may be the rig's)
        while not self._stop.is_set():
            kicked = self._wake.wait(max(0.0, due_s - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            full = not kicked or time.monotonic() >= due_s
            try:
                if full:
                    self.probe_once()
                    self._after_round()
                else:
                    self.probe_after_reply()
            except Exception:  # the prober must never die; the next round tries again
                pass
            if full:  # the next round starts an interval after this one ends
                due_s = time.monotonic() + self.dev.config.prober_interval_s

    def probe_once(self) -> None:
        """One round: a device-load sample, then each cloud that is due a probe."""
        dev = self.dev
        now = dev.clock()
        clouds = self.clouds.all()
        util = psutil.cpu_percent(None) / 100.0
        # Our own share is not "load": subtract it (the same Process object, or cpu_percent reads 0).
        own = self._proc.cpu_percent(None) / 100.0 / max(psutil.cpu_count() or 1, 1)
        with self._lock:
            observe.observe_device(dev.load, observe.DeviceSample(other_util=util - own), now)
        self.probe_clouds(now, clouds)

    def probe_after_reply(self) -> None:
        """The probes a reply wakes: only while requests flow at a known pace (else the next request of a
        closed loop may start at once; the rounds' schedule applies)."""
        now = self.dev.clock()
        with self._lock:
            flowing = self.dev.pace.gap_s(now) is not None
        if flowing:
            self.probe_clouds(now)

    def probe_clouds(self, now: float | None = None, clouds: list[Cloud] | None = None) -> None:
        """The probes of one round (no load sample): each cloud that is due one, then the later tiers."""
        now = self.dev.clock() if now is None else now
        for c in self.clouds.all() if clouds is None else clouds:
            self._probe(c, now)
        if self.dev.hops.next:  # three tiers: the hop past the first server, and later servers reached directly
            self._beyond(now)

    def _beyond(self, now: float) -> None:
        """Revive later tiers' servers that are down and due; probe hop 1 through a live first-tier server
        (which also learns its next tier's address when none is known)."""
        dev = self.dev
        for clouds in dev.hops.direct:
            hops.revive(clouds, now, timeout_s=dev.config.probe_timeout_s)
        relay = self.clouds.live()[:1]
        if not relay:
            return
        try:
            hops.relay_round(
                dev.hops, relay[0].link, now, timeout_s=dev.config.probe_timeout_s, clock=dev.clock, lock=self._lock
            )
        except CloudError as exc:
            self.clouds.mark_failed(relay[0], now, exc)

    def _probe(self, c: Cloud, now: float) -> None:
        dev = self.dev
        if not c.up and now < c.retry_at_s:
            return
        with self._lock:
            gap_s = dev.pace.gap_s(now)
            due, self._state = observe.probe_due(
                dev.link,
                self._state,
                now,
                up=c.up,
                link_busy=self.clouds.inflight > 0,
                last_reply_s=dev.last_reply_s,
                gap_s=gap_s,
            )
        if not due:
            return
        with self._lock:
            first = c.up and observe.bandwidth_first(dev.link, now, flowing=gap_s is not None)
            bw = observe.bandwidth_probe(dev.link, now, gap_s=gap_s) if first else None
        if bw is not None:  # into the gap before the next request; the RTT probe (if due) after it
            self._bandwidth_probe(c, now, bw, flowing=True)
            with self._lock:
                rtt_due = observe.rtt_stale(dev.link, dev.clock())
            if rtt_due:
                self._rtt_probe(c, dev.clock(), None)
            return
        bw = self._rtt_probe(c, now, gap_s)
        if bw is not None:
            self._bandwidth_probe(c, now, bw, flowing=gap_s is not None)

    def _rtt_probe(self, c: Cloud, now: float, gap_s: float | None) -> observe.BandwidthProbe | None:
        """An RTT probe (tiny: the transfer time must not count as RTT); the bandwidth probe to follow it,
        None when transfers keep bandwidth fresh (or the cloud was down)."""
        dev = self.dev
        try:
            pr = c.link.probe(observe.RTT_PROBE_BYTES, observe.RTT_PROBE_BYTES, timeout_s=dev.config.probe_timeout_s)
        except CloudError as exc:
            self.clouds.mark_failed(c, now, exc)
            return None
        was_down = not c.up
        self.clouds.mark_up(c)
        with self._lock:
            c.add_load(now, pr.load, own=False)  # the queue ages out between requests; probes refresh it
            c.rtt_ms = pr.seconds * 1e3 if c.rtt_ms is None else 0.7 * c.rtt_ms + 0.3 * pr.seconds * 1e3
            observe.observe_probe(
                dev.link,
                observe.ProbeObservation(
                    bytes_up=observe.RTT_PROBE_BYTES, bytes_down=observe.RTT_PROBE_BYTES, seconds=pr.seconds
                ),
                now,
            )
            # ... then a bandwidth probe, when no transfer refreshed bandwidth (in what is left of the gap)
            left_s = None if gap_s is None else gap_s - pr.seconds
            return None if was_down else observe.bandwidth_probe(dev.link, now, gap_s=left_s)

    def _bandwidth_probe(self, c: Cloud, now: float, bw: observe.BandwidthProbe, *, flowing: bool) -> None:
        """The bandwidth probe (twice where the kernel restarts idle connections and no request flows)."""
        dev = self.dev
        timeout_s = max(
            dev.config.probe_timeout_s, 4 * (bw.bytes_up * 8 / 1e6 / max(dev.link.bandwidth_mbps(), 0.01) + bw.rtt_s)
        )
        try:
            with self.clouds.probing(bw.rtt_s):
                pb = c.link.probe(bw.bytes_up, bw.bytes_down, timeout_s=timeout_s)
                if observe.probe_twice(pairs=self.pairs, link_busy=self.clouds.inflight > 0 or flowing):
                    pb = c.link.probe(bw.bytes_up, bw.bytes_down, timeout_s=timeout_s)
        except CloudError as exc:
            if exc.code == "DEADLINE_EXCEEDED":  # the link is far slower than estimated
                with self._lock:
                    observe.observe_probe_timeout(
                        dev.link, observe.ProbeTimeout(bytes_up=bw.bytes_up, timeout_s=timeout_s), dev.clock()
                    )
            else:
                self.clouds.mark_failed(c, now, exc)
            return
        with self._lock:
            observe.observe_probe(
                dev.link,
                observe.ProbeObservation(bytes_up=pb.up_bytes, bytes_down=pb.down_bytes, seconds=pb.seconds),
                dev.clock(),
            )
