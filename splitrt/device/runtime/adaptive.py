"""The adaptive device runtime: per request, plan -> head -> cloud (or local) -> outputs, never lost.

This is the I/O shell around the pure parts: it reads the clock, asks the ``Controller`` for a plan
from the ``netmon`` estimates, runs the head with a ``Device``, sends to the best live cloud, and when
the cloud is unreachable, slow or failing it finishes the request locally *from the head's output*
within the deadline. Failed clouds are retried with exponential backoff by a background prober,
which also keeps the link estimate fresh with ``Probe`` RPCs when real transfers are stale.

The background prober lives in ``prober`` and the clouds' health and backoff in ``clouds``; their
public names (``slow_start_after_idle``, ``IDLE_WAIT_ROUNDS``) stay importable from here.

Policies (the rig's strategies drive the same code): ``adaptive`` re-plans per request; ``periodic:S``
re-plans every S seconds (REAP-style); ``fixed:PLAN`` never re-plans (``device``, ``cloud@fp16``, ...).

- ``AdaptiveDevice(model, table, clouds=[...], *, config=RuntimeConfig(...), device_config, power, log,
  clock=time.monotonic, start_prober=True, connect=None)``: ``connect(address) -> Transport`` makes each cloud's
  transport (again after a failure: a fresh one); None: the gRPC (or v2) transport from ``device_config``.
  Runtime tests that need a working cloud, not sockets, pass ``tests/fakecloud.FakeCloud .connect`` (a real
  servicer through ``InProcessTransport``). ``.infer(inputs, *, request=None, deadline_ms=None) ->
  Outcome(request, outputs, plan, latency_ms, fallback, server, decision, result, fallback_reason)`` (why the
  tail ran here: each cloud's error, or no time left; also ``decision.extra["fallback_reason"]``); raises only
  for bad inputs (an onnxruntime error on the device is ``InputError``). ``.set_clouds([...])`` (order =
  preference among equals), ``.clouds()``, ``.status()``, ``.stats``, ``.close()``.
- ``RuntimeConfig(deadline_ms, policy="adaptive" | "periodic:S" | "fixed:PLAN", controller, link,
  backoff_initial_s, backoff_max_s, prober_interval_s, probe_timeout_s, balance=BalanceConfig(), ...)``.
- The deadline holds with a local fallback (``plan.reserve.send_budget``, the simulator's too): an RPC gets what
  is left of the deadline once the local finish (its profiled time x device load x ``LOCAL_SAFETY`` 1.5, plus
  ``LOCAL_SLACK_MS`` 10) is kept in reserve; but the whole remaining budget (at least the local finish) when
  the local finish would miss the deadline anyway, and the whole remaining budget the first time a cut goes
  to a server (a cold tail's build). With no room left the cloud is not asked: ``Outcome.not_sent`` says why,
  ``stats["not_sent"]`` counts it, and it is no fallback (nothing reached the wire).
- Several clouds (``device.runtime.balancer.Balancer``, one turn per request): every request orders the admitting clouds
  with ``plan.balance.order`` (queue estimate, RTT, this device's requests on the wire to each:
  ``Cloud.inflight``, ``Cloud.workers``), is planned with the first one's queue, and tries them in that order,
  then finishes locally: a cloud that dies mid-request costs a retry, never the request. With two or more
  candidates the decision carries ``extra["balance"]`` (``Choice.to_json()``), which ``plan.balance.replay``
  recomputes. ``Cloud.served`` counts what each answered (``.clouds()`` lists it). Servers keep nothing per
  device or request (tails keyed by model sha256 + cut, shape-generic): any server holding the model serves any
  request, so one more server is more capacity.
- A refused connection marks a cloud down at once, a timeout only the second time in a row; a down cloud is
  probed again after exponential backoff on a fresh channel.
- Queue (``Cloud.queue``, a ``plan.queueing.QueueEstimator`` per cloud): fed by every reply's ``Load`` (own
  request subtracted; not its ``queue_ms``: the wait one request met; a first session build is ``build_ms``) and
  by probes; the first cloud the request may go to gives the decision's ``LoadEstimate.queue_ms``. A
  RESOURCE_EXHAUSTED with a retry hint is not a failure: that request finishes locally (or on the next cloud),
  ``stats["refused"]`` counts it, and the cloud is left out of plans (``Clouds.admitting(now)``) until the hint
  expires.
- The prober probes a live cloud only when the link estimate is stale and no request is on the wire (for up to 8
  rounds; then anyway): an RTT probe (64 B) always, a bandwidth probe (two back to back, the second counted,
  where the kernel restarts slow start after idle: ``bandwidth_probe_pairs=None`` reads
  ``net.ipv4.tcp_slow_start_after_idle``; True/False force it) only when no transfer refreshed bandwidth.
- Every request feeds ``LoadEstimator.add_head(now, measured_ms=, profiled_ms=)`` (the whole model's time on the
  device plan): the device's real speed over the profile, net of the utilisation factor.
- Every request that did not fall back feeds its controller's corrections (``plan.correction``, as ``rig.sim``
  does): what it took beyond its head and its RPC against the decision's encode + call terms; its log line
  carries ``extra["observed"]`` (index, plan, predicted_ms, measured_ms, t_s), which ``replay`` feeds back.
- Per-shape plans (``device.runtime.shapeplans``): the table given was profiled at ``table_shapes``
  (default: the bound graph's ``input_shapes``, else the first request's). A request of another input-shape
  signature gets, once, a table scaled from it (``plan.reshape.scale_table`` on ``graph.rebind.cut_costs_at``)
  and its own controller (LRU of ``RuntimeConfig.max_shapes``); decisions carry ``extra["shape"]`` and where
  their table came from (``extra["costs"]``: ``RuntimeConfig.table_source``, when set), and
  ``plan.reshape.replay_by_shape`` replays such logs. ``.shape_plans()``, ``.table_for(sig)``.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TextIO

from splitrt.device.client.device import Device, DeviceConfig, HeadResult, SplitResult
from splitrt.device.runtime import feedback
from splitrt.device.runtime.balancer import Balancer
from splitrt.device.runtime.clouds import Cloud, Clouds, Connect
from splitrt.device.runtime.config import RuntimeConfig
from splitrt.device.runtime.dispatch import Answer, Dispatcher
from splitrt.device.runtime.hops import Hops
from splitrt.device.runtime.outcome import Outcome, ended, tier_name
from splitrt.device.runtime.prober import IDLE_WAIT_ROUNDS, Prober, slow_start_after_idle
from splitrt.device.runtime.shapeplans import ShapePlan, ShapePlans
from splitrt.errors import ConfigError, InputError
from splitrt.plan import observe, reshape
from splitrt.plan.controller import Controller, Decision, Policy
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, CostTable, Power, is_image_codec
from splitrt.plan.netmon import LinkEstimator, LoadEstimate, LoadEstimator
from splitrt.plan.path import parse_path
from splitrt.plan.reshape import Signature
from splitrt.transport import imagecodec

__all__ = ["IDLE_WAIT_ROUNDS", "AdaptiveDevice", "Outcome", "RuntimeConfig", "slow_start_after_idle", "status_json"]

# How long close() waits for the background thread (a probe round, or a head-session build on a slow board):
# a session build cannot be interrupted, and a process that exits while a thread is inside onnxruntime
# aborts (exit 134 on an arm64 board, SIGTERM right after a request).
CLOSE_WAIT_S = 30.0


def _counts_failed(infer: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """``AdaptiveDevice.infer`` counting its ``InputError`` in ``stats["failed"]`` (then raised)."""

    @functools.wraps(infer)
    def counted(self: AdaptiveDevice, *args: Any, **kwargs: Any) -> Outcome:
        try:
            return infer(self, *args, **kwargs)
        except InputError:
            with self._lock:
                self.stats["failed"] += 1
            raise

    return counted


class AdaptiveDevice:
    """Thread-safe: the daemon's API threads call ``infer`` concurrently.

    A path of tiers: the device, then server tiers. Two tiers: ``table`` (the device's heads and the
    cloud's tails) and ``clouds``, the first tier's servers (balanced, in failover order). More: ``table``
    one table per tier and ``path`` the servers of each server tier (``[[edge], [cloud]]``; an empty
    last tier is learnt from the first tier's ``Status``). The first server of the plan's route runs its
    segment and forwards the rest to its next tier. Fallbacks, for any number of tiers: a server tier
    that fails -> the head output goes straight to a later tier the device reaches, else finishes here;
    a server's next tier that fails -> that server finishes (and the plans have it finish until a probe
    through it succeeds).

    The tables were profiled at ``table_shapes`` (input name -> shape; default: the bound graph's
    ``input_shapes``, else the shape of the first request). ``connect(address) -> Transport`` makes a
    cloud's transport, called again for a fresh one after a failure (default None: the gRPC, or v2,
    transport built from ``device_config``); tests pass an ``InProcessTransport`` over a servicer."""

    def __init__(
        self,
        model: Any,
        table: CostTable | Sequence[CostTable],
        clouds: Sequence[str] = (),
        *,
        path: Sequence[Sequence[str]] | None = None,
        config: RuntimeConfig | None = None,
        device_config: DeviceConfig | None = None,
        power: Power = DEFAULT_POWER,
        log: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_prober: bool = True,
        table_shapes: Mapping[str, Sequence[int]] | None = None,
        connect: Connect | None = None,
    ) -> None:
        self.config = config or RuntimeConfig()
        self.device_config = device_config or DeviceConfig()
        self.local: Device = Device(model, config=self.device_config)
        self.graph = self.local.graph  # bound when the caller bound it: sized at the profiled shapes
        tables = (table, table) if isinstance(table, CostTable) else tuple(table)
        servers = [list(clouds)] if path is None else [list(p) for p in path]
        if len(servers) != len(tables) - 1:
            raise ConfigError(
                f"path: expected {len(tables) - 1} server tiers (one per table after the device's), got {len(servers)}"
            )
        for t in tables:
            if list(t.ids) != [c.id for c in self.graph.cuts()]:
                raise ConfigError(
                    f"cost table lists {len(t.ids)} cuts, model {self.graph.path.name} has "
                    f"{len(self.graph.cuts())}: expected a profile of this model"
                )
        self.tables = tables
        self.table = tables[0]
        if any(is_image_codec(c) for c in self.table.codecs):  # Pillow's set-up, not the first request's
            imagecodec.warm()

        def make(ts: tuple[CostTable, ...]) -> tuple[Controller, Policy]:
            controller = Controller(ts, self.config.controller, power=power)
            return controller, Policy(self.config.policy, controller)

        profiled = table_shapes if table_shapes is not None else self.graph.input_shapes
        self._shapes = ShapePlans(
            self.graph,
            tables,
            make,
            size=self.config.max_shapes,
            profiled=reshape.signature(profiled) if profiled is not None else None,
        )
        # The profiled shape's planning state (other shapes get their own: ``shape_plans``).
        self.controller, self.policy = self._shapes.profiled.controller, self._shapes.profiled.policy
        self.link = LinkEstimator(self.config.link)
        self.load = LoadEstimator()
        self.clock = clock
        self.log = log
        self._lock = threading.RLock()
        self._clouds = Clouds(
            self.graph,
            self.device_config,
            backoff_initial_s=self.config.backoff_initial_s,
            backoff_max_s=self.config.backoff_max_s,
            lock=self._lock,
            connect=connect,
        )
        self._balancer = Balancer(self.config.balance)
        self.set_clouds(servers[0])
        # Hops 1.. and server tiers 2.. (none for two tiers).
        self.hops = Hops(
            len(tables),
            servers[1:],
            graph=self.graph,
            device_config=self.device_config,
            link=self.config.link,
            backoff_initial_s=self.config.backoff_initial_s,
            backoff_max_s=self.config.backoff_max_s,
            lock=self._lock,
            connect=connect,
        )
        self._warm_due = False
        self._closing = threading.Event()
        self.stats = {
            "completed": 0,
            "failed": 0,
            "fallbacks": 0,
            "switches": 0,
            "local_errors": 0,
            "shape_tables": 0,
            "refused": 0,
            "diverged": 0,
            "relayed": 0,  # requests a server forwarded to its next tier
            "not_sent": 0,  # planned for a cloud, finished here without sending (no cloud, no time): no fallback
        }
        self.last_diverged = ""  # why the last request could not be split (a specialised graph's guard)
        self._dispatch = Dispatcher(
            self.local, self._clouds, self.hops, lock=self._lock, clock=lambda: self.clock(), stats=self.stats
        )
        self.prober = Prober(self, self._clouds, lock=self._lock, after_round=self._warm_if_due)
        self.last_reply_s: float | None = None  # when the latest request ended (the prober's schedule)
        self.pace = observe.RequestPace()  # when the next request is expected (the probes' size)
        # Called when a reply comes: wakes the prober (the rig, driving the prober itself, replaces it).
        self.on_reply: Callable[[], None] = self.prober.kick
        if start_prober:
            self.prober.start()

    # -- clouds ------------------------------------------------------------------------------------
    def set_clouds(self, addresses: Sequence[str]) -> None:
        """Replace the known clouds (static list or discovery); order = preference."""
        self._clouds.set(addresses)

    def clouds(self) -> list[dict[str, object]]:
        """The servers this runtime knows: the first tier's; past it, what each tier reports of its
        next (``ADDRESS/next``) and the later tiers' servers reached directly."""
        first = self._clouds.snapshot()
        with self._lock:
            return first + self.hops.servers(first)

    # -- planning ----------------------------------------------------------------------------------
    def _decide(self, sp: ShapePlan, now_s: float, request: str, cloud: Cloud | None) -> Decision:
        """The plan from one link estimate per hop, one load per server tier and what is reachable: the
        first tier when one of its servers admits; a later tier as the tier before it reports it while
        that one is reachable, else directly."""
        with self._lock:
            # The queue of the cloud the request goes to first is the plan's queue term.
            first = replace(self.load.estimate(now_s), queue_ms=cloud.queue.estimate(now_s) if cloud else 0.0)
            links = [self.link.estimate(now_s), *[h.estimate(now_s) for h in self.hops.links]]
            loads = [first] + [
                LoadEstimate(device_factor=first.device_factor, cloud_factor=x.estimate(now_s).cloud_factor)
                for x in self.hops.loads
            ]
            up = [cloud is not None]
            for nxt, direct in zip(self.hops.next, self.hops.direct, strict=True):
                up.append(nxt.up() if up[-1] else bool(direct.admitting(now_s)))
            return sp.policy.decide(now_s, links, loads, cloud_available=up, request=request)

    def shape_plans(self) -> dict[Signature, ShapePlan]:
        """The signatures planned for now, the profiled one first (the others most recent last)."""
        return self._shapes.snapshot()

    def table_for(self, sig: Signature | None) -> CostTable:
        """The table requests of ``sig`` are planned with (None: the profiled one); for an evicted or
        unseen signature the scaled table is computed afresh. ``reshape.replay_by_shape`` takes this."""
        held = self.shape_plans().get(sig) if sig is not None else self._shapes.profiled
        return held.table if held is not None else self._shapes.tables_at(sig or ())[0][0]

    # -- one request -------------------------------------------------------------------------------
    @_counts_failed
    def infer(
        self, inputs: Mapping[str, Any], *, request: str | None = None, deadline_ms: float | None = None
    ) -> Outcome:
        """Outputs for ``inputs``; raises only for bad inputs (``InputError``, counted in ``stats["failed"]``:
        the device's check or head refused them, or a splitrt cloud answered INVALID_ARGUMENT for its tail,
        which is then not run again here; a v2 engine's refusal finishes locally), never for the cloud."""
        rid = request or uuid.uuid4().hex[:12]
        t0 = time.perf_counter()
        now = self.clock()
        deadline = deadline_ms or self.config.deadline_ms
        feeds = self.local.check_inputs(inputs)
        diverges = self.local.diverges(feeds)
        if diverges is not None:  # not the branch the graph was specialised for: no cut of it is right
            return self._original(feeds, rid, t0, diverges)
        # decide (plan) -> execute (device, transport) -> observe (plan.observe), each once.
        sp = self._shapes.get(reshape.signature({n: a.shape for n, a in feeds.items()}), feeds)
        live = self._clouds.admitting(now)  # a cloud that refused us waits out its retry hint
        with self._lock:  # least loaded first; the rest are the failover order
            live, choice = self._balancer.order(live, now)
        decision = self._decide(sp, now, rid, live[0] if live else None)
        route = decision.route or tuple(range(len(self.tables)))
        cuts, codecs = parse_path(decision.plan, sp.table.codecs[0], hops=len(route) - 1)
        cut = cuts[0]
        with self._lock:  # every request: a plan may switch to the link at the next
            self.pace.started(now, sends=cut != DEVICE_CUT)
        head = self.local.run_head(feeds, cut, checked=True)
        targets = self.hops.targets(route, cuts, live, now) if cut != DEVICE_CUT else []
        factor = self.load.estimate(now).device_factor
        result, answer, why = self._dispatch.finish(
            sp.table, head, cuts, codecs[0], targets, t0=t0, deadline_ms=deadline, now=now, device_factor=factor
        )
        self._observe(sp, cut, head, result, answer)
        # The server that produced the outputs: the one that answered, or its next tier when it forwarded.
        relayed = result.hops is not None and result.hops.forwarded
        server = None if answer is None else answer.cloud.address
        if relayed and answer is not None and result.hops is not None:
            server = result.hops.next_address or f"{answer.cloud.address}/next"
        not_sent, fallback = ended(why, answered=answer is not None)
        finished_by = 0 if answer is None else answer.tier + int(relayed)
        latency = (time.perf_counter() - t0) * 1e3
        observed = None if fallback else self._correct(sp, decision, head, result, answer, latency)
        decision = replace(
            decision,
            actual_ms=latency,
            fallback=fallback,
            server=server,
            extra={
                **decision.extra,
                **({"observed": observed} if observed else {}),
                "model": self.graph.sha256[:16],
                "policy": self.config.policy,
                "shape": reshape.signature_json(sp.signature),
                "table": sp.source,
                **({"costs": self.config.table_source} if self.config.table_source else {}),
                **({"balance": choice.to_json()} if len(live) > 1 else {}),
                **({"not_sent": why} if not_sent else {"fallback_reason": why} if why else {}),
                **({"finished_by": tier_name(finished_by, len(self.tables))} if len(self.tables) > 2 else {}),
            },
        )
        with self._lock:
            self.stats["shape_tables"] = self._shapes.built
            self.stats["completed"] += 1
            self.stats["fallbacks"] += int(fallback)
            self.stats["not_sent"] += int(not_sent)
            self.stats["switches"] += int(decision.switched)
        if self.log is not None:
            with self._lock:
                self.log.write(decision.to_json() + "\n")
                self.log.flush()
        self._warm_due = True
        return Outcome(
            request=rid,
            outputs=result.outputs,
            plan=decision.plan,
            latency_ms=latency,
            fallback=fallback,
            server=server,
            decision=decision,
            result=result,
            fallback_reason="" if not_sent else why or "",
            not_sent=(why or "") if not_sent else "",
            route="local" if cut == DEVICE_CUT else tier_name(route[1], len(self.tables)),
            finished_by=tier_name(finished_by, len(self.tables)),
        )

    def _original(self, feeds: Mapping[str, Any], rid: str, t0: float, why: str) -> Outcome:
        """The whole original model here, for a request the specialised graph is wrong for; said in
        ``stats["diverged"]``, ``last_diverged`` and the outcome (a fallback to ``device``)."""
        result = self.local.run_original(feeds, request_id=rid)
        latency = (time.perf_counter() - t0) * 1e3
        # Not the controller's decision (it was not asked, nor is it logged: replays stay exact).
        decision = Decision(
            t_s=self.clock(),
            request=rid,
            link_mbps=(0.0,),
            link_rtt_ms=(0.0,),
            link_confidence=(0.0,),
            loads=(1.0, 1.0),
            waits_ms=(0.0,),
            up=(False,),
            previous=None,
            plan=DEVICE_CUT,
            best=DEVICE_CUT,
            predicted_ms=0.0,
            objective_value=0.0,
            switched=False,
            reason=f"diverged: {why}",
            actual_ms=latency,
            fallback=True,
            extra={"model": self.graph.sha256[:16], "diverged": why, "fallback_reason": why},
        )
        with self._lock:
            self.stats["completed"] += 1
            self.stats["fallbacks"] += 1
            self.stats["diverged"] += 1
            self.last_diverged = why
        return Outcome(
            request=rid,
            outputs=result.outputs,
            plan=DEVICE_CUT,
            latency_ms=latency,
            fallback=True,
            server=None,
            decision=decision,
            result=result,
            fallback_reason=f"diverged: {why}",
        )

    def _observe(self, sp: ShapePlan, cut: str, head: HeadResult, res: SplitResult, answer: Answer | None) -> None:
        """What one request says about the links, the servers and the device, into the estimators: built
        as a value (``device.runtime.feedback``), fed by ``plan.observe`` under the lock, which the estimators need
        (plain objects that request threads and the prober change and ``_decide`` reads together)."""
        cloud = answer.cloud if answer is not None and (answer.tier == 1 or res.hops is not None) else None
        queue = cloud.report(res.load) if cloud is not None and res.load is not None else None
        obs = feedback.observation(
            sp.tables,
            cut,
            head,
            res,
            tier=None if answer is None else answer.tier,
            next_cut=None if answer is None else answer.next_cut,
            queue=queue,
        )
        now = self.clock()
        # the gap before the next request starts (a reply came, or the request finished here, leaving the
        # link idle all the same): a due probe goes out now
        self.last_reply_s = now
        self.on_reply()
        with self._lock:
            observe.observe_request(
                obs,
                now,
                links=[self.link, *self.hops.links],
                loads=[self.load, *self.hops.loads],
                queue=cloud.queue if cloud is not None else None,
            )
            if res.hops is not None:
                self.stats["relayed"] += int(res.hops.forwarded)

    def _correct(
        self,
        sp: ShapePlan,
        decision: Decision,
        head: HeadResult,
        res: SplitResult,
        answer: Answer | None,
        latency_ms: float,
    ) -> dict[str, object]:
        """What the request took beyond its price, into the plan's corrections; the log line's ``observed``."""
        now = self.clock()
        with self._lock:
            obs = feedback.correction(
                decision,
                head,
                res,
                answered=answer is not None,
                latency_ms=latency_ms,
                t_s=now,
                load_lag=self.load.device_lag(now),
            )
            index = sp.controller.observe(obs)
        return {"index": index, **obs.to_json()}

    def _warm(self, now_s: float) -> None:
        """Build head sessions of the plans likely next, off the request path's critical section."""
        if not self.config.warm_sessions or self.config.policy != "adaptive":
            return
        with self._lock:  # the plans of the shape requests come at now
            plans = self._shapes.last.controller.warm_plans(self.link.estimate(now_s), self.load.estimate(now_s))
        for cut in [parse_path(p, self.table.codecs[0])[0][0] for p in plans[:4]]:
            if not self._closing.is_set():
                self.local.warm(cut)

    # -- background: probes, device load -----------------------------------------------------------
    @property
    def last_local_error(self) -> str:
        """The last error of ours that finished a request here (``stats["local_errors"]``)."""
        return self._dispatch.last_local_error

    def probe_once(self) -> None:
        """One prober round now (the rig and the tests drive it by hand with ``start_prober=False``)."""
        self.prober.probe_once()

    def _warm_if_due(self) -> None:
        if self._warm_due:
            self._warm_due = False
            self._warm(self.clock())

    def status(self) -> dict[str, object]:
        now = self.clock()
        with self._lock:
            est = self.link.estimate(now)
            load = self.load.estimate(now)
            last = self._shapes.last
            return {
                "plan": last.controller.current,
                "policy": self.config.policy,
                "shape": reshape.signature_json(last.signature),
                "shape_plans": len(self.shape_plans()),
                "bandwidth_mbps": est.bandwidth_mbps,
                "rtt_ms": est.rtt_ms,
                "confidence": est.confidence,
                "device_load": load.device_factor,
                "cloud_load": load.cloud_factor,
                "clouds": self.clouds(),
                # Three tiers: the hops past the first server, what each server reports of its next tier
                # and the later tiers' servers reached directly.
                **({"path": self.hops.status(now)} if self.hops.next else {}),
                **self.stats,
            }

    def close(self) -> None:
        self._closing.set()  # no new session build; the one in progress is waited for (CLOSE_WAIT_S)
        self.prober.stop(timeout_s=CLOSE_WAIT_S)
        self._clouds.close()
        self.hops.close()

    def __enter__(self) -> AdaptiveDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_json(dev: AdaptiveDevice) -> str:
    return json.dumps(dev.status(), default=str)
