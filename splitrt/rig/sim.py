"""Trace-driven simulation of the bench strategies, pure (no I/O, no clock, no sessions).

The rig (``splitrt.rig.bench``) measures real processes on a shaped kernel link, and inherits the host's
jitter: the resnet50 head under the rig's cgroup quota varies +-10 % run to run, so two strategies that
run the very same plan on every request come out a few percent apart. This module replays a trace
against a cost table with the jitter switched off (or on, seeded): every strategy decides through the
same ``Policy``/``Controller``/estimators the device runtime uses, fed through the runtime's own
``plan.observe`` functions (transfers after each cloud request, RTT and bandwidth probes on the
runtime's probe schedule every 0.25 s, device-load samples every round), and pays what the trace and
the table say:

- a request starts every ``1 / rate_hz`` seconds or when the previous one ends (the rig's paced closed
  loop); its head costs ``head_ms x device load``; a cloud plan then sends its bytes through the trace
  (``rigstats.transfer_ms``, first in first out behind a probe on the wire), waits one RTT and the tail;
  the wait behind a probe is also the plan's correction's (its mean wait, as the runtime feeds it);
- the table may be wrong (``device_speed``, ``cloud_speed``: what compute really takes over what the
  table says); the runtime's estimators learn it from the requests, as on a real board;
- a probe is an RTT sample, then (when bandwidth is stale) one bandwidth probe of the size the runtime
  would send, timed through the same trace; as the runtime's prober (one thread, ``Prober._probe``) each
  is a blocking RPC with its deadline (``probe_timeout_s``; a bandwidth probe's scales with its size), the
  next round starts an interval after the last one ends, and a due probe waits (up to
  ``observe.IDLE_WAIT_ROUNDS``) while a request's whole RPC, encoding to reply, is in flight
  (``Clouds.inflight``) or, while requests flow, until a reply wakes the prober (``Prober.kick``: a round
  of probes only, once the thread is out of its last probe); a sample (a probe's, a reply's) reaches the
  estimators when it comes back;
- during a device burst the other processes take ``burst_util`` of the device's CPU: compute slows by
  ``1 / (1 - burst_util)`` and the prober reads that utilisation (as psutil does on a board);
- a request that sends pays the table's encode and call cost on the device (slowed as its compute) and
  its decode on the cloud; ``plan_cost`` makes chosen plans cost more (or less) than the table prices
  them (``(("cloud@fp32", 1.5),)``: every request on that plan takes 1.5x), which only the controller's
  corrections (``plan.correction``, fed after every request as the runtime feeds them) can learn;
- ``stalls`` (share, ms): that share of the requests that send wait that long on the device around their
  call, whatever their plan (a busy board's scheduler: on the rig a quota's period, 26-80 ms, about one
  remote call in four); request n draws the same stall in every strategy, as its jitter.

So a simulated run isolates the decision logic: with no jitter, adaptive and a fixed strategy on the
same plan cost exactly the same, and any gap between them is a decision that differed.

The feeding and the probe schedule are ``plan.observe``'s functions, which the runtimes call too: change
how a reply or probe becomes samples there, never in ``sim`` or a runtime (tests/rig/test_sim.py pins it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from splitrt.errors import ConfigError
from splitrt.plan import observe, reserve
from splitrt.plan.controller import Controller, ControllerConfig, Policy
from splitrt.plan.correction import Observation
from splitrt.plan.costmodel import DEVICE_CUT
from splitrt.plan.netmon import LinkConfig, LinkEstimator, LoadEstimator
from splitrt.plan.solver import parse_plan
from splitrt.rig import traces
from splitrt.rig.stats import in_intervals, transfer_ms
from splitrt.rig.strategies import HOLD_ABLATION, NEWS_ABLATION, SLOW_ABLATION


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    rate_hz: float = 4.0
    duration_s: float = 60.0
    warmup_s: float = 2.0  # uncounted requests before the window, as the rig's warm-up
    rtt_ms: float = 80.0
    bursts: tuple[tuple[float, float], ...] = ()  # device-burst intervals, seconds into the window
    burst_util: float = 0.5  # other processes' share of the device CPU during a burst
    prober_interval_s: float = 0.25
    probe_timeout_s: float = 2.0  # a probe RPC's deadline, as ``RuntimeConfig.probe_timeout_s``
    bandwidth_probe_pairs: bool = False  # the rig's namespaces run without slow start after idle
    jitter: float = 0.0  # relative sd of compute times; request n draws the same factor in every strategy
    # What compute really takes over what the cost table says (a profile's error): the strategies plan
    # with the table, the requests pay the truth.
    device_speed: float = 1.0
    cloud_speed: float = 1.0
    plan_cost: tuple[tuple[str, float], ...] = ()  # (plan key, what its requests take over what they would)
    stalls: tuple[float, float] = (0.0, 0.0)  # (share of remote calls, ms): a busy board's waits, any plan
    seed: int = 0
    deadline_ms: float = 5000.0  # per request, as ``RuntimeConfig.deadline_ms``: the local reserve's budget
    link: LinkConfig = field(default_factory=LinkConfig)
    controller: ControllerConfig = field(default_factory=lambda: ControllerConfig(codecs=None))

    def __post_init__(self) -> None:
        if not (
            self.rate_hz > 0
            and self.duration_s > 0
            and self.warmup_s >= 0
            and self.rtt_ms >= 0
            and 0 <= self.burst_util < 1
            and self.prober_interval_s > 0
            and self.probe_timeout_s > 0
            and 0 <= self.jitter < 0.5
            and self.device_speed > 0
            and self.cloud_speed > 0
            and all(f > 0 for _, f in self.plan_cost)
            and 0 <= self.stalls[0] <= 1
            and self.stalls[1] >= 0
            and self.deadline_ms > 0
        ):
            raise ConfigError(
                "SimConfig: expected rate_hz > 0, duration_s > 0, warmup_s >= 0, rtt_ms >= 0, "
                "0 <= burst_util < 1, prober_interval_s > 0, probe_timeout_s > 0, 0 <= jitter < 0.5, speeds > 0, "
                f"stalls (share in [0, 1], ms >= 0), deadline_ms > 0; got {self!r}"
            )


@dataclass(frozen=True, kw_only=True)
class SimRequest:
    t_s: float  # start, seconds into the window
    plan: str
    latency_ms: float
    head_ms: float
    send_ms: float  # on the wire, waiting behind a probe included (0 on the device)
    device_load: float
    # How a cloud plan ended (``plan.reserve``, as the runtime): served by the cloud; not sent (no time after
    # the local reserve: finished here, no fallback); or a fallback (the RPC's budget ran out first).
    served: bool = False
    not_sent: bool = False
    fallback: bool = False


@dataclass(frozen=True, kw_only=True)
class SimProbe:
    """A probe RPC the prober sent: an RTT probe (``bytes_up`` ``RTT_PROBE_BYTES``) or a bandwidth probe."""

    t_s: float  # sent
    bytes_up: int
    seconds: float | None  # its round trip; None: its deadline came first


class _Run:
    """One strategy through the window: the estimators, the policy, and the wire's state."""

    def __init__(self, table: Any, policy: str, played: traces.Trace, cfg: SimConfig, with_cloud: bool) -> None:
        self.table, self.played, self.cfg, self.with_cloud = table, played, cfg, with_cloud
        self.policy = Policy(policy, Controller(table, cfg.controller))
        self.link = LinkEstimator(cfg.link)
        self.load = LoadEstimator()
        self.wire_free_s = -math.inf  # the link carries one thing at a time (FIFO)
        # a request's RPC, encoding to reply (the runtime's ``Clouds.inflight``): the prober waits for it
        self.busy: tuple[float, float] = (-math.inf, -math.inf)
        self.probe_log: list[SimProbe] = []
        self.pending: list[tuple[float, int, Callable[[], None]]] = []  # samples fed at their end (``_later``)
        self.order = itertools.count()
        self.next_round_s = -cfg.warmup_s
        self.last_reply_s: float | None = None  # the runtime's ``last_reply_s``: its reply wakes the prober
        self.kicks: list[float] = []  # replies not yet met by a round (``Prober.kick``)
        self.prober_free_s = -math.inf  # when the prober's thread is out of its last probe
        self.pace = observe.RequestPace()  # the runtime's: when the next request is expected
        self.probes = observe.ProbeState()  # the prober's schedule
        self.rtt_s = cfg.rtt_ms / 1e3
        self.plan_cost = dict(cfg.plan_cost)
        self.sent: set[str] = set()  # cuts sent once: their tail is no longer cold (``reserve.send_budget``)

    def _wire(self, start_s: float, nbytes: float) -> float:
        """Seconds from ``start_s`` until ``nbytes`` are through (queued behind what is on the wire)."""
        begin = max(start_s, self.wire_free_s)
        if begin < 0:  # the warm-up: the link holds the window's first rate, as in the rig
            rate = max(self.played.rate_at(0.0), 0.05) * 1e6
            first = min(nbytes * 8.0, rate * -begin)
            done = begin + first / rate
            if first < nbytes * 8.0:
                done += transfer_ms(self.played, 0.0, nbytes - first / 8.0) / 1e3
        else:
            done = begin + transfer_ms(self.played, begin, nbytes) / 1e3
        self.wire_free_s = done
        return done - start_s

    def _later(self, at_s: float, feed: Callable[[], None]) -> None:
        """Feed an estimator when the sim's clock reaches ``at_s`` (a probe's or a reply's end): a decision
        before then must not see it."""
        heapq.heappush(self.pending, (at_s, next(self.order), feed))

    def _feed_until(self, t_s: float) -> None:
        while self.pending and self.pending[0][0] <= t_s:
            heapq.heappop(self.pending)[2]()

    def rounds_until(self, t_s: float) -> None:
        """The prober's rounds before ``t_s``: device-load samples and probes (runtime.probe_once)."""
        cfg = self.cfg
        while self.next_round_s < t_s or (self.kicks and self.kicks[0] < t_s):
            if self.kicks and self.kicks[0] < self.next_round_s:  # a reply woke the prober: probes only
                now = max(self.kicks[0], self.prober_free_s)  # once the thread is out of its probes
                if now >= t_s:
                    break
                self.kicks.pop(0)
                self._feed_until(now)
                if self.with_cloud and self.pace.gap_s(now) is not None:  # ``Prober.probe_after_reply``
                    self.prober_free_s = self._probe(now)
                    self.next_round_s = max(self.next_round_s, self.prober_free_s)
                continue
            self.kicks = [k for k in self.kicks if k > self.next_round_s]
            now = self.next_round_s
            self._feed_until(now)
            observe.observe_device(
                self.load,
                observe.DeviceSample(other_util=cfg.burst_util if in_intervals(now, cfg.bursts) else 0.0),
                now,
            )
            # The prober's thread blocks in its probes: the next round starts an interval after they end.
            self.prober_free_s = self._probe(now) if self.with_cloud else now
            self.next_round_s = self.prober_free_s + cfg.prober_interval_s
        self._feed_until(t_s)

    def _in_flight(self, at_s: float) -> bool:
        return self.busy[0] <= at_s < self.busy[1]

    def _probe(self, now: float) -> float:
        """A round's probes (``Prober._probe``), when due: an RTT probe, then a bandwidth probe when no
        transfer refreshed bandwidth; while requests flow, the bandwidth probe first (sized to the gap) and
        the RTT probe after it; each a blocking RPC with its deadline. Returns when the round ends."""
        cfg = self.cfg
        gap_s = self.pace.gap_s(now)
        due, self.probes = observe.probe_due(
            self.link, self.probes, now, link_busy=self._in_flight(now), last_reply_s=self.last_reply_s, gap_s=gap_s
        )
        if not due:
            return now
        if observe.bandwidth_first(self.link, now, flowing=gap_s is not None):
            bw = observe.bandwidth_probe(self.link, now, gap_s=gap_s)
            end = self._bandwidth_round(now, bw, flowing=True) if bw is not None else now
            if not observe.rtt_stale(self.link, end):
                return end
            secs = self._rtt_probe(end)
            return end + (cfg.probe_timeout_s if secs is None else secs)
        secs = self._rtt_probe(now)
        if secs is None:
            return now + cfg.probe_timeout_s
        bw = observe.bandwidth_probe(self.link, now, gap_s=None if gap_s is None else gap_s - secs)
        return now + secs if bw is None else self._bandwidth_round(now + secs, bw, flowing=gap_s is not None)

    def _rtt_probe(self, now: float) -> float | None:
        """An RTT probe from ``now``, its sample stamped at its start (as the runtime's): its seconds, None
        when its deadline came first (no sample: the runtime marks a failure)."""
        rtt_s = self._wire(now, 2 * observe.RTT_PROBE_BYTES) + self.rtt_s  # queued behind what is on the wire
        if rtt_s > self.cfg.probe_timeout_s:
            self.probe_log.append(SimProbe(t_s=now, bytes_up=observe.RTT_PROBE_BYTES, seconds=None))
            return None
        self.probe_log.append(SimProbe(t_s=now, bytes_up=observe.RTT_PROBE_BYTES, seconds=rtt_s))
        rtt = observe.ProbeObservation(
            bytes_up=observe.RTT_PROBE_BYTES, bytes_down=observe.RTT_PROBE_BYTES, seconds=rtt_s
        )
        observe.observe_probe(self.link, rtt, now)
        return rtt_s

    def _bandwidth_round(self, at: float, bw: observe.BandwidthProbe, *, flowing: bool) -> float:
        """The bandwidth probe from ``at`` (twice where the runtime would ask twice); returns when it ends.
        Its sample (or its timeout) reaches the estimator when it comes back."""
        cfg = self.cfg
        timeout_s = max(
            cfg.probe_timeout_s, 4 * (bw.bytes_up * 8 / 1e6 / max(self.link.bandwidth_mbps(), 0.01) + bw.rtt_s)
        )
        secs = self._bandwidth_probe(at, bw, timeout_s)
        # the runtime asks again once the first is back, with the link then as it is; the second counts
        if secs is not None and observe.probe_twice(
            pairs=cfg.bandwidth_probe_pairs, link_busy=self._in_flight(at + secs) or flowing
        ):
            at += secs
            secs = self._bandwidth_probe(at, bw, timeout_s)
        if secs is None:  # DEADLINE_EXCEEDED: the link is far slower than estimated
            gone = observe.ProbeTimeout(bytes_up=bw.bytes_up, timeout_s=timeout_s)
            self._later(at + timeout_s, lambda: observe.observe_probe_timeout(self.link, gone, at + timeout_s))
            return at + timeout_s
        done = observe.ProbeObservation(bytes_up=bw.bytes_up, bytes_down=bw.bytes_down, seconds=secs)
        self._later(at + secs, lambda: observe.observe_probe(self.link, done, at + secs))
        return at + secs

    def _bandwidth_probe(self, at: float, bw: observe.BandwidthProbe, timeout_s: float) -> float | None:
        """One bandwidth probe's RPC from ``at``: its seconds, None when its deadline came first."""
        secs = self._wire(at, bw.bytes_up + bw.bytes_down) + self.rtt_s
        if secs > timeout_s:
            # gRPC cancels the stream at its deadline: HTTP/2 flow control leaves little of it in flight
            self.wire_free_s = min(self.wire_free_s, at + timeout_s)
        answered = secs if secs <= timeout_s else None
        self.probe_log.append(SimProbe(t_s=at, bytes_up=bw.bytes_up, seconds=answered))
        return answered

    def request(self, t: float, jitter: float, stall_ms: float = 0.0) -> SimRequest:
        tbl = self.table
        self.rounds_until(t)
        est = self.link.estimate(t)
        load = self.load.estimate(t)
        d = self.policy.decide(t, est, load, cloud_available=self.with_cloud)
        cut, codec = parse_plan(d.plan, tbl.codecs[0])
        i = tbl.index(cut)
        slowed = 1.0 / (1.0 - self.cfg.burst_util) if in_intervals(t, self.cfg.bursts) else 1.0  # a device burst
        head_ms = float(tbl.head_ms[i]) * slowed * self.cfg.device_speed * jitter
        send_at = t + head_ms / 1e3  # the head's end
        self.rounds_until(send_at)
        observe.observe_local(
            self.load, observe.LocalRun(measured_ms=head_ms, profiled_ms=float(tbl.head_ms[i])), send_at
        )
        latency_ms, send_s, round_trip_ms = head_ms, 0.0, 0.0
        waited_ms: float | None = 0.0  # behind a probe (None: a fallback)
        outcome: dict[str, bool] = {}
        self.pace.started(t, sends=cut != DEVICE_CUT)  # every request, as the runtime's
        if cut != DEVICE_CUT:
            dev_i = tbl.index(DEVICE_CUT)
            budget = reserve.send_budget(
                deadline_ms=self.cfg.deadline_ms,
                elapsed_ms=head_ms,
                local_finish_ms=reserve.local_finish_ms(
                    float(tbl.head_ms[dev_i]), float(tbl.head_ms[i]), load.device_factor
                ),
                cold=cut not in self.sent,
            )
            # What finishing here really takes (the truth, as the head's).
            local_ms = float(tbl.head_ms[dev_i] - tbl.head_ms[i]) * slowed * self.cfg.device_speed * jitter
            if budget.timeout_ms is None:
                outcome = {"not_sent": True}
                latency_ms = head_ms + local_ms
            else:
                self.sent.add(cut)
                latency_ms, send_s, round_trip_ms, waited_ms = self._remote(
                    t, send_at + stall_ms / 1e3, i, codec, (jitter, slowed), budget.timeout_ms
                )
                outcome = {"served": True} if waited_ms is not None else {"fallback": True}
                if waited_ms is None:
                    latency_ms += local_ms
        latency_ms *= self.plan_cost.get(d.plan, 1.0)
        if not outcome.get("served"):  # finished here: the link is idle from its end, as after a reply
            end = t + latency_ms / 1e3
            self._later(end, lambda: setattr(self, "last_reply_s", end))
            self.kicks.append(end)
        # what the request took beyond its head and its RPC, against its price, as the runtime feeds it (not
        # a fallback's)
        if not outcome.get("fallback"):
            self.policy.controller.observe(
                Observation.of_request(
                    plan=d.plan,
                    priced_ms=d.encode_ms + d.call_ms,
                    total_ms=latency_ms,
                    head_ms=head_ms,
                    round_trip_ms=round_trip_ms,
                    t_s=t + latency_ms / 1e3,
                    price_ms=d.predicted_ms - d.correction_ms,
                    probe_wait_ms=waited_ms or 0.0,
                    upload_ms=d.hop_upload_ms[0] if d.hop_upload_ms else None,
                    rtt_ms=d.hop_rtt_ms[0] if d.hop_rtt_ms else 0.0,
                    load_lag=self.load.device_lag(t + latency_ms / 1e3),
                )
            )
        return SimRequest(
            t_s=t,
            plan=d.plan,
            latency_ms=latency_ms,
            head_ms=head_ms,
            send_ms=send_s * 1e3,
            device_load=load.device_factor,
            **outcome,
        )

    def _remote(
        self, t: float, send_at: float, i: int, codec: str, factors: tuple[float, float], timeout_ms: float
    ) -> tuple[float, float, float, float | None]:
        """(latency so far ms, seconds on the wire, round trip ms, its wait behind a probe ms: None when not
        served) of a request whose head ended at
        ``send_at`` (``factors``: this request's jitter and the device burst's slow-down): the device
        encodes and makes the call, then the wire, the RTT and the tail; the reply when it comes within
        ``timeout_ms`` of ``send_at`` (observed, as the runtime's), else the timeout's end."""
        tbl = self.table
        jitter, slowed = factors
        k = tbl.codec_index(codec)
        sent = float(tbl.sent_bytes[i, k]) + float(tbl.reply_bytes[i])
        # the device encodes and makes the call (as slow as its compute), then the wire
        start = send_at + (float(tbl.encode_ms[i, k]) + tbl.call_ms) * slowed * self.cfg.device_speed * jitter / 1e3
        queued_s = max(start, self.wire_free_s)
        send_s = self._wire(start, sent)
        # Queued behind the device's own probe (the runtime's ``Clouds.probe_wait_ms``): the plan's cost (a plan
        # whose uploads are too small to refresh bandwidth draws the probes), the correction's mean wait.
        wait_s = max(0.0, min(send_s, queued_s - start))
        tail_ms = (float(tbl.tail_ms[i]) + float(tbl.decode_ms[i, k])) * self.cfg.cloud_speed * jitter
        net_s = send_s + self.rtt_s
        end = start + net_s + tail_ms / 1e3
        self.busy = (send_at, min(end, send_at + timeout_ms / 1e3))  # ``Clouds.on_wire`` wraps the whole call
        if (end - send_at) * 1e3 > timeout_ms:  # the RPC's deadline fires first: no reply to learn from
            return (send_at - t) * 1e3 + timeout_ms, send_s, (send_at - start) * 1e3 + timeout_ms, None
        # The trace carries both ways as one transfer: all of ``sent`` counts as up.
        reply = observe.ReplyObservation(
            bytes_up=int(sent),
            bytes_down=0,
            net_s=net_s,
            tail_s=tail_ms / 1e3,
            profiled_tail_s=float(tbl.tail_ms[i]) / 1e3,
            probe_wait_s=wait_s,
        )
        self._later(end, lambda: observe.observe_reply(reply, end, link=self.link, load=self.load))
        self._later(end, lambda: setattr(self, "last_reply_s", end))
        self.kicks.append(end)
        return (end - t) * 1e3, send_s, (end - start) * 1e3, wait_s * 1e3


def simulate(
    table: Any,
    policy: str,
    played: traces.Trace,
    cfg: SimConfig,
    *,
    with_cloud: bool = True,
    probes: list[SimProbe] | None = None,
) -> list[SimRequest]:
    """One strategy (``policy`` as the runtime takes it) over ``played``: the counted requests; ``probes``
    (when given) receives every probe the prober sent, the warm-up's included."""
    run = _Run(table, policy, played, cfg, with_cloud)
    if probes is not None:
        run.probe_log = probes
    n_max = math.ceil((cfg.duration_s + cfg.warmup_s) * cfg.rate_hz) + 2
    jit = np.exp(np.random.default_rng(cfg.seed).normal(0.0, cfg.jitter, n_max)) if cfg.jitter > 0 else np.ones(n_max)
    share, stall_ms = cfg.stalls
    stalled = np.random.default_rng([cfg.seed, 1]).random(n_max) < share  # its own stream: jitter's stays put
    out: list[SimRequest] = []
    t = -cfg.warmup_s
    while t < cfg.duration_s:  # request n (the n-th counted) draws jitter n and stall n
        n = min(len(out), n_max - 1)
        r = run.request(t, float(jit[n]) if t >= 0 else 1.0, stall_ms if t >= 0 and stalled[n] else 0.0)
        if t >= 0:
            out.append(r)
        t = max(t + 1.0 / cfg.rate_hz, t + r.latency_ms / 1e3)
    return out


def simulate_all(
    table: Any, policies: dict[str, str], played: traces.Trace, cfg: SimConfig
) -> dict[str, list[SimRequest]]:
    """Every strategy over the same window (``device-only`` runs without a cloud, as in the rig; the hold
    ablation with ``hold_drift_fraction`` 0, the slow-sample ones with ``forgive_slow_s`` None and with
    ``confirm_slow`` False, as the rig's worker runs them)."""
    ablated = {
        HOLD_ABLATION: replace(cfg, controller=replace(cfg.controller, hold_drift_fraction=0.0)),
        SLOW_ABLATION: replace(cfg, link=replace(cfg.link, forgive_slow_s=None)),
        NEWS_ABLATION: replace(cfg, link=replace(cfg.link, confirm_slow=False)),
    }
    return {
        name: simulate(table, pol, played, ablated.get(name, cfg), with_cloud=name != "device-only")
        for name, pol in policies.items()
    }


def latencies(reqs: Sequence[SimRequest]) -> list[float]:
    return [r.latency_ms for r in reqs]
