"""plan.constraints: a privacy floor and a memory ceiling as allowed cuts, honoured and priced."""

from __future__ import annotations

import pytest

from splitrt.errors import ConfigError, PlanError
from splitrt.plan.constraints import Constraints, CutFacts, allowed_cuts, price
from splitrt.plan.controller import Controller, ControllerConfig, Policy
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.netmon import LinkEstimate, LoadEstimate

IDS = ("cloud", "c1", "c2", "c3", "device")
FACTS = CutFacts(
    ids=IDS,
    head_flops_fraction=(0.0, 0.05, 0.3, 0.7, 1.0),
    sends_input=(True, True, False, False, False),
    head_memory_bytes=(0, 2 << 20, 40 << 20, 300 << 20, 600 << 20),
)
TABLE = CostTable(
    ids=list(IDS),
    head_ms=[0, 10, 60, 200, 300],
    tail_ms=[20, 19, 14, 6, 0],
    bytes=[600_000, 700_000, 100_000, 20_000, 0],
    reply_bytes=4000,
)
IDLE = LoadEstimate(device_factor=1.0, cloud_factor=1.0)


def test_each_constraint_excludes_what_it_says() -> None:
    assert allowed_cuts(FACTS, Constraints(min_head_flops_fraction=0.3)).cuts == ("c2", "c3", "device")
    raw = allowed_cuts(FACTS, Constraints(no_raw_input=True))
    assert raw.cuts == ("c2", "c3", "device") and raw.excluded == {"cloud": "raw input", "c1": "raw input"}
    mem = allowed_cuts(FACTS, Constraints(device_memory_mb=100))
    assert mem.cuts == ("cloud", "c1", "c2") and mem.excluded["device"] == "memory"
    both = allowed_cuts(FACTS, Constraints(min_head_flops_fraction=0.2, device_memory_mb=100))
    assert both.cuts == ("c2",)
    assert "1 of 5 cuts allowed" in both.note() and "routing cannot comply" in both.note()
    with pytest.raises(PlanError, match="expected at least one cut meeting them"):
        allowed_cuts(FACTS, Constraints(min_head_flops_fraction=0.5, device_memory_mb=10))
    with pytest.raises(ConfigError, match=r"min_head_flops: expected a share .* in \[0, 1\], got 1.5"):
        Constraints(min_head_flops_fraction=1.5)
    assert not Constraints().active and Constraints(no_raw_input=True).active


def test_the_solver_honours_the_cuts_and_the_price_is_the_difference() -> None:
    cond = Conditions(link=Link(bandwidth_mbps=100.0, rtt_ms=10.0))
    allowed = allowed_cuts(FACTS, Constraints(no_raw_input=True))
    p = price(TABLE, cond, allowed)
    assert p.free.cut == "cloud"  # 48 ms + 10 + 20: unconstrained, the input goes
    assert p.constrained.cut in allowed.cuts and p.constrained.cut == "c2"
    assert p.cost == pytest.approx(p.constrained.predicted_ms - p.free.predicted_ms) and p.cost > 0


def test_controller_decisions_stay_inside_and_record_the_price() -> None:
    allowed = allowed_cuts(FACTS, Constraints(device_memory_mb=100))
    ctl = Controller(TABLE, ControllerConfig(cuts=allowed.cuts, hysteresis_fraction=0.0))
    for i, bw in enumerate((0.1, 1.0, 100.0)):
        d = ctl.decide(float(i), LinkEstimate(bandwidth_mbps=bw, rtt_ms=10.0, confidence=1.0), IDLE)
        assert d.plan.split("@")[0] in allowed.cuts
        assert d.extra["unconstrained"] and float(d.extra["constraint_cost"]) >= 0  # type: ignore[arg-type]
    # at 0.1 Mbit/s the unconstrained best is the device (300 ms), out of memory here
    first = Controller(TABLE, ControllerConfig(cuts=allowed.cuts)).decide(
        0.0, LinkEstimate(bandwidth_mbps=0.1, rtt_ms=10.0, confidence=1.0), IDLE
    )
    assert first.extra["unconstrained"] == "device" and float(first.extra["constraint_cost"]) > 0  # type: ignore[arg-type]
    # route under a privacy floor has only the device left
    route = Policy(
        "route", Controller(TABLE, ControllerConfig(cuts=allowed_cuts(FACTS, Constraints(no_raw_input=True)).cuts))
    )
    assert route.decide(0.0, LinkEstimate(bandwidth_mbps=100.0, rtt_ms=10.0, confidence=1.0), IDLE).plan == "device"
