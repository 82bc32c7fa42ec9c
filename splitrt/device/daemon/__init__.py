"""The device daemon (``splitrt daemon --config FILE``), one concern a module: :mod:`.config` (the TOML
file -> ``DaemonConfig``), :mod:`.costs` (which cost table a model is planned with), :mod:`.api` (the
local gRPC API for apps and its client ``LocalClient``), :mod:`.metrics` (Prometheus text) and
:mod:`.process` (``Daemon``: build the runtimes, start, drain; ``run()``: the process, its signals).
The public names of each are re-exported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.device.daemon.api import LocalClient, LocalResult
    from splitrt.device.daemon.config import MODEL_KEYS, TOP_KEYS, DaemonConfig, ModelConfig, load_config, parse_config
    from splitrt.device.daemon.costs import HOST_GFLOPS, profiles_dir, select_cost_table
    from splitrt.device.daemon.process import Daemon, run

_NAMES = {
    "LocalClient": "api",
    "LocalResult": "api",
    "DaemonConfig": "config",
    "ModelConfig": "config",
    "load_config": "config",
    "parse_config": "config",
    "TOP_KEYS": "config",
    "MODEL_KEYS": "config",
    "HOST_GFLOPS": "costs",
    "profiles_dir": "costs",
    "select_cost_table": "costs",
    "Daemon": "process",
    "run": "process",
    "api": "",
    "config": "",
    "costs": "",
    "metrics": "",
    "process": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
