"""The runtime's tiers past the first server: each hop's link, each server tier's load, what a server
reports of its next tier, the servers reached directly when the one before them is down, and the prober's
round through a relay (its samples through ``plan.observe``; a relayed reply's: ``device.runtime.feedback``).

A path of N tiers is the device, then N-1 server tiers. The device sends to the first tier of the
plan's route; a server with a next tier runs its segment and forwards (``send(..., next_cut=)``), else
it finishes. Two tiers have no ``Hops`` state beyond the first hop's, which ``runtime`` keeps as always.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from splitrt.device.client.config import DeviceConfig
from splitrt.device.runtime.clouds import Cloud, Clouds, Connect
from splitrt.errors import CloudError
from splitrt.plan import observe
from splitrt.plan.netmon import LinkConfig, LinkEstimator, LoadEstimator

RTT = observe.RTT_PROBE_BYTES


class NextHealth:
    """A server tier's next tier as the server reports it (in replies and relay probes), with backoff."""

    def __init__(self, *, backoff_initial_s: float, backoff_max_s: float) -> None:
        self.initial_s, self.max_s = backoff_initial_s, backoff_max_s
        self.backoff_s = backoff_initial_s
        self.down_until: float | None = None  # None: up
        self.failures = 0
        self.timeouts = 0  # in a row
        self.last_error = ""

    def up(self) -> bool:
        return self.down_until is None

    def due(self, now_s: float) -> bool:
        """Down, and its backoff is over: probe through the relay."""
        return self.down_until is not None and now_s >= self.down_until

    def failed(self, now_s: float, error: str) -> None:
        if self.down_until is not None:
            self.backoff_s = min(2 * self.backoff_s, self.max_s)
        self.down_until = now_s + self.backoff_s
        self.failures += 1
        self.last_error = error

    def answered(self) -> None:
        self.timeouts = 0
        self.down_until = None
        self.backoff_s = self.initial_s

    def reported(self, now_s: float, *, forwarded: bool, code: str, message: str) -> None:
        """A reply's account of the next tier: it forwarded (up), failed with ``code``, or was not asked
        (the request's next cut was ``device``: nothing learnt). A timeout may be this request's short
        deadline: the tier counts as down at the second in a row."""
        if forwarded:
            self.answered()
            return
        if not code:
            return
        timed_out = code == "DEADLINE_EXCEEDED"
        self.timeouts = self.timeouts + 1 if timed_out else 0
        if not timed_out or self.timeouts >= 2:
            self.failed(now_s, f"{code}: {message}")

    def snapshot(self) -> dict[str, object]:
        return {"up": self.up(), "failures": self.failures, "last_error": self.last_error}


class Hops:
    """State of hops 1.. and server tiers 2.. (the first hop and tier are the runtime's ``link`` and
    ``load``, as for two tiers): ``links[h - 1]`` for hop h, ``loads[t - 2]`` for server tier t,
    ``direct[t - 2]`` the servers of tier t the device reaches itself, ``next[t - 1]`` what server tier t
    reports of tier t + 1. All read and changed under the runtime's lock."""

    def __init__(
        self,
        tiers: int,
        servers: Sequence[Sequence[str]],
        *,
        graph: Any,
        device_config: DeviceConfig,
        link: LinkConfig,
        backoff_initial_s: float,
        backoff_max_s: float,
        lock: threading.RLock,
        connect: Connect | None,
    ) -> None:
        backoff = {"backoff_initial_s": backoff_initial_s, "backoff_max_s": backoff_max_s}
        self.links = [LinkEstimator(link) for _ in range(tiers - 2)]
        self.loads = [LoadEstimator() for _ in range(tiers - 2)]
        self.next = [NextHealth(**backoff) for _ in range(tiers - 2)]
        self.direct = [Clouds(graph, device_config, lock=lock, connect=connect, **backoff) for _ in range(tiers - 2)]
        for clouds, addresses in zip(self.direct, servers, strict=True):
            clouds.set(addresses)

    def targets(
        self, route: tuple[int, ...], cuts: tuple[str, ...], live: list[Cloud], now_s: float
    ) -> list[tuple[int, list[Cloud], str | None]]:
        """Where a head output may go, in order: the route's first server tier (``live``: the first
        tier's servers in balanced order), with the next cut when the route goes on past it; then each
        later tier the device reaches itself, which finishes the request."""
        first = route[1]
        servers = live if first == 1 else self.direct[first - 2].admitting(now_s)
        out = [(first, servers, cuts[1] if len(cuts) > 1 else None)]
        for t in range(first + 1, len(self.direct) + 2):
            out.append((t, self.direct[t - 2].admitting(now_s), None))
        return out

    def status(self, now_s: float) -> list[dict[str, object]]:
        """Each hop past the first: its link estimate, the next tier's load, what the tier before it
        reports of it, and its servers reached directly."""
        out = []
        for h, (link, load, nxt, direct) in enumerate(
            zip(self.links, self.loads, self.next, self.direct, strict=True), start=1
        ):
            est = link.estimate(now_s)
            out.append(
                {
                    "hop": h,
                    "bandwidth_mbps": est.bandwidth_mbps,
                    "rtt_ms": est.rtt_ms,
                    "load": load.estimate(now_s).cloud_factor,
                    "next": nxt.snapshot(),
                    "servers": direct.snapshot(),
                }
            )
        return out

    def servers(self, first: list[dict[str, object]]) -> list[dict[str, object]]:
        """Past the first tier (``first``: its servers' snapshots): what each tier reports of its next
        (``ADDRESS/next``) and the later tiers' servers reached directly."""
        out: list[dict[str, object]] = []
        via = [str(c["address"]) for c in first]
        for nxt, direct in zip(self.next, self.direct, strict=True):
            out += [
                {"address": f"{a}/next", "up": nxt.up(), "failures": nxt.failures, "rtt_ms": None}
                | {"last_error": nxt.last_error, "served": 0}
                for a in via
            ]
            seen = direct.snapshot()
            out += seen
            via = [str(c["address"]) for c in seen]
        return out

    def close(self) -> None:
        for clouds in self.direct:
            clouds.close()


def relay_round(
    hops: Hops,
    relay: Any,
    now_s: float,
    *,
    timeout_s: float,
    clock: Callable[[], float],
    lock: threading.RLock,
) -> None:
    """One prober round through the live first-tier server ``relay`` (a ``Remote``): learn its next
    tier's address when none is known, and probe hop 1 through it while its estimate is stale or the
    next tier is due a revival (an RTT probe first when a bandwidth probe goes out: a bandwidth probe is
    judged against its hop's RTT, and a first RTT inflated by the channel's set-up would stay the floor).
    Raises ``CloudError`` when the relay itself fails."""
    nxt = hops.next[0]
    if not hops.direct[0]:
        address = relay.status(timeout_s=timeout_s).next_address
        if address:
            hops.direct[0].set([address])
    with lock:
        sizes = observe.relay_probe_sizes(hops.links[:1], now_s, tier_due=nxt.due(now_s))
    if sizes is None:
        return
    rounds = [RTT, sizes[0]] if sizes[0] > RTT else [sizes[0]]
    for size in rounds:
        p = relay.probe(RTT, RTT, timeout_s=timeout_s, next_bytes=(size, RTT))
        with lock:
            if p.next_ms is None:
                nxt.failed(clock(), p.next_error)
                return
            nxt.answered()
            obs = observe.ProbeObservation(bytes_up=size, bytes_down=RTT, seconds=p.next_ms / 1e3)
            observe.observe_probe(hops.links[0], obs, clock())


def revive(clouds: Clouds, now_s: float, *, timeout_s: float) -> None:
    """An RTT probe of each server of a later tier that is down and due (no link sample: the device's
    own path to it is not a hop of the plan)."""
    for c in clouds.all():
        if c.up or now_s < c.retry_at_s:
            continue
        try:
            c.link.probe(RTT, RTT, timeout_s=timeout_s)
        except CloudError as exc:
            clouds.mark_failed(c, now_s, exc)
            continue
        clouds.mark_up(c)


__all__ = ["Hops", "NextHealth", "relay_round", "revive"]
