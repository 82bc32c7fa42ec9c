"""reshape: a cost table profiled at one input shape, scaled to another by FLOPs, with B's own bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import PlanError
from splitrt.plan.controller import Controller
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.reshape import replay_by_shape, scale_table, signature, signature_json

IDS = ("cloud", "c1", "c2", "c3", "device")


@dataclass(frozen=True, kw_only=True)
class Costs:
    ids: tuple[str, ...] = IDS
    head_flops: tuple[float, ...]
    tail_flops: tuple[float, ...]
    bytes: tuple[int, ...]
    float_bytes: tuple[int, ...]
    reply_bytes: int = 400


def costs(k: float = 1.0, *, bytes_k: float = 1.0) -> Costs:
    """A 4-node chain of 10/20/30/40 FLOPs (times k), crossing bytes times bytes_k."""
    node = np.array([10.0, 20.0, 30.0, 40.0]) * k
    head = tuple(float(node[:i].sum()) for i in (0, 1, 2, 3, 4))
    total = float(node.sum())
    b = tuple(int(x * bytes_k) for x in (1000, 800, 600, 400, 0))
    return Costs(
        head_flops=head, tail_flops=tuple(total - h for h in head), bytes=b, float_bytes=tuple(x // 2 for x in b)
    )


def table() -> CostTable:
    return CostTable(
        ids=IDS,
        head_ms=[0, 1, 3, 6, 10],
        tail_ms=[5, 4.5, 3.5, 2, 0],
        bytes=[1000, 800, 600, 400, 0],
        float_bytes=[1000, 800, 600, 400, 0],
        reply_bytes=400,
        codecs={"fp32": 1.0, "fp16": 0.5},
    )


def test_identity_when_b_equals_a() -> None:
    t = table()
    a = costs()
    a = replace(a, float_bytes=tuple(t.float_bytes.astype(int).tolist()))
    s = scale_table(t, a, a)
    for name in ("head_ms", "tail_ms", "bytes", "float_bytes", "sent_bytes"):
        np.testing.assert_array_equal(getattr(s, name), getattr(t, name))
    np.testing.assert_array_equal(s.reply_bytes, t.reply_bytes)
    assert s.codecs == t.codecs
    np.testing.assert_array_equal(s.codec_ratios, t.codec_ratios)


def test_times_scale_with_each_sides_flops_and_bytes_come_from_b() -> None:
    t = table()
    b = costs(4.0, bytes_k=4.0)
    s = scale_table(t, costs(), b)
    np.testing.assert_allclose(s.head_ms, t.head_ms * 4)
    np.testing.assert_allclose(s.tail_ms, t.tail_ms * 4)
    np.testing.assert_array_equal(s.bytes, b.bytes)
    np.testing.assert_array_equal(s.float_bytes, b.float_bytes)
    assert s.reply_bytes.tolist() == [b.reply_bytes] * (len(s) - 1) + [0]


def test_each_cut_scales_by_its_own_sides_ratio() -> None:
    """A shape change that grows only the last node: heads without it keep their time."""
    t = table()
    a = costs()
    head_b = (0.0, 10.0, 30.0, 60.0, 160.0)  # node 4: 40 -> 100 FLOPs
    b = replace(a, head_flops=head_b, tail_flops=tuple(160.0 - h for h in head_b))
    s = scale_table(t, a, b)
    np.testing.assert_allclose(s.head_ms[1:4], t.head_ms[1:4])
    np.testing.assert_allclose(s.head_ms[4], 10 * 160 / 100)
    np.testing.assert_allclose(s.tail_ms[:4], t.tail_ms[:4] * np.array([160 / 100, 150 / 90, 130 / 70, 100 / 40]))


def test_a_side_without_flops_at_a_scales_by_the_whole_model() -> None:
    """An elementwise-only head (0 FLOPs) still costs time: it grows like the model."""
    t = table()
    a = replace(costs(), head_flops=(0.0, 0.0, 30.0, 60.0, 100.0), tail_flops=(100.0, 100.0, 70.0, 40.0, 0.0))
    b = replace(costs(), head_flops=(0.0, 0.0, 60.0, 120.0, 200.0), tail_flops=(200.0, 200.0, 140.0, 80.0, 0.0))
    s = scale_table(t, a, b)
    np.testing.assert_allclose(s.head_ms, t.head_ms * 2)
    no_flops = replace(a, head_flops=(0.0,) * 5, tail_flops=(0.0,) * 5)  # no Conv/MatMul at all: input bytes
    s2 = scale_table(t, no_flops, replace(no_flops, bytes=(3000, 800, 600, 400, 0)))
    np.testing.assert_allclose(s2.head_ms, t.head_ms * 3)


def test_fixed_ms_is_held_out_of_the_scaling() -> None:
    t = table()
    s = scale_table(t, costs(), costs(4.0), fixed_ms=0.5)
    np.testing.assert_allclose(s.head_ms[1:], 0.5 + (t.head_ms[1:] - 0.5) * 4)
    with pytest.raises(PlanError, match="fixed_ms"):
        scale_table(t, costs(), costs(), fixed_ms=-1)


@settings(max_examples=60, deadline=None)
@given(k1=st.floats(0.1, 50), k2=st.floats(0.1, 50))
def test_scaling_is_monotone_in_flops(k1: float, k2: float) -> None:
    t = table()
    lo, hi = sorted((k1, k2))
    s_lo, s_hi = scale_table(t, costs(), costs(lo)), scale_table(t, costs(), costs(hi))
    assert np.all(s_lo.head_ms <= s_hi.head_ms + 1e-12) and np.all(s_lo.tail_ms <= s_hi.tail_ms + 1e-12)
    cond = Conditions(link=Link(bandwidth_mbps=10, rtt_ms=20))
    assert np.all(s_lo.latency_ms(cond) <= s_hi.latency_ms(cond) + 1e-9)


def test_mismatched_cut_ids_are_refused() -> None:
    t = table()
    other = replace(costs(), ids=("cloud", "c1", "c2", "c9", "device"))
    with pytest.raises(PlanError, match="cut ids"):
        scale_table(t, costs(), other)
    with pytest.raises(PlanError, match="cut ids"):
        scale_table(t, other, costs())
    short = Costs(ids=IDS[:3], head_flops=(0, 1, 2), tail_flops=(2, 1, 0), bytes=(1, 1, 1), float_bytes=(1, 1, 1))
    with pytest.raises(PlanError, match="cut ids"):
        scale_table(t, short, costs())
    with pytest.raises(PlanError, match="head_flops at B"):
        scale_table(t, costs(), replace(costs(), head_flops=(0.0, 1.0, -2.0, 3.0, 4.0)))


def test_signature_is_order_free_and_round_trips_through_json() -> None:
    a = signature({"mask": (1, 16), "ids": [1, 16]})
    assert a == signature({"ids": (1, 16), "mask": (1, 16)}) == (("ids", (1, 16)), ("mask", (1, 16)))
    assert signature(json.loads(json.dumps(signature_json(a)))) == a


def test_a_log_of_two_shapes_replays_per_shape() -> None:
    """Two controllers (one per shape) interleaved in one log: each group replays on its own table."""
    t_a = table()
    t_b = scale_table(t_a, costs(), costs(6.0, bytes_k=6.0))
    sig_a, sig_b = signature({"x": (1, 8)}), signature({"x": (1, 48)})
    ctl = {sig_a: Controller(t_a), sig_b: Controller(t_b)}
    lines = []
    for i, (bw, sig) in enumerate([(1.0, sig_a), (1.0, sig_b), (50.0, sig_a), (0.2, sig_b), (50.0, sig_b)]):
        d = ctl[sig].decide(
            float(i),
            LinkEstimate(bandwidth_mbps=bw, rtt_ms=20, confidence=1),
            LoadEstimate(device_factor=1, cloud_factor=1),
        )
        lines.append(replace(d, extra={"shape": signature_json(sig)}).to_json())
    pairs = replay_by_shape(lines, {sig_a: t_a, sig_b: t_b}.__getitem__)
    assert len(pairs) == 5 and all(a.plan == b.plan for a, b in pairs)
    assert {a.plan for a, _ in pairs} != {pairs[0][0].plan}  # the plans did change along the log


def test_node_fixed_cost_is_fitted_and_held_out_of_the_scaling() -> None:
    """A side whose time is 1 ms per node plus 1 ms per MFLOP: at 10x the FLOPs, a cut of 10 nodes and
    1 MFLOP goes from 11 to 20 ms (not 110), which the fit recovers from the profile's cuts alone."""
    from splitrt.plan.reshape import fit_node_ms

    nodes = np.array([2.0, 5.0, 10.0, 20.0, 40.0])
    flops = np.array([3e6, 1e6, 8e6, 2e6, 30e6])
    ms = nodes * 1.0 + flops / 1e6
    node_ms, per_flop = fit_node_ms(ms, nodes, flops)
    assert node_ms == pytest.approx(1.0) and per_flop == pytest.approx(1e-6)
