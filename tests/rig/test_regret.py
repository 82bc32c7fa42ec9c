"""Regret and split-vs-route tables (splitrt.rig.regret): numbers in, numbers out."""

from __future__ import annotations

import math

import pytest

from splitrt.rig import regret


def _cell(**means: float) -> dict[str, dict[str, float]]:
    return {n: {"mean_ms": m, "p95_ms": 2 * m} for n, m in means.items()}


CELLS = [
    ("a", _cell(route=100.0, adaptive=80.0, oracle=75.0, **{"oracle-route": 100.0, "device-only": 120.0})),
    ("b", _cell(route=100.0, adaptive=100.0, oracle=90.0, **{"oracle-route": 90.0, "device-only": 100.0})),
    ("c", _cell(route=50.0, adaptive=50.0, oracle=50.0, **{"oracle-route": 50.0, "device-only": 200.0})),
]


def test_each_strategy_is_compared_with_its_routing_counterpart() -> None:
    by = {r.strategy: r for r in regret.regret(CELLS)}
    assert by["adaptive"].geo_vs_route == pytest.approx((0.8 * 1.0 * 1.0) ** (1 / 3))
    assert by["oracle"].geo_vs_route == pytest.approx((0.75 * 1.0 * 1.0) ** (1 / 3))
    assert by["device-only"].geo_vs_route == pytest.approx((1.2 * 1.0 * 4.0) ** (1 / 3))
    lo, hi = by["adaptive"].geo_vs_route_ci
    assert 0.8 <= lo <= by["adaptive"].geo_vs_route <= hi <= 1.0
    # the oracles are not contenders for the per-cell best: adaptive is best in cell a
    assert by["adaptive"].worst_mean == pytest.approx(1.0)


def test_without_route_the_column_is_nan_and_printed_as_a_dash() -> None:
    cells = [(label, {n: s for n, s in c.items() if "route" not in n}) for label, c in CELLS]
    r = {x.strategy: x for x in regret.regret(cells)}["adaptive"]
    assert math.isnan(r.geo_vs_route)
    assert regret.rows([r])[0][-1] == "-"


def test_split_route_reports_the_gain_of_splitting() -> None:
    a = regret.split_route(CELLS, "adaptive")
    assert a.route == "route" and a.cells == 3
    assert a.geo == pytest.approx(1.25 ** (1 / 3))
    assert (a.worst, a.worst_cell, a.gain_cells) == (pytest.approx(1.25), "a", 1)
    o = regret.split_route(CELLS, "oracle")
    assert o.route == "oracle-route" and o.worst == pytest.approx(100 / 75) and o.worst_cell == "a"
    assert o.geo_ci[0] <= o.geo <= o.geo_ci[1]
    assert regret.split_route(CELLS[:1], "static").cells == 0


def test_geo_ci_of_identical_ratios_is_a_point() -> None:
    assert regret.geo_ci([1.1, 1.1, 1.1]) == pytest.approx((1.1, 1.1))
    assert all(math.isnan(x) for x in regret.geo_ci([]))


def test_bootstrap_ratio_resamples_turns_and_call_needs_the_interval_to_exclude_one() -> None:
    fast = [[10.0, 12.0], [11.0, 9.0], [10.0, 10.0], [12.0, 8.0]]
    slow = [[20.0, 22.0], [19.0, 21.0], [20.0, 18.0], [22.0, 18.0]]
    lo, hi = regret.bootstrap_ratio(fast, slow, seed=1)
    assert 0.4 < lo <= 0.5 <= hi < 0.6
    assert regret.call((lo, hi)) == "better"
    assert regret.call(regret.bootstrap_ratio(slow, fast, seed=1)) == "worse"
    # the same requests on both sides: the interval holds 1, and the call is "same"
    same = regret.bootstrap_ratio(fast, fast, seed=1, stat="p95")
    assert same[0] <= 1.0 <= same[1] and regret.call(same) == "same"
    # identical turns: every resample gives the same ratio
    assert regret.bootstrap_ratio([[5.0]] * 3, [[10.0]] * 3) == pytest.approx((0.5, 0.5))
    assert all(math.isnan(x) for x in regret.bootstrap_ratio([], slow))
    assert all(math.isnan(x) for x in regret.bootstrap_ratio(fast, [[]]))


def test_split_route_rows_print_the_interval() -> None:
    row = regret.split_route_rows([regret.split_route(CELLS, "adaptive")])[0]
    assert row[0] == "adaptive vs route" and row[1] == "3" and row[-1] == "1"
    assert row[2].startswith(f"{1.25 ** (1 / 3):.3f} (") and row[3] == "1.250 (a)"
