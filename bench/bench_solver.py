"""Solver speed and min-cut agreement.

1. Re-plan time with a profile already loaded: ``solver.solve`` on every cut of a model (densenet121 by
   default), median and p90 of 1000 calls, per objective; also 3 tiers (``solve_path`` per objective,
   one codec on both hops as the controller plans them), one ``Controller.decide`` for 2 and for 3 tiers,
   and the sweep. The load average is printed with the
   table: this host may be busy with other work.
2. DADS min-cut vs exhaustive enumeration of every down-closed head on random small DAGs (agreement
   count), and min-cut vs the best candidate cut on the model's real DAG.

    .venv/bin/python bench/bench_solver.py [--model densenet121] [--calls 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import mincut, solver
from splitrt.plan.controller import Controller, ControllerConfig
from splitrt.plan.costmodel import Conditions, Link
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.path import PathConditions, solve_path
from splitrt.profile import profiler

ROOT = Path(__file__).resolve().parent.parent


def _timeit(fn, calls: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), float(np.percentile(ts, 90))


def random_dag(rng: random.Random, n: int) -> mincut.Dag:
    preds = [[]] + [sorted(rng.sample(range(v), rng.randint(1 if v else 0, min(v, 3)))) for v in range(1, n)]
    cons: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for p in ps:
            cons[p].append(v)
    tensors = [mincut.DagTensor(name="x", bytes=rng.randint(1, 10**6), producer=-1, consumers=(0,))]
    for v in range(n):
        tensors.append(
            mincut.DagTensor(
                name=f"t{v}",
                bytes=rng.randint(1, 10**6),
                producer=v,
                consumers=tuple(cons[v]),
                is_output=not cons[v],
            )
        )
    return mincut.Dag(
        device_ms=tuple(rng.uniform(0, 50) for _ in range(n)),
        cloud_ms=tuple(rng.uniform(0, 10) for _ in range(n)),
        tensors=tuple(tensors),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="densenet121")
    ap.add_argument("--profile", default=None, help="default: profiles/<host class>__<model>.json")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--dags", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = Path(args.profile or ROOT / "profiles" / f"{profiler.host_class()}__{args.model}.json")
    g = graph.load(zoo.get(args.model))
    prof = profiler.load_profile(path, sha256=g.sha256)
    table = profiler.cost_table(prof, prof, device_speed_factor=5.2, min_agreement=0.0)
    cond = Conditions(link=Link(bandwidth_mbps=20.0, rtt_ms=30.0), device_load=1.3, cloud_load=1.1)
    rows: list[dict[str, object]] = []
    for objective in solver.OBJECTIVES:
        med, p90 = _timeit(lambda o=objective: solver.solve(table, cond, objective=o), args.calls)
        rows.append({"what": f"solve {objective}", "cuts": len(table), "median_ms": med, "p90_ms": p90})
    chain_cond = PathConditions(
        hops=(Link(bandwidth_mbps=100.0, rtt_ms=2.0), Link(bandwidth_mbps=20.0, rtt_ms=30.0)), loads=(1.0, 1.0, 1.0)
    )
    edge = profiler.cost_table(prof, prof, device_speed_factor=1.0, min_agreement=0.0)
    for objective in solver.OBJECTIVES:
        # throughput is a max of stages, not separable: O(cuts²), fewer calls
        calls = args.calls if objective != "throughput" else max(args.calls // 50, 5)
        med, p90 = _timeit(
            lambda o=objective: solve_path((table, edge, edge), chain_cond, objective=o, same_codec=True), calls
        )
        rows.append({"what": f"solve_path {objective} (3 tiers)", "cuts": len(table), "median_ms": med, "p90_ms": p90})
    hop1 = LinkEstimate(bandwidth_mbps=100.0, rtt_ms=2.0, confidence=1.0)
    hop2 = LinkEstimate(bandwidth_mbps=20.0, rtt_ms=30.0, confidence=1.0)
    load = LoadEstimate(device_factor=1.3, cloud_factor=1.1)
    two = Controller(table, ControllerConfig(codecs=None))
    med, p90 = _timeit(lambda: two.decide(0.0, hop2, load), args.calls)
    rows.append({"what": "Controller.decide (2 tiers)", "cuts": len(table), "median_ms": med, "p90_ms": p90})
    three = Controller((table, edge, edge), ControllerConfig(codecs=None))
    med, p90 = _timeit(lambda: three.decide(0.0, (hop1, hop2), load), args.calls)
    rows.append({"what": "Controller.decide (3 tiers)", "cuts": len(table), "median_ms": med, "p90_ms": p90})
    med, p90 = _timeit(lambda: solver.sweep(table, cond), 3)
    rows.append({"what": "sweep 0.1-1000 Mbit/s", "cuts": len(table), "median_ms": med, "p90_ms": p90})
    d = profiler.dag(g, prof, prof, device_speed_factor=5.2)
    fp32 = Conditions(link=cond.link, device_load=cond.device_load, cloud_load=cond.cloud_load)
    med, p90 = _timeit(lambda: mincut.best_head(d, fp32), 5)
    rows.append({"what": "min-cut (Dinic) on the node DAG", "cuts": len(d.device_ms), "median_ms": med, "p90_ms": p90})

    load_avg = os.getloadavg()
    # agreement on random DAGs
    rng = random.Random(1)
    agree = 0
    worse_than_prefix = 0
    for _ in range(args.dags):
        dag = random_dag(rng, rng.randint(2, 10))
        c = Conditions(link=Link(bandwidth_mbps=rng.uniform(0.5, 200), rtt_ms=rng.uniform(0, 50)))
        mc, ex = mincut.best_head(dag, c), mincut.best_by_enumeration(dag, c)
        agree += abs(mc.latency_ms - ex.latency_ms) <= 1e-9 * max(1.0, ex.latency_ms)
        worse_than_prefix += mc.latency_ms > mincut.best_prefix(dag, c).latency_ms + 1e-9
    real_mc = mincut.best_head(d, fp32)
    real_prefix = mincut.best_prefix(d, fp32)
    agreement = {
        "random_dags": args.dags,
        "min_cut_equals_enumeration": agree,
        "min_cut_worse_than_best_prefix": worse_than_prefix,
        "model": args.model,
        "model_min_cut_ms": real_mc.latency_ms,
        "model_best_prefix_ms": real_prefix.latency_ms,
    }
    if args.json:
        print(
            json.dumps(
                {"timings": rows, "agreement": agreement, "load_avg": load_avg, "cpus": os.cpu_count()}, indent=1
            )
        )
        return 0
    print(f"{'what':<34}{'cuts/nodes':>11}{'median ms':>12}{'p90 ms':>10}")
    for r in rows:
        print(f"{r['what']:<34}{r['cuts']:>11}{r['median_ms']:>12.4f}{r['p90_ms']:>10.4f}")
    print(f"load average {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f} on {os.cpu_count()} CPUs")
    print()
    print(
        f"min-cut == enumeration on {agree}/{args.dags} random DAGs (2-10 nodes); "
        f"worse than best prefix: {worse_than_prefix}"
    )
    print(
        f"{args.model}: min-cut {real_mc.latency_ms:.2f} ms vs best candidate cut {real_prefix.latency_ms:.2f} ms "
        "(additive fp32 model)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
