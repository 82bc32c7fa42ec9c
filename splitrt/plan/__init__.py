"""The pure decision core: cost model, exact solvers (cut × codec, any number of tiers, DADS min-cut), link and
load estimators, the controller. No sockets, sessions, files or clock reads: every time is passed in
(``now_s``), so the daemon, the rig, the simulator and the tests drive the same code and a decision
log replays. Imports only ``splitrt.errors`` (and numpy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.plan.controller import Controller, ControllerConfig, Decision, Policy, parse_policy
    from splitrt.plan.correction import CorrectionConfig, Corrections, Observation
    from splitrt.plan.costmodel import Conditions, CostTable, Link, Power
    from splitrt.plan.netmon import LinkConfig, LinkEstimate, LinkEstimator, LoadConfig, LoadEstimate, LoadEstimator
    from splitrt.plan.path import PathConditions, Plan, evaluate_path, parse_path, solve_path
    from splitrt.plan.queueing import QueueConfig, QueueEstimator, expected_wait_ms
    from splitrt.plan.replay import replay
    from splitrt.plan.solver import evaluate, parse_plan, solve

_NAMES = {
    "Controller": "controller",
    "ControllerConfig": "controller",
    "Decision": "controller",
    "Policy": "controller",
    "parse_policy": "controller",
    "replay": "replay",
    "CorrectionConfig": "correction",
    "Corrections": "correction",
    "Observation": "correction",
    "Conditions": "costmodel",
    "CostTable": "costmodel",
    "Link": "costmodel",
    "Power": "costmodel",
    "LinkConfig": "netmon",
    "LinkEstimate": "netmon",
    "LinkEstimator": "netmon",
    "LoadConfig": "netmon",
    "LoadEstimate": "netmon",
    "LoadEstimator": "netmon",
    "QueueConfig": "queueing",
    "QueueEstimator": "queueing",
    "expected_wait_ms": "queueing",
    "PathConditions": "path",
    "Plan": "path",
    "evaluate_path": "path",
    "parse_path": "path",
    "solve_path": "path",
    "evaluate": "solver",
    "parse_plan": "solver",
    "solve": "solver",
    "balance": "",
    "controller": "",
    "correction": "",
    "costmodel": "",
    "mincut": "",
    "netmon": "",
    "observe": "",
    "path": "",
    "queueing": "",
    "solver": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
