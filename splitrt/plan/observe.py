"""Sans-IO observation: how a reply, a probe or a local run becomes estimator samples, and when to probe.

The runtime (``device.runtime``, ``device.runtime.prober``, ``device.runtime.hops``) and the simulator (``rig.sim``)
all call these functions, so what the simulator learns from a request is what a device learns from
one. Each takes the estimator(s) to feed, a small frozen observation and ``now_s``; none reads a clock,
a socket or a file. The estimators are the state: they are fed in place, as everywhere in ``plan``; the
probe schedule's own state (``ProbeState``) is a value, returned anew.

``splitrt.plan.observe`` (pure, sans-IO: every call takes ``now_s``): how an observation becomes estimator
samples, and when to probe. ``device.runtime`` (a request: its ``feedback`` builds the observation; its
``prober``, ``clouds`` and ``hops``) and ``rig.sim`` all call these, none feeds an estimator by hand.

- ``observe_request(RequestObservation(local, replies=(TierReply(tier, reply, hop),...), queue), now_s, *,
  links, loads, queue)``: everything one request says, in one call (the runtime's).

- ``observe_reply(ReplyObservation(bytes_up, bytes_down, net_s, tail_s, profiled_tail_s, queue_wait_s=0), now_s,
  *, link, load)``, ``observe_queue(queue, QueueReport(queue_depth, workers, service_ms), now_s, own=)``,
  ``observe_probe(link, ProbeObservation(bytes_up, bytes_down, seconds), now_s)`` (an RTT sample up to
  ``RTT_PROBE_BYTES``, else a transfer), ``observe_probe_timeout(link, ProbeTimeout(...), now_s)``,
  ``observe_local(load, LocalRun(measured_ms, profiled_ms), now_s)``, ``observe_device(load,
  DeviceSample(other_util), now_s)`` (clipped to [0, 1]).
- The probe schedule: ``probe_due(link, ProbeState, now_s, *, up, link_busy, last_reply_s, gap_s) -> (due,
  ProbeState)`` (marks ``probe_started``), ``bandwidth_first(link, now_s, flowing=)``, ``rtt_stale(link,
  now_s)``, ``bandwidth_probe(link, now_s, gap_s=) -> BandwidthProbe | None``, ``probe_twice(pairs=,
  link_busy=)``; ``RequestPace`` (``.started(now_s)``, ``.gap_s(now_s)``: when the next request that sends is
  expected); through a relay (``device.runtime.hops``): ``relay_probe_sizes(hops, now_s, tier_due=) -> sizes
  per hop | None``.
- ``probe_bandwidth(rtts_s, loaded_s, nbytes) -> ProbeBandwidth`` (``splitrt run --cut auto``'s one-shot probe):
  measured only when the transfer outlasts ``PROBE_RESOLVE`` x the RTT's jitter, else ``resolved`` False and
  the least rate consistent with it (loopback: a 1 MiB probe comes back within the jitter).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from splitrt.errors import PlanError
from splitrt.plan.netmon import LinkEstimator, LoadEstimator
from splitrt.plan.queueing import QueueEstimator

RTT_PROBE_BYTES = 64  # an RTT probe's payload each way: tiny, so its transfer time does not count as RTT
IDLE_WAIT_ROUNDS = 8  # prober rounds a due probe waits for an idle link (2 s at the default interval)
# While requests flow (``RequestPace``: under REQUEST_FLOW_S apart), a probe goes out only within
# AFTER_REPLY_S of a reply: the gap before the next request is then the longest it will be. A round of an
# RTT and a bandwidth probe holds the link ~3 RTTs; started at a random time among requests 4 a second, it
# delayed the next one by up to 230 ms on the rig (busy board, 80 ms RTT). 50 ms: a busy board's prober
# thread may wait a 25 ms scheduler period before it runs.
REQUEST_FLOW_S = 1.0
AFTER_REPLY_S = 0.05
GAP_PROBE_MIN_RTTS = 0.5  # a gap-sized bandwidth probe's least transfer, in RTTs
# The least gap a probe goes into while requests flow: one RTT (a bandwidth probe then overruns it by at
# most GAP_PROBE_MIN_RTTS); shorter (requests back to back), probes wait as for a busy link.
MIN_GAP_RTTS = 1.0
PACE_SAMPLES = 4  # request starts before ``RequestPace`` expects the next
BANDWIDTH_PROBE_MIN_BYTES = 16 * 1024
BANDWIDTH_PROBE_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class ReplyObservation:
    """A server's reply to one request: the bytes both ways, the time they took on the network (the
    round trip minus the server's own time), and the server's compute against the profile's figure."""

    bytes_up: int
    bytes_down: int
    net_s: float
    tail_s: float
    profiled_tail_s: float
    queue_wait_s: float = 0.0  # the wait the request met for a worker (0: priced by the queue estimator)
    # Of ``net_s``, the wait behind the device's own bandwidth probe: it timed the probe, not the link.
    probe_wait_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class QueueReport:
    """A server's load report (in a reply or a probe's answer)."""

    queue_depth: int
    workers: int
    service_ms: float


@dataclass(frozen=True, kw_only=True)
class ProbeObservation:
    """A probe's round trip: an RTT probe (``bytes_up <= RTT_PROBE_BYTES``) or a bandwidth probe."""

    bytes_up: int
    bytes_down: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class ProbeTimeout:
    """A bandwidth probe of ``bytes_up`` that did not come back within ``timeout_s``."""

    bytes_up: int
    timeout_s: float


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    """A part of the model run on the device: what it took, and what the cost table says it takes."""

    measured_ms: float
    profiled_ms: float


@dataclass(frozen=True, kw_only=True)
class DeviceSample:
    """The share of the device's CPU the other processes took (a prober round's reading)."""

    other_util: float


def observe_reply(obs: ReplyObservation, now_s: float, *, link: LinkEstimator | None, load: LoadEstimator) -> None:
    """A reply: a transfer sample for ``link`` (None: the path has no estimator of its own) and, when
    the profile gives the server's part a time, a load sample for ``load``."""
    if link is not None:
        # Less the wait behind our own probe: a 5 KB request queued 150 ms behind one read as 0.4 Mbit/s on a
        # 3 Mbit/s link, priced the link's plans out, and the device (1.3x its price) ran 60 % of requests.
        link.add_transfer(now_s, obs.bytes_up + obs.bytes_down, max(obs.net_s - obs.probe_wait_s, 0.0))
    if obs.profiled_tail_s > 0:
        load.add_cloud(now_s, queue_wait_s=obs.queue_wait_s, profiled_tail_s=obs.profiled_tail_s, tail_s=obs.tail_s)


def observe_queue(queue: QueueEstimator, report: QueueReport, now_s: float, *, own: bool) -> None:
    """A load report; ``own``: it came in the reply of a request still counted in its queue depth. The
    state reported predicts the next wait; the wait this request met does not (it may include a tail
    session's first build: hundreds of ms, once)."""
    queue.add_load(
        now_s, queue_depth=max(0, report.queue_depth - int(own)), workers=report.workers, service_ms=report.service_ms
    )


def observe_probe(link: LinkEstimator, obs: ProbeObservation, now_s: float) -> None:
    """A probe's round trip: an RTT sample, or a transfer sample when it was a bandwidth probe."""
    if obs.bytes_up > RTT_PROBE_BYTES:
        link.add_transfer(now_s, obs.bytes_up + obs.bytes_down, obs.seconds)
    else:
        link.add_rtt(now_s, obs.seconds * 1e3)


def observe_probe_timeout(link: LinkEstimator, obs: ProbeTimeout, now_s: float) -> None:
    """A bandwidth probe that timed out: the link is far slower than estimated, at most this fast."""
    link.add_rate(now_s, max(1e-3, obs.bytes_up * 8 / 1e6 / obs.timeout_s))


def observe_local(load: LoadEstimator, run: LocalRun, now_s: float) -> None:
    """A head (the whole model on the device plan): the device's real speed over the profile."""
    load.add_head(now_s, measured_ms=run.measured_ms, profiled_ms=run.profiled_ms)


def observe_device(load: LoadEstimator, sample: DeviceSample, now_s: float) -> None:
    """A device-load sample, clipped to a fraction (a reading net of our own share may dip below 0)."""
    load.add_device(now_s, other_util=min(1.0, max(0.0, sample.other_util)))


@dataclass(frozen=True, kw_only=True)
class TierReply:
    """A server tier's part of a request's reply: ``tier`` (1: the first server tier), its reply, and
    whether its network time is one hop's (``hop``: the hop into ``tier``; False: a later tier reached
    directly crosses several, no one hop's sample)."""

    tier: int
    reply: ReplyObservation
    hop: bool = True


@dataclass(frozen=True, kw_only=True)
class RequestObservation:
    """All one request says: the device's run, each server tier's reply (none: it finished here), and the
    answering server's load report (``queue``)."""

    local: LocalRun
    replies: tuple[TierReply, ...] = ()
    queue: QueueReport | None = None


def observe_request(
    obs: RequestObservation,
    now_s: float,
    *,
    links: Sequence[LinkEstimator],
    loads: Sequence[LoadEstimator],
    queue: QueueEstimator | None = None,
) -> None:
    """One request into the estimators: ``links[h]`` hop h's (hop 0: device -> tier 1), ``loads[t - 1]``
    server tier t's (``loads[0]`` also holds the device's speed), ``queue`` the answering server's (its
    reply's report counts the request itself: ``own``)."""
    for r in obs.replies:
        observe_reply(r.reply, now_s, link=links[r.tier - 1] if r.hop else None, load=loads[r.tier - 1])
    if obs.queue is not None and queue is not None:
        observe_queue(queue, obs.queue, now_s, own=True)
    observe_local(loads[0], obs.local, now_s)


# -- the probe schedule ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProbeState:
    waits: int = 0  # rounds a due probe has waited for an idle link


@dataclass(frozen=True, kw_only=True)
class BandwidthProbe:
    """The bandwidth probe to send after an RTT probe, sized from the estimate; ``rtt_s`` the RTT it
    was sized with (its timeout scales with it)."""

    bytes_up: int
    bytes_down: int = RTT_PROBE_BYTES
    rtt_s: float


def probe_due(
    link: LinkEstimator,
    state: ProbeState,
    now_s: float,
    *,
    up: bool = True,
    link_busy: bool = False,
    last_reply_s: float | None = None,
    gap_s: float | None = None,
    idle_wait_rounds: int = IDLE_WAIT_ROUNDS,
) -> tuple[bool, ProbeState]:
    """Whether a server is probed (an RTT probe) in this round, and the schedule's next state.

    A server that is up is probed only when the link estimate is stale; a down one (its backoff over:
    the caller's rule) always. An up server is probed on an idle link only: an RTT probe queued behind a
    request's upload measures the queue (RTT estimates crept from 88 to 137 ms on an 80 ms link), and a
    bandwidth probe would slow the request down. While requests flow at a known pace (``gap_s``, the
    time until the next is expected, ``RequestPace.gap_s``; None: unknown, or they do not flow), a round
    that needs a bandwidth probe counts the link idle only within ``AFTER_REPLY_S`` of the latest reply
    (``last_reply_s``: the start of the gap; the caller runs a round when a reply comes), and only if the
    gap is at least ``MIN_GAP_RTTS`` RTTs (``bandwidth_first``: its bandwidth probe goes first). A link
    that is never idle (requests back to back) is probed all the same after ``idle_wait_rounds`` rounds:
    a queued RTT sample beats none. A probe that is due is recorded in ``link`` (``probe_started``)."""
    if up and not link.needs_probe(now_s):
        return False, state
    if gap_s is not None and link.needs_bandwidth_probe(now_s):  # flowing: a bandwidth probe needs a gap
        since_reply_s = math.inf if last_reply_s is None else now_s - last_reply_s
        short = gap_s < MIN_GAP_RTTS * link.rtt_ms() / 1e3
        link_busy = link_busy or not 0 <= since_reply_s <= AFTER_REPLY_S or short
    if up and link_busy and state.waits < idle_wait_rounds:
        return False, ProbeState(waits=state.waits + 1)
    link.probe_started(now_s)
    return True, ProbeState(waits=0)


def bandwidth_probe(link: LinkEstimator, now_s: float, *, gap_s: float | None = None) -> BandwidthProbe | None:
    """After an RTT probe: the bandwidth probe to send, None when transfers keep bandwidth fresh.

    Its transfer takes about twice the RTT at the current estimate: a probe much smaller than the
    bandwidth-delay product is RTT-dominated, and the few samples that pass the estimator's filter are
    the slow ones (a low estimate would then never recover). While requests flow, ``gap_s`` (the time
    until the next request is expected, ``RequestPace.gap_s``) caps it to end before that request, down
    to ``GAP_PROBE_MIN_RTTS`` x the RTT of transfer, still well past the estimator's filter."""
    if not link.needs_bandwidth_probe(now_s):
        return None
    rtt_s = link.estimate(now_s).rtt_ms / 1e3
    target_s = max(0.05, 2 * rtt_s)
    if gap_s is not None:
        target_s = max(GAP_PROBE_MIN_RTTS * rtt_s, min(target_s, gap_s - rtt_s))
    size = link.suggest_probe_bytes(target_s=target_s, lo=BANDWIDTH_PROBE_MIN_BYTES, hi=BANDWIDTH_PROBE_MAX_BYTES)
    return BandwidthProbe(bytes_up=size, rtt_s=rtt_s)


def bandwidth_first(link: LinkEstimator, now_s: float, *, flowing: bool) -> bool:
    """Whether a round sends its bandwidth probe first (then an RTT probe, if RTT is stale too): while
    requests flow, the bandwidth probe must fit the gap between two requests, and an RTT probe ahead of
    it would take 80 ms of a 130 ms gap on the rig's 3G link. An RTT probe (64 B) after it costs the next
    request nothing."""
    return flowing and link.needs_bandwidth_probe(now_s)


def rtt_stale(link: LinkEstimator, now_s: float) -> bool:
    """Whether the RTT has no sample within ``LinkConfig.probe_after_s``."""
    age_s = link.rtt_age_s(now_s)
    return age_s is None or age_s >= link.config.probe_after_s


class RequestPace:
    """When the next request is expected, from when the last ones started (pure: every call takes the time;
    the callers feed every request, and whether it sends). Requests of a camera or a sensor come at a
    steady rate whatever their plan, so the pace is known at once when a plan switches to the link (fed
    only the requests that send, it took four of them, and the probes met the first ones: 80 ms on the rig).
    ``gap_s`` is None until ``PACE_SAMPLES`` starts are known, when they are further apart than
    ``REQUEST_FLOW_S``, or when the latest request did not send: the link is idle, any time suits a probe."""

    def __init__(self) -> None:
        self._starts: deque[float] = deque(maxlen=PACE_SAMPLES + 1)
        self._sends = False

    def started(self, now_s: float, *, sends: bool = True) -> None:
        self._starts.append(_finite("now_s", now_s))
        self._sends = sends

    def gap_s(self, now_s: float) -> float | None:
        """Seconds from ``now_s`` until the next request is expected (the median interval after the last
        start), None when requests do not flow or the latest did not send."""
        if len(self._starts) < PACE_SAMPLES or not self._sends:
            return None
        starts = list(self._starts)
        interval = sorted(b - a for a, b in itertools.pairwise(starts))[(len(starts) - 1) // 2]
        if interval >= REQUEST_FLOW_S or now_s - starts[-1] >= REQUEST_FLOW_S:
            return None
        return max(0.0, starts[-1] + interval - now_s)


def probe_twice(*, pairs: bool, link_busy: bool) -> bool:
    """Whether a bandwidth probe goes out a second time, back to back, and the second counts: after an
    idle period TCP restarts from its initial window (slow start after idle), so the first probe's
    rate is a cold connection's; the second runs on the window the first opened, as requests in a
    steady stream do. Only with ``pairs`` (the kernel restarts) and nothing else on the wire."""
    return pairs and not link_busy


def relay_probe_sizes(hops: Sequence[LinkEstimator], now_s: float, *, tier_due: bool = False) -> tuple[int, ...] | None:
    """A prober round through a relay (device -> edge -> cloud: one probe whose payload crosses every
    hop): None when no hop's estimate is stale and no tier is due a revival probe; else the payload per
    hop, a bandwidth probe sized from the estimate where the hop has an RTT sample and stale bandwidth,
    an RTT probe elsewhere. Every hop is told the probe went out (``probe_started``)."""
    if not (tier_due or any(h.needs_probe(now_s) for h in hops)):
        return None
    sizes = tuple(
        h.suggest_probe_bytes() if h.rtt_confidence(now_s) > 0 and h.needs_bandwidth_probe(now_s) else RTT_PROBE_BYTES
        for h in hops
    )
    for h in hops:
        h.probe_started(now_s)
    return sizes


# -- one-shot probe (`splitrt run --cut auto`) ---------------------------------------------------------

#: A probe's transfer counts as measured only when it lasts this many times the RTT samples' jitter.
PROBE_RESOLVE = 4.0
#: The least jitter a timed round trip is taken to have (timer and scheduling): 0.1 ms.
PROBE_JITTER_FLOOR_S = 1e-4


@dataclass(frozen=True, kw_only=True)
class ProbeBandwidth:
    """What a few empty and a few loaded probes tell: ``bandwidth_mbps`` (measured when ``resolved``, else
    the least rate consistent with a transfer lost in the jitter: what the probe can resolve at most),
    ``rtt_ms`` (the median), ``transfer_ms`` (fastest loaded probe minus the RTT) and ``jitter_ms``."""

    bandwidth_mbps: float
    rtt_ms: float
    transfer_ms: float
    jitter_ms: float
    resolved: bool

    def note(self, nbytes: int) -> str:
        """One line for the user: the estimate and, when not resolved, why."""
        if self.resolved:
            return f"{self.bandwidth_mbps:.4g} Mbit/s ({nbytes} B in {self.transfer_ms:.3g} ms beyond the RTT)"
        return (
            f"not measurable by a {nbytes} B probe (its {self.transfer_ms:.3g} ms beyond the RTT are within "
            f"{PROBE_RESOLVE:g}x the RTT's jitter of {self.jitter_ms:.3g} ms): planned at its floor, "
            f"{self.bandwidth_mbps:.4g} Mbit/s, the most this probe can resolve"
        )


def _finite(name: str, value: float) -> float:
    if not math.isfinite(v := float(value)):
        raise PlanError(f"{name}: expected a finite number, got {value!r}")
    return v


def probe_bandwidth(rtts_s: list[float], loaded_s: list[float], nbytes: int) -> ProbeBandwidth:
    """Bandwidth from round trips without payload (``rtts_s``) and with ``nbytes`` (``loaded_s``). The
    transfer (the fastest loaded probe minus the median RTT) is known to within the RTT samples' spread
    (of their middle half, at least ``PROBE_JITTER_FLOOR_S``); when it is shorter than ``PROBE_RESOLVE``
    spreads (loopback, a LAN) the rate is not measured: ``bandwidth_mbps`` is then ``nbytes`` over
    ``PROBE_RESOLVE + 1`` spreads, the least rate consistent with what was timed, never a division by a
    near-zero."""
    if not rtts_s or not loaded_s or nbytes <= 0:
        raise PlanError(f"probe: expected RTT and loaded samples and bytes > 0, got {rtts_s}, {loaded_s}, {nbytes}")
    ordered = sorted(_finite("rtt", x) for x in rtts_s)
    rtt = ordered[len(ordered) // 2]
    # the spread of the middle half (the fastest and slowest quarter dropped): one stalled round trip on a
    # busy host (70 ms among 0.5 ms ones) says nothing of how finely the others time
    quarter = len(ordered) // 4
    jitter = max(ordered[len(ordered) - 1 - quarter] - ordered[quarter], PROBE_JITTER_FLOOR_S)
    transfer = min(_finite("loaded", x) for x in loaded_s) - rtt
    bits = nbytes * 8 / 1e6  # Mbit
    resolved = transfer >= PROBE_RESOLVE * jitter
    mbps = bits / transfer if resolved else bits / ((PROBE_RESOLVE + 1) * jitter)
    return ProbeBandwidth(
        bandwidth_mbps=mbps, rtt_ms=rtt * 1e3, transfer_ms=transfer * 1e3, jitter_ms=jitter * 1e3, resolved=resolved
    )
