"""Three tiers on the device: device -> edge -> cloud, both cuts re-chosen per request, never lost.

``ChainDevice(model, device_table, edge_table, cloud_table, edge="host:port")`` plans every request with
the pure ``splitrt.plan.controller.Controller`` over the three tables (through the policy of
``ChainConfig.policy``) from one link estimate per hop and the three tiers' loads, runs the head up to
the first cut, and sends the crossing tensors to the edge with the second cut (``Device.send(...,
next_cut=)``); the edge runs the middle and forwards the rest to its next tier
(``splitrt serve --next``). The cloud is the edge's next tier (read from its ``Status``) unless given.

Each hop is measured: device -> edge by the request's round trip minus the edge's time (``edge_ms``) and
by probes; edge -> cloud by the edge, reported in the reply (``next_ms`` minus the cloud's own times)
and by probes through the edge (``Probe.next_probe``).

Nothing is lost when a tier dies:
- the cloud (the edge's next tier) -> the edge finishes the request itself and says so; the device
  then plans with the edge finishing (second cut ``device``) until a probe through the edge succeeds;
- the edge -> the device sends the same head output straight to the cloud (two tiers, when it knows
  the cloud), else finishes locally; the edge is probed again after a backoff.

- ``ChainDevice(model, device_tbl, edge_tbl, cloud_tbl, *, edge="host:port", cloud=None, config=ChainConfig(
  deadline_ms, controller, link, backoff_*, prober_interval_s, probe_timeout_s), clock, start_prober=True)``:
  ``.infer(inputs) -> ChainOutcome(plan, route, finished_by in {cloud, edge, device}, fallback, outputs,
  decision, result)``; raises only for bad inputs. One ``LinkEstimator`` per hop (hop 1: round trip minus
  ``edge_ms``; hop 2: ``next_ms`` minus the cloud's times, and probes through the edge; a round that probes
  bandwidth sends an RTT probe first, as the two-tier prober does), a ``LoadEstimator`` per tier. The cloud is
  the edge's ``Status.next_address`` unless given. Edge down -> the head's output straight to the cloud, else
  locally; ``next_error`` -> the next hop is down until a probe through the edge succeeds after its backoff; a
  down tier is re-probed on a fresh channel. ``.probe_once()``, ``.status()``, ``.close()``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import numpy as np

from splitrt.device.client import Device, DeviceConfig, HeadResult, SplitResult
from splitrt.device.deadline import MIN_RPC_MS, rpc_timeout_ms
from splitrt.errors import CloudError, ConfigError, SplitrtError
from splitrt.plan import observe
from splitrt.plan.controller import Controller, ControllerConfig, Decision, Policy, parse_policy
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, CostTable, Power
from splitrt.plan.netmon import LinkConfig, LinkEstimator, LoadEstimate, LoadEstimator
from splitrt.plan.path import parse_path

RTT_PROBE_BYTES = observe.RTT_PROBE_BYTES


@dataclass(frozen=True, kw_only=True)
class ChainConfig:
    deadline_ms: float = 5000.0
    policy: str = "adaptive"  # adaptive | periodic:SECONDS | fixed:PLAN (``c3@fp32>c12@fp32``)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    link: LinkConfig = field(default_factory=LinkConfig)  # priors of both hops
    # A tier that failed is retried after backoff_initial_s, doubling up to backoff_max_s.
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 2.0
    prober_interval_s: float = 0.25
    probe_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        parse_policy(self.policy)
        if self.deadline_ms <= 0:
            raise ConfigError(f"deadline_ms: expected > 0, got {self.deadline_ms!r}")


@dataclass(frozen=True, kw_only=True)
class ChainOutcome:
    request: str
    outputs: dict[str, np.ndarray]
    plan: str
    route: str  # edge | cloud | local: where the plan sent the request
    finished_by: str  # cloud | edge | device: the tier that produced the outputs
    fallback: bool  # a tier the plan counted on failed (the one before it finished)
    latency_ms: float
    decision: Decision
    result: SplitResult

    @property
    def server(self) -> str | None:
        """The tier that produced the outputs off the device (``edge``/``cloud``), None when the device did."""
        return None if self.finished_by == "device" else self.finished_by


def _feed(hop: LinkEstimator, now_s: float, up_bytes: int, seconds: float) -> None:
    """One probe's round trip into a hop's estimator: an RTT, or a transfer when it was a bandwidth probe."""
    observe.observe_probe(
        hop, observe.ProbeObservation(bytes_up=up_bytes, bytes_down=RTT_PROBE_BYTES, seconds=seconds), now_s
    )


def _cloud_reply(
    table: CostTable, cut: str, *, tail_ms: float, queue_ms: float, bytes: int = 0, net_ms: float = 0.0
) -> observe.ReplyObservation:
    """The cloud's part of a reply (relayed by the edge: with hop 2's bytes and network time)."""
    return observe.ReplyObservation(
        bytes_up=bytes,
        bytes_down=0,
        net_s=net_ms / 1e3,
        tail_s=tail_ms / 1e3,
        profiled_tail_s=float(table.tail_ms[table.index(cut)]) / 1e3,
        queue_wait_s=queue_ms / 1e3,
    )


def _rtt_probe(
    edge: Device,
    hop1: LinkEstimator,
    hop2: LinkEstimator,
    timeout_s: float,
    clock: Callable[[], float],
    lock: threading.RLock,
) -> None:
    """An RTT probe of both hops through the edge, before a bandwidth probe (as the two-tier prober does):
    a bandwidth probe is judged against its hop's RTT, and a first RTT sample inflated by the channel's
    set-up would otherwise stay the floor for good (every bandwidth probe then looks RTT-dominated and is
    ignored: in the three-tier rig hop 1 kept its 10 Mbit/s prior on a 26 Mbit/s link while on the device)."""
    r = edge.probe(RTT_PROBE_BYTES, RTT_PROBE_BYTES, timeout_s=timeout_s, next_bytes=(RTT_PROBE_BYTES, RTT_PROBE_BYTES))
    with lock:
        _feed(hop1, clock(), RTT_PROBE_BYTES, max(r.seconds - (r.next_ms or 0.0) / 1e3, 0.0))
        if r.next_ms is not None:
            _feed(hop2, clock(), RTT_PROBE_BYTES, r.next_ms / 1e3)


def _revive(tier: _Tier, timeout_s: float, clock: Callable[[], float], lock: threading.RLock) -> None:
    """An RTT probe of a down tier, on a fresh channel (the old one may sit in gRPC's reconnect backoff)."""
    assert tier.device is not None
    tier.device.close()
    try:
        tier.device.probe(RTT_PROBE_BYTES, RTT_PROBE_BYTES, timeout_s=timeout_s)
    except CloudError as exc:
        with lock:
            tier.failed(clock(), f"{type(exc).__name__}: {exc}")
        return
    with lock:
        tier.answered()


class _Tier:
    """A reachable server (edge or cloud), or a hop (the edge's next tier), with its failure backoff."""

    def __init__(self, name: str, device: Device | None, *, backoff_initial_s: float, backoff_max_s: float) -> None:
        self.name = name
        self.device = device
        self.initial_s, self.max_s = backoff_initial_s, backoff_max_s
        self.backoff_s = backoff_initial_s
        self.down_until: float | None = None  # None: up
        self.failures = 0
        self.timeouts = 0  # in a row
        self.last_error = ""

    def up(self) -> bool:
        return self.down_until is None

    def due(self, now_s: float) -> bool:
        """Down, and its backoff is over: probe it."""
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

    def snapshot(self) -> dict[str, object]:
        return {"name": self.name, "up": self.up(), "failures": self.failures, "last_error": self.last_error}


class ChainDevice:
    """Thread-safe ``infer``; ``probe_once`` is one prober round (tests drive it with ``start_prober=False``)."""

    def __init__(
        self,
        model: Any,
        device_table: CostTable,
        edge_table: CostTable,
        cloud_table: CostTable,
        *,
        edge: str,
        cloud: str | None = None,
        config: ChainConfig | None = None,
        device_config: DeviceConfig | None = None,
        power: Power = DEFAULT_POWER,
        log: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_prober: bool = True,
    ) -> None:
        self.config = config or ChainConfig()
        self.device_config = device_config or DeviceConfig()
        self.local = Device(model, config=self.device_config)
        self.graph = self.local.graph
        ids = [c.id for c in self.graph.cuts()]
        for what, t in (("device", device_table), ("edge", edge_table), ("cloud", cloud_table)):
            if list(t.ids) != ids:
                raise ConfigError(
                    f"{what} cost table lists {len(t.ids)} cuts, model {self.graph.path.name} has "
                    f"{len(ids)}: expected a profile of this model"
                )
        self.tables = (device_table, edge_table, cloud_table)
        self.controller = Controller((device_table, edge_table, cloud_table), self.config.controller, power=power)
        self.policy = Policy(self.config.policy, self.controller)
        self.hop1, self.hop2 = LinkEstimator(self.config.link), LinkEstimator(self.config.link)
        self.load, self.edge_load, self.cloud_load = LoadEstimator(), LoadEstimator(), LoadEstimator()
        self.clock, self.log = clock, log
        self._lock = threading.RLock()
        backoff = {"backoff_initial_s": self.config.backoff_initial_s, "backoff_max_s": self.config.backoff_max_s}
        self.edge = _Tier(edge, Device(self.graph, edge, config=self.device_config), **backoff)
        self.next = _Tier("next", None, **backoff)  # the edge -> cloud hop, as the edge reports it
        self.cloud: _Tier | None = None
        if cloud:
            self.set_cloud(cloud)
        self.stats = {"completed": 0, "fallbacks": 0, "switches": 0, "by_edge": 0, "by_cloud": 0, "by_device": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start_prober:
            self._thread = threading.Thread(target=self._loop, name="splitrt-chain-prober", daemon=True)
            self._thread.start()

    def set_cloud(self, address: str) -> None:
        """The cloud to reach directly when the edge is down (the edge's next tier by default)."""
        with self._lock:
            if self.cloud is not None and self.cloud.name == address:
                return
            old, self.cloud = (
                self.cloud,
                _Tier(
                    address,
                    Device(self.graph, address, config=self.device_config),
                    backoff_initial_s=self.config.backoff_initial_s,
                    backoff_max_s=self.config.backoff_max_s,
                ),
            )
        if old is not None and old.device is not None:
            old.device.close()

    # -- one request -------------------------------------------------------------------------------
    def infer(
        self, inputs: Mapping[str, Any], *, request: str | None = None, deadline_ms: float | None = None
    ) -> ChainOutcome:
        """Outputs for ``inputs``; raises only for bad inputs (``InputError``), never for a tier."""
        rid = request or uuid.uuid4().hex[:12]
        t0 = time.perf_counter()
        now = self.clock()
        deadline = deadline_ms or self.config.deadline_ms
        feeds = self.local.check_inputs(inputs)
        with self._lock:
            # The cloud is reached through the edge while the edge is up (its next tier as it reports it),
            # directly otherwise.
            cloud_up = self.next.up() if self.edge.up() else self.cloud is not None and self.cloud.up()
            device = self.load.estimate(now).device_factor
            loads = [
                LoadEstimate(device_factor=device, cloud_factor=est.estimate(now).cloud_factor)
                for est in (self.edge_load, self.cloud_load)
            ]
            decision = self.policy.decide(
                now,
                [self.hop1.estimate(now), self.hop2.estimate(now)],
                loads,
                cloud_available=(self.edge.up(), cloud_up),
                request=rid,
            )
        route = decision.route or (0, 1, 2)
        cuts, codecs = parse_path(decision.plan, hops=len(route) - 1)
        first, codec = cuts[0], codecs[0]
        diverges = self.local.diverges(feeds)
        if diverges is not None:  # not the branch the graph was specialised for: the whole original model here
            result, by, fallback, first = self.local.run_original(feeds, request_id=rid), "device", True, DEVICE_CUT
        elif first == DEVICE_CUT:
            result, by, fallback = self.local.finish_locally(self.local.run_head(feeds, first)), "device", False
        elif 1 in route:  # through the edge; it finishes when the route ends there
            head = self.local.run_head(feeds, first)
            second = cuts[1] if len(cuts) > 1 else DEVICE_CUT
            result, by, fallback = self._via_edge(head, second, codec, t0, deadline)
        else:
            head = self.local.run_head(feeds, first)
            result, by, fallback = self._direct(head, codec, t0, deadline)
        d_tbl = self.tables[0]
        with self._lock:
            measured = result.total_ms if first == DEVICE_CUT else result.head_ms
            observe.observe_local(
                self.load,
                observe.LocalRun(measured_ms=measured, profiled_ms=float(d_tbl.head_ms[d_tbl.index(first)])),
                self.clock(),
            )
        latency = (time.perf_counter() - t0) * 1e3
        decision = replace(
            decision,
            actual_ms=latency,
            fallback=fallback,
            extra={
                **decision.extra,
                "model": self.graph.sha256[:16],
                "finished_by": by,
                **({"diverged": diverges} if diverges is not None else {}),
            },
        )
        with self._lock:
            self.stats["completed"] += 1
            self.stats["fallbacks"] += int(fallback)
            self.stats["switches"] += int(decision.switched)
            self.stats[f"by_{by}"] += 1
            if self.log is not None:
                self.log.write(decision.to_json() + "\n")
                self.log.flush()
        return ChainOutcome(
            request=rid,
            outputs=result.outputs,
            plan=decision.plan,
            route="local" if first == DEVICE_CUT else "edge" if 1 in route else "cloud",
            finished_by=by,
            fallback=fallback,
            latency_ms=latency,
            decision=decision,
            result=result,
        )

    def _timeout_s(self, first: str, t0: float, deadline_ms: float) -> float:
        """What is left of the deadline once a local finish from ``first`` is kept in reserve."""
        t = self.tables[0]
        local_ms = float(t.head_ms[t.index(DEVICE_CUT)] - t.head_ms[t.index(first)])
        local_ms *= max(1.0, self.load.estimate(self.clock()).device_factor)
        left = rpc_timeout_ms(
            deadline_ms=deadline_ms, elapsed_ms=(time.perf_counter() - t0) * 1e3, local_finish_ms=local_ms
        )
        return (left or MIN_RPC_MS) / 1e3  # no room: an RPC that fails at once, then the local finish

    def _via_edge(
        self, head: HeadResult, second: str, codec: str, t0: float, deadline_ms: float
    ) -> tuple[SplitResult, str, bool]:
        assert self.edge.device is not None
        try:
            res = self.edge.device.send(
                head, codec_spec=codec, next_cut=second, timeout_s=self._timeout_s(head.cut_id, t0, deadline_ms)
            )
        except (CloudError, SplitrtError, ValueError) as exc:
            # Edge down (or refusing): the cloud directly, else here. Not the edge's fault (a lossy codec
            # refusing NaN, ...) still leaves the edge up.
            with self._lock:
                if isinstance(exc, CloudError):
                    self.edge.failed(self.clock(), f"{type(exc).__name__}: {exc}")
            res2, by, _ = self._direct(head, codec, t0, deadline_ms)
            return res2, by, True
        hops = res.hops
        with self._lock:
            self.edge.answered()
            if hops is not None and hops.next_error_code:
                # A timeout may be this request's short deadline: the hop is down at the second in a row.
                timed_out = hops.next_error_code == "DEADLINE_EXCEEDED"
                self.next.timeouts = self.next.timeouts + 1 if timed_out else 0
                if not timed_out or self.next.timeouts >= 2:
                    self.next.failed(self.clock(), f"{hops.next_error_code}: {hops.next_error}")
            elif hops is not None and hops.forwarded:
                self.next.answered()
            self._observe_edge(res, head.cut_id, second)
        forwarded = hops is not None and hops.forwarded
        return res, "cloud" if forwarded else "edge", second != DEVICE_CUT and not forwarded

    def _direct(self, head: HeadResult, codec: str, t0: float, deadline_ms: float) -> tuple[SplitResult, str, bool]:
        cloud = self.cloud
        if cloud is not None and cloud.up() and cloud.device is not None:
            try:
                res = cloud.device.send(head, codec_spec=codec, timeout_s=self._timeout_s(head.cut_id, t0, deadline_ms))
            except (CloudError, SplitrtError, ValueError) as exc:
                with self._lock:
                    if isinstance(exc, CloudError):
                        cloud.failed(self.clock(), f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    cloud.answered()
                    self._observe_cloud(res.queue_ms, res.tail_ms, head.cut_id)
                return res, "cloud", False
        return self.local.finish_locally(head), "device", True

    def _observe_edge(self, res: SplitResult, first: str, second: str) -> None:
        """Feed both hops' estimators and the edge's and cloud's load from one relayed request."""
        hops = res.hops
        if hops is None:
            return
        now = self.clock()
        e = self.tables[1]
        upto = second if hops.forwarded else DEVICE_CUT  # not forwarded: the edge ran the whole rest
        prof_ms = float(e.head_ms[e.index(upto)] - e.head_ms[e.index(first)])
        observe.observe_reply(
            observe.ReplyObservation(
                bytes_up=res.bytes_up,
                bytes_down=res.bytes_down,
                net_s=(res.rpc_ms - hops.edge_ms) / 1e3,
                tail_s=res.tail_ms / 1e3,
                profiled_tail_s=prof_ms / 1e3,
                queue_wait_s=res.queue_ms / 1e3,
            ),
            now,
            link=self.hop1,
            load=self.edge_load,
        )
        if hops.forwarded:
            obs = _cloud_reply(
                self.tables[2],
                second,
                tail_ms=hops.next_tail_ms,
                queue_ms=hops.next_queue_ms,
                bytes=hops.next_bytes_up + hops.next_bytes_down,
                net_ms=hops.next_ms - hops.next_tail_ms - hops.next_queue_ms,
            )
            observe.observe_reply(obs, now, link=self.hop2, load=self.cloud_load)

    def _observe_cloud(self, queue_ms: float, tail_ms: float, cut: str) -> None:
        """The cloud's load from its direct reply (its bytes cross both hops: no one hop's sample)."""
        obs = _cloud_reply(self.tables[2], cut, tail_ms=tail_ms, queue_ms=queue_ms)
        observe.observe_reply(obs, self.clock(), link=None, load=self.cloud_load)

    # -- probes ------------------------------------------------------------------------------------
    def probe_once(self) -> None:
        """One prober round: revive tiers whose backoff is over; refresh stale hop estimates through the
        edge (its next hop included); learn the cloud's address from the edge."""
        now = self.clock()
        timeout = self.config.probe_timeout_s
        if self.cloud is not None and self.cloud.due(now):  # the edge is revived by the probe below
            _revive(self.cloud, timeout, self.clock, self._lock)
        edge = self.edge.device
        assert edge is not None
        if not (self.edge.up() or self.edge.due(now)):
            return
        with self._lock:  # an RTT probe first, then bandwidth probes while transfers leave a hop stale
            sizes = observe.relay_probe_sizes(
                (self.hop1, self.hop2), now, tier_due=self.edge.due(now) or self.next.due(now)
            )
        if sizes is None:
            return
        if self.edge.due(now):
            edge.close()  # a fresh channel: the old one may sit in gRPC's reconnect backoff
        try:
            if self.cloud is None:
                address = edge.status(timeout_s=timeout).next_address
                if address:
                    self.set_cloud(address)
            if max(sizes) > RTT_PROBE_BYTES:  # an RTT probe first (see _rtt_probe)
                _rtt_probe(edge, self.hop1, self.hop2, timeout, self.clock, self._lock)
            p = edge.probe(sizes[0], RTT_PROBE_BYTES, timeout_s=timeout, next_bytes=(sizes[1], RTT_PROBE_BYTES))
        except CloudError as exc:
            with self._lock:
                self.edge.failed(self.clock(), f"{type(exc).__name__}: {exc}")
            return
        now = self.clock()
        with self._lock:
            self.edge.answered()
            _feed(self.hop1, now, sizes[0], max(p.seconds - (p.next_ms or 0.0) / 1e3, 0.0))
            if p.next_ms is None:
                self.next.failed(now, p.next_error)
                return
            self.next.answered()
            _feed(self.hop2, now, sizes[1], p.next_ms / 1e3)

    def _loop(self) -> None:
        while not self._stop.wait(self.config.prober_interval_s):
            try:
                self.probe_once()
            except Exception:  # the prober must never die; the next round tries again
                continue

    def status(self) -> dict[str, object]:
        now = self.clock()
        with self._lock:
            h1, h2 = self.hop1.estimate(now), self.hop2.estimate(now)
            return {
                "plan": self.controller.current,
                "hop1_mbps": h1.bandwidth_mbps,
                "hop1_rtt_ms": h1.rtt_ms,
                "hop2_mbps": h2.bandwidth_mbps,
                "hop2_rtt_ms": h2.rtt_ms,
                "edge": self.edge.snapshot(),
                "next": self.next.snapshot(),
                "cloud": self.cloud.snapshot() if self.cloud else None,
                **self.stats,
            }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for tier in (self.edge, self.cloud):
            if tier is not None and tier.device is not None:
                tier.device.close()

    def __enter__(self) -> ChainDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
