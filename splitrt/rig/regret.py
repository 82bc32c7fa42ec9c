"""What adaptation buys, framed as regret over a grid of cells (pure: numbers in, numbers out).

No fixed choice is right everywhere: the best fixed strategy differs by trace, bandwidth scale, load and
model, and each one is far off somewhere. So for every strategy we report, over all cells, its ratio to
the per-cell best non-oracle strategy (mean and p95 latency): the worst cell and the geometric mean, and
its geometric-mean ratio to the oracle. A *fixed* strategy is ONE choice across all cells of a model
(device-only, cloud-only, and ``static-fixed``: the cut the profile picks at the median bandwidth of the
training traces, whatever the cell's scale or load); ``static`` (picked per cell, knowing its scale) and
``static-best`` (the best single plan in hindsight, per cell) are shown alongside as per-cell oracles of
the static kind.

Differences within a cell are called only when a bootstrap interval over turns excludes 1.

Split against route: ``route`` is the adaptive runtime restricted to the cuts ``device`` and ``cloud``
(whole-request routing) and ``oracle-route`` the hindsight oracle over those two; each strategy's
``geo_vs_route`` is its geometric-mean ratio to its routing counterpart (the oracle's to
``oracle-route``, every other's to ``route``), with a 95 % bootstrap interval over cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ORACLES = ("oracle", "oracle-route")
ROUTE_OF = {"oracle": "oracle-route"}  # a strategy's routing counterpart; any other's is ``route``
# Strategies that do not choose by looking at the cell: the ones regret is about.
FIXED = ("device-only", "cloud-only", "static-fixed")


@dataclass(frozen=True, kw_only=True)
class Regret:
    strategy: str
    cells: int
    worst_mean: float  # max over cells of mean / best non-oracle mean
    worst_mean_cell: str
    worst_p95: float  # the same for p95
    worst_p95_cell: str
    geo_mean: float  # geometric mean over cells of mean / best non-oracle mean
    geo_vs_oracle: float  # geometric mean over cells of mean / oracle mean (nan without an oracle)
    # geometric mean over cells of mean / its routing counterpart's mean, and its 95 % interval (cells
    # resampled); nan without route strategies
    geo_vs_route: float = math.nan
    geo_vs_route_ci: tuple[float, float] = (math.nan, math.nan)


def _geo(xs: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(xs)))) if xs else math.nan


def regret(cells: Sequence[tuple[str, Mapping[str, Mapping[str, float]]]]) -> list[Regret]:
    """``cells``: (cell label, {strategy: {"mean_ms", "p95_ms"}}). Every strategy present in every cell
    is ranked against the per-cell best of the non-oracle strategies (itself included)."""
    if not cells:
        return []
    names = [n for n in cells[0][1] if all(n in s for _, s in cells)]
    contenders = [n for n in names if n not in ORACLES]
    out = []
    for name in names:
        means, p95s, vs_oracle, vs_route = [], [], [], []
        counterpart = ROUTE_OF.get(name, "route")
        for label, s in cells:
            best_mean = min(s[n]["mean_ms"] for n in contenders)
            best_p95 = min(s[n]["p95_ms"] for n in contenders)
            means.append((s[name]["mean_ms"] / best_mean, label))
            p95s.append((s[name]["p95_ms"] / best_p95, label))
            if "oracle" in s:
                vs_oracle.append(s[name]["mean_ms"] / s["oracle"]["mean_ms"])
            if counterpart in s:
                vs_route.append(s[name]["mean_ms"] / s[counterpart]["mean_ms"])
        wm, wp = max(means), max(p95s)
        out.append(
            Regret(
                strategy=name,
                cells=len(cells),
                worst_mean=wm[0],
                worst_mean_cell=wm[1],
                worst_p95=wp[0],
                worst_p95_cell=wp[1],
                geo_mean=_geo([m for m, _ in means]),
                geo_vs_oracle=_geo(vs_oracle),
                geo_vs_route=_geo(vs_route) if len(vs_route) == len(cells) else math.nan,
                geo_vs_route_ci=geo_ci(vs_route) if len(vs_route) == len(cells) else (math.nan, math.nan),
            )
        )
    return out


def geo_ci(ratios: Sequence[float], *, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of the geometric mean of ``ratios`` (one per cell), the cells resampled."""
    if not ratios:
        return (math.nan, math.nan)
    logs = np.log(np.asarray(ratios, dtype=float))
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), (n, len(logs)))].mean(axis=1)
    lo, hi = np.exp(np.percentile(means, [2.5, 97.5]))
    return float(lo), float(hi)


@dataclass(frozen=True, kw_only=True)
class SplitRoute:
    """Splitting against routing over a grid: ``split`` (adaptive or oracle) over ``route`` (its counterpart
    restricted to device and cloud) per cell; < 1 means splitting is faster."""

    split: str
    route: str
    cells: int = 0
    geo: float = math.nan  # geometric mean over cells of route mean / split mean (> 1: splitting pays)
    geo_ci: tuple[float, float] = (math.nan, math.nan)
    worst: float = math.nan  # the cell where splitting gains most: max over cells of route mean / split mean
    worst_cell: str = "-"
    worst_p95: float = math.nan  # max over cells of route p95 / split p95
    worst_p95_cell: str = "-"
    gain_cells: int = 0  # cells where route mean / split mean >= 1.10


def split_route(
    cells: Sequence[tuple[str, Mapping[str, Mapping[str, float]]]], split: str = "adaptive", route: str | None = None
) -> SplitRoute:
    """route/split over the cells holding both (``route`` None: ``ROUTE_OF.get(split, "route")``)."""
    route = route or ROUTE_OF.get(split, "route")
    pairs = [
        (label, s[route]["mean_ms"] / s[split]["mean_ms"], s[route]["p95_ms"] / s[split]["p95_ms"])
        for label, s in cells
        if split in s and route in s
    ]
    if not pairs:
        return SplitRoute(split=split, route=route)
    ratios = [r for _, r, _ in pairs]
    wm = max(pairs, key=lambda x: x[1])
    wp = max(pairs, key=lambda x: x[2])
    return SplitRoute(
        split=split,
        route=route,
        cells=len(pairs),
        geo=_geo(ratios),
        geo_ci=geo_ci(ratios),
        worst=wm[1],
        worst_cell=wm[0],
        worst_p95=wp[2],
        worst_p95_cell=wp[0],
        gain_cells=sum(1 for r in ratios if r >= 1.10),
    )


def bootstrap_ratio(
    a_turns: Sequence[Sequence[float]],
    b_turns: Sequence[Sequence[float]],
    *,
    n: int = 2000,
    seed: int = 0,
    stat: str = "mean",
) -> tuple[float, float]:
    """95 % interval of stat(a) / stat(b) where each side's requests are grouped by turn and the turns
    are resampled (requests within a turn share the host's and the link's moment, so they are not
    independent). ``stat`` is ``mean`` or ``p95``."""
    a_groups = [np.asarray(t, dtype=float) for t in a_turns if len(t)]
    b_groups = [np.asarray(t, dtype=float) for t in b_turns if len(t)]
    if not a_groups or not b_groups:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    return interval([resampled(a_groups, rng, stat) / resampled(b_groups, rng, stat) for _ in range(n)])


def resampled(groups: Sequence[np.ndarray], rng: np.random.Generator, stat: str) -> float:
    """``stat`` (mean | p95) of one bootstrap resample of ``groups`` (whole groups drawn with replacement)."""
    xs = np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))])
    return float(np.mean(xs)) if stat == "mean" else float(np.percentile(xs, 95))


def interval(draws: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap ``draws``."""
    return float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def call(ci: tuple[float, float]) -> str:
    """``better`` / ``worse`` only when the interval of a/b excludes 1, else ``same``."""
    lo, hi = ci
    if hi < 1.0:
        return "better"
    if lo > 1.0:
        return "worse"
    return "same"


def rows(table: Sequence[Regret]) -> list[list[str]]:
    """Table rows: strategy, worst mean cell, worst p95 cell, geo mean, geo vs oracle, geo vs route (CI)."""
    return [
        [
            r.strategy,
            f"{r.worst_mean:.3f} ({r.worst_mean_cell})",
            f"{r.worst_p95:.3f} ({r.worst_p95_cell})",
            f"{r.geo_mean:.3f}",
            f"{r.geo_vs_oracle:.3f}",
            _with_ci(r.geo_vs_route, r.geo_vs_route_ci),
        ]
        for r in table
    ]


def _with_ci(x: float, ci: tuple[float, float]) -> str:
    return "-" if math.isnan(x) else f"{x:.3f} ({ci[0]:.3f}-{ci[1]:.3f})"


HEADER = [
    "strategy",
    "worst cell, mean / best",
    "worst cell, p95 / best",
    "geo-mean / best",
    "geo-mean / oracle",
    "geo-mean split/route (95 % CI)",
]


def split_route_rows(table: Sequence[SplitRoute]) -> list[list[str]]:
    return [
        [
            f"{r.split} vs {r.route}",
            str(r.cells),
            _with_ci(r.geo, r.geo_ci),
            f"{r.worst:.3f} ({r.worst_cell})",
            f"{r.worst_p95:.3f} ({r.worst_p95_cell})",
            str(r.gain_cells),
        ]
        for r in table
    ]


SPLIT_ROUTE_HEADER = [
    "split vs route",
    "cells",
    "route/split geo-mean (95 % CI)",
    "largest gain, mean",
    "largest gain, p95",
    "cells >= 1.10",
]
