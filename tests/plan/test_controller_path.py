"""The one controller over a path of three tiers (device -> edge -> cloud): both cuts re-chosen as a
hop's bandwidth changes, hysteresis, routes by what is reachable with the same fallback rules as two
tiers, fixed plans, and a decision log that replays (JSON and the string form). No clocks: ``now_s``."""

from __future__ import annotations

import pytest

from splitrt.errors import ConfigError
from splitrt.plan.controller import Controller, ControllerConfig, Decision, Policy
from splitrt.plan.costmodel import CostTable
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.replay import replay

IDS = ["cloud", "c1", "c2", "c3", "device"]
# The input is big, c1 small, c3 smaller still. The device is slow, the edge fast up to c2 and slow
# after c3, the cloud fast: which pair wins depends on both hops.
BYTES = [400_000, 20_000, 60_000, 2_000, 0]
DEVICE = CostTable(ids=IDS, head_ms=[0, 5, 60, 160, 200], tail_ms=[200, 195, 140, 40, 0], bytes=BYTES, reply_bytes=40)
EDGE = CostTable(ids=IDS, head_ms=[0, 1, 3, 60, 160], tail_ms=[160, 159, 157, 100, 0], bytes=BYTES, reply_bytes=40)
CLOUD = CostTable(
    ids=IDS, head_ms=[0, 0.2, 0.6, 1.0, 1.2], tail_ms=[1.2, 1.0, 0.6, 0.2, 0], bytes=BYTES, reply_bytes=40
)
IDLE = LoadEstimate(device_factor=1.0, cloud_factor=1.0)


def link(mbps: float, rtt_ms: float = 2.0) -> LinkEstimate:
    return LinkEstimate(bandwidth_mbps=mbps, rtt_ms=rtt_ms, confidence=1.0)


def controller(**kw: object) -> Controller:
    return Controller((DEVICE, EDGE, CLOUD), ControllerConfig(**kw))  # type: ignore[arg-type]


def test_the_pair_follows_each_hops_bandwidth() -> None:
    ctl = controller()
    fast = ctl.decide(0.0, (link(1000), link(1000)), IDLE)
    # Both hops fast: ship the input; the edge's cheap first layer shrinks it for the cloud.
    assert fast.plan == "cloud@fp32>c1@fp32" and fast.route == () and fast.cuts == ("cloud", "c1")
    # The device -> edge hop slows: the device runs c1 itself and sends its small tensors (both cuts move).
    slow1 = ctl.decide(1.0, (link(2), link(1000)), IDLE)
    assert slow1.plan == "c1@fp32>c1@fp32" and slow1.switched and slow1.previous == fast.plan
    # Then the edge -> cloud hop slows: the edge runs on to c3, whose tensors are smaller still.
    slow2 = ctl.decide(2.0, (link(2), link(0.5)), IDLE)
    assert slow2.plan == "c1@fp32>c3@fp32" and slow2.switched
    # The cloud hop all but gone (and the edge slow past c3): everything on the device.
    gone = ctl.decide(3.0, (link(2), link(0.01, 500)), IDLE)
    assert gone.plan == "device"
    assert ctl.decide(4.0, (link(1000), link(1000)), IDLE).plan == fast.plan
    assert ctl.switches == 4
    # The decision's terms are per tier and per hop, and add up.
    terms = sum(slow2.tier_ms) + slow2.transfer_ms + slow2.download_ms + slow2.round_trip_ms + slow2.queue_ms
    assert len(slow2.tier_ms) == 3 and len(slow2.hop_upload_ms) == 2
    assert terms == pytest.approx(slow2.predicted_ms)


def test_hysteresis_holds_a_plan_through_small_changes() -> None:
    ctl = controller(hysteresis_fraction=0.2, hysteresis_ms=5.0)
    first = ctl.decide(0.0, (link(2), link(1000)), IDLE)
    held = ctl.decide(1.0, (link(2.1), link(900)), IDLE)
    assert held.plan == first.plan and not held.switched and held.reason.startswith(("hold", "best"))


def test_routes_follow_what_is_reachable() -> None:
    ctl = controller()
    assert ctl.decide(0.0, (link(2), link(0.5)), IDLE).route == ()
    # The cloud (the edge's next tier) down: the edge finishes, whatever the hops say.
    no_next = ctl.decide(1.0, (link(1000), link(1000)), IDLE, cloud_available=(True, False))
    assert no_next.route == () and no_next.plan == "cloud@fp32>device" and no_next.cuts == ("cloud", "device")
    # The edge down, the cloud reachable: two tiers straight to the cloud (the hops in series).
    direct = ctl.decide(2.0, (link(1000), link(1000)), IDLE, cloud_available=(False, True))
    assert direct.route == (0, 2) and direct.plan == "cloud@fp32"
    # Nothing reachable: everything here.
    alone = ctl.decide(3.0, (link(1000), link(1000)), IDLE, cloud_available=False)
    assert alone.plan == "device" and "cloud unavailable" in alone.reason
    back = ctl.decide(4.0, (link(1000), link(1000)), IDLE)
    assert back.plan == "cloud@fp32>c1@fp32" and back.reason == "cloud back: splitting again"


def test_after_an_outage_three_tiers_return_at_once_as_two_do() -> None:
    """A hysteresis no gain can beat still does not hold `device` once a tier is back (two tiers never
    did; three used to)."""
    for tables in ((DEVICE, CLOUD), (DEVICE, EDGE, CLOUD)):
        ctl = Controller(tables, ControllerConfig(hysteresis_fraction=0.99, hysteresis_ms=1e9))
        hops = (link(1000),) * (len(tables) - 1)
        up = ctl.decide(0.0, hops, IDLE)
        assert up.plan != "device"
        assert ctl.decide(1.0, hops, IDLE, cloud_available=False).plan == "device"
        back = ctl.decide(2.0, hops, IDLE)
        assert back.plan == up.plan and back.switched, tables
        # ... while on an unchanged route the same hysteresis holds anything
        assert ctl.decide(3.0, (link(0.01, 500),) * len(hops), IDLE).plan == up.plan


def test_a_fixed_plan_holds_while_its_tiers_are_up() -> None:
    pol = Policy("fixed:c1@fp32>c3@fp32", controller())
    for t, (b1, b2) in enumerate([(1000, 1000), (2, 1000), (2, 0.5), (1000, 1000)]):
        d = pol.decide(float(t), (link(b1), link(b2)), IDLE)
        assert d.plan == "c1@fp32>c3@fp32" and d.best == d.plan and d.reason.startswith("policy")
    # the edge down: the controller's fallback (to the cloud directly), as for every policy
    down = pol.decide(9.0, (link(2), link(2)), IDLE, cloud_available=(False, True))
    assert down.route == (0, 2) and ">" not in down.plan
    back = pol.decide(10.0, (link(2), link(2)), IDLE)
    assert back.plan == "c1@fp32>c3@fp32" and back.switched
    # an edge-only plan needs only the edge
    edge_only = Policy("fixed:cloud@fp32>device", controller())
    assert edge_only.decide(0.0, (link(2), link(2)), IDLE, cloud_available=(True, False)).plan == "cloud@fp32>device"
    with pytest.raises(ConfigError, match="expected 2 hops"):
        Policy("fixed:c1@fp32", controller())


def test_log_replays() -> None:
    ctl = controller()
    schedule: list[tuple[float, float, object, tuple[bool, bool]]] = [
        (1000, 1000, IDLE, (True, True)),
        (2, 1000, IDLE, (True, True)),
        (2, 0.5, IDLE, (True, True)),
        (2, 0.5, IDLE, (True, False)),
        (5, 5, IDLE, (False, True)),
        (5, 5, IDLE, (False, False)),
        (1.5, 50, [LoadEstimate(device_factor=1.0, cloud_factor=3.0), IDLE], (True, True)),
    ]
    logged = [
        ctl.decide(float(t), (link(b1), link(b2)), load, cloud_available=up, request=f"r{t}")  # type: ignore[arg-type]
        for t, (b1, b2, load, up) in enumerate(schedule)
    ]
    lines = [d.to_json() for d in logged]
    assert [Decision.from_json(line) for line in lines] == logged
    assert [Decision.parse(str(d)) for d in logged] == logged
    pairs = replay(reversed(lines), (DEVICE, EDGE, CLOUD))  # completion order may differ: seq orders them
    assert [(r.plan, r.switched, r.route) for _, r in pairs] == [(d.plan, d.switched, d.route) for d in logged]
    assert len({d.plan for d in logged}) >= 5
    assert logged[-1].loads == (1.0, 3.0, 1.0)


def test_energy_objective_and_bad_inputs() -> None:
    d = controller(objective="energy").decide(0.0, (link(2), link(1000)), IDLE)
    assert d.objective_value > 0 and d.predicted_ms > 0 and d.objective_value != d.predicted_ms
    with pytest.raises(ConfigError, match="objective: expected one of"):
        ControllerConfig(objective="speed")
    with pytest.raises(ConfigError, match="hysteresis_fraction"):
        ControllerConfig(hysteresis_fraction=1.5)
    with pytest.raises(ConfigError, match="at least 2 tiers"):
        Controller((DEVICE,))
    from splitrt.errors import PlanError

    with pytest.raises(PlanError, match="expected 2 values or one for all"):
        controller().decide(0.0, (link(2), link(2), link(2)), IDLE)
