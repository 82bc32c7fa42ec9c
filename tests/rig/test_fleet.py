"""The fleet rig end to end (root): a tiny fleet, one server killed mid-run; and its shaping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from splitrt.rig import fleet, fleetnet, netns

pytestmark = pytest.mark.root


def test_one_tc_batch_rates_both_directions_of_every_device() -> None:
    net = fleetnet.FleetNet(f"spl-fn{os.getpid() % 100000}", 2, 1)
    try:
        assert net.set_rates([2.0, 8.0]) == 2
        assert net.set_rates([2.0, 8.01]) == 0  # within 2 %: no tc call
        assert net.set_rates([4.0, 8.0]) == 1
        up = netns.run_cmd(["ip", "netns", "exec", net.switch_ns, "tc", "class", "show", "dev", "ifb0"]).stdout
        down = netns.run_cmd(["ip", "netns", "exec", net.switch_ns, "tc", "class", "show", "dev", "p1"]).stdout
        assert "htb" in up and "htb" in down
        assert net.rates() == [4.0, 8.0]
    finally:
        net.close()


def test_a_tiny_fleet_loses_nothing_when_a_server_dies(tmp_path: Path) -> None:
    cfg = fleet.FleetConfig(
        devices=3, servers=2, segment_s=4.0, warmup_s=1.0, kill_at_fraction=0.5, strategies=("adaptive", "cloud-only")
    )
    result = fleet.run_fleet(cfg, tmp_path)
    servers = result["servers"]
    killed = servers[-1]
    for name, s in result["strategies"].items():
        assert s["failed"] == 0, name
        assert s["requests"] == s["completed"] > 0, name
        assert s["completed"] == s["local"] + sum(s["by_server"].values()), name  # every request accounted
        assert s["after_kill_on_killed"] == 0, name
    cloud = result["strategies"]["cloud-only"]
    assert cloud["local"] == 0 or cloud["fallbacks"] == cloud["local"]
    assert cloud["by_server"][killed] > 0  # it served before the kill ...
    assert cloud["moved"] > 0  # ... and its devices' requests moved to the survivor
    assert result["verdict"]["failed"] == 0
    assert {seg["killed"] for seg in result["segments"]} == {killed}
