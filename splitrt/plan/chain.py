"""The three-tier controller (pure): both cuts of a device -> edge -> cloud chain, per request.

Per request it re-solves the chain (``solver.solve_chain``) from one link estimate per hop (device ->
edge, edge -> cloud) and the three tiers' loads, and switches only past a hysteresis margin, as the
two-tier ``Controller`` does. What is reachable decides the route:

- ``edge`` (the edge is up): a chain plan ``A>B@codec``; the edge's next tier down -> ``B`` is pinned to
  ``device`` (the edge finishes every request);
- ``cloud`` (the edge is down, the cloud is known and up): a two-tier plan ``A@codec`` straight to the
  cloud, over a link estimated as the two hops in series (min bandwidth, RTTs added: no direct sample);
- ``local``: ``device``.

``device`` (everything on the device) is a candidate on every route. Every decision is a
``ChainDecision`` whose JSON line holds all its inputs; ``replay`` feeds a log back through a fresh
controller and must reproduce every plan. No clocks, sockets or sessions: ``now_s`` comes in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

from splitrt.plan.controller import check_switching
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.netmon import LinkEstimate
from splitrt.plan.solver import (
    ChainConditions,
    chain_objective,
    evaluate,
    evaluate_chain,
    parse_chain_plan,
    solve,
    solve_chain,
)

ROUTES = ("edge", "cloud", "local")


@dataclass(frozen=True, kw_only=True)
class ChainControllerConfig:
    objective: str = "latency"
    # Switch only when the plan in use is predicted to cost more than the best by both margins.
    hysteresis_fraction: float = 0.08
    hysteresis_ms: float = 1.0
    # Lossless by default (a lossy codec changes the answer); None: every codec of the tables.
    codecs: tuple[str, ...] | None = ("fp32",)

    def __post_init__(self) -> None:
        check_switching(self.objective, self.hysteresis_fraction, self.hysteresis_ms)


@dataclass(frozen=True, kw_only=True)
class ChainDecision:
    """One decision and everything it was made from (one JSON line in the decision log)."""

    t_s: float
    request: str
    hop1_mbps: float  # device -> edge
    hop1_rtt_ms: float
    hop2_mbps: float  # edge -> cloud
    hop2_rtt_ms: float
    device_load: float
    edge_load: float
    cloud_load: float
    edge_available: bool
    next_available: bool  # the edge's next tier (as the edge reports it)
    cloud_available: bool  # the cloud reached directly
    previous: str | None
    plan: str  # "A>B@codec" (route edge), "A@codec" (route cloud) or "device"
    best: str  # the solver's best (differs from plan while hysteresis holds)
    route: str
    predicted_ms: float
    objective_value: float
    switched: bool
    seq: int = 0
    # Filled in by the runtime once the request is done.
    actual_ms: float | None = None
    finished_by: str | None = None  # "cloud" | "edge" | "device"
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> ChainDecision:
        return ChainDecision(**json.loads(line))

    @property
    def cuts(self) -> tuple[str, str, str]:
        """(device cut, edge cut, codec); route ``cloud``: the edge cut is the device cut (no middle),
        ``device``: ("device", "device", "")."""
        if self.plan == DEVICE_CUT:
            return DEVICE_CUT, DEVICE_CUT, ""
        if ">" in self.plan:
            return parse_chain_plan(self.plan)
        cut, _, codec = self.plan.partition("@")
        return cut, cut, codec


def _key(first: str, second: str, codec: str) -> str:
    return DEVICE_CUT if first == DEVICE_CUT else f"{first}>{second}@{codec}"


class ChainController:
    """Both cuts per request from per-hop estimates (see the module's docstring)."""

    def __init__(
        self,
        device: CostTable,
        edge: CostTable,
        cloud: CostTable,
        config: ChainControllerConfig | None = None,
        *,
        power: Power = DEFAULT_POWER,
    ) -> None:
        self.device, self.edge, self.cloud = device, edge, cloud
        self.config = config or ChainControllerConfig()
        self.power = power
        # Edge down: the device's head and the cloud's tail over one (composed) link.
        self.direct = CostTable(
            ids=device.ids,
            head_ms=device.head_ms,
            tail_ms=cloud.tail_ms,
            bytes=device.bytes.astype(np.int64),
            float_bytes=device.float_bytes.astype(np.int64),
            reply_bytes=device.reply_bytes,
            codecs=dict(zip(device.codecs, device.codec_ratios.tolist(), strict=True)),
        )
        self.current: str | None = None
        self.switches = 0
        self._seq = 0

    def _cost(self, route: str, plan: str, chain: ChainConditions, direct: Conditions) -> tuple[float, float]:
        """(objective value, predicted ms) of ``plan`` on ``route``."""
        obj, power = self.config.objective, self.power
        if route == "edge":
            key = f"{DEVICE_CUT}>{DEVICE_CUT}@{self.device.codecs[0]}" if plan == DEVICE_CUT else plan
            cp = evaluate_chain(self.device, self.edge, self.cloud, key, chain, objective=obj, power=power)
            return chain_objective(cp), cp.predicted_ms
        p = evaluate(self.direct, plan, direct, objective=obj, power=power)
        value = {"latency": p.predicted_ms, "energy": p.energy_mj}.get(obj, p.period_ms)
        return value, p.predicted_ms

    def _best(self, route: str, chain: ChainConditions, direct: Conditions, next_available: bool) -> str:
        codecs = self.config.codecs
        if route == "edge":
            cp = solve_chain(
                self.device,
                self.edge,
                self.cloud,
                chain,
                objective=self.config.objective,
                power=self.power,
                codecs=codecs,
                edge_cuts=None if next_available else [DEVICE_CUT],
            )
            return _key(cp.device_cut, cp.edge_cut, cp.codec)
        if route == "cloud":
            return str(solve(self.direct, direct, objective=self.config.objective, power=self.power, codecs=codecs))
        return DEVICE_CUT

    def _feasible(self, plan: str | None, route: str, next_available: bool) -> bool:
        if plan is None:
            return False
        if plan == DEVICE_CUT:
            return True
        if route == "local" or (">" in plan) != (route == "edge"):
            return False
        return route != "edge" or next_available or parse_chain_plan(plan)[1] == DEVICE_CUT

    def decide(
        self,
        now_s: float,
        hop1: LinkEstimate,
        hop2: LinkEstimate,
        *,
        device_load: float = 1.0,
        edge_load: float = 1.0,
        cloud_load: float = 1.0,
        edge_available: bool = True,
        next_available: bool = True,
        cloud_available: bool = True,
        request: str = "",
    ) -> ChainDecision:
        route = "edge" if edge_available else "cloud" if cloud_available else "local"
        chain = ChainConditions(
            device_edge=Link(bandwidth_mbps=hop1.bandwidth_mbps, rtt_ms=hop1.rtt_ms),
            edge_cloud=Link(bandwidth_mbps=hop2.bandwidth_mbps, rtt_ms=hop2.rtt_ms),
            device_load=device_load,
            edge_load=edge_load,
            cloud_load=cloud_load,
        )
        # No sample of the direct path: the two hops in series.
        direct = Conditions(
            link=Link(bandwidth_mbps=min(hop1.bandwidth_mbps, hop2.bandwidth_mbps), rtt_ms=hop1.rtt_ms + hop2.rtt_ms),
            device_load=device_load,
            cloud_load=cloud_load,
        )
        best = self._best(route, chain, direct, next_available)
        value, predicted = self._cost(route, best, chain, direct)
        plan, previous = best, self.current
        if previous is not None and previous != best and self._feasible(previous, route, next_available):
            held, held_ms = self._cost(route, previous, chain, direct)
            gain = held - value
            cfg = self.config
            if gain <= cfg.hysteresis_fraction * abs(held) or gain <= cfg.hysteresis_ms:
                plan, value, predicted = previous, held, held_ms
        switched = previous is not None and plan != previous
        self.switches += int(switched)
        self.current = plan
        self._seq += 1
        return ChainDecision(
            t_s=now_s,
            request=request,
            hop1_mbps=hop1.bandwidth_mbps,
            hop1_rtt_ms=hop1.rtt_ms,
            hop2_mbps=hop2.bandwidth_mbps,
            hop2_rtt_ms=hop2.rtt_ms,
            device_load=device_load,
            edge_load=edge_load,
            cloud_load=cloud_load,
            edge_available=edge_available,
            next_available=next_available,
            cloud_available=cloud_available,
            previous=previous,
            plan=plan,
            best=best,
            route=route if plan != DEVICE_CUT else "local",
            predicted_ms=predicted,
            objective_value=value,
            switched=switched,
            seq=self._seq,
        )


def replay(
    lines: Iterable[str],
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    config: ChainControllerConfig | None = None,
    *,
    power: Power = DEFAULT_POWER,
) -> list[tuple[ChainDecision, ChainDecision]]:
    """Each logged decision (in ``seq`` order) beside the one a fresh controller makes from its inputs."""
    logged = sorted((ChainDecision.from_json(line) for line in lines if line.strip()), key=lambda d: d.seq)
    ctl = ChainController(device, edge, cloud, config, power=power)
    out = []
    for d in logged:
        hop1 = LinkEstimate(bandwidth_mbps=d.hop1_mbps, rtt_ms=d.hop1_rtt_ms, confidence=1.0)
        hop2 = LinkEstimate(bandwidth_mbps=d.hop2_mbps, rtt_ms=d.hop2_rtt_ms, confidence=1.0)
        out.append(
            (
                d,
                ctl.decide(
                    d.t_s,
                    hop1,
                    hop2,
                    device_load=d.device_load,
                    edge_load=d.edge_load,
                    cloud_load=d.cloud_load,
                    edge_available=d.edge_available,
                    next_available=d.next_available,
                    cloud_available=d.cloud_available,
                    request=d.request,
                ),
            )
        )
    return out


__all__ = ["ROUTES", "ChainController", "ChainControllerConfig", "ChainDecision", "replay"]
