"""How well the cost model predicts what a request really costs, per plan, on the rig (issue 34).

Runs the rig (`splitrt bench`'s runner: an emulated board, a shaped kernel link, a real server) on one
trace window and, for every plan a strategy used, prints the median of |measured - predicted| / measured
of end-to-end latency over its requests (predicted: the decision's ``predicted_ms``, what the controller
planned with), with a 95 % bootstrap interval, the medians of both figures and the load average; beside it
the plan's noise floor (median |m - median(m)| / m over its own requests: the error of the best constant
prediction in hindsight, so an error near the floor is the emulation's noise, not the cost model's) and its
bias, median(m) / median(p). With ``--before`` the floor is over the requests pooled over the runs.
Fallbacks and failed requests are left out (their time is a timeout, not the plan's).

The same script runs against an older checkout (``PYTHONPATH=/tmp/base python bench/bench_prediction.py``):
it uses only the runner's records, which every version has. ``--before REV`` does it for you: the same cell
at REV (``git archive``) and at this tree (or ``--after REV``), ``--rounds`` runs each, alternating, and one
table of both, each plan's errors pooled over its runs.

    .venv/bin/python bench/bench_prediction.py [--model resnet50] [--trace hsdpa/car] [--offset 123]
        [--duration 24] [--load device-burst] [--strategies adaptive,route] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from _common import prediction_figures

from splitrt.cli import bench as cmd_bench
from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench
from splitrt.rig import harness as rig
from splitrt.rig import runner
from splitrt.rig.tracespec import family_median_mbps, load_trace, trace_family


def errors_by_plan(records: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Per (strategy, plan): n, median relative error and its 95 % bootstrap interval, the noise floor
    (median |m - median(m)| / m of the plan's own requests: what the best constant prediction in hindsight
    scores), the bias median(m) / median(p) (``ratio``) and median((p - m) / m) (``bias``), median figures."""
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
                    **prediction_figures(list(m), list(p)),
                    "ci": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))],
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


def request_row(r: Any, played: Any) -> dict[str, Any]:
    """One request's figures, with the trace's mean rate over its time on the link (window position
    ``t_s`` on, for its latency): what its upload really met, beside what the estimator said."""
    ends = [r.t_s + k * r.latency_ms / 1e3 / 8 for k in range(9)]
    row = {k: v for k, v in asdict(r).items() if k != "match"}
    row["trace_mbps"] = float(np.mean([played.rate_at(t) for t in ends]))
    return row


def _passthrough(argv: list[str]) -> list[str]:
    """``argv`` without the comparison's own options (and their values)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--before", "--after", "--rounds", "--json", "--label"):
            skip = True
        elif not x.startswith(("--before=", "--after=", "--rounds=", "--json=", "--label=")):
            out.append(x)
    return out


def compare(a: argparse.Namespace, argv: list[str]) -> int:
    """Runs of the cell at ``a.before`` and at ``a.after`` (None: this tree), alternating (``PYTHONPATH`` and
    the working directory pick the code, the venv is this one); one table, requests pooled per plan."""
    root = Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="splitrt-prediction-") as tmp:
        trees = {"before": f"{tmp}/before", "after": f"{tmp}/after" if a.after else str(root)}
        for label, rev in (("before", a.before), ("after", a.after)):
            if rev:
                os.makedirs(trees[label])
                subprocess.run(f"git -C '{root}' archive {rev} | tar -x -C '{trees[label]}'", shell=True, check=True)
        for r in range(a.rounds):
            for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
                out = f"{tmp}/{label}{r}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), *_passthrough(argv), "--json", out]
                env = {**os.environ, "PYTHONPATH": trees[label]}
                print(f"[bench_prediction] {label} round {r + 1}", file=sys.stderr, flush=True)
                subprocess.run(cmd, env=env, cwd=trees[label], check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    runs[label].append(json.load(f))
    records: dict[str, list[Any]] = defaultdict(list)
    for label, results in runs.items():
        for res in results:
            for name, rows in res["requests"].items():
                records[f"{label} {name}"] += [SimpleNamespace(**x) for x in rows]
    rows = errors_by_plan(records)
    loads = [x["load_average"][k] for v in runs.values() for x in v for k in ("before", "after")]
    print(
        f"prediction per plan, {a.before} (before) vs {a.after or 'this tree'} (after), {a.rounds} runs each, "
        f"alternating: {a.model} on {a.board}, {a.trace} from {a.offset:g} s x{a.scale:g}, {a.duration:g} s, load "
        f"{a.load}; load average (1 min) {min(x[0] for x in loads):.1f}-{max(x[0] for x in loads):.1f}"
    )
    print(render_rows(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "rows": rows, "runs": runs}, f, indent=1)
    return 0


def render_rows(rows: list[dict[str, Any]]) -> str:
    return render(
        [
            "strategy",
            "plan",
            "n",
            "median |m-p|/m",
            "95 % CI",
            "floor",
            "median measured ms",
            "median predicted ms",
            "measured / predicted",
        ],
        [
            [
                x["strategy"],
                x["plan"],
                str(x["n"]),
                f"{100 * x['median_err']:.1f} %",
                f"{100 * x['ci'][0]:.1f}-{100 * x['ci'][1]:.1f} %",
                f"{100 * x['floor']:.1f} %",
                f"{x['median_measured_ms']:.1f}",
                f"{x['median_predicted_ms']:.1f}",
                f"{x['ratio']:.2f}",
            ]
            for x in rows
        ],
    )


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
    p.add_argument("--before", default=None, metavar="REV", help="compare with this revision, alternating")
    p.add_argument("--after", default=None, metavar="REV", help="with --before: this revision (default: this tree)")
    p.add_argument("--rounds", type=int, default=2, help="with --before: runs of each")
    a = p.parse_args(argv)
    if a.before:
        return compare(a, argv if argv is not None else sys.argv[1:])
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
    played = out.spec.hops[0].played[0]
    means = {n: statistics.fmean(x.latency_ms for x in rs if not x.error) for n, rs in records.items()}
    result = {
        "label": a.label,
        "config": vars(a),
        "rows": rows,
        "mean_ms": means,
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "requests": {n: [request_row(x, played) for x in rs] for n, rs in records.items()},
    }
    print(
        f"prediction per plan{' (' + a.label + ')' if a.label else ''}: {a.model} on {a.board}, {a.trace} "
        f"from {a.offset:g} s x{a.scale:g}, {a.duration:g} s, load {a.load}; load average "
        f"{'/'.join(f'{x:.2f}' for x in load_before)} before, {'/'.join(f'{x:.2f}' for x in load_after)} after"
    )
    print(render_rows(rows))
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
