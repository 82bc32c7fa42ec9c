"""The trace simulator (splitrt.rig.sim): the runtime's decision logic replayed against a trace, no I/O."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import ConfigError
from splitrt.plan.costmodel import CostTable
from splitrt.rig import sim, traces

# A resnet-like model on a slow board: the whole model 500 ms on the device, 50 ms on the cloud;
# the input (150 KB) is the cheapest thing to send, a middle cut sends more.
TABLE = CostTable(
    ids=["cloud", "mid", "device"],
    head_ms=[0.0, 200.0, 500.0],
    tail_ms=[50.0, 25.0, 0.0],
    bytes=[150_000, 400_000, 0],
    reply_bytes=4000,
    codecs={"fp32": 1.0},
)
# Breakeven: the cloud plan costs 50 + 80 + 154 KB / bandwidth, the device 500 ms: ~3.3 Mbit/s.
FAST, SLOW = 20.0, 1.0


def cfg(**kw: object) -> sim.SimConfig:
    return sim.SimConfig(**{"duration_s": 60.0, "rtt_ms": 80.0, **kw})  # type: ignore[arg-type]


def test_adaptive_matches_the_right_fixed_plan_exactly_on_a_steady_link() -> None:
    for mbps, right in ((FAST, "cloud@fp32"), (SLOW, "device")):
        link = traces.constant(mbps, 60.0)
        ad = sim.simulate(TABLE, "adaptive", link, cfg())
        fixed = sim.simulate(TABLE, f"fixed:{right}", link, cfg(), with_cloud=right != "device")
        assert {r.plan for r in ad[8:]} == {right}
        # the same plan costs the same: no jitter, so the means agree to the last request
        assert statistics.fmean(r.latency_ms for r in ad[8:]) == pytest.approx(
            statistics.fmean(r.latency_ms for r in fixed[8:]), rel=0.01
        )


def test_adaptive_follows_a_step_down_and_back_up() -> None:
    link = traces.step([FAST, SLOW, FAST], step_s=20.0)
    ad = sim.simulate(TABLE, "adaptive", link, cfg())
    plan_at = {round(r.t_s, 2): r.plan for r in ad}
    # on the device within 3 s of the drop (two 1.4 s uploads tell), back on the cloud within 2 s
    assert all(p == "device" for t, p in plan_at.items() if 23.0 <= t < 40.0)
    assert all(p.startswith("cloud") for t, p in plan_at.items() if 42.0 <= t < 60.0)
    assert all(p.startswith("cloud") for t, p in plan_at.items() if 2.0 <= t < 20.0)


def test_a_low_estimate_recovers_when_probes_are_rtt_dominated() -> None:
    """Regression: on the device plan only probes feed the estimate, sized from it; on a link 20x
    faster than estimated they were all RTT-dominated and ignored, and adaptive stayed on the device
    (100 s on the HSDPA bus trace x5). Their lower bound now lifts the estimate."""
    link = traces.step([0.8, 25.0], step_s=30.0)
    ad = sim.simulate(TABLE, "adaptive", link, cfg())
    back = [r.t_s for r in ad if r.t_s >= 30.0 and r.plan.startswith("cloud")]
    assert back and back[0] < 33.0
    assert all(r.plan.startswith("cloud") for r in ad if r.t_s >= 33.0)


def test_the_device_speed_is_learned_from_the_heads() -> None:
    """The table says 500 ms, the board takes 650: adaptive's device estimate converges to 1.3 x."""
    ad = sim.simulate(TABLE, "adaptive", traces.constant(SLOW, 60.0), cfg(device_speed=1.3))
    assert {r.plan for r in ad} == {"device"}
    assert ad[-1].device_load == pytest.approx(1.3, rel=0.03)
    assert ad[-1].latency_ms == pytest.approx(650.0)


def test_a_device_burst_is_load_not_speed() -> None:
    ad = sim.simulate(TABLE, "adaptive", traces.constant(SLOW, 60.0), cfg(bursts=((20.0, 40.0),)))
    during = [r.device_load for r in ad if 25.0 <= r.t_s < 40.0]
    after = [r.device_load for r in ad if r.t_s >= 55.0]
    assert min(during) > 1.6  # the burst doubles compute (burst_util 0.5)
    assert max(after) < 1.4  # and fades once over (half-life 10 s): the speed stayed ~1


def test_periodic_holds_its_plan_between_re_plans() -> None:
    link = traces.square(SLOW, FAST, period_s=6.0, duration_s=60.0)
    per = sim.simulate(TABLE, "periodic:5", link, cfg())
    ad = sim.simulate(TABLE, "adaptive", link, cfg())
    switches = [b.t_s for a, b in itertools.pairwise(per) if a.plan != b.plan]
    assert switches and all(y - x >= 5.0 for x, y in itertools.pairwise(switches))
    assert sum(a.plan != b.plan for a, b in itertools.pairwise(ad)) > len(switches)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(1.5, 40.0), min_size=2, max_size=6), st.floats(0.0, 0.2))
def test_requests_are_paced_and_never_overlap(levels: list[float], jitter: float) -> None:
    link = traces.step(levels, step_s=5.0)
    c = cfg(duration_s=5.0 * len(levels), jitter=jitter, seed=3)
    for policy in ("adaptive", "fixed:cloud@fp32", "fixed:mid@fp32", "periodic:2"):
        reqs = sim.simulate(TABLE, policy, link, c)
        assert reqs and reqs[0].t_s >= 0.0  # warm-up requests are not counted
        for a, b in itertools.pairwise(reqs):
            gap = b.t_s - a.t_s
            assert gap >= 1 / c.rate_hz - 1e-9  # paced at rate_hz at most
            assert gap >= a.latency_ms / 1e3 - 1e-9  # closed loop: one at a time
        for r in reqs:
            assert r.latency_ms >= r.head_ms > 0 or r.plan.startswith("cloud")


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="rate_hz"):
        sim.SimConfig(rate_hz=0.0)
    with pytest.raises(ConfigError, match="speeds"):
        sim.SimConfig(device_speed=0.0)
    with pytest.raises(ConfigError, match="policy"):
        sim.simulate(TABLE, "sometimes", traces.constant(5.0), cfg())


def test_route_uses_only_device_and_cloud_and_splitting_can_beat_it() -> None:
    # a middle cut that sends little: on a slow link only splitting avoids both the upload and the device
    table = CostTable(
        ids=["cloud", "mid", "device"],
        head_ms=[0.0, 100.0, 500.0],
        tail_ms=[50.0, 25.0, 0.0],
        bytes=[150_000, 5_000, 0],
        reply_bytes=4000,
        codecs={"fp32": 1.0},
    )
    link = traces.constant(1.0, 60.0)
    route = sim.simulate(table, "route", link, cfg())
    ad = sim.simulate(table, "adaptive", link, cfg())
    assert {r.plan for r in route} <= {"device", "cloud@fp32"}
    assert {r.plan for r in ad[8:]} == {"mid@fp32"}
    assert statistics.fmean(r.latency_ms for r in route[8:]) > 1.5 * statistics.fmean(r.latency_ms for r in ad[8:])


def test_the_hold_ablation_runs_adaptive_without_added_up_gains() -> None:
    link, c = traces.constant(3.2, 60.0), cfg(jitter=0.1)  # at the breakeven (~3.3 Mbit/s): holds matter
    runs = sim.simulate_all(TABLE, {"adaptive": "adaptive", "adaptive-hold": "adaptive"}, link, c)
    held = replace(c, controller=replace(c.controller, hold_drift_fraction=0.0))
    assert sim.latencies(runs["adaptive-hold"]) == sim.latencies(sim.simulate(TABLE, "adaptive", link, held))
    assert sim.latencies(runs["adaptive"]) == sim.latencies(sim.simulate(TABLE, "adaptive", link, c))
    assert sim.latencies(runs["adaptive"]) != sim.latencies(runs["adaptive-hold"])


def _rpcs(reqs: list[sim.SimRequest]) -> list[tuple[float, float]]:
    return [(r.t_s + r.head_ms / 1e3, r.t_s + r.latency_ms / 1e3) for r in reqs if r.served]


def test_the_prober_sends_nothing_while_its_own_probe_is_on_the_wire() -> None:
    """The runtime's prober is one thread that blocks in each probe RPC (to its deadline): no RTT probe
    queues behind its own bandwidth probe (the sim sent one every round, and read ~1 s RTTs at 0.5 Mbit/s)."""
    probes: list[sim.SimProbe] = []
    sim.simulate(TABLE, "fixed:device", traces.constant(0.5, 60.0), cfg(), probes=probes)
    bandwidth = [p for p in probes if p.bytes_up > 64]
    assert len(bandwidth) > 10 and any(p.seconds is None for p in bandwidth)  # the first one times out
    c = cfg()
    for p, q in itertools.pairwise(probes):
        took = c.probe_timeout_s if p.seconds is None else p.seconds
        assert q.t_s >= p.t_s + took - 1e-9, (p, q)
    # nothing else on the wire: every RTT probe reads the link's RTT and its 128 bytes
    assert all(p.seconds == pytest.approx(0.080 + 128 * 8 / 0.5e6) for p in probes if p.bytes_up == 64)


def test_the_prober_waits_for_a_requests_whole_rpc_not_only_its_upload() -> None:
    """``Clouds.inflight`` covers a request's call from its encoding to its reply: with a 300 ms tail and
    idle gaps between requests, no probe starts while a request waits for its reply (the sim's "busy" was
    the upload only)."""
    table = CostTable(
        ids=["cloud", "device"], head_ms=[0.0, 900.0], tail_ms=[300.0, 0.0], bytes=[20_000, 0], codecs={"fp32": 1.0}
    )
    probes: list[sim.SimProbe] = []
    reqs = sim.simulate(table, "fixed:cloud@fp32", traces.constant(20.0, 60.0), cfg(rate_hz=1.0), probes=probes)
    rpcs = _rpcs(reqs)
    assert len(rpcs) == 60 and len(probes) > 60
    assert not [p for p in probes if any(a <= p.t_s < b for a, b in rpcs)]


def test_an_rtt_probe_puts_its_bytes_on_the_wire_once() -> None:
    # 128 bytes at 0.1 Mbit/s: 10.24 ms on the wire; the bandwidth probe follows its answer at once
    probes: list[sim.SimProbe] = []
    sim.simulate(TABLE, "fixed:device", traces.constant(0.1, 10.0), cfg(duration_s=5.0), probes=probes)
    rtt, bw = probes[0], probes[1]
    assert rtt.bytes_up == 64 and rtt.seconds == pytest.approx(0.080 + 0.01024)
    assert bw.bytes_up > 64 and bw.t_s == pytest.approx(rtt.t_s + rtt.seconds)


def test_a_probes_sample_is_not_seen_before_it_comes_back() -> None:
    # requests 2 s apart: no pace, so the probes keep the prober's own schedule, which a run without
    # requests replays
    probes: list[sim.SimProbe] = []
    sim.simulate(TABLE, "fixed:device", traces.constant(2.0, 60.0), cfg(rate_hz=0.5), probes=probes)
    bw = next(p for p in probes if p.bytes_up > 64 and p.seconds is not None and p.t_s > 1.0)
    assert bw.seconds is not None
    # the estimators as the prober's round left them, just before the probe's answer and just after
    fresh = sim._Run(TABLE, "fixed:device", traces.constant(2.0, 60.0), cfg(rate_hz=0.5), True)
    fresh.rounds_until(bw.t_s + bw.seconds - 1e-6)
    before = fresh.link.samples
    fresh.rounds_until(bw.t_s + bw.seconds + 1e-6)
    assert fresh.link.samples == before + 1


def test_while_requests_flow_probes_go_into_the_gaps_after_replies() -> None:
    """4 requests a second whose small uploads never refresh bandwidth (RTT-dominated): the bandwidth
    probes they draw start right after a reply, sized to end before the next request, not at random among
    them (a round of an RTT and a 2-RTT bandwidth probe held the next request up to 230 ms on the rig)."""
    small = CostTable(
        ids=["cloud", "device"], head_ms=[0.0, 500.0], tail_ms=[10.0, 0.0], bytes=[6000, 0], codecs={"fp32": 1.0}
    )
    probes: list[sim.SimProbe] = []
    reqs = sim.simulate(
        small, "fixed:cloud@fp32", traces.constant(5.0, 30.0), cfg(duration_s=30.0, rate_hz=4.0), probes=probes
    )
    replies = [r.t_s + r.latency_ms / 1e3 for r in reqs if r.served]
    starts = [r.t_s for r in reqs]
    late = [p for p in probes if p.t_s > 2.0 and p.bytes_up > 64]  # bandwidth probes (RTT probes: 64 B)
    assert len(late) >= 10  # the uploads draw probes all along
    after_reply = [p for p in late if any(0 <= p.t_s - e <= 0.06 for e in replies)]
    assert len(after_reply) >= 0.9 * len(late), [round(p.t_s, 3) for p in late]
    # each ends about when the next request starts (sized from the estimate): none delays one by > 10 ms
    for p in late:
        nxt = min((s for s in starts if s > p.t_s), default=None)
        assert p.seconds is not None and (nxt is None or p.t_s + p.seconds <= nxt + 0.01), (p, nxt)
