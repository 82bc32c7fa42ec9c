"""The rig's load scenarios: which of them a run starts under (its strategies settle under it too)."""

from __future__ import annotations

from splitrt.rig import loads


def test_only_a_device_load_on_from_the_start_is_applied_while_the_strategies_settle() -> None:
    assert loads.busy_at_start("device-busy")  # busy for the whole run: it learnt its speed busy
    for load in ("none", "device-burst", "cloud-busy", ""):  # idle at the start, or not the device's
        assert not loads.busy_at_start(load)
