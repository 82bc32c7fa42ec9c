"""Balancing over several clouds (pure): the least expected queue + RTT goes first, near-ties take
turns, the order is a permutation (the failover order), and a logged choice replays."""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import PlanError
from splitrt.plan.balance import BalanceConfig, Candidate, Choice, choose, order, replay, scores, tolerance_ms

ms = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
candidates = st.lists(
    st.builds(
        lambda q, r, n, s, w: (q, r, n, s, w), ms, st.one_of(st.none(), ms), st.integers(0, 8), ms, st.integers(1, 8)
    ),
    min_size=1,
    max_size=6,
).map(
    lambda xs: [
        Candidate(address=f"10.0.0.{i}:50051", queue_ms=q, rtt_ms=r, inflight=n, service_ms=s, workers=w)
        for i, (q, r, n, s, w) in enumerate(xs)
    ]
)
configs = st.builds(BalanceConfig, tie_ms=st.floats(0.0, 20.0), tie_fraction=st.floats(0.0, 0.5), rotate=st.booleans())


@settings(max_examples=300, deadline=None)
@given(candidates, st.integers(0, 10_000), configs)
def test_the_order_is_every_cloud_once_and_the_first_is_a_least_loaded_one(
    cands: list[Candidate], turn: int, cfg: BalanceConfig
) -> None:
    got = order(cands, turn=turn, config=cfg)
    assert sorted(got) == sorted(c.address for c in cands)  # a permutation: every cloud is a failover
    s = dict(zip((c.address for c in cands), scores(cands), strict=True))
    best = min(s.values())
    assert s[got[0]] <= best + tolerance_ms(best, cfg)


@settings(max_examples=300, deadline=None)
@given(candidates, st.integers(0, 10_000), configs)
def test_a_clearly_more_loaded_cloud_never_goes_before_a_less_loaded_one(
    cands: list[Candidate], turn: int, cfg: BalanceConfig
) -> None:
    got = order(cands, turn=turn, config=cfg)
    s = dict(zip((c.address for c in cands), scores(cands), strict=True))
    tol = tolerance_ms(min(s.values()), cfg)
    pos = {a: i for i, a in enumerate(got)}
    for a in s:
        for b in s:
            if s[a] > s[b] + tol:
                assert pos[b] < pos[a], (a, b, s, got)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.floats(0.0, 100.0), st.integers(0, 1000))
def test_equally_loaded_clouds_take_turns(n: int, load_ms: float, start: int) -> None:
    cands = [Candidate(address=f"s{i}", queue_ms=load_ms, rtt_ms=1.0) for i in range(n)]
    firsts = [order(cands, turn=t)[0] for t in range(start, start + n)]
    assert sorted(firsts) == sorted(c.address for c in cands)  # each first exactly once per n turns


def test_without_rotation_ties_keep_the_given_preference() -> None:
    cands = [Candidate(address=a, rtt_ms=1.0) for a in ("b", "a", "c")]
    assert {tuple(order(cands, turn=t, config=BalanceConfig(rotate=False))) for t in range(5)} == {("b", "a", "c")}


def test_queue_rtt_and_own_requests_all_count() -> None:
    idle = Candidate(address="idle", queue_ms=0.0, rtt_ms=1.0)
    queued = Candidate(address="queued", queue_ms=50.0, rtt_ms=1.0)
    far = Candidate(address="far", queue_ms=0.0, rtt_ms=80.0)
    mine = Candidate(address="mine", queue_ms=0.0, rtt_ms=1.0, inflight=4, service_ms=20.0, workers=2)  # 40 ms
    for t in range(4):
        assert order([queued, far, mine, idle], turn=t) == ["idle", "mine", "queued", "far"]
    # Unprobed: priced as the slowest probed one (neither preferred nor shunned for being new).
    new = Candidate(address="new", rtt_ms=None)
    assert scores([far, new]) == [80.0, 80.0]
    # Our own request on the wire with no service time known yet still breaks a tie.
    busy = Candidate(address="busy", inflight=1, rtt_ms=0.0)
    free = Candidate(address="free", rtt_ms=0.0)
    cfg = BalanceConfig(tie_ms=1.0)
    assert [order([busy, free], turn=t, config=cfg)[0] for t in range(3)] == ["free"] * 3


def test_a_logged_choice_replays() -> None:
    lines = io.StringIO()
    for t in range(6):
        c = choose(
            [
                Candidate(address="a", queue_ms=3.0 * t, rtt_ms=1.0),
                Candidate(address="b", queue_ms=5.0, rtt_ms=None, inflight=t % 2, service_ms=4.0),
            ],
            turn=t,
        )
        lines.write(f'{{"extra": {{"balance": {__import__("json").dumps(c.to_json())}}}}}\n')
    lines.write('{"extra": {}}\n')  # a single-cloud decision: nothing to replay
    pairs = replay(lines.getvalue().splitlines())
    assert len(pairs) == 6 and all(a == b for a, b in pairs)
    assert Choice.from_json(pairs[0][0].to_json()) == pairs[0][0]


@pytest.mark.parametrize(
    "bad",
    [
        {"queue_ms": -1.0},
        {"rtt_ms": math.inf},
        {"inflight": -1},
        {"workers": 0},
        {"service_ms": math.nan},
    ],
)
def test_nonsense_inputs_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(PlanError, match="expected finite queue_ms"):
        Candidate(address="x", **bad)  # type: ignore[arg-type]


def test_duplicate_addresses_and_bad_records_are_refused() -> None:
    with pytest.raises(PlanError, match="expected distinct addresses"):
        order([Candidate(address="a"), Candidate(address="a")], turn=0)
    with pytest.raises(PlanError, match="expected keys turn, order, candidates"):
        Choice.from_json({"turn": 1})
    with pytest.raises(PlanError, match="tie_fraction"):
        BalanceConfig(tie_fraction=1.5)
    assert order([], turn=3) == []
