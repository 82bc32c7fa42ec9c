"""Issue 5 figures: controller overhead per request (estimate update + re-plan) and flapping.

    python bench/bench_controller.py [--model densenet121] [--calls 2000] [--json]

Target: < 0.2 ms per request on densenet121 (all cuts). Also prints, from a replayed synthetic link,
how many requests the controller needs to follow a 20x drop of bandwidth across the table's slowest plan
boundary (the estimator's share of them, then the controller's), and how often it switches under
stationary +-20 % noise. A drop that keeps the plan measures nothing: the bench stops with an error then.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.controller import Controller
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.netmon import LinkEstimator, LoadEstimate, LoadEstimator
from splitrt.plan.solver import solve, sweep
from splitrt.profile import profiler
from splitrt.profile.priors import flops_table

ROOT = Path(__file__).resolve().parent.parent


def table_for(name: str) -> tuple[CostTable, str]:
    path = zoo.get(name)
    shipped = sorted((ROOT / "profiles").glob(f"*__{name}.json"))
    if shipped:
        prof = profiler.load_profile(shipped[0], sha256=graph.file_sha256(path))
        return profiler.cost_table(prof, prof, device_speed_factor=5.2, min_agreement=0.0), shipped[
            0
        ].name + " (rpi4 x5.2)"
    return flops_table(graph.load(path), device_gflops=15, cloud_gflops=80), "FLOPs prior"


def overhead(table: CostTable, calls: int) -> dict[str, float]:
    ctl = Controller(table)
    link = LinkEstimator()
    load = LoadEstimator()
    rng = np.random.default_rng(0)
    times = []
    for i in range(calls):
        now = i * 0.05
        t0 = time.perf_counter()
        link.add_transfer(now, 200_000, 200_000 * 8 / (rng.uniform(4, 6) * 1e6))
        load.add_cloud(now, queue_wait_s=0.001, profiled_tail_s=0.02, tail_s=0.02)
        ctl.decide(now, link.estimate(now), load.estimate(now), request=str(i))
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "p99_ms": float(np.percentile(times, 99)), "cuts": len(table)}


#: The step is a drop of this factor (20 -> 1 Mbit/s), placed across the table's slowest plan boundary.
STEP = 20.0


def follow_and_flap(table: CostTable) -> dict[str, Any]:
    """How many requests the controller needs to follow a ``STEP``-fold drop of bandwidth across the fp32
    sweep's slowest boundary (where the best plan changes: a drop that stays inside one band measures
    nothing), split into the estimator's lag (requests until the estimate is below the boundary) and the
    controller's own (hysteresis beyond it); and how often it switches under +-20 % noise."""
    idle = LoadEstimate(device_factor=1.0, cloud_factor=1.0)

    def run(bws: list[float], noise: float, seed: int) -> tuple[list[str], list[float]]:
        rng = np.random.default_rng(seed)
        ctl, link = Controller(table), LinkEstimator()
        plans, ests = [], []
        for i, bw in enumerate(bws):
            now = i * 0.1
            e = link.estimate(now)
            plans.append(ctl.decide(now, e, idle).plan)
            ests.append(e.bandwidth_mbps)
            sent = 300_000
            link.add_transfer(now, sent, sent * 8 / (bw * (1 + rng.uniform(-noise, noise)) * 1e6))
            link.add_rtt(now, 30.0)
        return plans, ests

    bands = sweep(table, Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=30.0)), codecs=["fp32"])
    boundaries = [b.from_mbps for b in bands[1:]]
    if not boundaries:
        raise SystemExit(f"no plan boundary in the sweep ({bands[0].plan} everywhere): no step to follow")
    edge = boundaries[0]
    hi, lo = edge * STEP**0.5, edge / STEP**0.5
    plans, ests = run([hi] * 50 + [lo] * 50, 0.0, 1)
    target = solve(table, Conditions(link=Link(bandwidth_mbps=lo, rtt_ms=30.0)), codecs=["fp32"]).key
    before = plans[49]
    if before == target:
        raise SystemExit(f"the step {hi:.3g} -> {lo:.3g} Mbit/s keeps plan {target}: it measures nothing")
    seen = next(i for i in range(50, 100) if ests[i] < edge) - 50
    followed = next(i for i in range(50, 100) if plans[i] == target) - 50
    # Noise is worst right at a boundary where the best plan changes: centre the noise there too.
    switches = []
    for bw in (1.0, 3.0, 8.0, 20.0, *boundaries):
        p, _ = run([bw] * 1000, 0.2, int(bw * 10))
        switches.append(sum(a != b for a, b in itertools.pairwise(p[10:])) / 9.9)
    return {
        "step_mbps": f"{hi:.3g} -> {lo:.3g}",
        "step_plans": f"{before} -> {target}",
        "requests_to_follow_step": followed,
        "requests_estimate_lag": seen,
        "requests_controller_lag": followed - seen,
        "boundaries_mbps": [round(b, 2) for b in boundaries],
        "max_switches_per_100_noise20": max(switches),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="densenet121")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table, source = table_for(args.model)
    print(f"cost table: {source}", file=sys.stderr)
    row = {"model": args.model, **overhead(table, args.calls), **follow_and_flap(table)}
    if args.json:
        print(json.dumps(row))
        return 0
    print(
        render(
            [
                "model",
                "cuts",
                "decide median ms",
                "p99 ms",
                "20x step Mbit/s",
                "plans",
                "requests to follow",
                "of which estimate",
                "of which controller",
                "switches/100 at +-20%",
                "boundaries Mbit/s",
            ],
            [
                (
                    row["model"],
                    row["cuts"],
                    row["median_ms"],
                    row["p99_ms"],
                    row["step_mbps"],
                    row["step_plans"],
                    row["requests_to_follow_step"],
                    row["requests_estimate_lag"],
                    row["requests_controller_lag"],
                    row["max_switches_per_100_noise20"],
                    " ".join(map(str, row["boundaries_mbps"])),
                )
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
