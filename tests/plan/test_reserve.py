"""plan.reserve: the local-fallback reserve never stops an offload that is the plan's best chance."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitrt.plan import reserve


def test_a_local_finish_that_misses_the_deadline_anyway_sends_with_the_whole_budget() -> None:
    # a 33-GFLOP detector on a Pi: the tail here takes 12 s, the deadline is 5 s
    b = reserve.send_budget(deadline_ms=5000, elapsed_ms=300, local_finish_ms=12_000)
    assert b.sent and b.timeout_ms == 12_000 and b.reason == reserve.LATE_ANYWAY
    b = reserve.send_budget(deadline_ms=20_000, elapsed_ms=300, local_finish_ms=14_000)
    assert b.timeout_ms == 19_700  # 300 + 14000 x 1.5 + 10 > 20000: the whole budget, not nothing
    assert b.reason == reserve.LATE_ANYWAY


def test_the_reserve_holds_when_the_local_finish_meets_the_deadline() -> None:
    b = reserve.send_budget(deadline_ms=5000, elapsed_ms=100, local_finish_ms=1000)
    assert b.timeout_ms == 5000 - 100 - 1000 * reserve.LOCAL_SAFETY - reserve.LOCAL_SLACK_MS
    assert b.reason == reserve.RESERVE


def test_a_cold_tail_gets_the_whole_budget_for_its_build() -> None:
    b = reserve.send_budget(deadline_ms=20_000, elapsed_ms=100, local_finish_ms=5_000, cold=True)
    assert b.timeout_ms == 19_900 and b.reason == reserve.COLD


def test_no_room_after_the_reserve_is_not_sent() -> None:
    b = reserve.send_budget(deadline_ms=100.5, elapsed_ms=0, local_finish_ms=60)
    assert not b.sent and b.reason == reserve.NOT_SENT


@given(
    deadline=st.floats(1, 1e5),
    elapsed=st.floats(0, 1e5),
    local=st.floats(0, 1e5),
    cold=st.booleans(),
)
def test_the_budget_is_never_below_the_local_finish_when_late_and_never_past_the_reserve_when_not(
    deadline: float, elapsed: float, local: float, cold: bool
) -> None:
    b = reserve.send_budget(deadline_ms=deadline, elapsed_ms=elapsed, local_finish_ms=local, cold=cold)
    reserve_ms = local * reserve.LOCAL_SAFETY + reserve.LOCAL_SLACK_MS
    if deadline - elapsed < reserve_ms:  # late anyway: always sent
        assert b.timeout_ms is not None and b.timeout_ms >= max(local, deadline - elapsed)
    elif not cold and b.timeout_ms is not None:  # the local finish still meets the deadline
        assert elapsed + b.timeout_ms + reserve_ms <= deadline + 1e-6
