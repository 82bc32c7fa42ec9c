"""Solver: exact over candidates, monotone in bandwidth, plan strings, sweep."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import PlanError
from splitrt.plan.costmodel import Conditions, CostTable, Link, Power
from splitrt.plan.solver import (
    OBJECTIVES,
    evaluate,
    objective_matrix,
    parse_path,
    parse_plan,
    solve,
    sweep,
)

ms = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)
nbytes = st.integers(min_value=0, max_value=20_000_000)


@st.composite
def tables(draw: st.DrawFn) -> CostTable:
    n = draw(st.integers(min_value=2, max_value=12))
    ids = ["cloud"] + [f"c{i}" for i in range(1, n - 1)] + ["device"]
    head = np.cumsum(draw(st.lists(ms, min_size=n, max_size=n)))
    total = draw(st.floats(min_value=0.1, max_value=5.0))  # cloud speed relative to device
    tail = (head[-1] - head) * total
    b = draw(st.lists(nbytes, min_size=n, max_size=n))
    fb = [draw(st.integers(min_value=0, max_value=x)) for x in b]
    return CostTable(
        ids=ids, head_ms=head, tail_ms=tail, bytes=b, float_bytes=fb, reply_bytes=draw(st.integers(0, 10_000))
    )


bandwidths = st.floats(min_value=0.01, max_value=10_000.0)
conditions = st.builds(
    lambda bw, rtt, dl, cl: Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=rtt), device_load=dl, cloud_load=cl),
    bandwidths,
    st.floats(min_value=0.0, max_value=300.0),
    st.floats(min_value=1.0, max_value=8.0),
    st.floats(min_value=1.0, max_value=8.0),
)
powers = st.builds(
    Power,
    idle_w=st.floats(0.0, 10.0),
    active_w=st.floats(0.0, 30.0),
    radio_w=st.floats(0.0, 5.0),
)


@settings(max_examples=200, deadline=None)
@given(tables(), conditions, powers, st.sampled_from(OBJECTIVES))
def test_chosen_plan_costs_no_more_than_any_candidate(
    t: CostTable, cond: Conditions, power: Power, objective: str
) -> None:
    plan = solve(t, cond, objective=objective, power=power)
    chosen = {"latency": plan.predicted_ms, "energy": plan.energy_mj, "throughput": plan.period_ms}[objective]
    for cut, codec in itertools.product(t.ids, t.codecs):
        e = t.estimate(cut, codec, cond, power)
        other = {"latency": e.latency_ms, "energy": e.energy_mj, "throughput": e.period_ms}[objective]
        assert chosen <= other * (1 + 1e-9) + 1e-12, (plan, e)
    assert np.min(objective_matrix(t, cond, objective, power)) == pytest.approx(chosen, rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(tables(), conditions, bandwidths, st.sampled_from([None, ("fp32",)]))
def test_monotone_in_bandwidth(t: CostTable, cond: Conditions, bw2: float, codecs: tuple[str] | None) -> None:
    lo, hi = sorted([cond.link.bandwidth_mbps, bw2])
    at = [
        solve(
            t,
            Conditions(
                link=Link(bandwidth_mbps=bw, rtt_ms=cond.link.rtt_ms),
                device_load=cond.device_load,
                cloud_load=cond.cloud_load,
            ),
            codecs=codecs,
        )
        for bw in (lo, hi)
    ]
    assert at[1].sent_bytes >= at[0].sent_bytes, at
    assert at[1].predicted_ms <= at[0].predicted_ms * (1 + 1e-12), at


def test_plan_string_roundtrip() -> None:
    t = CostTable(ids=["cloud", "c1", "device"], head_ms=[0, 5, 9], tail_ms=[3, 2, 0], bytes=[100, 10**6, 0])
    cond = Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=1.0))
    plan = solve(t, cond)
    assert str(plan) == f"{plan.cut}@{plan.codec}"
    assert parse_plan(str(plan)) == (plan.cut, plan.codec)
    assert parse_plan("device") == ("device", "fp32")
    again = evaluate(t, str(plan), cond)
    assert again == plan
    assert parse_path("c3@fp16>c12@fp16") == (("c3", "c12"), ("fp16", "fp16"))
    for bad in ("", "@fp16", "c1@", "c1>c2@fp16"):
        with pytest.raises(PlanError, match="expected a plan"):
            parse_plan(bad)
    with pytest.raises(PlanError, match="expected a plan like"):
        parse_path("c1@>c2@fp16")


def test_extremes_pick_device_or_cloud() -> None:
    t = CostTable(
        ids=["cloud", "c1", "c2", "device"],
        head_ms=[0, 10, 20, 30],
        tail_ms=[3, 2, 1, 0],
        bytes=[600_000, 2_000_000, 100_000, 4000],
    )
    slow = Conditions(link=Link(bandwidth_mbps=0.01, rtt_ms=50))
    fast = Conditions(link=Link(bandwidth_mbps=100_000, rtt_ms=0.1))
    assert solve(t, slow).cut == "device"
    assert solve(t, fast).cut == "cloud"
    # a loaded cloud pushes work to the device
    loaded = Conditions(link=Link(bandwidth_mbps=100_000, rtt_ms=0.1), cloud_load=100)
    assert solve(t, loaded).cut == "device"
    # restricting candidates is honoured
    assert solve(t, fast, cuts=["c2", "device"], codecs=["fp32"]).key == "c2@fp32"
    with pytest.raises(PlanError, match="objective must be one of"):
        solve(t, fast, objective="cheapest")


def test_sweep_bands_are_consistent() -> None:
    t = CostTable(
        ids=["cloud", "c1", "c2", "device"],
        head_ms=[0, 10, 40, 100],
        tail_ms=[20, 12, 5, 0],
        bytes=[600_000, 200_000, 20_000, 4000],
        codecs={"fp32": 1.0},
    )
    cond = Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=10))
    bands = sweep(t, cond, min_mbps=0.1, max_mbps=10_000)
    assert [b.plan for b in bands] == ["device", "c2@fp32", "c1@fp32", "cloud@fp32"]
    for a, b in itertools.pairwise(bands):
        assert a.to_mbps == b.from_mbps
        assert a.plan != b.plan
    # the break between c2 and c1: 10 + 1600/bw + 22 == 40 + 160/bw + 15  (ms, bw in Mbit/s)
    assert bands[2].from_mbps == pytest.approx((1600 - 160) / (55 - 32), rel=1e-5)
    for b in bands:
        mid = (b.from_mbps * b.to_mbps) ** 0.5
        assert solve(t, Conditions(link=Link(bandwidth_mbps=mid, rtt_ms=10))).key == b.plan
