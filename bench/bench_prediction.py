"""How well the cost model predicts what a request really costs, per plan, on the rig (issue 34).

Runs the rig (`splitrt bench`'s runner: an emulated board, a shaped kernel link, a real server) on one
trace window and, for every plan a strategy used, prints the median of |measured - predicted| / measured
of end-to-end latency over its requests (predicted: the decision's ``predicted_ms``, what the controller
planned with), with a 95 % bootstrap interval, the medians of both figures and the load average.
Fallbacks and failed requests are left out (their time is a timeout, not the plan's).

The same script runs against an older checkout (``PYTHONPATH=/tmp/base python bench/bench_prediction.py``):
it uses only the runner's records, which every version has.

    .venv/bin/python bench/bench_prediction.py [--model resnet50] [--trace hsdpa/car] [--offset 123]
        [--duration 24] [--load device-burst] [--strategies adaptive,route] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from splitrt.cli import bench as cmd_bench
from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench
from splitrt.rig import harness as rig
from splitrt.rig import runner
from splitrt.rig.tracespec import family_median_mbps, load_trace, trace_family


def errors_by_plan(records: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Per (strategy, plan): n, median relative error and its 95 % bootstrap interval, median figures."""
    rows = []
    rng = np.random.default_rng(0)
    for name, recs in records.items():
        by_plan: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in recs:
            if r.error or r.fallback or not np.isfinite(r.predicted_ms) or r.latency_ms <= 0:
                continue
            by_plan[r.plan].append((r.latency_ms, r.predicted_ms))
        for plan, pairs in sorted(by_plan.items(), key=lambda kv: -len(kv[1])):
            m = np.array([a for a, _ in pairs])
            p = np.array([b for _, b in pairs])
            err = np.abs(m - p) / m
            boots = [float(np.median(rng.choice(err, err.size))) for _ in range(1000)]
            rows.append(
                {
                    "strategy": name,
                    "plan": plan,
                    "n": int(err.size),
                    "median_err": float(np.median(err)),
                    "ci": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))],
                    "median_measured_ms": float(np.median(m)),
                    "median_predicted_ms": float(np.median(p)),
                    "bias": float(np.median((p - m) / m)),
                }
            )
    return rows


def measured_terms(r: Any) -> dict[str, float]:
    """A record's measured time by the terms of ``protocol.predicted_terms``: the server's (tail, queue)
    as it reports them; the wire is the rest of the call (round trip, transfers, the reply parsed)."""
    server = r.tail_ms + r.queue_ms
    return {
        "head": r.head_ms,
        "encode": r.encode_ms,
        "wire": max(0.0, r.rpc_ms + r.decode_ms - server),
        "server": server,
    }


def terms_by_plan(records: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Per (strategy, plan) sent to a server: the median measured and predicted ms of every term (records
    that carry their prediction by term: this version's runner)."""
    rows = []
    for name, recs in records.items():
        by_plan: dict[str, list[Any]] = defaultdict(list)
        for r in recs:
            if not (r.error or r.fallback) and getattr(r, "predicted_by", None) and r.where == "cloud":
                by_plan[r.plan].append(r)
        for plan, rs in sorted(by_plan.items(), key=lambda kv: -len(kv[1])):
            row: dict[str, Any] = {"strategy": name, "plan": plan, "n": len(rs)}
            for term in ("head", "encode", "wire", "server"):
                row[term] = [
                    float(np.median([measured_terms(r)[term] for r in rs])),
                    float(np.median([r.predicted_by[term] for r in rs])),
                ]
            row["correction"] = float(np.median([r.predicted_by["correction"] for r in rs]))
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--board", default="rpi4")
    p.add_argument("--trace", default="hsdpa/car")
    p.add_argument("--offset", type=float, default=123.0)
    p.add_argument("--duration", type=float, default=24.0)
    p.add_argument("--turn", type=float, default=3.0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--load", default="device-burst")
    p.add_argument("--codecs", default=None, help="comma-separated (default: every codec of the table)")
    p.add_argument("--strategies", default="adaptive,route")
    p.add_argument("--label", default="", help="a name for this run in the table (e.g. before, after)")
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    cfg = rigbench.BenchConfig(
        model=a.model,
        trace=a.trace,
        bandwidth_scale=a.scale,
        load=a.load,
        rate_hz=a.rate,
        duration_s=a.duration,
        turn_s=a.turn,
        trace_offset_s=a.offset,
        codecs=tuple(a.codecs.split(",")) if a.codecs else None,
        strategies=tuple(a.strategies.split(",")),
    )
    line = cmd_bench.LiveLine()
    load_before = os.getloadavg()
    with rig.Rig(rig.RigConfig(board=a.board, link="auto", models=(a.model,)), progress=line.say) as r:
        hop = rigbench._hop(cfg.trace, cfg.trace_offset_s, cfg.bandwidth_scale, cfg.rtt_ms, cfg.duration_s)
        family = family_median_mbps(trace_family(load_trace(cfg.trace)))
        hop = replace(hop, median_mbps=family * cfg.bandwidth_scale)
        out = runner.run(rigbench._spec(cfg, hops=(hop,), fixed_mbps=family), r, progress=line.say, live=line)
    load_after = os.getloadavg()
    records: dict[str, list[Any]] = defaultdict(list)
    for t in out.turns:
        records[t.name] += list(t.devices[0])
    rows = errors_by_plan(records)
    means = {n: statistics.fmean(x.latency_ms for x in rs if not x.error) for n, rs in records.items()}
    result = {
        "label": a.label,
        "config": vars(a),
        "rows": rows,
        "mean_ms": means,
        "load_average": {"before": list(load_before), "after": list(load_after)},
    }
    print(
        f"prediction per plan{' (' + a.label + ')' if a.label else ''}: {a.model} on {a.board}, {a.trace} "
        f"from {a.offset:g} s x{a.scale:g}, {a.duration:g} s, load {a.load}; load average "
        f"{'/'.join(f'{x:.2f}' for x in load_before)} before, {'/'.join(f'{x:.2f}' for x in load_after)} after"
    )
    print(
        render(
            ["strategy", "plan", "n", "median |m-p|/m", "95 % CI", "median measured ms", "median predicted ms", "bias"],
            [
                [
                    x["strategy"],
                    x["plan"],
                    str(x["n"]),
                    f"{100 * x['median_err']:.1f} %",
                    f"{100 * x['ci'][0]:.1f}-{100 * x['ci'][1]:.1f} %",
                    f"{x['median_measured_ms']:.1f}",
                    f"{x['median_predicted_ms']:.1f}",
                    f"{100 * x['bias']:+.1f} %",
                ]
                for x in rows
            ],
        )
    )
    terms = terms_by_plan(records)
    result["terms"] = terms
    if terms:
        print("by term, median measured / predicted ms (predicted with the correction apart):")
        print(
            render(
                ["strategy", "plan", "n", "head", "encode + call", "wire", "server", "correction"],
                [
                    [x["strategy"], x["plan"], str(x["n"])]
                    + [f"{x[t][0]:.1f} / {x[t][1]:.1f}" for t in ("head", "encode", "wire", "server")]
                    + [f"{x['correction']:+.1f}"]
                    for x in terms
                ],
            )
        )
    print("mean latency: " + ", ".join(f"{n} {v:.1f} ms" for n, v in means.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
