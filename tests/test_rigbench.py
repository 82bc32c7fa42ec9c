"""The benchmark's turn schedule and a strategy's paused clock (pure parts of rigbench / rigworker)."""

from __future__ import annotations

import statistics
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt import rigbench
from splitrt.errors import ConfigError
from splitrt.rigworker import TurnClock

NAMES = ["device-only", "cloud-only", "static", "periodic", "adaptive"]


def test_turns_cover_the_window_once_per_strategy_in_alternating_order() -> None:
    plan = rigbench.turn_plan(NAMES, 12.0, 3.0)
    assert len(plan) == 4 * len(NAMES)
    assert [n for n, _ in plan[:5]] == NAMES
    assert [n for n, _ in plan[5:10]] == NAMES[::-1]
    for name in NAMES:
        assert [u for n, u in plan if n == name] == [3.0, 6.0, 9.0, 12.0]


@given(n=st.integers(1, 6), rounds=st.integers(1, 8), turn_s=st.floats(0.5, 5.0))
def test_every_strategy_sits_at_the_same_mean_place_in_time(n: int, rounds: int, turn_s: float) -> None:
    names = [f"s{i}" for i in range(n)]
    plan = rigbench.turn_plan(names, rounds * turn_s, turn_s)
    assert len(plan) == n * rounds
    means = [statistics.fmean(k for k, (name, _) in enumerate(plan) if name == s) for s in names]
    # even rounds: a linear drift of the host cancels exactly; odd: off by at most one round's spread
    spread = max(means) - min(means)
    assert spread == pytest.approx(0.0, abs=1e-9) if rounds % 2 == 0 else spread <= (n - 1) / rounds + 1e-9
    assert plan[-1][1] == pytest.approx(rounds * turn_s)


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
