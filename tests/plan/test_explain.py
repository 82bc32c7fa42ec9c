"""plan.explain: where inner cuts beat whole-request routing, checked against the solver point by point."""

from __future__ import annotations

import math

import numpy as np
import pytest

from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import explain
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.profile import boards, priors, profiler
from splitrt.rig import models

RPI4 = boards.load_board("rpi4")
# Models small enough to load in a test; the others are checked through their shipped profiles.
SMALL = ("tiny_chain", "multi_io", "branchy", "bert_tiny", "vit_tiny", "yolo_tiny")


def table_for(name: str) -> CostTable:
    prof = models.shipped_profile(name)
    if prof is not None:
        p = profiler.load_profile(prof)
        return profiler.cost_table(p, p, device_speed_factor=RPI4.cpu_speed_factor)
    assert name in SMALL, f"{name}: no shipped profile (profiles/) and too big to load here"
    mg = graph.load(zoo.get(name), zoo.default_binding(zoo.get(name)))
    return priors.flops_table(mg, device_gflops=80.0 / RPI4.cpu_speed_factor, cloud_gflops=80.0)


@pytest.mark.parametrize("name", zoo.names())
def test_the_verdict_agrees_with_the_solver_on_a_grid(name: str) -> None:
    table = table_for(name)
    loads = (1.0, 4.0)
    v = explain.explain(
        table, rtt_ms=40.0, min_mbps=0.1, max_mbps=100.0, device_loads=loads, codecs=None, power=RPI4.power, points=80
    )
    rng = np.random.default_rng(7)
    for objective in ("latency", "energy", "throughput"):
        for dl in loads:
            bands = [b for b in v.bands if b.objective == objective and b.device_load == dl]
            edges = [e for b in bands for e in (b.from_mbps, b.to_mbps)]
            for bw in np.exp(rng.uniform(math.log(0.1), math.log(100.0), 25)):
                if any(abs(bw / e - 1) < 1e-4 for e in edges):
                    continue
                cond = Conditions(link=Link(bandwidth_mbps=float(bw), rtt_ms=40.0), device_load=dl)
                gain, split, route = explain.gain_at(table, cond, objective=objective, power=RPI4.power)
                inside = [b for b in bands if b.from_mbps <= bw <= b.to_mbps]
                assert (gain > 1 + explain.TOLERANCE) == bool(inside), (name, objective, dl, bw, gain, split.key)
                if inside:
                    assert split.cut not in ("cloud", "device") and route.cut in ("cloud", "device")
                    assert gain <= inside[0].max_gain * (1 + 1e-9) or gain == pytest.approx(
                        inside[0].max_gain, rel=0.02
                    )
    assert v.splits == bool(v.bands)
    assert v.summary.startswith(("split", "route"))
    if not v.bands:
        assert v.summary.startswith("route, do not split")


def _table(inner_bytes: int) -> CostTable:
    return CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0.0, 100.0, 500.0],
        tail_ms=[50.0, 25.0, 0.0],
        bytes=[150_000, inner_bytes, 0],
        reply_bytes=4000,
        codecs={"fp32": 1.0, "int8": 0.25},
    )


def test_no_smaller_inner_tensor_says_route_plainly() -> None:
    v = explain.explain(_table(300_000), rtt_ms=40.0)
    assert not v.splits and v.smaller_cuts == ()
    assert v.summary.startswith(
        "route, do not split: no inner tensor is smaller than the input under any allowed codec"
    )


def test_a_small_inner_tensor_wins_a_band_and_says_by_how_much() -> None:
    v = explain.explain(_table(5_000), rtt_ms=40.0, objectives=["latency"], device_loads=[1.0])
    assert v.splits and v.pays and v.smaller_cuts == ("c1",)
    (band,) = v.bands
    # c1 (100 ms + 9 kB) against the cloud (154 kB) and the device (500 ms): it wins on slow links
    assert 0.1 < band.from_mbps < 0.2 and 2 < band.to_mbps < 100
    assert band.best_plan.startswith("c1@") and band.max_gain > 1.1
    assert v.summary.startswith("split: inner cuts beat routing for latency up to ")
    # only fp32 allowed: the input (150 kB) vs c1 (5 kB) still wins
    assert explain.explain(_table(5_000), rtt_ms=40.0, codecs=["fp32"]).splits


def test_constraints_without_device_or_cloud_mean_routing_cannot_comply() -> None:
    v = explain.explain(_table(5_000), rtt_ms=40.0, cuts=["c1"], objectives=["latency"], device_loads=[1.0])
    assert v.summary.startswith("split: routing cannot meet the constraints")
    with pytest.raises(Exception, match="min_mbps"):
        explain.explain(_table(5_000), rtt_ms=40.0, min_mbps=10, max_mbps=1)
