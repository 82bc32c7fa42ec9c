"""The optimal cut (pure): exact over every candidate cut, two tiers or a device → edge → cloud chain.

``solve(table, cond, objective=...)`` evaluates every (cut, codec) of a ``CostTable`` with a few
numpy operations and returns a ``Plan``. Ties (within a relative 1e-12) go to the plan sending fewer
bytes, then to the earlier cut: the answer does not flicker between equal plans.

A plan's short form is ``<cut>@<codec>`` (``c12@fp16``; ``device`` alone when nothing is sent) and a
chain plan's ``<device cut>><edge cut>@<codec>``; ``parse_plan`` / ``parse_chain_plan`` read them back.
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
    MS_PER_BYTE_AT_1MBPS,
    Conditions,
    CostTable,
    Estimate,
    FloatArray,
    Link,
    Power,
)

OBJECTIVES = ("latency", "energy", "throughput")
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
    # The terms of predicted_ms, which they add up to: device + transfer (both ways) + round trip + cloud.
    device_ms: float
    transfer_ms: float
    rtt_ms: float
    cloud_ms: float
    bytes: int  # raw crossing bytes
    sent_bytes: int  # after the codec

    @property
    def key(self) -> str:
        return format_plan(self.cut, self.codec)

    def __str__(self) -> str:
        return self.key


def format_plan(cut: str, codec: str) -> str:
    return cut if cut == DEVICE_CUT else f"{cut}@{codec}"


def parse_plan(text: str, default_codec: str = "fp32") -> tuple[str, str]:
    """``"c12@fp16"`` → ``("c12", "fp16")``; ``"device"`` → ``("device", default_codec)``."""
    cut, sep, codec = text.strip().partition("@")
    if not cut or (sep and not codec) or ">" in cut:
        raise PlanError(f"expected a plan like 'c12@fp16' or 'device', got {text!r}")
    return cut, codec if sep else default_codec


def _plan(est: Estimate, objective: str) -> Plan:
    return Plan(cut=est.cut, codec=est.codec, objective=objective, predicted_ms=est.latency_ms,
                energy_mj=est.energy_mj, period_ms=est.period_ms, device_ms=est.device_ms,
                transfer_ms=est.transfer_ms, rtt_ms=est.rtt_ms, cloud_ms=est.cloud_ms, bytes=est.bytes,
                sent_bytes=est.sent_bytes)


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise PlanError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


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
    _check_objective(objective)
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
    _check_objective(objective)
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
    _check_objective(objective)
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
        )
        return solve(table, c, objective=objective, power=power, codecs=codecs)

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


def solve_chain(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    cond: ChainConditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
) -> ChainPlan:
    """Best pair of nested cuts (i ≤ j in the tables' topological order) for a device → edge → cloud chain.

    Uses ``device.head_ms`` (device part), ``edge.head_ms[j] - edge.head_ms[i]`` (edge part, exact when
    the edge profile's head times are prefix sums of chain segments, as the profiler writes them) and
    ``cloud.tail_ms`` (cloud part); crossing bytes from ``device``. Cut ids must be a chain (each head
    contains the previous), which ``splitrt.graph`` cut lists are. Exact over all O(cuts²) pairs.
    """
    _check_objective(objective)
    if not (device.ids == edge.ids == cloud.ids):
        raise PlanError("device, edge and cloud tables must list the same cuts in the same order")
    if device.codecs != edge.codecs or device.codecs != cloud.codecs:
        raise PlanError("device, edge and cloud tables must list the same codecs")
    ids = device.ids
    n = len(ids)
    dev_head = device.head_ms * cond.device_load  # (n,)
    edge_head = edge.head_ms
    seg = np.clip(edge_head[None, :] - edge_head[:, None], 0.0, None) * cond.edge_load  # (i, j)
    cloud_tail = cloud.tail_ms * cond.cloud_load  # (j,)
    sends = device.sends  # False only for the device cut
    upper = np.triu(np.ones((n, n), dtype=bool))  # i <= j

    best: tuple[float, float, int, int, int] | None = None
    best_fig: dict[str, float] = {}
    codec_names = device.codecs if codecs is None else tuple(codecs)
    for codec in codec_names:
        k = device.codec_index(codec)
        send1 = device.sent_bytes[:, k] * MS_PER_BYTE_AT_1MBPS / cond.device_edge.bandwidth_mbps  # (i,)
        send2 = device.sent_bytes[:, k] * MS_PER_BYTE_AT_1MBPS / cond.edge_cloud.bandwidth_mbps  # (j,)
        reply1 = device.reply_bytes * MS_PER_BYTE_AT_1MBPS / cond.device_edge.bandwidth_mbps
        reply2 = device.reply_bytes * MS_PER_BYTE_AT_1MBPS / cond.edge_cloud.bandwidth_mbps
        hop1 = np.where(sends, send1 + reply1 + cond.device_edge.rtt_ms, 0.0)  # (i,)
        hop2 = np.where(sends, send2 + reply2 + cond.edge_cloud.rtt_ms, 0.0)  # (j,)
        # j = device: the edge runs everything after i and replies; i = device forces j = device.
        latency = dev_head[:, None] + hop1[:, None] + seg + hop2[None, :] + cloud_tail[None, :]
        feasible = upper
        if objective == "latency":
            primary = latency
        elif objective == "energy":
            waiting = latency - dev_head[:, None] - np.where(sends, send1, 0.0)[:, None]
            primary = (
                power.active_w * dev_head[:, None]
                + power.radio_w * np.where(sends, send1, 0.0)[:, None]
                + power.idle_w * waiting
            )
        else:
            stages = [
                np.broadcast_to(dev_head[:, None], (n, n)),
                np.broadcast_to(np.where(sends, send1 + reply1, 0.0)[:, None], (n, n)),
                seg,
                np.broadcast_to(np.where(sends, send2 + reply2, 0.0)[None, :], (n, n)),
                np.broadcast_to(cloud_tail[None, :], (n, n)),
            ]
            primary = np.maximum.reduce(stages)
        primary = np.where(feasible, primary, np.inf)
        flat = _pick(primary, latency, np.zeros_like(latency))
        i, j = divmod(flat, n)
        key = (float(primary[i, j]), float(latency[i, j]), k, i, j)
        if best is None or key[:2] < best[:2]:
            best = key
            sent1 = send1[i] if sends[i] else 0.0
            best_fig = {
                "latency": float(latency[i, j]),
                "device": float(dev_head[i]),
                "edge": float(seg[i, j]),
                "cloud": float(cloud_tail[j]),
                "transfer": float(hop1[i] - (cond.device_edge.rtt_ms if sends[i] else 0.0))
                + float(hop2[j] - (cond.edge_cloud.rtt_ms if sends[j] else 0.0)),
                "energy": float(
                    power.active_w * dev_head[i]
                    + power.radio_w * sent1
                    + power.idle_w * (latency[i, j] - dev_head[i] - sent1)
                ),
                "period": float(
                    max(
                        dev_head[i],
                        hop1[i] - (cond.device_edge.rtt_ms if sends[i] else 0.0),
                        seg[i, j],
                        hop2[j] - (cond.edge_cloud.rtt_ms if sends[j] else 0.0),
                        cloud_tail[j],
                    )
                ),
            }
    if best is None:
        raise PlanError("no codec to plan with")
    _, _, k, i, j = best
    return ChainPlan(
        device_cut=ids[i],
        edge_cut=ids[j],
        codec=device.codecs[k],
        objective=objective,
        predicted_ms=best_fig["latency"],
        energy_mj=best_fig["energy"],
        period_ms=best_fig["period"],
        device_ms=best_fig["device"],
        edge_ms=best_fig["edge"],
        cloud_ms=best_fig["cloud"],
        transfer_ms=best_fig["transfer"],
    )


__all__ = [
    "CLOUD_CUT",
    "DEVICE_CUT",
    "OBJECTIVES",
    "ChainConditions",
    "ChainPlan",
    "Plan",
    "SweepBand",
    "evaluate",
    "format_plan",
    "objective_matrix",
    "parse_chain_plan",
    "parse_plan",
    "solve",
    "solve_chain",
    "sweep",
]
