"""What the three-tier rig bench runs and how it reads the results (pure: tables and numbers in, choices
and figures out; no sockets, sessions, files or clocks).

The strategies (``STRATEGIES``): device-only, cloud-only (the input straight to the cloud, through the
edge's network) and the best static 2-tier split run on the two-tier runtime (``AdaptiveDevice`` with a
fixed plan), as a system that does not know the edge would; edge-only (``cloud@fp32>device``: the edge
runs the whole model), the best static 3-tier cut pair and the 3-tier adaptive runtime run on
``AdaptiveDevice`` over the three tiers. Static choices are made once, from the profile at the traces'
median bandwidths, with the objective the adaptive runtime uses; a static 3-tier strategy is the
runtime's ``fixed:PLAN`` policy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from splitrt.errors import ConfigError
from splitrt.plan.controller import Controller, ControllerConfig
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.path import PathConditions, Plan, evaluate_path, solve_path
from splitrt.plan.solver import evaluate, solve

STRATEGIES = (
    "device-only",
    "cloud-only",
    "static-2tier",
    "edge-only",
    "static-3tier",
    "adaptive",
    "adaptive-2tier",
    "route",
)
# route: whole-request routing over the direct path (the two-tier runtime restricted to device and cloud)
DEFAULT_STRATEGIES = ("device-only", "cloud-only", "static-2tier", "edge-only", "static-3tier", "adaptive")
STATIC = ("device-only", "cloud-only", "static-2tier", "edge-only", "static-3tier")
TWO_TIER_STATIC = ("device-only", "cloud-only", "static-2tier")


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """One strategy: which path the runtime runs over (``tiers`` 2: ``AdaptiveDevice`` over the direct
    path, 3: over the three tiers, through the edge), its policy (``fixed:PLAN`` or ``adaptive``) and what
    the cost model predicts for it at the median bandwidths (nan for adaptive)."""

    name: str
    tiers: int
    policy: str
    predicted_ms: float
    predicted_mj: float

    @property
    def plan(self) -> str | None:
        """The fixed plan (``c12@fp32``, ``c3>c40@fp32``, ``device``), None when adaptive."""
        return self.policy.split(":", 1)[1] if self.policy.startswith("fixed:") else None


def direct_table(device: CostTable, edge: CostTable, cloud: CostTable) -> CostTable:
    """The two-tier table of the direct path: the device's heads, the cloud's tails (as the chain
    controller plans with the edge down)."""
    return Controller((device, edge, cloud)).direct_table(2)


def direct_conditions(hop1: Link, hop2: Link) -> Conditions:
    """The direct path is the two hops in series: the narrower bandwidth, both round trips."""
    return Conditions(
        link=Link(bandwidth_mbps=min(hop1.bandwidth_mbps, hop2.bandwidth_mbps), rtt_ms=hop1.rtt_ms + hop2.rtt_ms)
    )


def choose(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    *,
    hop1: Link,
    hop2: Link,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] = ("fp32",),
    names: Sequence[str] = DEFAULT_STRATEGIES,
) -> dict[str, Strategy]:
    """Every strategy of ``names`` with its plan chosen at ``hop1``/``hop2`` (the traces' medians)."""
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise ConfigError(f"strategies: expected names in {', '.join(STRATEGIES)}, got {bad}")
    codec = codecs[0]
    table = direct_table(device, edge, cloud)
    cond = direct_conditions(hop1, hop2)
    chain = PathConditions(hops=(hop1, hop2), loads=(1.0, 1.0, 1.0))

    def two(plan: str) -> tuple[float, float]:
        p = evaluate(table, plan, cond, objective=objective, power=power)
        return p.predicted_ms, p.energy_mj

    def three(plan: str) -> tuple[float, float]:
        if plan == DEVICE_CUT:
            return two(plan)
        p = evaluate_path((device, edge, cloud), plan, chain, objective=objective, power=power)
        return p.predicted_ms, p.energy_mj

    best2 = solve(table, cond, objective=objective, power=power, codecs=list(codecs)).key
    best3 = _solve3(device, edge, cloud, chain, objective=objective, power=power, codecs=codecs).key
    fixed = {
        "device-only": (2, DEVICE_CUT),
        "cloud-only": (2, f"cloud@{codec}"),
        "static-2tier": (2, best2),
        "edge-only": (3, f"cloud@{codec}>{DEVICE_CUT}"),
        "static-3tier": (3, best3),
    }
    out: dict[str, Strategy] = {}
    for name in names:
        if name in fixed:
            tiers, plan = fixed[name]
            ms, mj = two(plan) if tiers == 2 else three(plan)
            out[name] = Strategy(name=name, tiers=tiers, policy=f"fixed:{plan}", predicted_ms=ms, predicted_mj=mj)
        else:
            out[name] = Strategy(
                name=name,
                tiers=2 if name in ("adaptive-2tier", "route") else 3,
                policy="route" if name == "route" else "adaptive",
                predicted_ms=math.nan,
                predicted_mj=math.nan,
            )
    return out


def likely_first_cuts(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    *,
    rtt1_ms: float,
    rtt2_ms: float,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] = ("fp32",),
) -> list[str]:
    """Every device cut (chain and direct) the solver picks over 0.1-100 Mbit/s per hop and device loads
    1-4: the sessions worth building before the timed part."""
    table = direct_table(device, edge, cloud)
    cuts = {DEVICE_CUT, "cloud"}
    grid = [0.1 * 10 ** (i / 4) for i in range(13)]
    for bw1 in grid:
        for bw2 in grid:
            for load in (1.0, 4.0):
                h1, h2 = Link(bandwidth_mbps=bw1, rtt_ms=rtt1_ms), Link(bandwidth_mbps=bw2, rtt_ms=rtt2_ms)
                cond3 = PathConditions(hops=(h1, h2), loads=(load, 1.0, 1.0))
                cp = _solve3(device, edge, cloud, cond3, objective=objective, power=power, codecs=codecs)
                cuts.add(cp.cuts[0])
                d = replace(direct_conditions(h1, h2), device_load=load)
                cuts.add(solve(table, d, objective=objective, power=power, codecs=list(codecs)).cut)
    return sorted(cuts)


def _solve3(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    cond: PathConditions,
    *,
    objective: str,
    power: Power,
    codecs: Sequence[str],
) -> Plan:
    """The best 3-tier plan with one codec on both hops (what the runtime sends)."""
    return solve_path(
        (device, edge, cloud), cond, objective=objective, power=power, codecs=list(codecs), same_codec=True
    )


def chain_config(objective: str, codecs: Sequence[str]) -> ControllerConfig:
    return ControllerConfig(objective=objective, codecs=tuple(codecs))


# ---- reading the results --------------------------------------------------------------------------


def by_turn(records: Sequence[Mapping[str, Any]], turn_s: float, key: str) -> list[list[float]]:
    """``key`` of each record grouped by the turn (window slice of ``turn_s``) it started in."""
    if turn_s <= 0:
        raise ConfigError(f"turn_s: expected > 0, got {turn_s!r}")
    groups: dict[int, list[float]] = {}
    for r in records:
        groups.setdefault(int(float(r["t_s"]) // turn_s), []).append(float(r[key]))
    return [groups[k] for k in sorted(groups)]


def best_of(strategies: Mapping[str, Mapping[str, Any]], names: Sequence[str], key: str) -> str | None:
    """The strategy of ``names`` (present, with completed requests) with the lowest ``key``."""
    have = [n for n in names if n in strategies and not math.isnan(float(strategies[n].get(key, math.nan)))]
    return min(have, key=lambda n: float(strategies[n][key])) if have else None


def gain_pct(adaptive: float, other: float) -> float:
    """How much lower adaptive is than ``other``, in % of ``other`` (negative: higher)."""
    return 100.0 * (1.0 - adaptive / other) if other > 0 and not math.isnan(other) else math.nan


def gains(strategies: Mapping[str, Mapping[str, Any]], adaptive: str = "adaptive") -> dict[str, Any]:
    """Adaptive's gain in mean latency and in energy per inference over the static 2-tier split chosen with
    the same objective (``static-2tier``: the reference system's baseline is a static split), over the best
    static 2-tier alternative and over the best of every static alternative, the last two picked per
    figure (the lowest-latency and the lowest-energy static strategy may differ)."""
    if adaptive not in strategies:
        return {}
    a = strategies[adaptive]
    out: dict[str, Any] = {}
    if "static-2tier" in strategies:  # the static split chosen with the same objective: the reference's baseline
        st = strategies["static-2tier"]
        for key, figure in (("mean_ms", "latency"), ("energy_mj", "energy")):
            out[f"{figure}_vs_static_split"] = {
                "against": "static-2tier",
                "pct": gain_pct(float(a[key]), float(st[key])),
            }
    for label, names in (("static_2tier", TWO_TIER_STATIC), ("any_static", STATIC)):
        for key, figure in (("mean_ms", "latency"), ("energy_mj", "energy")):
            best = best_of(strategies, names, key)
            out[f"{figure}_vs_{label}"] = {
                "against": best,
                "pct": gain_pct(float(a[key]), float(strategies[best][key])) if best else math.nan,
            }
    return out


def median_or_nan(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def likely_pairs(
    device: CostTable,
    edge: CostTable,
    cloud: CostTable,
    rates: Sequence[tuple[float, float]],
    *,
    rtt1_ms: float,
    rtt2_ms: float,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] = ("fp32",),
    limit: int = 10,
) -> list[str]:
    """The chain plans the solver picks at the (hop 1, hop 2) bandwidths of ``rates``, most frequent
    first, at most ``limit``: the segments the edge and the cloud should build before the timed part."""
    count: dict[str, int] = {}
    for bw1, bw2 in rates:
        cond = PathConditions(
            hops=(Link(bandwidth_mbps=bw1, rtt_ms=rtt1_ms), Link(bandwidth_mbps=bw2, rtt_ms=rtt2_ms)),
            loads=(1.0, 1.0, 1.0),
        )
        cp = _solve3(device, edge, cloud, cond, objective=objective, power=power, codecs=codecs)
        if cp.cuts[0] != DEVICE_CUT:
            count[cp.key] = count.get(cp.key, 0) + 1
    return sorted(count, key=lambda k: -count[k])[:limit]


def bootstrap_ci(
    groups: Sequence[Sequence[float]], *, stat: str = "mean", n: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of ``stat`` (mean | p95) over requests grouped by turn, the turns resampled (the
    requests of one turn share the host's and the link's moment: they are not independent)."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if len(gs) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n):
        xs = np.concatenate([gs[i] for i in rng.integers(0, len(gs), len(gs))])
        vals.append(float(np.mean(xs)) if stat == "mean" else float(np.percentile(xs, 95)))
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))
