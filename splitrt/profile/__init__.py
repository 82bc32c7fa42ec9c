"""What compute costs on a machine: measured profiles (onnxruntime), FLOP priors before profiling,
board descriptors (``devices/*.toml``) and power readers (measured energy). Turns them into the plan's
``CostTable``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.profile.boards import Board, load_board
    from splitrt.profile.priors import flops_table
    from splitrt.profile.profiler import Profile, cost_table, load_profile, measure, save_profile

_NAMES = {
    "Board": "boards",
    "load_board": "boards",
    "flops_table": "priors",
    "Profile": "profiler",
    "cost_table": "profiler",
    "load_profile": "profiler",
    "measure": "profiler",
    "save_profile": "profiler",
    "boards": "",
    "priors": "",
    "profiler": "",
    "energy": "",
    "power": "",
    "power_select": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
