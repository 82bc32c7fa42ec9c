"""The optimal cut (pure): exact over every candidate cut of two tiers, and the sweep over bandwidth.

``solve(table, cond, objective=...)`` evaluates every (cut, codec) of a ``CostTable`` with a few
numpy operations and returns the one ``Plan`` type (``plan.path``) with one hop. Ties (within a
relative 1e-12) go to the plan sending fewer bytes, then to the earlier cut: the answer does not
flicker between equal plans. Any number of tiers is ``plan.path.solve_path`` (re-exported here); the
two-tier ``solve`` is its N=2 case kept as a direct (cuts x codecs) matrix because it runs per request
(tests/plan/test_path.py checks one against the other on random tables).

A plan's short form is ``<cut>@<codec>`` (``c12@fp16``; ``device`` alone when nothing is sent), hops
joined by ``>`` over more tiers; ``parse_plan`` / ``parse_path`` read them back.

- ``solver.solve(table, cond, *, objective="latency"|"energy"|"throughput", power, cuts=None, codecs=None,
  offset=None) -> Plan`` (``offset``: added per (cut, codec) to the objective), the two-tier case kept as a direct
  (cuts x codecs) matrix (it runs per request); exact over all (cut, codec); ties → fewer bytes. ``str(plan)`` =
  ``c12@fp16`` (``device`` alone); ``parse_plan(text) -> (cut, codec)``; ``evaluate(table, "c12@fp16", cond) -> Plan``
  re-costs the plan in use. ``sweep(table, cond, ...) -> list[SweepBand(from_mbps, to_mbps, plan, ...)]``.
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
from splitrt.plan.objective import OBJECTIVES, check_objective
from splitrt.plan.path import (
    PathConditions,
    Plan,
    evaluate_path,
    format_path,
    format_plan,
    parse_path,
    parse_plan,
    solve_path,
)

_TIE_RTOL = 1e-12


def _plan(est: Estimate, objective: str) -> Plan:
    """A two-tier estimate as the one ``Plan`` type (one hop)."""
    return Plan(
        cuts=(est.cut,),
        codecs=(est.codec,),
        objective=objective,
        predicted_ms=est.latency_ms,
        energy_mj=est.energy_mj,
        period_ms=est.period_ms,
        tier_ms=(est.device_ms, est.cloud_ms),
        hop_upload_ms=(est.transfer_ms,),
        hop_download_ms=(est.download_ms,),
        hop_rtt_ms=(est.rtt_ms,),
        hop_queue_ms=(est.queue_ms,),
        hop_bytes=(est.bytes,),
        hop_sent_bytes=(est.sent_bytes,),
        reply_bytes=est.reply_bytes,
        hop_encode_ms=(est.encode_ms,),
        hop_call_ms=(est.call_ms,),
        hop_decode_ms=(est.decode_ms,),
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
    offset: FloatArray | None = None,
) -> Plan:
    """The best (cut, codec) of ``table`` for ``objective``, exact over every candidate.

    ``cuts`` / ``codecs`` restrict the candidates (e.g. codecs the cloud supports); ``offset`` (cuts,
    codecs) is added to each candidate's objective before the comparison (``plan.correction``'s offsets).
    """
    check_objective(objective)
    latency = table.latency_ms(cond)
    if objective == "latency":
        primary = latency
    elif objective == "energy":
        primary = table.energy_mj(cond, power)
    else:
        primary = table.period_ms(cond)
    if offset is not None:
        primary = primary + offset
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


__all__ = [
    "CLOUD_CUT",
    "DEVICE_CUT",
    "OBJECTIVES",
    "PathConditions",
    "Plan",
    "SweepBand",
    "evaluate",
    "evaluate_path",
    "format_path",
    "format_plan",
    "objective_matrix",
    "parse_path",
    "parse_plan",
    "solve",
    "solve_path",
    "sweep",
]
