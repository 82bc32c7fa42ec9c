"""`splitrt sim`'s cells: the strategy set by default, and the hold ablation only when named."""

from __future__ import annotations

from splitrt.cli import sim
from splitrt.rig.strategies import HOLD_ABLATION, SLOW_ABLATION


def test_the_hold_ablation_runs_only_when_named() -> None:
    default = sim.sim_cell("squeezenet", "hsdpa/car", duration_s=5.0)
    assert not {HOLD_ABLATION, SLOW_ABLATION} & set(default["strategies"]) and "adaptive" in default["strategies"]
    named = sim.sim_cell("squeezenet", "hsdpa/car", duration_s=5.0, strategies=["adaptive", "route", HOLD_ABLATION])
    assert {"adaptive", "route", HOLD_ABLATION} <= set(named["strategies"])
    assert "device-only" not in named["strategies"]
