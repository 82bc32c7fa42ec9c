"""Issue 5 figures: controller overhead per request (estimate update + re-plan) and flapping.

    python bench/bench_controller.py [--model densenet121] [--calls 2000] [--json]

Target: < 0.2 ms per request on densenet121 (all cuts). Also prints, from a replayed synthetic link,
how many requests the controller needs to follow a 20 -> 1 Mbit/s step once the estimate shows it, and
how often it switches under stationary +-20 % noise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

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


def follow_and_flap(table: CostTable) -> dict[str, float]:
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

    plans, ests = run([20.0] * 50 + [1.0] * 50, 0.0, 1)
    target = solve(table, Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=30.0)), codecs=["fp32"]).key
    reflect = next(i for i in range(50, 100) if abs(ests[i] - 1.0) <= 0.1)
    follow = next(i for i in range(reflect, 100) if plans[i] == target) - reflect
    before = plans[49]
    # Noise is worst right at a boundary where the best plan changes: centre the noise there too.
    bands = sweep(table, Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=30.0)), codecs=["fp32"])
    boundaries = [b.from_mbps for b in bands[1:]]
    switches = []
    for bw in (1.0, 3.0, 8.0, 20.0, *boundaries):
        p, _ = run([bw] * 1000, 0.2, int(bw * 10))
        switches.append(sum(a != b for a, b in itertools.pairwise(p[10:])) / 9.9)
    return {
        "step_plans": f"{before} -> {target}",
        "requests_to_follow_step": follow,
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
                "20->1 Mbit/s step",
                "requests to follow",
                "switches/100 at +-20%",
                "boundaries Mbit/s",
            ],
            [
                (
                    row["model"],
                    row["cuts"],
                    row["median_ms"],
                    row["p99_ms"],
                    row["step_plans"],
                    row["requests_to_follow_step"],
                    row["max_switches_per_100_noise20"],
                    " ".join(map(str, row["boundaries_mbps"])),
                )
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
