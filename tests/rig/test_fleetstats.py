"""The fleet rig's pure parts: aggregation of request records, the kill account, the verdict, the
segment order and the per-device traces."""

from __future__ import annotations

import math

import pytest

from splitrt.errors import ConfigError
from splitrt.rig import fleet, fleetstats

A, B = "10.0.0.5:50051", "10.0.0.6:50051"


def seg(
    strategy: str,
    devices: list[list[list[object]]],
    *,
    kill_at_s: float | None = 5.0,
    cpu: dict[str, float] | None = None,
) -> dict[str, object]:
    return {
        "strategy": strategy,
        "round": 0,
        "duration_s": 10.0,
        "kill_at_s": kill_at_s,
        "killed": B if kill_at_s is not None else None,
        "devices": devices,
        "server_cpu_s": cpu or {A: 2.0, B: 1.0},
        "server_cpus": 0.5,
    }


def rec(
    t: float, ms: float, server: str | None, plan: str = "c5@int8", *, fallback: bool = False, error: str | None = None
) -> list[object]:
    return [t, ms, plan, server, fallback, error]


def test_summary_accounts_for_every_request() -> None:
    s = fleetstats.summarize(
        [
            seg(
                "adaptive",
                [
                    [rec(0.0, 100, A), rec(1.0, 100, B), rec(6.0, 50, None, "device")],
                    [rec(0.5, 200, B), rec(6.5, 100, A), rec(7.0, 80, A, error="CloudError: x")],
                ],
            )
        ],
        [A, B],
    )
    assert s["requests"] == 6 and s["completed"] == 5 and s["failed"] == 1
    assert s["local"] == 1 and s["by_server"] == {A: 2, B: 2}
    assert s["accounted"] and s["throughput_rps"] == pytest.approx(0.5)
    assert s["server_util"][A] == pytest.approx(2.0 / (10 * 0.5))
    assert s["p50_ms"] == pytest.approx(100)
    assert s["plans"] == {"c5@int8": 4, "device": 1}


def test_the_kill_account_counts_moved_requests_and_any_served_by_the_dead_server() -> None:
    s = seg(
        "cloud-only",
        [
            [
                rec(4.0, 500, B),  # started before the kill, answered after: not counted
                rec(4.0, 100, B),  # answered before the kill
                rec(5.5, 100, A),
                rec(6.0, 100, A),
            ],
            [rec(7.0, 100, B)],
        ],
    )  # impossible in a real run: the dead server answered
    k = fleetstats.kill_account(s)
    assert k == {"after_kill_on_killed": 1, "after_kill_on_others": 2, "moved": 2}
    # a device that never used the killed server moved nothing
    assert fleetstats.kill_account(seg("x", [[rec(1.0, 100, A), rec(6.0, 100, A)]]))["moved"] == 0
    assert fleetstats.kill_account(seg("x", [[rec(7.0, 100, B)]], kill_at_s=None)) == {
        "after_kill_on_killed": 0,
        "after_kill_on_others": 0,
        "moved": 0,
    }


def strat(rps: float, p95: float, **kw: object) -> dict[str, object]:
    return {"throughput_rps": rps, "p95_ms": p95, "failed": 0, "accounted": True, "after_kill_on_killed": 0, **kw}


def test_verdict_needs_the_best_throughput_at_no_worse_p95_and_no_failure() -> None:
    good = {"adaptive": strat(20, 200), "device-only": strat(10, 400), "cloud-only": strat(15, 300)}
    assert fleetstats.verdict(good)["pass"]
    slow = {**good, "static": strat(21, 150)}
    v = fleetstats.verdict(slow)
    assert not v["pass"] and len(v["reasons"]) == 2
    # p95 above, but the bootstrap interval of the ratio holds 1: equal.
    same = {"static": {"p95": {"call": "same"}}}
    v = fleetstats.verdict({**good, "static": strat(19, 190)}, same)
    assert v["pass"]
    v = fleetstats.verdict({**good, "device-only": strat(10, 400, failed=2)})
    assert not v["pass"] and v["failed"] == 2
    assert not fleetstats.verdict({"adaptive": strat(1, 1)})["pass"]


def test_compare_resamples_device_segments_and_flips_throughput() -> None:
    fast = [seg("adaptive", [[rec(t, 100 + t, A) for t in range(20)] for _ in range(6)])]
    slow = [seg("device-only", [[rec(t, 300 + t, None) for t in range(10)] for _ in range(6)])]
    c = fleetstats.compare(fast, slow, n=200)
    assert c["throughput"]["call"] == "better" and c["throughput"]["ci"][0] == pytest.approx(2.0)
    assert c["mean"]["call"] == "better" and c["p95"]["call"] == "better"
    empty = fleetstats.compare([], slow, n=10)
    assert empty["mean"]["call"] == "n/a" and math.isnan(empty["mean"]["ci"][0])


def test_segments_rotate_and_every_device_gets_its_own_trace_window() -> None:
    assert fleet.segment_plan(["a", "b", "c"], 2) == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a")]
    cfg = fleet.FleetConfig(devices=5, traces=("hsdpa/bus", "hsdpa/car"), bandwidth_scale=2.0, segment_s=5.0)
    ts = fleet.device_traces(cfg)
    assert len(ts) == 5
    assert ts[0].rates_mbps != ts[2].rates_mbps  # the same trace, a later offset
    assert ts[0].duration_s >= cfg.segment_s * cfg.rounds


@pytest.mark.parametrize(
    "kw",
    [
        {"servers": 1},
        {"kill_at_fraction": 1.0},
        {"strategies": ("oracle",)},
        {"device_cpus": (0.001,)},
        {"segment_s": 0.0},
    ],
)
def test_fleet_config_rejects_what_cannot_run(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        fleet.FleetConfig(**kw)  # type: ignore[arg-type]
