"""Which cost table a model is planned with (shared with ``splitrt run``, ``stream`` and ``plan
--explain``: :func:`select_cost_table`), and the daemon's constraints applied to it.

- ``select_cost_table(graph, *, profile_device, profile_cloud, board, directory=None, codecs=None,
  min_agreement=0.99) -> (CostTable, source)``: ``splitrt.profile.tables.build`` (both profiles, else
  ``profiles/*__<stem>.json`` matching the sha256 ($SPLITRT_PROFILES_DIR), else the FLOPs prior; the board's
  speed applied the same way in each case; lossy codecs guarded at ``min_agreement``), pricing every codec
  of ``codecs`` (:func:`priced`): a codec the profiles lack is a ``ConfigError`` at start (and at
  ``splitrt daemon --check``) naming it, the profile and what the profile prices; a FLOPs prior prices it
  at its quantisation's fixed ratio, as ``splitrt run`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt import paths
from splitrt.errors import ConfigError
from splitrt.profile.accuracy import MIN_AGREEMENT
from splitrt.profile.tables import HOST_GFLOPS

__all__ = ["HOST_GFLOPS", "PROFILES_ENV", "constrained", "priced", "profiles_dir", "select_cost_table"]

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
    codecs: Sequence[str] | None = None,
    min_agreement: float = MIN_AGREEMENT,
    name: str = "the model",
) -> tuple[Any, str]:
    """``(CostTable, where it came from)``: ``splitrt.profile.tables.build`` (the one table every command
    uses: the board's speed applied to any device profile not measured on that board), pricing ``codecs``."""
    from splitrt.profile import tables

    c = tables.build(
        mg, device=profile_device, cloud=profile_cloud, board=board, directory=directory, min_agreement=min_agreement
    )
    return priced(c, codecs or (), min_agreement, name), c.source


def priced(costs: Any, codecs: Sequence[str], min_agreement: float, name: str = "the model") -> Any:
    """``costs.table`` (a ``tables.Costs``) pricing every codec in ``codecs``. A measured table that lacks
    one cannot price it (its ratios, times and output agreement are the profile's measurements): a
    ``ConfigError`` says which, which profile, and what it prices. A FLOPs prior prices it at its
    quantisation's fixed ratio (``tables.with_codecs``: every figure of a prior is an estimate). A lossy
    codec the accuracy guard allows at no cut is logged: plans never use it."""
    from splitrt.profile import tables
    from splitrt.profile.costs import guard_note

    table = costs.table
    missing = [c for c in codecs if c not in table.codecs]
    if missing and costs.kind == "prior":
        log.info("%s: codecs %s priced at their quantisation's fixed ratio (%s)", name, missing, costs.source)
        return tables.with_codecs(table, missing)
    if missing:
        where = costs.source.split(";")[0]
        raise ConfigError(
            f"{name}: key 'codecs': expected codecs its profile prices ({', '.join(table.codecs)}), got "
            f"{', '.join(repr(c) for c in missing)}, which {where} does not measure; choose among those, or "
            "re-measure the profile's codecs (splitrt profile MODEL --codec-ratios-only --out PROFILE)"
        )
    if costs.device_profile is not None and min_agreement > 0:
        allowed: dict[str, list[str]] = guard_note(costs.device_profile, min_agreement=min_agreement)["allowed_cuts"]  # type: ignore[assignment]
        never = [c for c in codecs if c in allowed and not allowed[c]]
        if never:
            log.warning(
                "%s: codecs %s are used at no cut: the accuracy guard allows a lossy codec only where the "
                "profile's samples agreed >= min_agreement %g (%s)",
                name,
                never,
                min_agreement,
                costs.source.split("; ")[-1],
            )
    return table


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
