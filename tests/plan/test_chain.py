"""The three-tier controller (pure): both cuts re-chosen as a hop's bandwidth changes, hysteresis, routes
by what is reachable, and a decision log that replays. No clocks, no sleeps: ``now_s`` is given."""

from __future__ import annotations

import pytest

from splitrt.errors import ConfigError
from splitrt.plan.chain import ChainController, ChainControllerConfig, ChainDecision, replay
from splitrt.plan.costmodel import CostTable
from splitrt.plan.netmon import LinkEstimate

IDS = ["cloud", "c1", "c2", "c3", "device"]
# The input is big, c1 small, c3 smaller still. The device is slow, the edge fast up to c2 and slow
# after c3, the cloud fast: which pair wins depends on both hops.
BYTES = [400_000, 20_000, 60_000, 2_000, 0]
DEVICE = CostTable(ids=IDS, head_ms=[0, 5, 60, 160, 200], tail_ms=[200, 195, 140, 40, 0], bytes=BYTES, reply_bytes=40)
EDGE = CostTable(ids=IDS, head_ms=[0, 1, 3, 60, 160], tail_ms=[160, 159, 157, 100, 0], bytes=BYTES, reply_bytes=40)
CLOUD = CostTable(
    ids=IDS, head_ms=[0, 0.2, 0.6, 1.0, 1.2], tail_ms=[1.2, 1.0, 0.6, 0.2, 0], bytes=BYTES, reply_bytes=40
)


def link(mbps: float, rtt_ms: float = 2.0) -> LinkEstimate:
    return LinkEstimate(bandwidth_mbps=mbps, rtt_ms=rtt_ms, confidence=1.0)


def controller(**kw: object) -> ChainController:
    return ChainController(DEVICE, EDGE, CLOUD, ChainControllerConfig(**kw))  # type: ignore[arg-type]


def test_the_pair_follows_each_hops_bandwidth() -> None:
    ctl = controller()
    fast = ctl.decide(0.0, link(1000), link(1000))
    # Both hops fast: ship the input; the edge's cheap first layer shrinks it for the cloud.
    assert fast.plan == "cloud>c1@fp32" and fast.route == "edge"
    # The device -> edge hop slows: the device runs c1 itself and sends its small tensors (both cuts move).
    slow1 = ctl.decide(1.0, link(2), link(1000))
    assert slow1.plan == "c1>c1@fp32" and slow1.switched and slow1.previous == fast.plan
    # Then the edge -> cloud hop slows: the edge runs on to c3, whose tensors are smaller still.
    slow2 = ctl.decide(2.0, link(2), link(0.5))
    assert slow2.plan == "c1>c3@fp32" and slow2.switched
    # The cloud hop all but gone (and the edge slow past c3): everything on the device.
    gone = ctl.decide(3.0, link(2), link(0.01, 500))
    assert gone.plan == "device" and gone.route == "local"
    # Back to fast: back to the first pair.
    assert ctl.decide(4.0, link(1000), link(1000)).plan == fast.plan
    assert ctl.switches == 4


def test_hysteresis_holds_a_plan_through_small_changes() -> None:
    ctl = controller(hysteresis_fraction=0.2, hysteresis_ms=5.0)
    first = ctl.decide(0.0, link(2), link(1000))
    held = ctl.decide(1.0, link(2.1), link(900))
    assert held.plan == first.plan and not held.switched
    assert held.objective_value >= ctl.decide(2.0, link(2.1), link(900)).objective_value


def test_routes_follow_what_is_reachable() -> None:
    ctl = controller()
    up = ctl.decide(0.0, link(2), link(0.5))
    assert up.route == "edge"
    # The edge's next tier down: the edge finishes whatever the hops say.
    no_next = ctl.decide(1.0, link(1000), link(1000), next_available=False)
    assert no_next.plan == "cloud>device@fp32" and no_next.cuts[1] == "device" and no_next.route == "edge"
    # The edge down, the cloud reachable: two tiers straight to the cloud (hops in series).
    direct = ctl.decide(2.0, link(1000), link(1000), edge_available=False)
    assert direct.route == "cloud" and ">" not in direct.plan and direct.plan == "cloud@fp32"
    assert direct.cuts == ("cloud", "cloud", "fp32")
    # Nothing reachable: everything here.
    alone = ctl.decide(3.0, link(1000), link(1000), edge_available=False, cloud_available=False)
    assert alone.plan == "device" and alone.route == "local" and alone.cuts[0] == "device"
    back = ctl.decide(4.0, link(1000), link(1000))
    assert back.plan == "cloud>c1@fp32"


def test_log_replays() -> None:
    ctl = controller()
    schedule = [
        (link(1000), link(1000), {}),
        (link(2), link(1000), {}),
        (link(2), link(0.5), {}),
        (link(2), link(0.5), {"next_available": False}),
        (link(5), link(5), {"edge_available": False}),
        (link(5), link(5), {"edge_available": False, "cloud_available": False}),
        (link(1.5), link(50), {"edge_load": 3.0}),
    ]
    lines = []
    for t, (h1, h2, kw) in enumerate(schedule):
        d = ctl.decide(float(t), h1, h2, request=f"r{t}", **kw)  # type: ignore[arg-type]
        lines.append(d.to_json())
    assert ChainDecision.from_json(lines[0]) == ChainDecision.from_json(lines[0])
    pairs = replay(reversed(lines), DEVICE, EDGE, CLOUD)  # completion order may differ: seq orders them
    assert [r.plan for _, r in pairs] == [d.plan for d, _ in pairs]
    assert len({d.plan for d, _ in pairs}) >= 5


def test_energy_objective_and_bad_config() -> None:
    ctl = controller(objective="energy")
    d = ctl.decide(0.0, link(2), link(1000))
    assert d.objective_value > 0 and d.predicted_ms > 0
    with pytest.raises(ConfigError, match="objective: expected one of"):
        ChainControllerConfig(objective="speed")
    with pytest.raises(ConfigError, match="hysteresis_fraction"):
        ChainControllerConfig(hysteresis_fraction=1.5)
