"""`splitrt rig bench`: options reach the three-tier config, bad ones are refused, and the table says
that energy is estimated and shows the host's load average (the rig itself: tests/rig/test_tiers.py)."""

from __future__ import annotations

import math

import pytest

from splitrt.cli import app
from splitrt.cli import tiers as tierscli
from splitrt.errors import ConfigError
from splitrt.rig.bench import TierBenchConfig


def _args(*argv: str) -> object:
    return app.build_parser().parse_args(["rig", "bench", *argv])


def test_options_reach_the_config() -> None:
    cfg = tierscli.config_from(
        _args(
            "--objective",
            "energy",
            "--trace",
            "hsdpa/car",
            "--trace2",
            "fcc/amazon-799296",
            "--bandwidth-scale",
            "10",
            "--bandwidth-scale2",
            "5",
            "--rtt2-ms",
            "12",
            "--strategies",
            "device-only,adaptive",
        )
    )
    assert cfg == TierBenchConfig(
        objective="energy",
        trace="hsdpa/car",
        trace2="fcc/amazon-799296",
        bandwidth_scale=10.0,
        bandwidth_scale2=5.0,
        rtt2_ms=12.0,
        strategies=("device-only", "adaptive"),
    )
    a = _args()
    assert a.tiers == 3 and a.edge_cpus == 1.0 and a.func is tierscli.cmd_rig_bench


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="strategies: expected names in"):
        tierscli.config_from(_args("--strategies", "adaptive,oracle"))
    with pytest.raises(ConfigError, match="must be > 0"):
        tierscli.config_from(_args("--bandwidth-scale2", "0"))
    with pytest.raises(SystemExit):
        _args("--tiers", "4")


def _summary(mean: float, mj: float, plan: str, tiers: int, *, via_edge: int = 0) -> dict[str, object]:
    return {
        "mean_ms": mean,
        "p50_ms": mean,
        "p95_ms": mean * 1.2,
        "p99_ms": mean * 1.3,
        "energy_mj": mj,
        "energy_increment_mj": mj * 1.2,
        "completed": 10,
        "failed": 0,
        "switches": 0,
        "fallbacks": 0,
        "plans": {plan: 10},
        "tiers": tiers,
        "policy": f"fixed:{plan}",
        "mean_ci_ms": [mean - 5, mean + 5],
        "p95_ci_ms": [math.nan, math.nan],
        "energy_ci_mj": [mj - 1, mj + 1],
        "via_edge": via_edge,
        "finished_by": {"device": 0, "edge": via_edge, "cloud": 0},
        "mismatched": 0,
    }


def test_table_says_estimated_and_shows_the_load_average() -> None:
    from splitrt.rig.report import gains

    strategies = {
        "device-only": _summary(500, 3000, "device", 2),
        "static-2tier": _summary(800, 1900, "cloud@fp32", 2),
        "adaptive": _summary(450, 900, "cloud>device@fp32", 3, via_edge=10),
    }
    strategies["device-only"]["adaptive_over_this"] = {
        k: {"ci": [0.8, 0.95], "call": "better"} for k in ("mean", "p95", "energy")
    }
    result = {
        "model": "resnet50",
        "board": "rpi4",
        "objective": "energy",
        "rate_hz": 4.0,
        "duration_s": 20.0,
        "edge": {"cpus": 1.0, "measured_ms": 115.0},
        "factors": {"cloud_ms": 80.0, "device_ms": 480.0},
        "hop1": {
            "trace": "hsdpa/bus",
            "scale": 10.0,
            "offset_s": 60.0,
            "median_mbps": 26.6,
            "window_mean_mbps": 23.5,
            "rtt_ms": 80.0,
        },
        "hop2": {
            "trace": "fcc/amazon-214390",
            "scale": 5.0,
            "offset_s": 60.0,
            "median_mbps": 8.4,
            "window_mean_mbps": 7.9,
            "rtt_ms": 30.0,
        },
        "calibration": {"measured_ms": 460.0, "target_ms": 490.0},
        "energy": {
            "source": "estimated",
            "origin": "devices/rpi4.toml",
            "idle_w": 2.7,
            "active_w": 6.4,
            "radio_w": 1.0,
        },
        "load_average": {"start": [3.5, 8.5, 7.8], "end": [6.1, 6.9, 7.3]},
        "strategies": strategies,
        "gains": gains(strategies),
        "failed": 0,
    }
    text = tierscli.table_text(result)
    assert "energy ESTIMATED from devices/rpi4.toml" in text
    assert "host load average 3.50/8.50/7.80 at start, 6.10/6.90/7.30 at end" in text
    assert "latency vs the static split (static-2tier): +43.8%" in text
    assert "energy vs the static split (static-2tier): +52.6%" in text
    rows = tierscli.rows(result)
    assert [r[0] for r in rows] == ["device-only", "static-2tier", "adaptive"]
    assert rows[0][9] == "better/better" and rows[2][7] == 10  # adaptive vs device-only; adaptive via the edge
