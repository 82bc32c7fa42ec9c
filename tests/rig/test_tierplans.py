"""The three-tier bench's pure parts: static choices at the median bandwidths,
turn grouping, bootstrap intervals and the gains against the best static alternative."""

from __future__ import annotations

import math

import pytest

from splitrt.errors import ConfigError
from splitrt.plan.costmodel import DEFAULT_POWER, CostTable, Link
from splitrt.plan.netmon import LinkEstimate
from splitrt.rig import tierplans

IDS = ["cloud", "c1", "c2", "c3", "device"]
BYTES = [400_000, 20_000, 60_000, 2_000, 0]
DEVICE = CostTable(ids=IDS, head_ms=[0, 5, 60, 160, 200], tail_ms=[200, 195, 140, 40, 0], bytes=BYTES, reply_bytes=40)
EDGE = CostTable(ids=IDS, head_ms=[0, 1, 3, 60, 160], tail_ms=[160, 159, 157, 100, 0], bytes=BYTES, reply_bytes=40)
CLOUD = CostTable(
    ids=IDS, head_ms=[0, 0.2, 0.6, 1.0, 1.2], tail_ms=[1.2, 1.0, 0.6, 0.2, 0], bytes=BYTES, reply_bytes=40
)


def hop(mbps: float, rtt_ms: float = 2.0) -> Link:
    return Link(bandwidth_mbps=mbps, rtt_ms=rtt_ms)


def est(mbps: float) -> LinkEstimate:
    return LinkEstimate(bandwidth_mbps=mbps, rtt_ms=2.0, confidence=1.0)


def test_choices_at_the_medians() -> None:
    s = tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(2), hop2=hop(0.5))
    assert list(s) == list(tierplans.DEFAULT_STRATEGIES)
    assert s["device-only"].policy == "fixed:device" and s["device-only"].tiers == 2
    assert s["cloud-only"].policy == "fixed:cloud@fp32" and s["cloud-only"].tiers == 2
    assert s["edge-only"].policy == "fixed:cloud@fp32>device" and s["edge-only"].tiers == 3
    # the same pair the controller picks (tests/plan/test_controller_path.py: both hops slow -> c1, c3)
    assert s["static-3tier"].plan == "c1@fp32>c3@fp32" and s["static-3tier"].tiers == 3
    # two tiers over the hops in series (0.5 Mbit/s, both RTTs): c3's 2 kB beat everything else
    assert s["static-2tier"].plan == "c3@fp32"
    assert s["adaptive"].policy == "adaptive" and math.isnan(s["adaptive"].predicted_ms)
    # the best 3-tier pair is never predicted worse than the best 2-tier split, whose plans it includes
    assert s["static-3tier"].predicted_ms <= s["static-2tier"].predicted_ms + 1e-9
    assert all(s[n].predicted_ms > 0 for n in tierplans.STATIC)


def test_route_runs_on_two_tiers_with_the_route_policy() -> None:
    s = tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(2), hop2=hop(0.5), names=["route", "adaptive-2tier"])
    assert (s["route"].tiers, s["route"].policy) == (2, "route")
    assert (s["adaptive-2tier"].tiers, s["adaptive-2tier"].policy) == (2, "adaptive")


def test_a_device_only_chain_is_device() -> None:
    slow = tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(0.001, 500), hop2=hop(0.001, 500))
    assert slow["static-3tier"].plan == "device" and slow["static-2tier"].plan == "device"


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="expected names in"):
        tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(2), hop2=hop(2), names=["adaptive", "oracle"])


def test_energy_objective_chooses_by_energy() -> None:
    s = tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(50), hop2=hop(50), objective="energy", power=DEFAULT_POWER)
    lat = tierplans.choose(DEVICE, EDGE, CLOUD, hop1=hop(50), hop2=hop(50), objective="latency", power=DEFAULT_POWER)
    assert s["static-3tier"].predicted_mj <= lat["static-3tier"].predicted_mj + 1e-9


def test_likely_cuts_and_pairs() -> None:
    cuts = tierplans.likely_first_cuts(DEVICE, EDGE, CLOUD, rtt1_ms=2.0, rtt2_ms=2.0)
    assert {"device", "cloud", "c1"} <= set(cuts) and cuts == sorted(cuts)
    pairs = tierplans.likely_pairs(DEVICE, EDGE, CLOUD, [(1000, 1000)] * 3 + [(2, 0.5)], rtt1_ms=2.0, rtt2_ms=2.0)
    assert pairs == ["cloud@fp32>c1@fp32", "c1@fp32>c3@fp32"]  # most frequent first
    assert tierplans.likely_pairs(DEVICE, EDGE, CLOUD, [(1000, 1000), (2, 0.5)], rtt1_ms=2, rtt2_ms=2, limit=1) == [
        "cloud@fp32>c1@fp32"
    ]


def test_by_turn_and_bootstrap() -> None:
    recs = [{"t_s": t, "latency_ms": 10.0 + t} for t in (0.1, 0.5, 1.2, 2.9, 3.0)]
    assert tierplans.by_turn(recs, 1.0, "latency_ms") == [[10.1, 10.5], [11.2], [12.9], [13.0]]
    with pytest.raises(ConfigError, match="turn_s"):
        tierplans.by_turn(recs, 0.0, "latency_ms")
    lo, hi = tierplans.bootstrap_ci([[10.0, 12.0], [11.0], [13.0, 9.0]])
    assert 9.0 <= lo <= 11.0 <= hi <= 13.0
    assert all(math.isnan(x) for x in tierplans.bootstrap_ci([[1.0, 2.0]]))  # one turn: no interval
    same = tierplans.bootstrap_ci([[5.0], [5.0], [5.0]], stat="p95")
    assert same == (5.0, 5.0)


def test_gains_against_the_best_static_alternative() -> None:
    s = {
        "device-only": {"mean_ms": 400.0, "energy_mj": 2000.0},
        "cloud-only": {"mean_ms": 500.0, "energy_mj": 900.0},
        "static-2tier": {"mean_ms": 400.0, "energy_mj": 2000.0},
        "edge-only": {"mean_ms": 300.0, "energy_mj": 800.0},
        "static-3tier": {"mean_ms": 320.0, "energy_mj": 850.0},
        "adaptive": {"mean_ms": 280.0, "energy_mj": 880.0},
    }
    g = tierplans.gains(s)
    assert g["latency_vs_static_2tier"] == {"against": "device-only", "pct": pytest.approx(30.0)}
    assert g["energy_vs_static_2tier"] == {"against": "cloud-only", "pct": pytest.approx(100 * (1 - 880 / 900))}
    assert g["latency_vs_static_split"] == {"against": "static-2tier", "pct": pytest.approx(30.0)}
    assert g["energy_vs_static_split"] == {"against": "static-2tier", "pct": pytest.approx(56.0)}
    assert g["latency_vs_any_static"]["against"] == "edge-only"
    assert g["energy_vs_any_static"] == {"against": "edge-only", "pct": pytest.approx(-10.0)}  # worse: negative
    assert tierplans.gains({"device-only": {"mean_ms": 1.0, "energy_mj": 1.0}}) == {}
    assert math.isnan(tierplans.gain_pct(1.0, math.nan))
