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
import numpy.typing as npt

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
    # The terms of predicted_ms, which they add up to: device + transfer (both ways) + round trip +
    # queue (the expected wait for a cloud worker) + cloud.
    device_ms: float
    transfer_ms: float
    rtt_ms: float
    cloud_ms: float
    bytes: int  # raw crossing bytes
    sent_bytes: int  # after the codec
    queue_ms: float = 0.0

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
                sent_bytes=est.sent_bytes, queue_ms=est.queue_ms)


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
            queue_ms=cond.queue_ms,
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


@dataclass(frozen=True, kw_only=True)
class _ChainTerms:
    """The per-cut terms of every chain plan, shape (cuts,) or (cuts, codecs): a plan (i, j, k) costs
    ``dev[i] + hop1[i, k] + seg(i, j) + hop2[j, k] + cloud[j]`` ms, seg = ``edge[j] - edge[i]`` (>= 0)."""

    dev: FloatArray
    edge: FloatArray
    cloud: FloatArray
    up1: FloatArray  # device -> edge upload ms (the device's radio time)
    xfer1: FloatArray  # both ways
    hop1: FloatArray  # both ways + RTT
    xfer2: FloatArray
    hop2: FloatArray
    sent: FloatArray  # payload bytes per hop, (cuts, codecs)
    monotonic: bool  # edge head times never decrease: seg is a difference of prefix sums

    @classmethod
    def of(cls, device: CostTable, edge: CostTable, cloud: CostTable, cond: ChainConditions,
           ks: list[int]) -> _ChainTerms:
        sends = device.sends[:, None]
        sent = device.sent_bytes[:, ks]
        bw1, bw2 = cond.device_edge.bandwidth_mbps, cond.edge_cloud.bandwidth_mbps
        if not (bw1 > 0 and bw2 > 0):
            raise PlanError(f"bandwidth must be > 0 on both hops, got {bw1!r} and {bw2!r} Mbit/s")
        up1 = sent * MS_PER_BYTE_AT_1MBPS / bw1
        xfer1 = np.where(sends, up1 + device.reply_bytes * MS_PER_BYTE_AT_1MBPS / bw1, 0.0)
        xfer2 = np.where(sends, (sent + device.reply_bytes) * MS_PER_BYTE_AT_1MBPS / bw2, 0.0)
        e = edge.head_ms * cond.edge_load
        return cls(dev=device.head_ms * cond.device_load, edge=e, cloud=cloud.tail_ms * cond.cloud_load,
                   up1=np.where(sends, up1, 0.0), xfer1=xfer1,
                   hop1=xfer1 + np.where(sends, cond.device_edge.rtt_ms, 0.0), xfer2=xfer2,
                   hop2=xfer2 + np.where(sends, cond.edge_cloud.rtt_ms, 0.0), sent=sent,
                   monotonic=bool(np.all(np.diff(e) >= 0)))

    def figures(self, i: int, j: int, k: int, power: Power) -> dict[str, float]:
        seg = max(float(self.edge[j] - self.edge[i]), 0.0)
        latency = float(self.dev[i] + self.hop1[i, k] + seg + self.hop2[j, k] + self.cloud[j])
        up = float(self.up1[i, k])
        return {
            "latency": latency, "device": float(self.dev[i]), "edge": seg, "cloud": float(self.cloud[j]),
            "transfer": float(self.xfer1[i, k] + self.xfer2[j, k]),
            "energy": float(power.active_w * self.dev[i] + power.send_w * up
                            + power.idle_w * (latency - self.dev[i] - up)),
            "period": max(float(self.dev[i]), float(self.xfer1[i, k]), seg, float(self.xfer2[j, k]),
                          float(self.cloud[j])),
        }


def _allowed(table: CostTable, cuts: Sequence[str] | None) -> npt.NDArray[np.bool_]:
    if cuts is None:
        return np.ones(len(table), dtype=bool)
    ok = np.zeros(len(table), dtype=bool)
    ok[[table.index(c) for c in cuts]] = True
    return ok


def _chain_separable(t: _ChainTerms, objective: str, power: Power, ok_i: npt.NDArray[np.bool_],
                     ok_j: npt.NDArray[np.bool_]) -> tuple[int, int, int]:
    """O(cuts x codecs): with monotonic edge times the objective is ``u[i, k] + v[j, k]`` (i <= j), so the
    best i for each j is a running minimum of ``u``."""
    e = t.edge[:, None]
    if objective == "latency":
        u = t.dev[:, None] + t.hop1 - e
        v = e + t.hop2 + t.cloud[:, None]
    else:  # energy: the device idles from the end of its upload to the reply
        u = power.active_w * t.dev[:, None] + power.send_w * t.up1 + power.idle_w * (t.hop1 - t.up1 - e)
        v = power.idle_w * (e + t.hop2 + t.cloud[:, None])
    u = np.where(ok_i[:, None], u, np.inf)
    v = np.where(ok_j[:, None], v, np.inf)
    n, kk = u.shape
    running = np.minimum.accumulate(u, axis=0)
    before = np.vstack([np.full((1, kk), np.inf), running[:-1]])
    # First index attaining the running minimum (only strict improvements move it).
    best_i = np.maximum.accumulate(np.where(u < before, np.arange(n)[:, None], 0), axis=0)
    primary = running + v  # (j, k)
    cols = np.arange(kk)[None, :]
    latency = (t.dev[best_i] + t.hop1[best_i, cols] + (t.edge[:, None] - t.edge[best_i]) + t.hop2
               + t.cloud[:, None])
    sent = t.sent[best_i, cols] + t.sent
    flat = _pick(primary, latency, sent)
    j, k = divmod(flat, kk)
    return int(best_i[j, k]), int(j), int(k)


def _chain_matrix(t: _ChainTerms, objective: str, power: Power, ok_i: npt.NDArray[np.bool_],
                  ok_j: npt.NDArray[np.bool_]) -> tuple[int, int, int]:
    """O(cuts² x codecs): throughput (a max of stages), or edge times that are not prefix sums."""
    n = len(t.dev)
    seg = np.clip(t.edge[None, :] - t.edge[:, None], 0.0, None)  # (i, j)
    feasible = np.triu(np.ones((n, n), dtype=bool)) & ok_i[:, None] & ok_j[None, :]
    best: tuple[float, float, int, int, int] | None = None
    for k in range(t.hop1.shape[1]):
        latency = t.dev[:, None] + t.hop1[:, k, None] + seg + t.hop2[None, :, k] + t.cloud[None, :]
        if objective == "latency":
            primary = latency
        elif objective == "energy":
            up, dev = t.up1[:, k, None], t.dev[:, None]
            primary = power.active_w * dev + power.send_w * up + power.idle_w * (latency - dev - up)
        else:
            primary = np.maximum.reduce([np.broadcast_to(t.dev[:, None], (n, n)),
                                         np.broadcast_to(t.xfer1[:, k, None], (n, n)), seg,
                                         np.broadcast_to(t.xfer2[None, :, k], (n, n)),
                                         np.broadcast_to(t.cloud[None, :], (n, n))])
        primary = np.where(feasible, primary, np.inf)
        if not np.isfinite(primary).any():
            continue
        i, j = divmod(_pick(primary, latency, t.sent[:, k, None] + t.sent[None, :, k]), n)
        key = (float(primary[i, j]), float(latency[i, j]), k, int(i), int(j))
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        raise PlanError("no feasible plan: every candidate is excluded or infinite")
    return best[3], best[4], best[2]


def _check_chain(device: CostTable, edge: CostTable, cloud: CostTable) -> None:
    if not (device.ids == edge.ids == cloud.ids):
        raise PlanError("device, edge and cloud tables must list the same cuts in the same order")
    if device.codecs != edge.codecs or device.codecs != cloud.codecs:
        raise PlanError("device, edge and cloud tables must list the same codecs")


def _chain_plan(device: CostTable, t: _ChainTerms, i: int, j: int, k: int, codec: str, objective: str,
                power: Power) -> ChainPlan:
    fig = t.figures(i, j, k, power)
    return ChainPlan(device_cut=device.ids[i], edge_cut=device.ids[j], codec=codec, objective=objective,
                     predicted_ms=fig["latency"], energy_mj=fig["energy"], period_ms=fig["period"],
                     device_ms=fig["device"], edge_ms=fig["edge"], cloud_ms=fig["cloud"],
                     transfer_ms=fig["transfer"])


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
    _check_objective(objective)
    _check_chain(device, edge, cloud)
    names = device.codecs if codecs is None else tuple(codecs)
    if not names:
        raise PlanError("no codec to plan with")
    ks = [device.codec_index(c) for c in names]
    t = _ChainTerms.of(device, edge, cloud, cond, ks)
    ok_i, ok_j = _allowed(device, device_cuts), _allowed(device, edge_cuts)
    if objective == "throughput" or not t.monotonic:
        i, j, k = _chain_matrix(t, objective, power, ok_i, ok_j)
    else:
        i, j, k = _chain_separable(t, objective, power, ok_i, ok_j)
    return _chain_plan(device, t, i, j, k, names[k], objective, power)


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
    _check_objective(objective)
    _check_chain(device, edge, cloud)
    first, second, codec = parse_chain_plan(plan) if isinstance(plan, str) else plan
    i, j = device.index(first), device.index(second)
    if i > j:
        raise PlanError(f"chain plan: expected the edge cut at or after the device cut {first!r}, got {second!r}")
    t = _ChainTerms.of(device, edge, cloud, cond, [device.codec_index(codec)])
    return _chain_plan(device, t, i, j, 0, codec, objective, power)


def chain_objective(plan: ChainPlan) -> float:
    """The value ``plan.objective`` minimises (ms, mJ or ms per frame)."""
    return {"latency": plan.predicted_ms, "energy": plan.energy_mj}.get(plan.objective, plan.period_ms)


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
