"""Which cost table a model is planned with (shared with ``splitrt run``, ``stream`` and ``plan
--explain``: :func:`select_cost_table`), and the daemon's constraints applied to it.

- ``select_cost_table(graph, *, profile_device, profile_cloud, board, directory=None) -> (CostTable, source)``:
  both profiles, else ``profiles/*__<stem>.json`` matching the sha256 ($SPLITRT_PROFILES_DIR), else
  ``flops_table`` at ``HOST_GFLOPS / board.cpu_speed_factor``. ``splitrt run --count`` uses it too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt import paths
from splitrt.errors import ConfigError, ProfileError

if TYPE_CHECKING:
    from splitrt.device.daemon.config import DaemonConfig

log = logging.getLogger("splitrt.device.daemon")

#: GFLOP/s of the build host that measured profiles/ (resnet50: 8.2 GFLOP in ~94 ms, squeezenet 0.7
#: GFLOP in ~6.4 ms): the FLOPs prior's reference, divided by a board's cpu_speed_factor.
HOST_GFLOPS = 80.0
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
    """``(CostTable, where it came from)``: both profiles when given; else a shipped profile of this
    model (``<hostclass>__<stem>.json`` matching its sha256; this host class first) as device and cloud,
    head times scaled by the board's ``cpu_speed_factor``; else the FLOPs prior (``priors.flops_table``)."""
    from splitrt.profile import priors, profiler

    factor = float(board.cpu_speed_factor) if board is not None else 1.0
    if (profile_device is None) != (profile_cloud is None):
        raise ConfigError(
            "profiles: expected both a device and a cloud profile, got only "
            f"{'the device' if profile_cloud is None else 'the cloud'} one"
        )
    if profile_device is not None and profile_cloud is not None:
        dev = profiler.load_profile(profile_device, sha256=mg.sha256)
        cloud = profiler.load_profile(profile_cloud, sha256=mg.sha256)
        return profiler.cost_table(dev, cloud), f"profiles {profile_device} (device) and {profile_cloud} (cloud)"
    d = directory or profiles_dir()
    stem = Path(mg.path).stem
    candidates = sorted(d.glob(f"*__{stem}.json")) if d.is_dir() else []
    mine = f"{profiler.host_class()}__{stem}.json"
    candidates.sort(key=lambda p: p.name != mine)
    for path in candidates:
        try:
            prof = profiler.load_profile(path, sha256=mg.sha256)
        except ProfileError:
            continue  # another model of the same name
        scaled = f", device head times x{factor:g} (board {board.name})" if board is not None else ""
        return profiler.cost_table(prof, prof, device_speed_factor=factor), f"shipped profile {path}{scaled}"
    table = priors.flops_table(mg, device_gflops=HOST_GFLOPS / factor, cloud_gflops=HOST_GFLOPS)
    return table, (
        f"FLOPs prior (device {HOST_GFLOPS / factor:g} GFLOP/s, cloud {HOST_GFLOPS:g} GFLOP/s): "
        f"no profile of {stem} in {d}"
    )


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
