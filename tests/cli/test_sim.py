"""`splitrt sim`'s cells: the strategy set by default, and the hold ablation only when named."""

from __future__ import annotations

from typing import Any

import pytest

from splitrt.cli import sim
from splitrt.errors import ConfigError
from splitrt.rig.strategies import HOLD_ABLATION, SLOW_ABLATION


def test_the_hold_ablation_runs_only_when_named() -> None:
    default = sim.sim_cell("squeezenet", "hsdpa/car", duration_s=5.0)
    assert not {HOLD_ABLATION, SLOW_ABLATION} & set(default["strategies"]) and "adaptive" in default["strategies"]
    named = sim.sim_cell("squeezenet", "hsdpa/car", duration_s=5.0, strategies=["adaptive", "route", HOLD_ABLATION])
    assert {"adaptive", "route", HOLD_ABLATION} <= set(named["strategies"])
    assert "device-only" not in named["strategies"]


def test_a_busy_board_is_simulated_at_the_rigs_share() -> None:
    """device-busy (the rig grid's squeezenet cells): other work holds 3/4 of the CPU all along, so the
    whole model on the device takes 4x what it takes unloaded."""
    kw: dict[str, Any] = {"duration_s": 5.0, "strategies": ["adaptive", "route", "device-only"]}
    idle = sim.sim_cell("squeezenet", "hsdpa/car", **kw)["strategies"]["device-only"]
    busy = sim.sim_cell("squeezenet", "hsdpa/car", load="device-busy", **kw)["strategies"]["device-only"]
    assert busy["mean_ms"] == pytest.approx(4 * idle["mean_ms"], rel=1e-6)
    with pytest.raises(ConfigError, match="device-busy"):
        sim.sim_cell("squeezenet", "hsdpa/car", load="cloud-busy", **kw)


def test_stalls_make_every_remote_call_pay_and_leave_the_device_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """--stalls: a busy board's scheduler waits on a share of the remote calls, whatever the plan."""
    kw: dict[str, Any] = {"duration_s": 5.0, "strategies": ["adaptive", "route", "cloud-only", "device-only"]}
    calm = sim.sim_cell("squeezenet", "hsdpa/car", **kw)["strategies"]
    stalled = sim.sim_cell("squeezenet", "hsdpa/car", stalls=(1.0, 40.0), **kw)
    assert stalled["stalls"] == [1.0, 40.0]
    got = stalled["strategies"]
    assert got["cloud-only"]["mean_ms"] > calm["cloud-only"]["mean_ms"] + 30.0
    assert got["device-only"]["mean_ms"] == pytest.approx(calm["device-only"]["mean_ms"])
    from splitrt.cli import app as cli

    argv = ["sim", "--model", "squeezenet", "--duration", "3", "--strategies", "adaptive,route", "--stalls", "0.25,50"]
    assert cli.main(argv) == 0
    assert "stalls 0.25 x 50 ms" in capsys.readouterr().out
    for bad in ("0.25", "2,50", "a,b"):
        with pytest.raises(ConfigError, match="--stalls"):
            sim._stalls(bad)
