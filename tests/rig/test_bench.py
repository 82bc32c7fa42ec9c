"""The benchmark's turn schedule and a strategy's paused clock (pure parts of rigbench / rigworker)."""

from __future__ import annotations

import itertools
import statistics
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import ConfigError
from splitrt.rig import bench as rigbench
from splitrt.rig.worker import TurnClock

NAMES = ["device-only", "cloud-only", "static", "periodic", "adaptive"]


def test_turns_cover_the_window_once_per_strategy_in_rotating_order() -> None:
    plan = rigbench.turn_plan(NAMES, 12.0, 3.0)
    assert len(plan) == 4 * len(NAMES)
    assert [n for n, _ in plan[:5]] == NAMES
    assert [n for n, _ in plan[5:10]] == NAMES[1:] + NAMES[:1]
    for name in NAMES:
        assert [u for n, u in plan if n == name] == [3.0, 6.0, 9.0, 12.0]


@given(n=st.integers(1, 6), rounds=st.integers(1, 13), turn_s=st.floats(0.5, 5.0))
def test_every_strategy_takes_every_place_and_never_two_turns_in_a_row(n: int, rounds: int, turn_s: float) -> None:
    names = [f"s{i}" for i in range(n)]
    plan = rigbench.turn_plan(names, rounds * turn_s, turn_s)
    assert len(plan) == n * rounds
    assert plan[-1][1] == pytest.approx(rounds * turn_s)
    places = {s: [k % n for k, (name, _) in enumerate(plan) if name == s] for s in names}
    if rounds % n == 0:  # whole cycles: the same mean place, so a linear drift of the host cancels exactly
        assert len({statistics.fmean(p) for p in places.values()}) == 1
    if n >= 3:
        assert all(a[0] != b[0] for a, b in itertools.pairwise(plan))


def test_a_turn_longer_than_the_window_is_one_run_each() -> None:
    assert rigbench.turn_plan(NAMES, 10.0, 30.0) == [(n, 10.0) for n in NAMES]


def test_bench_config_rejects_a_bad_turn() -> None:
    with pytest.raises(ConfigError, match="turn_s"):
        rigbench.BenchConfig(turn_s=0.0)


def test_turn_clock_stands_still_while_parked() -> None:
    clock = TurnClock()
    a = clock()
    clock.pause()
    p = clock()
    time.sleep(0.05)
    assert clock() == p  # parked: not a tick
    clock.pause()  # idempotent
    clock.resume()
    time.sleep(0.02)
    b = clock()
    assert 0.015 <= b - p < 0.05  # only the running time counts
    assert b - a < 0.05  # the 50 ms parked did not count
    clock.resume()  # idempotent
    assert clock() >= b
