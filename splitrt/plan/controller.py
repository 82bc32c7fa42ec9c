"""The adaptive controller (pure): which plan the next request uses over a path of tiers, and why.

A path is the device, then 0..k servers (two tiers: device -> cloud; three: device -> edge -> cloud),
one cost table per tier (``Controller(table)`` is the two-tier path with one table for both). Per
request the controller re-solves from one link estimate per hop and one load per tier, and switches
only when the predicted gain beats a hysteresis threshold (relative and absolute), so stationary noise
does not make it flap, or when smaller gains persist until their sum (less a drift) beats it: a plan a
few % dearer is not held for good.

What is reachable decides the route, identically for any number of tiers: the plan runs over the
device and the servers that are up, in path order; a server that is down is skipped and the hops
around it are taken in series (the narrower bandwidth, both round trips: there is no sample of the
direct link). No server up: ``device`` (the whole model here). When the route changes (a tier is lost
or comes back) the best plan on the new route is taken at once, without hysteresis: a plan held over
from another route prices tiers that are not there (two tiers did this before three did; three tiers
used to leave ``device`` by hysteresis, now they return as two tiers do).

Every decision is a ``Decision`` whose JSON line (and compact string form) holds all its inputs:
``plan.replay`` feeds a log back through a fresh controller and must reproduce every decision. No clocks,
sockets or sessions here: ``now_s`` and the estimates come in as arguments.

- ``Controller(table | (device_tbl, edge_tbl, ..., cloud_tbl), ControllerConfig(objective, hysteresis_fraction,
  hysteresis_ms, warm_bandwidth_factors, codecs=("fp32",), cuts=None), *, power)``: ``.decide(now_s, link |
  [link per hop], load | [LoadEstimate per server], *, cloud_available=bool | [per server], request) ->
  Decision``. The live route is the device and the servers up (a skipped server's hops in series: min bandwidth,
  RTTs added); hysteresis only on an unchanged route, a changed route (a tier lost or back) takes the best at
  once; no server up: ``device``. ``config.cuts`` restricts the device's cut; three tiers and more plan one
  codec on every hop. ``Policy(spec, controller)``: adaptive, route, periodic:S, fixed:PLAN for any N (a fixed
  plan needs the tiers it sends to, else the controller's fallback).
- ``Decision`` (``plan.decision``: the record, its JSON line and string form; imported here too).
  ``plan.replay.replay(lines, table | tables, config) -> [(logged, replayed)]`` reproduces the plans.
- ``Controller(table: CostTable, config: ControllerConfig | None, *, power)``: ``.decide(now_s, link:
  LinkEstimate, load: LoadEstimate, *, cloud_available=True, request="") -> Decision``; ``.current`` (plan key
  in use), ``.switches``, ``.warm_plans(link, load) -> list[str]``.
- ``ControllerConfig(objective="latency", hysteresis_fraction=0.08, hysteresis_ms=1.0, hold_drift_fraction=0.25,
  warm_bandwidth_factors=(...), codecs=("fp32",), cuts=None)``: lossless unless the user allows lossy codecs;
  a hold within the margin accumulates its gains (less ``hold_drift_fraction`` x the margin each decision, at
  least 0): once they pass the margin the best is taken (reason ``... persists``);
  ``cuts`` the allowed cuts (constraints, ``route``); with ``cuts`` every decision's ``extra`` holds
  ``unconstrained`` (the solver's best over every cut) and ``constraint_cost`` (objective units).
- Corrections (``plan.correction``): ``controller.observe(Observation(plan, predicted_ms, measured_ms, t_s)) ->
  index`` after each request (the runtime and ``rig.sim`` both); with the latency objective ``decide`` adds each
  plan's offset at ``now_s`` to its price (two tiers) before comparing and before hysteresis, and the decision
  carries it as a term (``correction_ms``) with ``seen``. ``ControllerConfig.correction`` (``CorrectionConfig``).
- ``Policy(spec, controller)``: ``adaptive`` | ``route`` | ``periodic:S`` | ``fixed:PLAN``
  (``parse_policy(spec)`` checks the string); ``.decide(...)`` as the controller's. The runtime and
  ``splitrt.sim`` both decide through it. ``route`` = adaptive over ``ROUTE_CUTS`` (``cloud``, ``device``): it
  narrows ``controller.config`` with ``route_config`` (intersecting any ``cuts``); ``replay`` applies it to logs
  whose ``extra.policy`` is ``route``. ``route-codec`` (``ROUTE_CODEC``) is ``route`` sending the input under the
  table's image codecs (``route_codec_config``; a table without any: its lossy codecs): the camera router.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from splitrt.errors import ConfigError, PlanError
from splitrt.plan import costmodel
from splitrt.plan.correction import CorrectionConfig, Corrections, Observation
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.decision import Decision
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.objective import OBJECTIVES
from splitrt.plan.path import PathConditions, Plan, evaluate_path, format_path, parse_path, parse_plan, solve_path
from splitrt.plan.solver import evaluate, solve

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    objective: str = "latency"
    # Switch only when the current plan is predicted to cost more than the best by both margins.
    hysteresis_fraction: float = 0.08
    hysteresis_ms: float = 1.0
    # Small gains that persist add up (a CUSUM of the held plan's predicted excess over the best, less this
    # share of the margin per decision): past the margin the best is taken. A one-off gain within the margin
    # is still held, but a plan predicted worse by a few % on every request is no longer held for good
    # (on the rig a held ``device`` ran 10 requests at 18-20 ms over the cloud's price, margin 26 ms).
    # 0 disables (the margin alone decides).
    hold_drift_fraction: float = 0.25
    # Plans to keep warm: the best at these multiples of the estimated bandwidth.
    warm_bandwidth_factors: tuple[float, ...] = (0.25, 0.5, 2.0, 4.0)
    # Lossless by default: a lossy codec (fp16, int8) changes the answer, so it is the user's choice.
    # None allows every codec in the cost table. Over three or more tiers one codec is used on every
    # hop (an edge forwards with the codec it was sent).
    codecs: tuple[str, ...] | None = ("fp32",)
    # The device's cuts plans may use (None: every cut): a deployment's constraints (``plan.constraints``)
    # or the ``route`` policy (device and cloud only). ``device`` stays the fallback when no server is up.
    cuts: tuple[str, ...] | None = None
    # What each request measured against its price, per plan (``plan.correction``).
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if not 0.0 <= self.hysteresis_fraction < 1.0:
            raise ConfigError(f"hysteresis_fraction: expected [0, 1), got {self.hysteresis_fraction!r}")
        if self.hysteresis_ms < 0:
            raise ConfigError(f"hysteresis_ms: expected >= 0, got {self.hysteresis_ms!r}")
        if not 0.0 <= self.hold_drift_fraction <= 1.0:
            raise ConfigError(f"hold_drift_fraction: expected [0, 1], got {self.hold_drift_fraction!r}")
        if self.cuts is not None and not self.cuts:
            raise ConfigError("cuts: expected None (every cut) or at least one cut id, got ()")


def _per(value: Any, n: int, kind: type, what: str) -> tuple[Any, ...]:
    """One value for each of ``n`` hops or servers: a sequence of ``n``, or one value for all."""
    if isinstance(value, kind):
        return (value,) * n
    out = tuple(value)
    if len(out) != n:
        raise PlanError(f"{what}: expected {n} values or one for all, got {len(out)}")
    return out


@dataclass(frozen=True)
class _Route:
    """The tiers a request can use now and what the solver plans them with."""

    tiers: tuple[int, ...]  # 0 (the device), then the servers that are up, in path order
    on: tuple[int, ...]  # the tiers the plan's hops go through: ``tiers``, or the whole path
    tables: tuple[CostTable, ...]
    path: PathConditions  # one hop per pair of consecutive tiers of ``on``
    free: int  # hops that may carry; the later ones (to tiers that are down) are pinned to `device`

    def two_tier(self) -> Conditions:
        return Conditions(
            link=self.path.hops[0],
            device_load=self.path.loads[0],
            cloud_load=self.path.loads[1],
            queue_ms=self.path.queue(0),
        )


class DecideOptions(TypedDict, total=False):
    """``Controller.decide``'s keywords (``Policy.decide`` passes them on)."""

    cloud_available: bool | Sequence[bool]
    request: str


class Controller:
    """Holds the current plan; ``decide`` is a pure function of (state, inputs)."""

    def __init__(
        self,
        table: CostTable | Sequence[CostTable],
        config: ControllerConfig | None = None,
        *,
        power: Power = DEFAULT_POWER,
    ) -> None:
        self.tables = (table, table) if isinstance(table, CostTable) else tuple(table)
        if len(self.tables) < 2:
            raise ConfigError(f"a path needs at least 2 tiers (the device and a server), got {len(self.tables)}")
        self.table = self.tables[0]  # the device's: its cuts, codecs and head times
        for t, other in enumerate(self.tables[1:], start=1):
            if other.ids != self.table.ids or other.codecs != self.table.codecs:
                raise ConfigError(f"tier {t}'s table: expected the cuts and codecs of tier 0's, got others")
        self.config = config or ControllerConfig()
        self.power = power
        self.current: str | None = None
        self.live: tuple[int, ...] | None = None  # the route ``current`` was chosen on
        self.switches = 0
        self._seq = 0
        self._direct: dict[int, CostTable] = {}
        # (the held plan, the evidence against it in objective units): decide() alone updates it, from its
        # own inputs, so a replay that feeds the same decisions rebuilds it
        self._pressure: tuple[str, float] = ("", 0.0)
        self.corrections = Corrections(self.config.correction)

    @property
    def hops(self) -> int:
        return len(self.tables) - 1

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def direct_table(self, tier: int) -> CostTable:
        """Two tiers, the device and ``tier``: the device's heads, that tier's tails."""
        t = self.tables[tier]
        if t is self.table:
            return t
        if tier not in self._direct:
            self._direct[tier] = CostTable.joined(self.table, t)
        return self._direct[tier]

    def route(
        self,
        links: Sequence[LinkEstimate],
        loads: Sequence[LoadEstimate],
        up: Sequence[bool],
    ) -> _Route:
        """The live route: the device and the servers up. When the servers down are the last ones, the
        plan is over the whole path with the hops to them pinned to `device` (``c3@fp32>device``: the
        edge finishes); a server skipped in the middle is left out and the hops around it are taken in
        series (the narrower bandwidth, both round trips)."""
        n = len(self.tables)
        tiers = (0, *[t for t in range(1, n) if up[t - 1]])
        prefix = n > 2 and len(tiers) > 1 and tiers == tuple(range(len(tiers)))
        on = tuple(range(n)) if prefix else tiers
        # Nothing reachable: the plan is `device`, priced on the first hop (nothing crosses it).
        ends = itertools.pairwise(on) if len(on) > 1 else [(0, 1)]
        hops, tier_loads, queues = [], [max(loads[0].device_factor, 1e-3)], []
        for a, b in ends:
            span = links[a:b]
            bandwidth = min(x.bandwidth_mbps for x in span)
            hops.append(Link(bandwidth_mbps=max(bandwidth, 1e-6), rtt_ms=max(sum(x.rtt_ms for x in span), 0.0)))
            tier_loads.append(max(loads[b - 1].cloud_factor, 1e-3))
            queues.append(max(loads[b - 1].queue_ms, 0.0) if len(tiers) > 1 else 0.0)
        path = PathConditions(hops=tuple(hops), loads=tuple(tier_loads), queue_ms=tuple(queues))
        if len(on) <= 2:
            return _Route(tiers, on, (self.direct_table(on[-1] if len(on) == 2 else 1),) * 2, path, 1)
        return _Route(tiers, on, (self.table, *[self.tables[t] for t in on[1:]]), path, len(tiers) - 1)

    def solve(self, r: _Route, *, cuts: Sequence[str] | None = None, now_s: float | None = None) -> Plan:
        """The best plan on route ``r`` (``cuts``: the device's allowed cuts); with ``now_s``, each plan's
        correction then is added to its latency first (two tiers, objective latency)."""
        cfg = self.config
        codecs = list(cfg.codecs) if cfg.codecs else None
        if len(r.tiers) == 1:
            return self.evaluate(r, DEVICE_CUT)
        if len(r.on) == 2:
            bandwidth = r.two_tier().link.bandwidth_mbps
            offset = self.offset_matrix(r.tables[0], now_s, bandwidth) if now_s is not None else None
            return solve(
                r.tables[0],
                r.two_tier(),
                objective=cfg.objective,
                power=self.power,
                codecs=codecs,
                cuts=cuts,
                offset=offset,
            )
        hops = len(r.on) - 1
        pinned = [None if h < r.free else [DEVICE_CUT] for h in range(1, hops)]
        return solve_path(
            r.tables,
            r.path,
            objective=cfg.objective,
            power=self.power,
            codecs=codecs,
            cuts=[cuts, *pinned],
            same_codec=True,
        )

    def _held_pressure(self, before: tuple[str, float], held: str, gain: float, margin: float) -> float:
        """The evidence against ``held`` after one more decision whose best beats it by ``gain``: a CUSUM,
        ``max(0, before + gain - drift)`` with ``before`` the evidence the last decision left if it held
        ``held`` (else 0) and the drift ``hold_drift_fraction`` x the margin: stationary noise around an
        equal price drifts it back to 0, a gain above the drift that persists passes the margin."""
        frac = self.config.hold_drift_fraction
        if frac <= 0 or not math.isfinite(gain):
            return 0.0
        plan, value = before
        return max(0.0, (value if plan == held else 0.0) + gain - frac * margin)

    def correction_ms(self, plan: str, now_s: float, r: _Route | None = None) -> float:
        """What is added to ``plan``'s price now (0 unless the objective is latency): its learnt offset and,
        on a two-tier route ``r``, the upload of what its requests sent beyond (or short of) its price."""
        if self.config.objective != "latency":
            return 0.0
        extra = self.corrections.offset_ms(plan, now_s)
        if r is not None and len(r.on) == 2:
            extra += self.corrections.bytes_ms(r.tables[0], plan, r.two_tier().link.bandwidth_mbps)
        return extra

    def offset_matrix(self, table: CostTable, now_s: float, bandwidth_mbps: float) -> np.ndarray | None:
        """The corrections at ``now_s`` as a (cuts, codecs) matrix of ms (None: none)."""
        if self.config.objective != "latency":
            return None
        offsets = self.corrections.offsets(now_s, table.codecs)
        for key in self.corrections.bytes_plans():
            own = offsets.get(key, self.corrections.offset_ms(key, now_s))
            offsets[key] = own + self.corrections.bytes_ms(table, key, bandwidth_mbps)
        shared = self.corrections.shared_ms(now_s)
        if not shared and not any(offsets.values()):
            return None
        # every plan that sends carries the shared part; a plan with evidence of its own, its whole offset
        m = np.where(table.sends[:, None], shared, 0.0) * np.ones((1, len(table.codecs)))
        for key, f in offsets.items():
            if ">" in key:
                continue  # a plan over more tiers: not a cell of this matrix
            cut, codec = parse_plan(key, table.codecs[0])
            if cut not in table.ids:
                continue
            if cut == DEVICE_CUT:
                m[table.index(cut), :] = f  # nothing is sent: every codec is the one plan ``device``
            elif codec in table.codecs:
                m[table.index(cut), table.codec_index(codec)] = f
        return m

    def observe(self, obs: Observation) -> int:
        """What a request measured beyond its head and round trip against its price (``plan.correction``);
        returns its index, which its log line records (``replay`` feeds them back in order)."""
        return self.corrections.observe(obs)

    def evaluate(self, r: _Route, plan: str) -> Plan:
        """What ``plan`` (a key over ``r``'s hops) costs on route ``r``."""
        cfg = self.config
        if len(r.tables) == 2:
            return evaluate(r.tables[0], plan, r.two_tier(), objective=cfg.objective, power=self.power)
        return evaluate_path(r.tables, plan, r.path, objective=cfg.objective, power=self.power)

    def inputs(
        self,
        link: LinkEstimate | Sequence[LinkEstimate],
        load: LoadEstimate | Sequence[LoadEstimate],
        up: bool | Sequence[bool],
    ) -> tuple[tuple[LinkEstimate, ...], tuple[LoadEstimate, ...], tuple[bool, ...]]:
        """Per-hop links, per-server loads and reachability (one value: the same for every hop/server)."""
        n = self.hops
        return (
            _per(link, n, LinkEstimate, "links"),
            _per(load, n, LoadEstimate, "loads"),
            _per(up, n, bool, "cloud_available"),
        )

    def decide(
        self,
        now_s: float,
        link: LinkEstimate | Sequence[LinkEstimate],
        load: LoadEstimate | Sequence[LoadEstimate],
        *,
        cloud_available: bool | Sequence[bool] = True,
        request: str = "",
    ) -> Decision:
        """The plan for one request. ``link``: one estimate per hop; ``load``: one per server (its
        ``cloud_factor`` and ``queue_ms``; the device's factor is the first one's ``device_factor``);
        ``cloud_available``: one per server. A single value stands for every hop or server."""
        cfg = self.config
        links, loads, up = self.inputs(link, load, cloud_available)
        r = self.route(links, loads, up)
        previous = self.current
        best = self.solve(r, cuts=cfg.cuts if len(r.tiers) > 1 else None, now_s=now_s)
        chosen = best

        def corr(plan: str, now_s: float) -> float:
            return self.correction_ms(plan, now_s, r)

        pressure_before, self._pressure = self._pressure, ("", 0.0)  # kept only by a hold (below)
        if len(r.tiers) == 1:
            reason = "cloud unavailable: whole model on the device"
        elif previous is None:
            reason = "first plan"
        elif previous == best.key:
            reason = "best plan unchanged"
        elif self.live != r.tiers:
            back = self.live is not None and len(self.live) == 1
            reason = "cloud back: splitting again" if back else f"route {_tiers(self.live)} -> {_tiers(r.tiers)}"
        else:
            current = self.evaluate(r, previous)
            held = current.value + corr(previous, now_s)
            gain = held - (best.value + corr(best.key, now_s))
            margin = max(cfg.hysteresis_ms, cfg.hysteresis_fraction * held)
            pressure = self._held_pressure(pressure_before, previous, gain, margin)
            if gain > margin and math.isfinite(held):
                reason = f"gain {gain:.2f} > margin {margin:.2f}"
            elif gain > 0 and pressure > margin and math.isfinite(held):
                reason = f"gain {gain:.2f} persists: evidence {pressure:.2f} > margin {margin:.2f}"
            else:
                chosen = current
                reason = f"hold: gain {gain:.2f} <= margin {margin:.2f} (evidence {pressure:.2f})"
                self._pressure = (previous, pressure)
        extra: dict[str, object] = {}
        if cfg.cuts is not None and len(r.tiers) > 1:  # what the allowed cuts cost here (priced per decision)
            free = self.solve(r)
            extra = {"unconstrained": free.key, "constraint_cost": chosen.value - free.value}
        return self.record(now_s, request, (links, loads, up), r, chosen, best=best.key, reason=reason, extra=extra)

    def record(
        self,
        now_s: float,
        request: str,
        inputs: tuple[Sequence[LinkEstimate], Sequence[LoadEstimate], Sequence[bool]],
        r: _Route,
        chosen: Plan,
        *,
        best: str,
        reason: str,
        extra: dict[str, object] | None = None,
        live: tuple[int, ...] | None = None,
    ) -> Decision:
        """Adopt ``chosen`` (priced on route ``r``) as the plan in use and say so in a ``Decision`` (its
        price corrected at ``now_s``: the correction is a term of its own); ``live``: the tiers up now
        (default ``r``'s)."""
        links, loads, up = inputs
        extra_ms = self.correction_ms(chosen.key, now_s, r)
        previous = self.current
        switched = previous is not None and chosen.key != previous
        self.switches += int(switched)
        self.current, self.live = chosen.key, r.tiers if live is None else live
        full = tuple(range(len(self.tables)))
        return Decision(
            seq=self.next_seq(),
            t_s=now_s,
            request=request,
            link_mbps=tuple(x.bandwidth_mbps for x in links),
            link_rtt_ms=tuple(x.rtt_ms for x in links),
            link_confidence=tuple(x.confidence for x in links),
            loads=(loads[0].device_factor, *[x.cloud_factor for x in loads]),
            waits_ms=tuple(x.queue_ms for x in loads),
            up=tuple(up),
            previous=previous,
            plan=chosen.key,
            best=best,
            route=() if r.on in (full, (0,)) else r.on,
            predicted_ms=chosen.predicted_ms + extra_ms,
            objective_value=chosen.value + extra_ms,
            correction_ms=extra_ms,
            seen=self.corrections.seen,
            switched=switched,
            reason=reason,
            tier_ms=chosen.tier_ms,
            hop_upload_ms=chosen.hop_upload_ms,
            hop_download_ms=chosen.hop_download_ms,
            hop_rtt_ms=chosen.hop_rtt_ms,
            hop_queue_ms=chosen.hop_queue_ms,
            reply_bytes=chosen.reply_bytes,
            hop_encode_ms=chosen.hop_encode_ms,
            hop_call_ms=chosen.hop_call_ms,
            hop_decode_ms=chosen.hop_decode_ms,
            extra=extra or {},
        )

    def warm_plans(
        self, link: LinkEstimate | Sequence[LinkEstimate], load: LoadEstimate | Sequence[LoadEstimate]
    ) -> list[str]:
        """Plans likely to be chosen next (current, and best if bandwidth moved by the warm factors), on
        the whole path: the runtime keeps their head sessions built so a switch costs no session build."""
        keys: dict[str, None] = {}
        if self.current:
            keys[self.current] = None
        links, loads, up = self.inputs(link, load, True)
        for f in (1.0, *self.config.warm_bandwidth_factors):
            scaled = [replace(x, bandwidth_mbps=x.bandwidth_mbps * f) for x in links]
            keys[self.solve(self.route(scaled, loads, up), cuts=self.config.cuts).key] = None
        return list(keys)


def _tiers(tiers: tuple[int, ...] | None) -> str:
    return ">".join(str(t) for t in tiers or ())


ROUTE_CUTS = (CLOUD_CUT, DEVICE_CUT)  # whole-request routing: the whole model here or there
ROUTE_CODEC = "route-codec"  # routing that sends the input as an image (what a camera router does)


_BARE = ("adaptive", "route", ROUTE_CODEC)  # the policies without an argument


def parse_policy(spec: str) -> tuple[str, str]:
    """``adaptive`` | ``route`` | ``periodic:SECONDS`` | ``fixed:PLAN`` -> (kind, argument); ConfigError
    otherwise."""
    kind, _, arg = spec.partition(":")
    if kind not in (*_BARE, "periodic", "fixed") or (kind in _BARE and arg) or (kind not in _BARE and not arg):
        raise ConfigError(
            f"policy: expected adaptive, route, route-codec, periodic:SECONDS or fixed:PLAN, got {spec!r}"
        )
    if kind == "periodic":
        try:
            ok = float(arg) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"policy: periodic needs a period > 0 seconds, got {arg!r}")
    return kind, arg


class Policy:
    """What a strategy plans per request, pure like the controller it wraps, for any number of tiers:
    ``adaptive`` asks the controller every request; ``route`` is adaptive with the device's cut
    ``device`` or ``cloud`` only (whole-request routing, what hybrid-inference platforms ship: the
    baseline splitting must beat; it narrows the controller's ``config.cuts``); ``route-codec`` is route
    sending the input as an image (``route_codec_config``); ``periodic:S`` asks every
    S seconds and keeps that plan in between (REAP-style); ``fixed:PLAN`` never re-plans (``device``,
    ``cloud@fp16``, ``c3@fp32>c12@fp32``). A kept or fixed plan whose tiers are not all up gives way to
    the controller (the same fallback as adaptive). The device runtime and the trace simulator
    (``splitrt.rig.sim``) both decide through this class, so they cannot drift apart."""

    def __init__(self, spec: str, controller: Controller) -> None:
        kind, arg = parse_policy(spec)
        if kind == "fixed":  # a typo in a fixed plan fails here, not on every request
            full = controller.route(*controller.inputs(_ANY_LINK, _ANY_LOAD, True))
            try:
                controller.evaluate(full, arg)
            except PlanError as exc:
                raise ConfigError(f"policy {spec!r}: {exc}") from exc
        if kind == "route":
            controller.config = route_config(controller.config)
        if kind == ROUTE_CODEC:
            controller.config = route_codec_config(controller.config, controller.table.codecs)
        self.spec, self.kind, self.arg = spec, kind, arg
        self.controller = controller
        self._periodic_next_s = 0.0
        self._periodic_plan: str | None = None

    def decide(
        self,
        now_s: float,
        link: LinkEstimate | Sequence[LinkEstimate],
        load: LoadEstimate | Sequence[LoadEstimate],
        **options: Unpack[DecideOptions],
    ) -> Decision:
        """``Controller.decide``'s contract, under this policy."""
        ctl = self.controller
        held = self.arg if self.kind == "fixed" else None
        if self.kind == "periodic" and self._periodic_plan is not None and now_s < self._periodic_next_s:
            held = self._periodic_plan
        if held is not None:
            inputs = ctl.inputs(link, load, options.get("cloud_available", True))
            live = ctl.route(*inputs)
            on: _Route | None = None
            if self.kind == "fixed" and _needs(held, ctl.hops) <= set(live.tiers):
                on = ctl.route(inputs[0], inputs[1], (True,) * ctl.hops)  # the tiers it skips carry nothing
            elif self.kind == "periodic" and ctl.live == live.tiers:
                on = live
            if on is not None:
                p = ctl.evaluate(on, held)
                reason = f"policy {self.spec}"
                request = options.get("request", "")
                return ctl.record(now_s, request, inputs, on, p, best=p.key, reason=reason, live=live.tiers)
        d = ctl.decide(now_s, link, load, **options)
        if self.kind == "periodic":
            self._periodic_next_s = now_s + float(self.arg)
            self._periodic_plan = d.plan
        return d


_ANY_LINK = LinkEstimate(bandwidth_mbps=1.0, rtt_ms=0.0, confidence=0.0)
_ANY_LOAD = LoadEstimate(device_factor=1.0, cloud_factor=1.0)


def _needs(plan: str, hops: int) -> set[int]:
    """The tiers ``plan`` (a key over the whole path) sends to: tier h + 1 for each hop h that carries."""
    cuts = parse_path(plan, hops=hops)[0]
    return {0, *[h + 1 for h, c in enumerate(cuts) if c != DEVICE_CUT]}


def route_config(config: ControllerConfig) -> ControllerConfig:
    """``config`` restricted to whole-request routing (and to its own cuts, if it has any)."""
    cuts = tuple(c for c in ROUTE_CUTS if config.cuts is None or c in config.cuts)
    if not cuts:
        raise ConfigError(
            f"policy route: the allowed cuts {list(config.cuts or ())} include neither {CLOUD_CUT} nor {DEVICE_CUT}"
        )
    return replace(config, cuts=cuts)


def route_codec_config(config: ControllerConfig, codecs: Sequence[str]) -> ControllerConfig:
    """Routing (``route_config``) with the input sent under the table's image codecs (``codecs``: the
    table's; each priced at the input as the profile measured it, and a (cut, codec) the profile's accuracy
    guard refuses is priced out there, so the best allowed one wins), whatever ``config.codecs`` says: it is
    the router users compare with, a JPEG of the frame. A table without image codecs: its lossy ones (any
    codec but ``fp32``), else every one."""
    image = [c for c in codecs if costmodel.is_image_codec(c)]
    lossy = [c for c in codecs if c.split("+")[0] != "fp32"]
    return replace(route_config(config), codecs=tuple(image or lossy or codecs))


__all__ = [
    "ROUTE_CODEC",
    "ROUTE_CUTS",
    "Controller",
    "ControllerConfig",
    "DecideOptions",
    "Decision",
    "Policy",
    "format_path",
    "parse_policy",
    "route_codec_config",
    "route_config",
]
