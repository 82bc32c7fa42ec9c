"""Does splitting pay for this model, or is whole-request routing as good? (pure: a table in, a verdict out)

Routing sends each whole request to the device or to the cloud (cuts ``device`` and ``cloud``);
splitting may also use an inner cut. For every objective and device-load level, ``explain`` finds the
bandwidth intervals (within the range asked) where the best plan over all allowed cuts beats the best
routing plan, and by how much (route's objective over split's, > 1), locating each interval's edges by
bisection as ``solver.sweep`` does. The router is the best one, ``route-codec``'s included: the allowed
codecs gain the table's image codecs (a JPEG of the input), for both sides. The verdict says plainly when
inner cuts never win, and why when the reason is structural: no inner cut sends fewer bytes than the input
under any allowed codec.

``splitrt.plan.explain`` (pure): ``explain(table, *, rtt_ms, min_mbps, max_mbps, objectives, device_loads,
power, codecs, cuts=None, points=160, pay_gain=1.10) -> Verdict(splits, pays, summary, bands=[Band( objective,
device_load, from_mbps, to_mbps, plans, route_plans, max_gain, at_mbps, best_plan)], smaller_cuts, ...)``: where
the best plan over the allowed cuts beats the best routing plan (``cloud`` / ``device``), edges by bisection;
``gain_at(table, cond, ...) -> (route/split, split plan, route plan)`` is the pointwise truth
``tests/plan/test_explain.py`` checks every zoo model's verdict against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from splitrt.errors import PlanError
from splitrt.plan import costmodel
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.solver import OBJECTIVES, Plan, solve

ROUTE_CUTS = (CLOUD_CUT, DEVICE_CUT)
DEVICE_LOADS = (1.0, 2.0, 4.0)
TOLERANCE = 1e-6  # a gain below this is a tie, not a win


@dataclass(frozen=True, kw_only=True)
class Band:
    """An interval of bandwidths where splitting beats routing, at one objective and device load."""

    objective: str
    device_load: float
    from_mbps: float
    to_mbps: float
    plans: tuple[str, ...]  # the split plans that win inside it, in bandwidth order
    route_plans: tuple[str, ...]  # what routing would do there
    max_gain: float  # max over the interval of route objective / split objective
    at_mbps: float  # where the max gain is
    best_plan: str  # the split plan there

    def to_json(self) -> dict[str, object]:
        return {
            "objective": self.objective,
            "device_load": self.device_load,
            "from_mbps": self.from_mbps,
            "to_mbps": self.to_mbps,
            "plans": list(self.plans),
            "route_plans": list(self.route_plans),
            "max_gain": self.max_gain,
            "at_mbps": self.at_mbps,
            "best_plan": self.best_plan,
        }


@dataclass(frozen=True, kw_only=True)
class Verdict:
    splits: bool  # some inner cut beats routing somewhere in the range
    pays: bool  # ... by at least ``pay_gain`` somewhere
    pay_gain: float
    summary: str  # one line, for logs and ``inspect``
    bands: tuple[Band, ...]
    smaller_cuts: tuple[str, ...]  # inner cuts sending fewer bytes than the input (best allowed codec)
    min_mbps: float
    max_mbps: float
    rtt_ms: float
    objectives: tuple[str, ...]
    device_loads: tuple[float, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "splits": self.splits,
            "pays": self.pays,
            "pay_gain": self.pay_gain,
            "summary": self.summary,
            "bands": [b.to_json() for b in self.bands],
            "smaller_cuts": list(self.smaller_cuts),
            "min_mbps": self.min_mbps,
            "max_mbps": self.max_mbps,
            "rtt_ms": self.rtt_ms,
            "objectives": list(self.objectives),
            "device_loads": list(self.device_loads),
        }


def value(plan: Plan, objective: str) -> float:
    if objective == "energy":
        return plan.energy_mj
    if objective == "throughput":
        return plan.period_ms
    return plan.predicted_ms


def gain_at(
    table: CostTable,
    cond: Conditions,
    *,
    objective: str,
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
    cuts: Sequence[str] | None = None,
) -> tuple[float, Plan, Plan]:
    """(route objective / split objective, split plan, route plan) at ``cond``; 1.0 when the best plan
    is a routing one. With ``cuts`` (a deployment's constraints) both sides keep to them; routing allowed
    neither device nor cloud has no plan: gain inf."""
    split = solve(table, cond, objective=objective, power=power, codecs=codecs, cuts=cuts)
    route_cuts = [c for c in ROUTE_CUTS if cuts is None or c in cuts]
    if not route_cuts:
        return math.inf, split, split
    route = solve(table, cond, objective=objective, power=power, codecs=codecs, cuts=route_cuts)
    s, r = value(split, objective), value(route, objective)
    if split.cut in ROUTE_CUTS or not s < r:
        return 1.0, route, route
    return (r / s if s > 0 else math.inf), split, route


def with_image_codecs(table: CostTable, codecs: Sequence[str] | None) -> list[str] | None:
    """``codecs`` and the table's image codecs (``route-codec``'s); None stays None (every codec)."""
    if codecs is None:
        return None
    return list(dict.fromkeys([*codecs, *[c for c in table.codecs if costmodel.is_image_codec(c)]]))


def smaller_than_input(table: CostTable, codecs: Sequence[str] | None = None) -> tuple[str, ...]:
    """Inner cuts whose crossing bytes (best allowed codec) are fewer than the input's (best codec)."""
    ks = [table.codec_index(k) for k in (codecs or table.codecs)]
    sent = table.sent_bytes[:, ks].min(axis=1)
    first = float(sent[table.index(CLOUD_CUT)])
    return tuple(c for i, c in enumerate(table.ids) if c not in ROUTE_CUTS and float(sent[i]) < first)


def explain(
    table: CostTable,
    *,
    rtt_ms: float,
    min_mbps: float = 0.1,
    max_mbps: float = 100.0,
    objectives: Sequence[str] = OBJECTIVES,
    device_loads: Sequence[float] = DEVICE_LOADS,
    cloud_load: float = 1.0,
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
    cuts: Sequence[str] | None = None,
    points: int = 160,
    pay_gain: float = 1.10,
) -> Verdict:
    """Where inner cuts beat routing over ``[min_mbps, max_mbps]``, per objective and device load."""
    if not 0 < min_mbps < max_mbps:
        raise PlanError(f"explain: expected 0 < min_mbps < max_mbps, got {min_mbps} and {max_mbps}")
    bad = [o for o in objectives if o not in OBJECTIVES]
    if bad or not objectives or not device_loads or any(x < 1 for x in device_loads):
        raise PlanError(
            f"explain: expected objectives in {OBJECTIVES} and device loads >= 1, got "
            f"{list(objectives)} and {list(device_loads)}"
        )
    # the best router is route-codec: the input as an image wherever the table prices one (and then the
    # split plans may send it too: their plans contain every router's)
    codecs = with_image_codecs(table, codecs)
    bands: list[Band] = []
    for objective in objectives:
        for dl in device_loads:
            bands += _bands(table, objective, dl, cloud_load, rtt_ms, min_mbps, max_mbps, power, codecs, cuts, points)
    smaller = smaller_than_input(table, codecs)
    pays = any(b.max_gain >= pay_gain for b in bands)
    v = Verdict(
        splits=bool(bands),
        pays=pays,
        pay_gain=pay_gain,
        summary="",
        bands=tuple(bands),
        smaller_cuts=smaller,
        min_mbps=min_mbps,
        max_mbps=max_mbps,
        rtt_ms=rtt_ms,
        objectives=tuple(objectives),
        device_loads=tuple(float(x) for x in device_loads),
    )
    return Verdict(**{**v.__dict__, "summary": summary(v, cuts)})


def _bands(
    table: CostTable,
    objective: str,
    dl: float,
    cl: float,
    rtt_ms: float,
    lo: float,
    hi: float,
    power: Power,
    codecs: Sequence[str] | None,
    cuts: Sequence[str] | None,
    points: int,
) -> list[Band]:
    def at(bw: float) -> tuple[float, Plan, Plan]:
        cond = Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=rtt_ms), device_load=dl, cloud_load=cl)
        return gain_at(table, cond, objective=objective, power=power, codecs=codecs, cuts=cuts)

    def wins(bw: float) -> bool:
        return at(bw)[0] > 1.0 + TOLERANCE

    grid = [float(b) for b in np.geomspace(lo, hi, max(points, 2))]
    flags = [wins(b) for b in grid]
    out: list[Band] = []
    i = 0
    while i < len(grid):
        if not flags[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(grid) and flags[j + 1]:
            j += 1
        start = lo if i == 0 else _edge(wins, grid[i - 1], grid[i])
        end = hi if j == len(grid) - 1 else _edge(wins, grid[j], grid[j + 1])
        inside = grid[i : j + 1]
        results = [at(b) for b in inside]
        k = int(np.argmax([g for g, _, _ in results]))
        out.append(
            Band(
                objective=objective,
                device_load=dl,
                from_mbps=start,
                to_mbps=end,
                plans=tuple(dict.fromkeys(s.key for _, s, _ in results)),
                route_plans=tuple(dict.fromkeys(r.key for _, _, r in results)),
                max_gain=results[k][0],
                at_mbps=inside[k],
                best_plan=results[k][1].key,
            )
        )
        i = j + 1
    return out


def _edge(wins: Callable[[float], bool], a: float, b: float) -> float:
    """The bandwidth between grid points ``a`` < ``b`` where ``wins`` flips, to 1e-6 relative."""
    fa = wins(a)
    for _ in range(60):
        if b / a - 1 < 1e-6:
            break
        m = math.sqrt(a * b)
        if wins(m) == fa:
            a = m
        else:
            b = m
    return math.sqrt(a * b)


def summary(v: Verdict, cuts: Sequence[str] | None = None) -> str:
    """The verdict in one line."""
    where = (
        f"{v.min_mbps:g}-{v.max_mbps:g} Mbit/s, rtt {v.rtt_ms:g} ms, device load "
        f"{'/'.join(f'{x:g}' for x in v.device_loads)}, {'/'.join(v.objectives)}"
    )
    if cuts is not None and not any(c in ROUTE_CUTS for c in cuts):
        return f"split: routing cannot meet the constraints (neither device nor cloud allowed) ({where})"
    if not v.bands:
        if not v.smaller_cuts:
            return f"route, do not split: no inner tensor is smaller than the input under any allowed codec ({where})"
        return (
            f"route, do not split: inner cuts never beat routing here, though {len(v.smaller_cuts)} send "
            f"fewer bytes than the input ({where})"
        )
    verdict = "split" if v.pays else f"route (splitting gains < {(v.pay_gain - 1) * 100:.0f} %)"
    parts = []
    for objective in v.objectives:
        mine = [b for b in v.bands if b.objective == objective]
        if not mine:
            parts.append(f"{objective} never")
            continue
        b = max(mine, key=lambda x: x.max_gain)
        parts.append(
            f"{objective} up to {(b.max_gain - 1) * 100:.1f} % ({b.best_plan}, device load {b.device_load:g}, "
            f"{b.at_mbps:.3g} Mbit/s; {b.from_mbps:.3g}-{b.to_mbps:.3g})"
        )
    return f"{verdict}: inner cuts beat routing for " + ", ".join(parts) + f" ({where})"
