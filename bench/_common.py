"""Helpers shared by the benchmarks: progress lines, and the grids (bench_rig_grid.py, bench_sim.py).

Imported as ``_common`` with the bench folder on ``sys.path``: running a script puts it there; a test that
loads a script by its file path puts it there first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

from splitrt.rig.bench import TRACE_SETS
from splitrt.rig.processes import free_port as free_port  # re-exported: the one copy


def progress(tag: str, msg: str) -> None:
    """One progress line on stderr (stdout carries the table or the JSON)."""
    print(f"[{tag}] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def prediction_figures(measured: list[float], predicted: list[float]) -> dict[str, float]:
    """One plan's requests (issue 34): the median of |m - p| / m, the noise floor (the median of
    |m - median(m)| / m: what the best constant prediction in hindsight scores, so an error near it is the
    emulation's noise, not the cost model's) and the bias, median(m) / median(p) (1: none)."""
    mid = statistics.median(measured)
    return {
        "n": len(measured),
        "median_err": statistics.median(abs(m - p) / m for m, p in zip(measured, predicted, strict=True)),
        "floor": statistics.median(abs(m - mid) / m for m in measured),
        "ratio": mid / statistics.median(predicted),
        "median_measured_ms": mid,
        "median_predicted_ms": statistics.median(predicted),
    }


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The acceptance grid's options, shared by ``bench/bench_rig_grid.py`` and ``bench/bench_sim.py``:
    every shipped HSDPA trace x resnet50, inception_v1 on rpi4 x bandwidth scale 1, 5 x load none,
    device-burst by default."""
    p.add_argument(
        "--traces",
        default="tuned",
        help="comma-separated shipped traces, or 'tuned' (the HSDPA traces the controller was tuned on) "
        "or 'heldout' (HSDPA traces never used for tuning)",
    )
    p.add_argument("--models", default="resnet50,inception_v1")
    p.add_argument("--scales", default="1,5")
    p.add_argument("--loads", default="none,device-burst")
    p.add_argument("--board", default="rpi4")


#: (models, bandwidth scales, loads) per part of a grid, each over every trace.
Groups = tuple[tuple[tuple[str, ...], tuple[float, ...], tuple[str, ...]], ...]


def grid_cells(args: argparse.Namespace, groups: Groups = ()) -> list[tuple[str, str, float, str]]:
    """(trace, model, bandwidth scale, load) of every cell, in the order the tables print them: the product
    of ``--models``, ``--scales`` and ``--loads``; with ``groups`` (a grid of parts), the parts' cells, and
    those options (when given) pick some of them."""
    names = [t for item in args.traces.split(",") for t in TRACE_SETS.get(item, (item,))]
    if not groups:
        scales = [float(x) for x in args.scales.split(",")]
        return list(itertools.product(names, args.models.split(","), scales, args.loads.split(",")))
    cells = [
        (t, m, sc, ld)
        for t in names
        for models, scales_, loads in groups
        for m, sc, ld in itertools.product(models, scales_, loads)
    ]
    pick = {
        1: args.models and set(args.models.split(",")),
        2: args.scales and {float(x) for x in args.scales.split(",")},
        3: args.loads and set(args.loads.split(",")),
    }
    return [c for c in cells if all(not want or c[k] in want for k, want in pick.items())]


def run_commit() -> str:
    """The checkout's commit (marked when its code has changes), for a benchmark's JSON: results name the code
    that produced them (``bench/render_results.py`` prints it beside the one it renders at)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")
