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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ORACLES = ("oracle",)
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
        means, p95s, vs_oracle = [], [], []
        for label, s in cells:
            best_mean = min(s[n]["mean_ms"] for n in contenders)
            best_p95 = min(s[n]["p95_ms"] for n in contenders)
            means.append((s[name]["mean_ms"] / best_mean, label))
            p95s.append((s[name]["p95_ms"] / best_p95, label))
            if "oracle" in s:
                vs_oracle.append(s[name]["mean_ms"] / s["oracle"]["mean_ms"])
        wm, wp = max(means), max(p95s)
        out.append(Regret(strategy=name, cells=len(cells), worst_mean=wm[0], worst_mean_cell=wm[1],
                          worst_p95=wp[0], worst_p95_cell=wp[1], geo_mean=_geo([m for m, _ in means]),
                          geo_vs_oracle=_geo(vs_oracle)))
    return out


def bootstrap_ratio(a_turns: Sequence[Sequence[float]], b_turns: Sequence[Sequence[float]], *, n: int = 2000,
                    seed: int = 0, stat: str = "mean") -> tuple[float, float]:
    """95 % interval of stat(a) / stat(b) where each side's requests are grouped by turn and the turns
    are resampled (requests within a turn share the host's and the link's moment, so they are not
    independent). ``stat`` is ``mean`` or ``p95``."""
    a_groups = [np.asarray(t, dtype=float) for t in a_turns if len(t)]
    b_groups = [np.asarray(t, dtype=float) for t in b_turns if len(t)]
    if not a_groups or not b_groups:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)

    def one(groups: list[np.ndarray]) -> float:
        pick = rng.integers(0, len(groups), len(groups))
        xs = np.concatenate([groups[i] for i in pick])
        return float(np.mean(xs)) if stat == "mean" else float(np.percentile(xs, 95))

    ratios = np.array([one(a_groups) / one(b_groups) for _ in range(n)])
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def call(ci: tuple[float, float]) -> str:
    """``better`` / ``worse`` only when the interval of a/b excludes 1, else ``same``."""
    lo, hi = ci
    if hi < 1.0:
        return "better"
    if lo > 1.0:
        return "worse"
    return "same"


def rows(table: Sequence[Regret]) -> list[list[str]]:
    """Table rows: strategy, worst mean cell, worst p95 cell, geo mean, geo vs oracle."""
    return [[r.strategy, f"{r.worst_mean:.3f} ({r.worst_mean_cell})", f"{r.worst_p95:.3f} ({r.worst_p95_cell})",
             f"{r.geo_mean:.3f}", f"{r.geo_vs_oracle:.3f}"] for r in table]


HEADER = ["strategy", "worst cell, mean / best", "worst cell, p95 / best", "geo-mean / best", "geo-mean / oracle"]
