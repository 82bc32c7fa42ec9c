"""One solver for any number of tiers: the path DP equals the two-tier ``solve``, the three-tier
chain formula (one codec on both hops, written out plainly) and brute force over every plan of 3- and 4-tier paths, on
random tables; its terms add up and its plans print and parse back."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import PlanError
from splitrt.plan.costmodel import Conditions, CostTable, Link, Power
from splitrt.plan.path import PathConditions, _advance, evaluate_path, format_path, parse_path, solve_path
from splitrt.plan.solver import OBJECTIVES, solve

POWER = Power(idle_w=2.0, active_w=6.0, radio_w=1.5)


def _ids(n: int) -> list[str]:
    return ["cloud", *[f"c{i}" for i in range(1, n - 1)], "device"]


@st.composite
def table_sets(draw: st.DrawFn, tiers: int, max_cuts: int = 10) -> list[CostTable]:
    """``tiers`` tables over the same cuts; head times are prefix sums except, sometimes, a middle tier's."""
    n = draw(st.integers(3, max_cuts))
    ids = _ids(n)
    ms = st.floats(0.0, 50.0, allow_nan=False)
    raw = draw(st.lists(st.integers(0, 2_000_000), min_size=n, max_size=n))
    raw[-1] = 0
    floats = [draw(st.integers(0, b)) for b in raw]
    reply = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n))  # per cut: outputs the tail makes
    out = []
    for t in range(tiers):
        steps = np.array(draw(st.lists(ms, min_size=n, max_size=n)))
        head = np.cumsum(steps) - steps[0]
        if 0 < t < tiers - 1 and draw(st.booleans()):
            head = np.array(draw(st.lists(ms, min_size=n, max_size=n)))  # not a prefix sum
        tail = np.clip(head.max() - head, 0.0, None)
        out.append(CostTable(ids=ids, head_ms=head, tail_ms=tail, bytes=raw, float_bytes=floats, reply_bytes=reply))
    return out


links = st.builds(Link, bandwidth_mbps=st.floats(0.05, 1000.0), rtt_ms=st.floats(0.0, 200.0))
loads = st.floats(0.25, 8.0)


def _value(plan: object, objective: str) -> float:
    return {"latency": plan.predicted_ms, "energy": plan.energy_mj}.get(objective, plan.period_ms)  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    tables=table_sets(2),
    link=links,
    dl=loads,
    cl=loads,
    queue=st.floats(0.0, 50.0),
    objective=st.sampled_from(OBJECTIVES),
    codec_subset=st.sets(st.sampled_from(["fp32", "fp16", "int8"]), min_size=1),
)
def test_two_tiers_equal_solve(
    tables: list[CostTable], link: Link, dl: float, cl: float, queue: float, objective: str, codec_subset: set[str]
) -> None:
    table = tables[0]
    codecs = sorted(codec_subset)
    old = solve(
        table,
        Conditions(link=link, device_load=dl, cloud_load=cl, queue_ms=queue),
        objective=objective,
        power=POWER,
        codecs=codecs,
    )
    new = solve_path(
        [table, table],
        PathConditions(hops=(link,), loads=(dl, cl), queue_ms=(queue,)),
        objective=objective,
        power=POWER,
        codecs=codecs,
    )
    assert new.value == pytest.approx(_value(old, objective), rel=1e-9, abs=1e-9)
    if objective == "latency":
        assert new.predicted_ms == pytest.approx(old.predicted_ms, rel=1e-9, abs=1e-9)


def _reference_chain(
    tables: list[CostTable],
    hop1: Link,
    hop2: Link,
    tier_loads: tuple[float, float, float],
    objective: str,
    codec: str,
    edge_cuts: list[str] | None,
) -> float:
    """The three-tier cost written out plainly, one pair of cuts at a time (the formula of the old
    ``solve_chain``, which commit 1baf52d checked equal to the path solver before it was replaced)."""
    device, edge, cloud = tables
    k = device.codec_index(codec)
    dl, el, cl = tier_loads
    best = float("inf")
    for i in range(len(device)):
        for j in range(i, len(device)):
            if edge_cuts is not None and device.ids[j] not in edge_cuts:
                continue
            sends_i, sends_j = device.ids[i] != "device", device.ids[j] != "device"
            up1 = device.sent_bytes[i, k] * 8e-3 / hop1.bandwidth_mbps
            x1 = up1 + (device.reply_bytes[i] * 8e-3 / hop1.bandwidth_mbps if sends_i else 0.0)
            x2 = (device.sent_bytes[j, k] + device.reply_bytes[j]) * 8e-3 / hop2.bandwidth_mbps if sends_j else 0.0
            dev = device.head_ms[i] * dl
            seg = max(edge.head_ms[j] * el - edge.head_ms[i] * el, 0.0)
            tail = cloud.tail_ms[j] * cl
            latency = dev + x1 + hop1.rtt_ms * sends_i + seg + x2 + hop2.rtt_ms * sends_j + tail
            value = {
                "latency": latency,
                "energy": POWER.active_w * dev + POWER.send_w * up1 + POWER.idle_w * (latency - dev - up1),
                "throughput": max(dev, x1, seg, x2, tail),
            }[objective]
            best = min(best, value)
    return best


@settings(max_examples=40, deadline=None)
@given(
    tables=table_sets(3),
    hop1=links,
    hop2=links,
    tier_loads=st.tuples(loads, loads, loads),
    objective=st.sampled_from(OBJECTIVES),
    codec=st.sampled_from(["fp32", "fp16", "int8"]),
    edge_finishes=st.booleans(),
)
def test_three_tiers_equal_the_chain_formula(
    tables: list[CostTable],
    hop1: Link,
    hop2: Link,
    tier_loads: tuple[float, float, float],
    objective: str,
    codec: str,
    edge_finishes: bool,
) -> None:
    edge_cuts = ["device"] if edge_finishes else None
    want = _reference_chain(tables, hop1, hop2, tier_loads, objective, codec, edge_cuts)
    new = solve_path(
        tables,
        PathConditions(hops=(hop1, hop2), loads=tier_loads),
        objective=objective,
        power=POWER,
        codecs=[codec],
        cuts=[None, edge_cuts],
    )
    assert new.value == pytest.approx(want, rel=1e-9, abs=1e-9)
    # One codec on every hop (what the controller plans three tiers with) is the same plan here, and
    # evaluate_path re-costs it from its string form to the same figures.
    cond = PathConditions(hops=(hop1, hop2), loads=tier_loads)
    same = solve_path(
        tables, cond, objective=objective, power=POWER, codecs=[codec], cuts=[None, edge_cuts], same_codec=True
    )
    assert same.value == pytest.approx(want, rel=1e-9, abs=1e-9)
    again = evaluate_path(tables, str(same), cond, objective=objective, power=POWER)
    assert again.value == pytest.approx(same.value, rel=1e-12, abs=1e-12) and again.cuts == same.cuts
    if edge_finishes:
        assert new.cuts[1] == "device" and same.cuts[1] == "device"


@settings(max_examples=60, deadline=None)
@given(prev=st.lists(st.floats(0.0, 1e4), min_size=1, max_size=40), data=st.data())
def test_running_minimum_equals_the_pairwise_matrix(prev: list[float], data: st.DataObject) -> None:
    """The O(cuts) step (a middle tier whose head times are prefix sums) finds what the O(cuts^2) one does."""
    steps = data.draw(st.lists(st.floats(0.0, 100.0), min_size=len(prev), max_size=len(prev)))
    seg_of, p = np.cumsum(steps), np.array(prev)
    fast, arg = _advance(p, seg_of, additive=True)
    pair = np.where(
        np.triu(np.ones((len(p), len(p)), dtype=bool)), p[:, None] + (seg_of[None, :] - seg_of[:, None]), np.inf
    )
    assert np.allclose(fast, pair.min(axis=0))
    assert np.allclose(p[arg] + seg_of - seg_of[arg], fast) and np.all(arg <= np.arange(len(p)))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), tiers=st.integers(3, 4), objective=st.sampled_from(OBJECTIVES))
def test_equals_brute_force_with_a_codec_per_hop(data: st.DataObject, tiers: int, objective: str) -> None:
    tables = data.draw(table_sets(tiers, max_cuts=6))
    cond = PathConditions(
        hops=tuple(data.draw(links) for _ in range(tiers - 1)),
        loads=tuple(data.draw(loads) for _ in range(tiers)),
        queue_ms=tuple(data.draw(st.floats(0.0, 20.0)) for _ in range(tiers - 1)),
    )
    ids, codecs = tables[0].ids, tables[0].codecs
    best = min(
        evaluate_path(tables, (cuts, ks), cond, objective=objective, power=POWER).value
        for cuts in itertools.combinations_with_replacement(ids, tiers - 1)
        for ks in itertools.product(codecs, repeat=tiers - 1)
    )
    got = solve_path(tables, cond, objective=objective, power=POWER)
    assert got.value == pytest.approx(best, rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(tables=table_sets(3), hop1=links, hop2=links)
def test_terms_add_up_and_the_plan_parses_back(tables: list[CostTable], hop1: Link, hop2: Link) -> None:
    cond = PathConditions(hops=(hop1, hop2), loads=(2.0, 1.0, 0.5), queue_ms=(1.0, 3.0))
    plan = solve_path(tables, cond)
    terms = sum(plan.tier_ms) + sum(plan.hop_upload_ms) + sum(plan.hop_download_ms)
    terms += sum(plan.hop_rtt_ms) + sum(plan.hop_queue_ms)
    assert terms == pytest.approx(plan.predicted_ms)
    assert plan.transfer_ms + plan.download_ms == pytest.approx(sum(plan.hop_upload_ms) + sum(plan.hop_download_ms))
    assert evaluate_path(tables, str(plan), cond).predicted_ms == pytest.approx(plan.predicted_ms)
    # The string form stops at the first `device` hop (nothing goes further) and pads back.
    assert parse_path(str(plan), tables[0].codecs[0], hops=2) == (plan.cuts, plan.codecs)


def test_string_form() -> None:
    assert format_path(["c3", "c12"], ["fp16", "int8"]) == "c3@fp16>c12@int8"
    assert format_path(["c5", "device"], ["fp32", "fp32"]) == "c5@fp32>device"
    assert parse_path("c12@fp16") == (("c12",), ("fp16",))
    assert parse_path("device") == (("device",), ("fp32",))
    assert format_path(["device", "device"], ["fp32", "fp32"]) == "device"
    assert parse_path("c5@fp16>device", hops=3) == (("c5", "device", "device"), ("fp16", "fp32", "fp32"))
    with pytest.raises(PlanError, match="expected a plan like"):
        parse_path("c3@>c4@fp16")


def test_bad_paths_are_refused_with_what_was_expected() -> None:
    t = CostTable(ids=_ids(4), head_ms=[0, 1, 2, 3], tail_ms=[3, 2, 1, 0], bytes=[10, 5, 5, 0])
    cond = PathConditions(hops=(Link(bandwidth_mbps=10, rtt_ms=1),) * 2, loads=(1, 1, 1))
    with pytest.raises(PlanError, match="non-decreasing"):
        evaluate_path([t, t, t], "c2@fp32>c1@fp32", cond)
    with pytest.raises(PlanError, match="expected 2 hops"):
        evaluate_path([t, t, t], "c2@fp32", cond)
    with pytest.raises(PlanError, match="expected 3 loads"):
        PathConditions(hops=(Link(bandwidth_mbps=10, rtt_ms=1),) * 2, loads=(1, 1))
    with pytest.raises(PlanError, match="at least 2 tiers"):
        solve_path([t], PathConditions(hops=(), loads=(1,)))
