"""Which cost table a model is planned with (shared with ``splitrt run``, ``stream`` and ``plan
--explain``: :func:`select_cost_table`), and the daemon's constraints applied to it.

- ``select_cost_table(graph, *, profile_device, profile_cloud, board, directory=None) -> (CostTable, source)``:
  ``splitrt.profile.tables.build`` (both profiles, else ``profiles/*__<stem>.json`` matching the sha256
  ($SPLITRT_PROFILES_DIR), else the FLOPs prior; the board's speed applied the same way in each case).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt import paths
from splitrt.profile.tables import HOST_GFLOPS

__all__ = ["HOST_GFLOPS", "PROFILES_ENV", "constrained", "profiles_dir", "select_cost_table"]

if TYPE_CHECKING:
    from splitrt.device.daemon.config import DaemonConfig

log = logging.getLogger("splitrt.device.daemon")

PROFILES_ENV = paths.PROFILES_ENV


def profiles_dir() -> Path:
    """$SPLITRT_PROFILES_DIR, else the checkout's ``profiles/``."""
    return paths.profiles_dir()


def select_cost_table(
    mg: Any,
    *,
    profile_device: Path | None = None,
    profile_cloud: Path | None = None,
    board: Any = None,
    directory: Path | None = None,
) -> tuple[Any, str]:
    """``(CostTable, where it came from)``: ``splitrt.profile.tables.build`` (the one table every command
    uses: the board's speed applied to any device profile not measured on that board)."""
    from splitrt.profile import tables

    c = tables.build(mg, device=profile_device, cloud=profile_cloud, board=board, directory=directory)
    return c.table, c.source


def constrained(controller: Any, mg: Any, table: Any, config: DaemonConfig, board: Any, name: str) -> Any:
    """The ``ControllerConfig`` with the constraints' allowed cuts (the device's cut, on any path of tiers),
    and the split-vs-route verdict logged once."""
    from dataclasses import replace

    from splitrt.plan import explain
    from splitrt.plan.constraints import Constraints
    from splitrt.plan.costmodel import DEFAULT_POWER
    from splitrt.profile.cutfacts import allowed_for, memory_mb

    cons = Constraints(
        min_head_flops_fraction=config.min_head_flops,
        no_raw_input=config.no_raw_input,
        device_memory_mb=memory_mb(config.device_memory_mb, board),
    )
    allowed = allowed_for(mg, table, cons)
    cuts = allowed.cuts if allowed is not None else None
    if allowed is not None:
        log.info("model %s: %s", name, allowed.note())
    v = explain.explain(
        table,
        rtt_ms=40.0,
        power=board.power if board is not None else DEFAULT_POWER,
        codecs=config.codecs,
        cuts=cuts,
        objectives=(config.objective,),
    )
    log.info("model %s: split vs route (%s): %s", name, "details: splitrt plan MODEL --explain", v.summary)
    return controller if cuts is None else replace(controller, cuts=cuts)
