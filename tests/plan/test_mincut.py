"""DADS min-cut: agrees with exhaustive enumeration of down-closed heads on random small DAGs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import PlanError
from splitrt.plan.costmodel import Conditions, Link
from splitrt.plan.mincut import (
    Dag,
    DagTensor,
    best_by_enumeration,
    best_head,
    best_prefix,
    down_closed_sets,
    head_latency_ms,
    is_down_closed,
)


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    n = draw(st.integers(min_value=1, max_value=9))
    preds: list[list[int]] = [[]]
    for v in range(1, n):
        k = draw(st.integers(min_value=0, max_value=min(v, 3)))
        preds.append(sorted(draw(st.sets(st.integers(0, v - 1), min_size=k, max_size=k))))
    consumers: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for p in ps:
            consumers[p].append(v)
    tensors = []
    # graph inputs: every node without predecessors reads one (sometimes a shared second input)
    roots = tuple(v for v in range(n) if not preds[v])
    tensors.append(DagTensor(name="x", bytes=draw(st.integers(0, 10**6)), producer=-1, consumers=roots))
    if draw(st.booleans()):
        extra = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))))
        tensors.append(DagTensor(name="y", bytes=draw(st.integers(0, 10**6)), producer=-1, consumers=extra))
    for v in range(n):
        out = not consumers[v] or draw(st.integers(0, 9)) == 0
        tensors.append(
            DagTensor(
                name=f"t{v}",
                bytes=draw(st.integers(0, 10**6)),
                producer=v,
                consumers=tuple(consumers[v]),
                is_output=out,
            )
        )
    cost = st.floats(min_value=0.0, max_value=100.0)
    return Dag(
        device_ms=tuple(draw(cost) for _ in range(n)),
        cloud_ms=tuple(draw(cost) for _ in range(n)),
        tensors=tuple(tensors),
    )


conditions = st.builds(
    lambda bw, rtt, dl, cl: Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=rtt), device_load=dl, cloud_load=cl),
    st.floats(0.05, 1000.0),
    st.floats(0.0, 100.0),
    st.floats(1.0, 4.0),
    st.floats(1.0, 4.0),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(dags(), conditions)
def test_min_cut_agrees_with_enumeration(dag: Dag, cond: Conditions) -> None:
    cut = best_head(dag, cond)
    exhaustive = best_by_enumeration(dag, cond)
    assert is_down_closed(dag, cut.head)
    assert cut.latency_ms == pytest.approx(exhaustive.latency_ms, rel=1e-9, abs=1e-9)
    assert cut.latency_ms == pytest.approx(head_latency_ms(dag, cut.head, cond), rel=1e-12)
    # never worse than the best candidate cut (topological prefixes)
    assert cut.latency_ms <= best_prefix(dag, cond).latency_ms * (1 + 1e-9) + 1e-9


def diamond() -> Dag:
    # 0 -> {1, 2} -> 3; branch 1 is cheap on the device and its tensor is big
    return Dag(
        device_ms=(1.0, 1.0, 50.0, 50.0),
        cloud_ms=(1.0, 1.0, 1.0, 1.0),
        tensors=(
            DagTensor(name="x", bytes=1_000_000, producer=-1, consumers=(0,)),
            DagTensor(name="a", bytes=1_000_000, producer=0, consumers=(1, 2)),
            DagTensor(name="b", bytes=1_000, producer=1, consumers=(3,)),
            DagTensor(name="c", bytes=1_000_000, producer=2, consumers=(3,)),
            DagTensor(name="y", bytes=4, producer=3, consumers=(), is_output=True),
        ),
    )


def test_min_cut_beats_prefixes_on_a_branching_dag() -> None:
    dag = diamond()
    cond = Conditions(link=Link(bandwidth_mbps=8.0, rtt_ms=5.0))  # 1000 bytes per ms
    cut = best_head(dag, cond)
    # send 'a' once (1000 ms) ... or run {0, 1} and send 'a' for node 2 anyway; all-device 102 ms wins
    assert cut.head == frozenset(range(4))
    assert cut.latency_ms == pytest.approx(102.0)
    fast = Conditions(link=Link(bandwidth_mbps=8000.0, rtt_ms=5.0))
    assert best_head(dag, fast).latency_ms == pytest.approx(best_by_enumeration(dag, fast).latency_ms)
    assert len(list(down_closed_sets(dag))) == 6  # {}, 0, 01, 02, 012, 0123


def test_enumeration_refuses_large_dags() -> None:
    wide = Dag(
        device_ms=(1.0,) * 20,
        cloud_ms=(1.0,) * 20,
        tensors=(DagTensor(name="x", bytes=1, producer=-1, consumers=tuple(range(20))),),
    )
    with pytest.raises(PlanError, match="more than 1000"):
        list(down_closed_sets(wide, limit=1000))


def test_dag_validation() -> None:
    with pytest.raises(PlanError, match="topological"):
        Dag(
            device_ms=(1.0, 1.0),
            cloud_ms=(1.0, 1.0),
            tensors=(DagTensor(name="a", bytes=1, producer=1, consumers=(0,)),),
        )
