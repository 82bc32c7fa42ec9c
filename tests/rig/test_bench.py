"""The one rig's pure parts: the turn schedule, a strategy's paused clock, the typed worker protocol, the
strategy set and its static choices, and the report (bootstrap intervals,
what a server kill did, the fleet's verdict, the three-tier gains)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import ConfigError, RigError
from splitrt.plan.controller import ControllerConfig
from splitrt.plan.costmodel import CostTable, Link
from splitrt.rig import bench as rigbench
from splitrt.rig import protocol as P
from splitrt.rig import report, strategies
from splitrt.rig.runner import Turn, turn_plan
from splitrt.rig.worker import TurnClock

NAMES = ["device-only", "cloud-only", "static", "periodic", "adaptive"]
IDS = ["cloud", "c1", "c2", "c3", "device"]
BYTES = [400_000, 20_000, 60_000, 2_000, 0]
DEVICE = CostTable(ids=IDS, head_ms=[0, 5, 60, 160, 200], tail_ms=[200, 195, 140, 40, 0], bytes=BYTES, reply_bytes=40)
EDGE = CostTable(ids=IDS, head_ms=[0, 1, 3, 60, 160], tail_ms=[160, 159, 157, 100, 0], bytes=BYTES, reply_bytes=40)
CLOUD = CostTable(
    ids=IDS, head_ms=[0, 0.2, 0.6, 1.0, 1.2], tail_ms=[1.2, 1.0, 0.6, 0.2, 0], bytes=BYTES, reply_bytes=40
)
# the device's table as the rig builds it: its own heads, the last tier's tails (the direct path)
DIRECT = CostTable(ids=IDS, head_ms=[0, 5, 60, 160, 200], tail_ms=[1.2, 1.0, 0.6, 0.2, 0], bytes=BYTES, reply_bytes=40)
A, B = "10.0.0.5:50051", "10.0.0.6:50051"


def test_turns_cover_the_window_once_per_strategy_in_rotating_order() -> None:
    plan = turn_plan(NAMES, 12.0, 3.0)
    assert len(plan) == 4 * len(NAMES)
    assert [n for n, _ in plan[:5]] == NAMES
    assert [n for n, _ in plan[5:10]] == NAMES[1:] + NAMES[:1]
    for name in NAMES:
        assert [u for n, u in plan if n == name] == [3.0, 6.0, 9.0, 12.0]
    assert turn_plan(NAMES, 10.0, 30.0) == [(n, 10.0) for n in NAMES]  # a turn longer than the window


@given(n=st.integers(1, 6), rounds=st.integers(1, 13), turn_s=st.floats(0.5, 5.0))
def test_every_strategy_takes_every_place_and_never_two_turns_in_a_row(n: int, rounds: int, turn_s: float) -> None:
    names = [f"s{i}" for i in range(n)]
    plan = turn_plan(names, rounds * turn_s, turn_s)
    assert len(plan) == n * rounds
    assert plan[-1][1] == pytest.approx(rounds * turn_s)
    places = {s: [k % n for k, (name, _) in enumerate(plan) if name == s] for s in names}
    if rounds % n == 0:  # whole cycles: the same mean place, so a linear drift of the host cancels exactly
        assert len({statistics.fmean(p) for p in places.values()}) == 1
    if n >= 3:
        assert all(a[0] != b[0] for a, b in itertools.pairwise(plan))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: rigbench.BenchConfig(turn_s=0.0), "turn_s"),
        (lambda: rigbench.BenchConfig(strategies=("edge-only",)), "2 tiers"),
        (lambda: rigbench.TierBenchConfig(strategies=("oracle",)), "3 tiers"),
        (lambda: rigbench.FleetConfig(servers=1), "kill_at_fraction"),
        (lambda: rigbench.FleetConfig(kill_at_fraction=1.0), "kill_at_fraction"),
        (lambda: rigbench.FleetConfig(segment_s=0.0), "segment_s"),
        (lambda: rigbench.FleetConfig(device_cpus=(0.001,)), "cpus"),
    ],
)
def test_configs_reject_what_cannot_run(make: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make()  # type: ignore[operator]
        rigbench.fleet_rig_config(rigbench.FleetConfig(device_cpus=(0.001,)), __import__("pathlib").Path("/tmp"))


def test_turn_clock_stands_still_while_parked() -> None:
    wall = [100.0]  # a fake wall clock: the test moves it, nothing sleeps
    clock = TurnClock(lambda: wall[0])
    a = clock()
    wall[0] += 0.01
    clock.pause()
    p = clock()
    assert p - a == pytest.approx(0.01)
    wall[0] += 0.05
    assert clock() == p  # parked: not a tick
    clock.pause()  # idempotent
    clock.resume()
    wall[0] += 0.02
    b = clock()
    assert b - p == pytest.approx(0.02)  # only the running time counts
    assert b - a == pytest.approx(0.03)  # the 50 ms parked did not count
    clock.resume()  # idempotent
    assert clock() == b


def test_protocol_round_trips_typed_messages_and_names_a_wrong_one() -> None:
    rec = P.Record(
        i=3, t_s=1.5, latency_ms=120.0, plan="c3@int8", where="cloud", server=A, predicted_ms=99.0, match=True
    )
    done = P.Done(end_s=2.0, records=(rec,), stats={"refused": 1.0})
    assert P.decode(P.encode(done)) == done
    spec = P.Spec(model_path="m.onnx", servers=((A, B),), codecs=("fp32",), warm_cuts=("device", "c3"))
    assert P.decode(P.encode(spec)) == spec  # nested tuples survive JSON
    settle = P.Settle(name="adaptive", seconds=2.0, rate_hz=4.0, tasks_file="/tmp/board_tasks")
    assert P.decode(P.encode(settle)) == settle
    with pytest.raises(RigError, match="expected one of"):
        P.decode('{"type": "Nope"}')


def hop(mbps: float, rtt_ms: float = 2.0) -> Link:
    return Link(bandwidth_mbps=mbps, rtt_ms=rtt_ms)


def test_one_strategy_set_chosen_per_topology() -> None:
    three = strategies.choose(
        (*rigbench.TIER_DEFAULTS, "route"), [DIRECT, EDGE, CLOUD], [hop(2), hop(0.5)], fixed_mbps=1, codecs=["fp32"]
    )
    assert [(three[n].tiers, three[n].policy) for n in ("device-only", "cloud-only", "edge-only", "route")] == [
        (2, "fixed:device"),
        (2, "fixed:cloud@fp32"),
        (3, "fixed:cloud@fp32>device"),
        (2, "route"),
    ]
    assert three["static-3tier"].plan == "c1@fp32>c3@fp32"  # the pair the chain solver picks with both hops slow
    assert three["static-2tier"].plan == "c3@fp32"  # the hops in series (0.5 Mbit/s): c3's 2 kB win
    assert (three["adaptive"].tiers, three["adaptive"].plan) == (3, None)
    slow = strategies.choose(
        ["static-3tier"], [DEVICE, EDGE, CLOUD], [hop(0.001, 500)] * 2, fixed_mbps=1, codecs=["fp32"]
    )
    assert slow["static-3tier"].plan == "device"
    two = strategies.choose(
        rigbench.STRATEGIES, [DIRECT, CLOUD], [hop(1000)], fixed_mbps=0.5, periodic_s=3, codecs=["fp32"]
    )
    assert set(two) == set(rigbench.STRATEGIES) - {"oracle", "oracle-route"}  # the oracles are computed
    assert two["static"].plan == "cloud@fp32" and two["static-fixed"].plan == "c3@fp32"
    assert two["periodic"].policy == "periodic:3" and all(c.tiers == 2 for c in two.values())
    with pytest.raises(ConfigError, match="expected names in"):
        strategies.choose(["adaptive", "oracle", "edge-only"], [DEVICE, CLOUD], [hop(2)], fixed_mbps=1)


def test_the_hold_ablation_runs_adaptive_with_gains_held_within_the_margin() -> None:
    two = strategies.choose(["adaptive", "adaptive-hold"], [DIRECT, CLOUD], [hop(2)], fixed_mbps=1)
    assert two["adaptive-hold"].policy == two["adaptive"].policy == "adaptive"
    assert strategies.HOLD_ABLATION == "adaptive-hold" and ControllerConfig().hold_drift_fraction > 0.0
    with pytest.raises(ConfigError, match="expected names in"):  # two tiers only
        strategies.choose(["adaptive-hold"], [DIRECT, EDGE, CLOUD], [hop(2), hop(2)], fixed_mbps=1)


def test_likely_plans_cover_the_grid() -> None:
    cuts, pairs = strategies.likely_plans([DIRECT, EDGE, CLOUD], [2.0, 2.0], codecs=["fp32"])
    assert {"device", "cloud", "c1"} <= set(cuts) and cuts == sorted(cuts)
    assert "c1@fp32>c3@fp32" in pairs and all(">" in p for p in pairs)
    two, none = strategies.likely_plans([DIRECT, CLOUD], [2.0])
    assert {"device", "cloud", "c3"} <= set(two) and none == []


def r(t: float, ms: float, server: str | None, plan: str = "c5@int8", error: str | None = None) -> P.Record:
    where = "local" if server is None else "cloud"
    finished = "device" if server is None else "cloud"
    return P.Record(
        i=int(t * 10), t_s=t, latency_ms=ms, plan=plan, server=server, where=where, finished_by=finished, error=error
    )


def turn(name: str, devices: list[list[P.Record]], kill_at_s: float | None = 5.0) -> Turn:
    return Turn(
        name=name, from_s=0.0, until_s=10.0, devices=tuple(tuple(d) for d in devices),
        server_cpu_s={A: 2.0, B: 1.0}, killed=B if kill_at_s is not None else None, kill_at_s=kill_at_s,
    )  # fmt: skip


def test_summary_accounts_for_every_request_and_the_kill() -> None:
    from splitrt.plan.costmodel import DEFAULT_POWER
    from splitrt.rig import traces

    t = turn(
        "adaptive",
        [
            [r(0.0, 100, A), r(1.0, 100, B), r(6.0, 50, None, "device")],
            [r(0.5, 200, B), r(6.5, 100, A), r(7.0, 80, A, error="CloudError: x")],
        ],
    )
    s = report.summary([t], [traces.constant(10.0, 20.0)], DEFAULT_POWER, [A, B], 0.5, 0)
    assert s["requests"] == 6 and s["completed"] == 5 and s["failed"] == 1
    assert s["local"] == 1 and s["by_server"] == {A: 2, B: 2} and s["accounted"]
    assert s["throughput_rps"] == pytest.approx(0.5)
    assert s["server_util"][A] == pytest.approx(2.0 / (10 * 0.5))
    assert s["plans"] == {"c5@int8": 4, "device": 1} and s["energy_mj"] > 0
    k = report.kill_account(t)
    # after 5 s: device 1's request to A moved off the killed B (it had used B before); none on B
    assert k == {"after_kill_on_killed": 0, "after_kill_on_others": 1, "moved": 1}
    late = turn("x", [[r(1.0, 100, B), r(6.0, 100, B)]])
    assert report.kill_account(late)["after_kill_on_killed"] == 1
    assert report.kill_account(turn("x", [[r(6.0, 1, B)]], kill_at_s=None))["after_kill_on_killed"] == 0


def test_bootstrap_intervals() -> None:
    lo, hi = report.bootstrap_ci([[10.0, 12.0], [11.0], [13.0, 9.0]])
    assert 9.0 <= lo <= 11.0 <= hi <= 13.0
    assert all(math.isnan(x) for x in report.bootstrap_ci([[1.0, 2.0]]))  # one group: no interval
    assert report.bootstrap_ci([[5.0], [5.0], [5.0]], stat="p95") == (5.0, 5.0)


def strat(rps: float, p95: float, **kw: object) -> dict[str, object]:
    return {"throughput_rps": rps, "p95_ms": p95, "failed": 0, "accounted": True, "after_kill_on_killed": 0, **kw}


def test_verdict_needs_the_best_throughput_at_no_worse_p95_and_no_failure() -> None:
    good = {"adaptive": strat(20, 200), "device-only": strat(10, 400), "cloud-only": strat(15, 300)}
    assert report.verdict(good)["pass"]
    v = report.verdict({**good, "static": strat(21, 150)})
    assert not v["pass"] and len(v["reasons"]) == 2
    same = strat(19, 190, adaptive_over_this={"p95": {"call": "same"}})  # p95 above, interval holds 1: equal
    assert report.verdict({**good, "static": same})["pass"]
    assert report.verdict({**good, "route": strat(30, 100)})["pass"]  # only fixed strategies must be beaten
    v = report.verdict({**good, "device-only": strat(10, 400, failed=2)})
    assert not v["pass"] and v["failed"] == 2
    assert not report.verdict({"adaptive": strat(1, 1)})["pass"]


def test_gains_against_the_best_static_alternative() -> None:
    s = {
        "device-only": {"mean_ms": 400.0, "energy_mj": 2000.0},
        "cloud-only": {"mean_ms": 500.0, "energy_mj": 900.0},
        "static-2tier": {"mean_ms": 400.0, "energy_mj": 2000.0},
        "edge-only": {"mean_ms": 300.0, "energy_mj": 800.0},
        "static-3tier": {"mean_ms": 320.0, "energy_mj": 850.0},
        "adaptive": {"mean_ms": 280.0, "energy_mj": 880.0},
    }
    g = report.gains(s)
    assert g["latency_vs_static_2tier"] == {"against": "device-only", "pct": pytest.approx(30.0)}
    assert g["energy_vs_static_2tier"] == {"against": "cloud-only", "pct": pytest.approx(100 * (1 - 880 / 900))}
    assert g["latency_vs_static_split"] == {"against": "static-2tier", "pct": pytest.approx(30.0)}
    assert g["energy_vs_any_static"] == {"against": "edge-only", "pct": pytest.approx(-10.0)}  # worse: negative
    assert report.gains({"device-only": {"mean_ms": 1.0, "energy_mj": 1.0}}) == {}
    assert math.isnan(report.gain_pct(1.0, math.nan))
