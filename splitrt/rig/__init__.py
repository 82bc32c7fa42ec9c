"""Hardware in the loop: one rig for every topology (a path of tiers: devices, then server tiers) in
network namespaces, kernel link shaping from real traces, CPU throttling, one typed worker protocol, one
runner and one report; and the pure trace-driven simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.rig.bench import BenchConfig, FleetConfig, TierBenchConfig, run_bench, run_fleet, run_tiers
    from splitrt.rig.harness import Rig, RigConfig, Tier

_NAMES = {
    "BenchConfig": "bench",
    "TierBenchConfig": "bench",
    "FleetConfig": "bench",
    "run_bench": "bench",
    "run_tiers": "bench",
    "run_fleet": "bench",
    "Rig": "harness",
    "RigConfig": "harness",
    "Tier": "harness",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="harness")
