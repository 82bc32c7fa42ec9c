"""The optimal cut (pure): exact over every candidate cut, two tiers or a device → edge → cloud chain.

``solve(table, cond, objective=...)`` evaluates every (cut, codec) of a ``CostTable`` with a few
numpy operations and returns a ``Plan``. Ties (within a relative 1e-12) go to the plan sending fewer
bytes, then to the earlier cut: the answer does not flicker between equal plans.

A plan's short form is ``<cut>@<codec>`` (``c12@fp16``; ``device`` alone when nothing is sent) and a
chain plan's ``<device cut>><edge cut>@<codec>``; ``parse_plan`` / ``parse_chain_plan`` read them back.
``solve_chain`` is the three-tier case of ``plan.path.solve_path`` (one codec on both hops); the two-tier
``solve`` stays a direct (cuts x codecs) matrix because it runs per request (tests/plan/test_path.py
checks it against the path solver).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitrt.errors import PlanError
from splitrt.plan.costmodel import (
    CLOUD_CUT,
    DEFAULT_POWER,
    DEVICE_CUT,
    Conditions,
    CostTable,
    Estimate,
    FloatArray,
    Link,
    Power,
)
from splitrt.plan.objective import OBJECTIVES, check_objective, objective_value
from splitrt.plan.path import PathConditions, PathPlan, evaluate_path, format_plan, parse_plan, solve_path

_TIE_RTOL = 1e-12


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A chosen (cut, codec) and what it is predicted to cost."""

    cut: str
    codec: str
    objective: str
    predicted_ms: float  # end-to-end latency of one request
    energy_mj: float  # device energy per request
    period_ms: float  # pipelined frame period (1000 / throughput)
    # The terms of predicted_ms, which they add up to: device + transfer (the upload) + download (the
    # reply) + round trip + queue (the expected wait for a cloud worker) + cloud.
    device_ms: float
    transfer_ms: float
    rtt_ms: float
    cloud_ms: float
    bytes: int  # raw crossing bytes
    sent_bytes: int  # after the codec
    queue_ms: float = 0.0
    download_ms: float = 0.0
    reply_bytes: int = 0  # the graph outputs the tail makes (those the head made stay on the device)

    @property
    def key(self) -> str:
        return format_plan(self.cut, self.codec)

    def __str__(self) -> str:
        return self.key


def _plan(est: Estimate, objective: str) -> Plan:
    return Plan(
        cut=est.cut,
        codec=est.codec,
        objective=objective,
        predicted_ms=est.latency_ms,
        energy_mj=est.energy_mj,
        period_ms=est.period_ms,
        device_ms=est.device_ms,
        transfer_ms=est.transfer_ms,
        rtt_ms=est.rtt_ms,
        cloud_ms=est.cloud_ms,
        bytes=est.bytes,
        sent_bytes=est.sent_bytes,
        queue_ms=est.queue_ms,
        download_ms=est.download_ms,
        reply_bytes=est.reply_bytes,
    )


def _pick(primary: FloatArray, secondary: FloatArray, tertiary: FloatArray) -> int:
    """Flat index of the minimum of ``primary``; near-ties broken by ``secondary`` then ``tertiary``."""
    flat = primary.ravel()
    best = flat.min()
    if not math.isfinite(best):
        raise PlanError("no feasible plan: every candidate is excluded or infinite")
    tied = np.flatnonzero(flat <= best + abs(best) * _TIE_RTOL)
    if tied.size == 1:
        return int(tied[0])
    sec = secondary.ravel()[tied]
    tied = tied[sec <= sec.min() + abs(sec.min()) * _TIE_RTOL]
    if tied.size == 1:
        return int(tied[0])
    ter = tertiary.ravel()[tied]
    return int(tied[int(np.argmin(ter))])


def _mask(table: CostTable, cuts: Sequence[str] | None, codecs: Sequence[str] | None) -> FloatArray | None:
    """0 where allowed, +inf where excluded (added to the objective); None when all allowed."""
    if cuts is None and codecs is None:
        return None
    m = np.zeros((len(table), len(table.codecs)))
    if cuts is not None:
        allowed = np.zeros(len(table), dtype=bool)
        allowed[[table.index(c) for c in cuts]] = True
        m[~allowed, :] = np.inf
    if codecs is not None:
        allowed_k = np.zeros(len(table.codecs), dtype=bool)
        allowed_k[[table.codec_index(c) for c in codecs]] = True
        m[:, ~allowed_k] = np.inf
    return m


def objective_matrix(
    table: CostTable, cond: Conditions, objective: str = "latency", power: Power = DEFAULT_POWER
) -> FloatArray:
    """The objective of every (cut, codec), shape (cuts, codecs): ms, mJ or ms per frame."""
    check_objective(objective)
    if objective == "latency":
        return table.latency_ms(cond)
    if objective == "energy":
        return table.energy_mj(cond, power)
    return table.period_ms(cond)


def solve(
    table: CostTable,
    cond: Conditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    cuts: Sequence[str] | None = None,
    codecs: Sequence[str] | None = None,
) -> Plan:
    """The best (cut, codec) of ``table`` for ``objective``, exact over every candidate.

    ``cuts`` / ``codecs`` restrict the candidates (e.g. codecs the cloud supports).
    """
    check_objective(objective)
    latency = table.latency_ms(cond)
    if objective == "latency":
        primary = latency
    elif objective == "energy":
        primary = table.energy_mj(cond, power)
    else:
        primary = table.period_ms(cond)
    mask = _mask(table, cuts, codecs)
    if mask is not None:
        primary = primary + mask
    secondary = latency if objective != "latency" else table.sent_bytes
    tertiary = table.sent_bytes if objective != "latency" else np.zeros_like(latency)
    flat = _pick(primary, secondary, tertiary)
    i, k = divmod(flat, len(table.codecs))
    est = table.estimate(table.ids[i], table.codecs[k], cond, power)
    return _plan(est, objective)


def evaluate(
    table: CostTable,
    plan: str | tuple[str, str],
    cond: Conditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
) -> Plan:
    """Cost of a given plan (``"c12@fp16"`` or ``(cut, codec)``) under ``cond``: e.g. the plan in use."""
    check_objective(objective)
    cut, codec = parse_plan(plan, table.codecs[0]) if isinstance(plan, str) else plan
    est = table.estimate(cut, codec, cond, power)
    return _plan(est, objective)


# ---- sweep: Edgent's configuration map -----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SweepBand:
    """Over ``[from_mbps, to_mbps)`` the best plan is ``plan`` (its latency given at both ends)."""

    from_mbps: float
    to_mbps: float
    plan: str
    bytes: int
    predicted_ms_from: float
    predicted_ms_to: float


def sweep(
    table: CostTable,
    cond: Conditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    min_mbps: float = 0.1,
    max_mbps: float = 1000.0,
    points: int = 400,
    codecs: Sequence[str] | None = None,
    cuts: Sequence[str] | None = None,
) -> list[SweepBand]:
    """Bandwidths at which the best plan changes, for ``cond``'s RTT and loads.

    A log-spaced grid finds the changes; each change is then located by bisection to 1e-6 relative.
    """
    if not (0 < min_mbps < max_mbps):
        raise PlanError(f"expected 0 < min_mbps < max_mbps, got {min_mbps} and {max_mbps}")

    def at(bw: float) -> Plan:
        c = Conditions(
            link=Link(bandwidth_mbps=bw, rtt_ms=cond.link.rtt_ms),
            device_load=cond.device_load,
            cloud_load=cond.cloud_load,
            queue_ms=cond.queue_ms,
        )
        return solve(table, c, objective=objective, power=power, codecs=codecs, cuts=cuts)

    grid = np.geomspace(min_mbps, max_mbps, max(points, 2))
    plans = [at(float(b)) for b in grid]
    edges: list[float] = [min_mbps]
    keys: list[str] = [plans[0].key]
    for j in range(1, len(grid)):
        if plans[j].key == plans[j - 1].key:
            continue
        lo, hi = float(grid[j - 1]), float(grid[j])
        # Several changes may hide between two grid points; bisect to the first, then walk on.
        while True:
            left_key = at(lo).key
            a, b = lo, hi
            while b / a - 1 > 1e-6:
                mid = math.sqrt(a * b)
                if at(mid).key == left_key:
                    a = mid
                else:
                    b = mid
            edges.append(b)
            keys.append(at(b).key)
            if keys[-1] == plans[j].key:
                break
            lo = b
    edges.append(max_mbps)
    bands: list[SweepBand] = []
    for n, key in enumerate(keys):
        lo_bw, hi_bw = edges[n], edges[n + 1]
        p_lo, p_hi = at(lo_bw), at(hi_bw if n + 1 == len(keys) else math.nextafter(hi_bw, 0.0))
        bands.append(
            SweepBand(
                from_mbps=lo_bw,
                to_mbps=hi_bw,
                plan=key,
                bytes=p_lo.bytes,
                predicted_ms_from=p_lo.predicted_ms,
                predicted_ms_to=p_hi.predicted_ms,
            )
        )
    return bands


# ---- three tiers: device → edge → cloud -----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ChainPlan:
    """Device runs up to ``device_cut``, the edge from there up to ``edge_cut``, the cloud the rest."""

    device_cut: str
    edge_cut: str
    codec: str
    objective: str
    predicted_ms: float
    energy_mj: float
    period_ms: float
    device_ms: float
    edge_ms: float
    cloud_ms: float
    transfer_ms: float  # both hops

    @property
    def key(self) -> str:
        return f"{self.device_cut}>{self.edge_cut}@{self.codec}"

    def __str__(self) -> str:
        return self.key


def parse_chain_plan(text: str) -> tuple[str, str, str]:
    """``"c3>c12@fp16"`` → ``("c3", "c12", "fp16")``."""
    cuts, _, codec = text.strip().partition("@")
    first, sep, second = cuts.partition(">")
    if not (first and sep and second and codec):
        raise PlanError(f"expected a chain plan like 'c3>c12@fp16', got {text!r}")
    return first, second, codec


@dataclass(frozen=True, kw_only=True)
class ChainConditions:
    device_edge: Link
    edge_cloud: Link
    device_load: float = 1.0
    edge_load: float = 1.0
    cloud_load: float = 1.0


def _check_chain(device: CostTable, edge: CostTable, cloud: CostTable) -> None:
    if not (device.ids == edge.ids == cloud.ids):
        raise PlanError("device, edge and cloud tables must list the same cuts in the same order")
    if device.codecs != edge.codecs or device.codecs != cloud.codecs:
        raise PlanError("device, edge and cloud tables must list the same codecs")


def _path_conditions(cond: ChainConditions) -> PathConditions:
    return PathConditions(
        hops=(cond.device_edge, cond.edge_cloud), loads=(cond.device_load, cond.edge_load, cond.cloud_load)
    )


def _chain_plan(p: PathPlan, codec: str) -> ChainPlan:
    return ChainPlan(
        device_cut=p.cuts[0],
        edge_cut=p.cuts[1],
        codec=codec,
        objective=p.objective,
        predicted_ms=p.predicted_ms,
        energy_mj=p.energy_mj,
        period_ms=p.period_ms,
        device_ms=p.tier_ms[0],
        edge_ms=p.tier_ms[1],
        cloud_ms=p.tier_ms[2],
        transfer_ms=sum(p.transfer_ms),
    )


def solve_chain(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    cond: ChainConditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
    device_cuts: Sequence[str] | None = None,
    edge_cuts: Sequence[str] | None = None,
) -> ChainPlan:
    """Best pair of nested cuts (i ≤ j in the tables' topological order) for a device → edge → cloud chain.

    Uses ``device.head_ms`` (device part), ``edge.head_ms[j] - edge.head_ms[i]`` (edge part, exact when
    the edge profile's head times are prefix sums of chain segments, as the profiler writes them) and
    ``cloud.tail_ms`` (cloud part); crossing bytes from ``device``. Cut ids must be a chain (each head
    contains the previous), which ``splitrt.graph`` cut lists are. Exact over all O(cuts²) pairs; with
    prefix-sum edge times, latency and energy take O(cuts) (a running minimum), ~0.2 ms for densenet121's
    669 cuts. ``device_cuts`` / ``edge_cuts`` restrict either cut (``edge_cuts=["device"]``: the edge
    finishes, no cloud). Ties → lower latency, then fewer bytes sent on both hops.
    """
    check_objective(objective)
    _check_chain(device, edge, cloud)
    names = device.codecs if codecs is None else tuple(codecs)
    if not names:
        raise PlanError("no codec to plan with")
    # One codec on both hops: what the chain runtime sends.
    p = solve_path(
        [device, edge, cloud],
        _path_conditions(cond),
        objective=objective,
        power=power,
        codecs=names,
        cuts=[device_cuts, edge_cuts],
        same_codec=True,
    )
    return _chain_plan(p, p.codecs[0])


def evaluate_chain(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    plan: str | tuple[str, str, str],
    cond: ChainConditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
) -> ChainPlan:
    """Cost of a given chain plan (``"c3>c12@fp16"`` or a tuple) under ``cond``: e.g. the plan in use."""
    check_objective(objective)
    _check_chain(device, edge, cloud)
    first, second, codec = parse_chain_plan(plan) if isinstance(plan, str) else plan
    if device.index(first) > device.index(second):
        raise PlanError(f"chain plan: expected the edge cut at or after the device cut {first!r}, got {second!r}")
    p = evaluate_path(
        [device, edge, cloud],
        ((first, second), (codec, codec)),
        _path_conditions(cond),
        objective=objective,
        power=power,
    )
    return _chain_plan(p, codec)


def chain_objective(plan: ChainPlan) -> float:
    """The value ``plan.objective`` minimises (ms, mJ or ms per frame)."""
    return objective_value(
        plan.objective, latency_ms=plan.predicted_ms, energy_mj=plan.energy_mj, period_ms=plan.period_ms
    )


__all__ = [
    "CLOUD_CUT",
    "DEVICE_CUT",
    "OBJECTIVES",
    "ChainConditions",
    "ChainPlan",
    "Plan",
    "SweepBand",
    "chain_objective",
    "evaluate",
    "evaluate_chain",
    "format_plan",
    "objective_matrix",
    "parse_chain_plan",
    "parse_plan",
    "solve",
    "solve_chain",
    "sweep",
]
