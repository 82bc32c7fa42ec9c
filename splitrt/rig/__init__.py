"""Hardware in the loop: network namespaces, kernel link shaping from real traces, CPU throttling,
the benchmark's worker processes and statistics, and the pure trace-driven simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.rig.bench import BenchConfig, run_bench
    from splitrt.rig.fleet import FleetConfig, run_fleet
    from splitrt.rig.harness import Rig, RigConfig

_NAMES = {
    "BenchConfig": "bench",
    "run_bench": "bench",
    "Rig": "harness",
    "RigConfig": "harness",
    "bench": "",
    "cgroup": "",
    "harness": "",
    "netns": "",
    "shaper": "",
    "sim": "",
    "stats": "",
    "traces": "",
    "worker": "",
    "calibration": "",
    "cloudserver": "",
    "link": "",
    "loads": "",
    "models": "",
    "processes": "",
    "quota": "",
    "tracespec": "",
    "FleetConfig": "fleet",
    "run_fleet": "fleet",
    "fleet": "",
    "fleetnet": "",
    "fleetstats": "",
    "fleetworker": "",
    "owners": "",  # listed, else `from splitrt.rig import owners` resolves through the legacy harness
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="harness")
