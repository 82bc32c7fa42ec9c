"""The adaptive runtime (``AdaptiveDevice``): per request, plan -> head -> the route's servers (or here) ->
outputs, never lost, and what each request teaches the estimators.

:mod:`.adaptive` (``AdaptiveDevice``; its contract in the docstring), :mod:`.config` (``RuntimeConfig``),
:mod:`.outcome` (``Outcome``), :mod:`.shapeplans` (a plan per request shape), :mod:`.clouds` (the servers and
their health), :mod:`.balancer` (their order per request), :mod:`.hops` (tiers past the first),
:mod:`.dispatch` (a head's output along the route, with failover), :mod:`.deadline` (the RPC's budget),
:mod:`.feedback` (what a request says, for ``plan.observe`` and the corrections), :mod:`.prober` (the
background probes). The public names of each are re-exported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.device.runtime.adaptive import AdaptiveDevice, status_json
    from splitrt.device.runtime.config import RuntimeConfig
    from splitrt.device.runtime.outcome import Outcome, tier_name
    from splitrt.device.runtime.prober import IDLE_WAIT_ROUNDS, slow_start_after_idle

_NAMES = {
    "AdaptiveDevice": "adaptive",
    "status_json": "adaptive",
    "RuntimeConfig": "config",
    "Outcome": "outcome",
    "tier_name": "outcome",
    "IDLE_WAIT_ROUNDS": "prober",
    "slow_start_after_idle": "prober",
    "adaptive": "",
    "balancer": "",
    "clouds": "",
    "config": "",
    "deadline": "",
    "dispatch": "",
    "feedback": "",
    "hops": "",
    "outcome": "",
    "prober": "",
    "shapeplans": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
