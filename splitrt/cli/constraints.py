"""The deployment-constraint flags shared by `splitrt plan` and `splitrt run` (``plan.constraints``)."""

from __future__ import annotations

import argparse
from typing import Any

from splitrt.plan.constraints import Constraints


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("constraints (cuts the plans may use)")
    g.add_argument(
        "--min-head-flops",
        type=float,
        default=0.0,
        metavar="F",
        help="privacy floor: the device computes at least this share (0-1) of the model's FLOPs "
        "before anything leaves it (rules out cloud)",
    )
    g.add_argument(
        "--no-raw-input",
        action="store_true",
        help="privacy floor: no plan sends a graph input (the raw data) off the device",
    )
    g.add_argument(
        "--device-memory-mb",
        default=None,
        metavar="MB|board",
        help="memory ceiling: heads whose weights + peak activations exceed MB are infeasible "
        "('board': the board file's memory_mb)",
    )


def constraints(args: argparse.Namespace, board: Any) -> Constraints:
    from splitrt.profile.cutfacts import memory_mb

    return Constraints(
        min_head_flops_fraction=args.min_head_flops,
        no_raw_input=args.no_raw_input,
        device_memory_mb=memory_mb(args.device_memory_mb, board),
    )
