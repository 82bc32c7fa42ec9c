"""The adaptive runtime's background prober: every ``prober_interval_s`` a device-load sample, and
``Probe`` RPCs that keep the link estimate fresh while real transfers are stale and bring a failed
cloud back once its backoff is over."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from splitrt.device.clouds import Cloud, Clouds
from splitrt.errors import CloudError

if TYPE_CHECKING:
    from splitrt.device.runtime import AdaptiveDevice

IDLE_WAIT_ROUNDS = 8  # prober rounds a due probe waits for an idle link (2 s at the default interval)


def slow_start_after_idle(path: str = "/proc/sys/net/ipv4/tcp_slow_start_after_idle") -> bool:
    """Whether this network namespace's TCP restarts an idle connection from its initial window."""
    try:
        with open(path) as f:
            return f.read().strip() != "0"
    except OSError:
        return True  # unknown (not Linux, or /proc hidden): assume the default, restart


class Prober:
    """Probes ``clouds`` for the runtime ``dev``, under the runtime's ``lock``. The runtime's clock,
    config and estimators are read through ``dev`` on every round, not kept: the rig swaps ``dev.load``
    after construction. ``after_round`` runs after each round of the background thread."""

    def __init__(self, dev: AdaptiveDevice, clouds: Clouds, *, lock: threading.RLock,
                 after_round: Callable[[], None]) -> None:
        self.dev = dev
        self.clouds = clouds
        self._lock = lock
        self._after_round = after_round
        self._waits = 0  # rounds a due probe has waited for an idle link
        pairs = dev.config.bandwidth_probe_pairs
        self.pairs = slow_start_after_idle() if pairs is None else pairs
        self._proc = psutil.Process()
        psutil.cpu_percent(None)  # prime: the first call always returns 0
        self._proc.cpu_percent(None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="splitrt-prober", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.dev.config.prober_interval_s):
            try:
                self.probe_once()
                self._after_round()
            except Exception:  # the prober must never die; the next round tries again
                continue

    def probe_once(self) -> None:
        """One round: a device-load sample, then each cloud that is due a probe."""
        dev = self.dev
        now = dev.clock()
        clouds = self.clouds.all()
        util = psutil.cpu_percent(None) / 100.0
        # Our own share is not "load": subtract it (the same Process object, or cpu_percent reads 0).
        own = self._proc.cpu_percent(None) / 100.0 / max(psutil.cpu_count() or 1, 1)
        with self._lock:
            dev.load.add_device(now, other_util=min(1.0, max(0.0, util - own)))
        for c in clouds:
            self._probe(c, now)

    def _probe(self, c: Cloud, now: float) -> None:
        dev = self.dev
        if not c.up and now < c.retry_at_s:
            return
        stale = dev.link.needs_probe(now)
        if c.up and not stale:
            return
        # Probe an idle link only: an RTT probe queued behind a request's upload measures the queue
        # (RTT estimates crept from 88 to 137 ms on an 80 ms link), and a bandwidth probe would
        # slow the request down. The next round (prober_interval_s later) tries again.
        # A link that is never idle (requests back to back) is probed all the same after
        # IDLE_WAIT_ROUNDS rounds: a queued RTT sample beats none.
        if c.up and self.clouds.inflight and self._waits < IDLE_WAIT_ROUNDS:
            self._waits += 1
            return
        self._waits = 0
        with self._lock:
            dev.link.probe_started(now)
        # An RTT probe (tiny: the transfer time must not count as RTT) ...
        try:
            pr = c.device.probe(64, 64, timeout_s=dev.config.probe_timeout_s)
        except CloudError as exc:
            self.clouds.mark_failed(c, now, exc)
            return
        was_down = not c.up
        self.clouds.mark_up(c)
        with self._lock:
            c.add_load(now, pr.load, own=False)  # the queue ages out between requests; probes refresh it
            c.rtt_ms = pr.seconds * 1e3 if c.rtt_ms is None else 0.7 * c.rtt_ms + 0.3 * pr.seconds * 1e3
            dev.link.add_rtt(now, pr.seconds * 1e3)
            rtt_s = dev.link.estimate(now).rtt_ms / 1e3
            # ... then a bandwidth probe whose transfer takes about twice the RTT at the current
            # estimate: a probe much smaller than the bandwidth-delay product is RTT-dominated, and
            # the few samples that pass the estimator's filter are the slow ones (a low estimate
            # would then never recover).
            up_bytes = dev.link.suggest_probe_bytes(target_s=max(0.05, 2 * rtt_s), lo=16 * 1024,
                                                    hi=1024 * 1024)
        if was_down or not dev.link.needs_bandwidth_probe(now):
            return
        timeout_s = max(dev.config.probe_timeout_s, 4 * (up_bytes * 8 / 1e6 / max(
            dev.link.bandwidth_mbps(), 0.01) + rtt_s))
        try:
            # Two back to back: after an idle period TCP restarts from its initial window
            # (slow start after idle), so the first probe's rate is that of a cold connection; the
            # second runs on the window the first opened, as requests in a steady stream do.
            pb = c.device.probe(up_bytes, 64, timeout_s=timeout_s)
            if self.pairs and self.clouds.inflight == 0:
                pb = c.device.probe(up_bytes, 64, timeout_s=timeout_s)
        except CloudError as exc:
            if exc.code == "DEADLINE_EXCEEDED":  # the link is far slower than estimated
                with self._lock:
                    dev.link.add_rate(dev.clock(), max(1e-3, up_bytes * 8 / 1e6 / timeout_s))
            else:
                self.clouds.mark_failed(c, now, exc)
            return
        with self._lock:
            dev.link.add_transfer(dev.clock(), pb.up_bytes + pb.down_bytes, pb.seconds)
