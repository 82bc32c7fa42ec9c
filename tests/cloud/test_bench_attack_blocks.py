"""attacks/bench_attack.py's interleaved phases: how calls fall into (baseline, attack) block pairs and what
the p99 ratio's bootstrap interval says (pure: no server)."""

from __future__ import annotations

import numpy as np

from tests.cloud.test_bench_attack import _bench


def test_calls_fall_into_their_blocks_and_the_last_baseline_joins_the_last_pair() -> None:
    b = _bench()
    blocks = b.Blocks(base=[(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)], attack=[(1.0, 2.0), (3.0, 4.0)])
    calls = [
        b.Call("dl", 0.5, 10.0, "OK"),
        b.Call("dl", 1.5, 20.0, "OK"),
        b.Call("dl", 1.6, 99.0, "DEADLINE_EXCEEDED"),  # failed: in no latency list
        b.Call("nodl", 2.5, 77.0, "OK"),  # without a deadline: not in the p99
        b.Call("dl", 2.5, 11.0, "OK"),
        b.Call("dl", 3.5, 21.0, "OK"),
        b.Call("dl", 4.5, 12.0, "OK"),
    ]
    assert blocks.units(calls) == [([10.0], [20.0]), ([11.0, 12.0], [21.0])]


def test_the_interval_holds_1_for_the_same_latencies_and_excludes_it_for_4x() -> None:
    b = _bench()
    rng = np.random.default_rng(1)
    same = [(list(rng.gamma(2.0, 5.0, 40)), list(rng.gamma(2.0, 5.0, 40))) for _ in range(4)]
    lo, hi = b._ratio_ci(same)
    assert lo <= 1.0 <= hi
    slower = [(base, [4 * x for x in rng.gamma(2.0, 5.0, 40)]) for base, _ in same]
    lo, hi = b._ratio_ci(slower)
    assert lo > 1.5 and hi > 3.0


def test_no_interval_without_calls_on_both_sides() -> None:
    b = _bench()
    assert b._ratio_ci([([10.0, 12.0], [])]) is None
