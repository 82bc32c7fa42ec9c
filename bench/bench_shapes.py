"""Issue 14 item 4 figures: a cost table profiled at one input shape, scaled to another, against a real
profile taken at that other shape.

    python bench/bench_shapes.py [--runs 5] [--segments 8] [--board rpi4] [--json]

Each model is profiled at its shape A and at every target shape B on this host (``profiler.measure``
with ``binding=``). The runtime's table for B is A's scaled by ``splitrt.plan.reshape.scale_table``
(times by each side's FLOPs ratio, bytes exact from the graph re-bound at B). Rows, per (model, A -> B):

- ``scaled``: the scaled table vs the table measured at B;
- ``unscaled``: A's table used as it is at B (what a per-shape-blind runtime plans with);
- ``A again`` (one per model, B = A): a second profile at A vs the first: the noise floor, what two
  measurements of the same thing disagree by on this host right now.

Columns: median and p90 relative error over cuts of head_ms (all but ``cloud``) and tail_ms (all but
``device``); ``full`` the whole model on the device; ``bytes`` the largest crossing-bytes difference; the
best plan's predicted latency (device = this host x the board's ``cpu_speed_factor``, cloud = this host,
fp32, RTT ``--rtt-ms``) at each of ``--bandwidths``: median and p90 relative error of the predicted
latency, the largest regret (the real cost of the plan the table picked over the real best, relative),
and how many bandwidths picked the same plan as the real table. A second table lists the scaled plans per
bandwidth. The host's 1-minute load average is printed beside the figures: timings on a busy host are
not comparable. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph import rebind, shapes, zoo
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.reshape import scale_table
from splitrt.plan.solver import evaluate, solve
from splitrt.profile import boards, profiler

# model -> (A's dims, [B's dims, ...])
CASES: dict[str, tuple[dict[str, int], list[dict[str, int]]]] = {
    "yolo_tiny": ({"height": 320, "width": 320}, [{"height": 640, "width": 640}, {"height": 256, "width": 416}]),
    "bert_tiny": ({"seq": 16}, [{"seq": 128}]),
}


def say(msg: str) -> None:
    print(f"[bench_shapes] {msg}", file=sys.stderr, flush=True)


def dims_text(dims: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


@dataclass(frozen=True, kw_only=True)
class Measured:
    dims: dict[str, int]
    graph: graph.ModelGraph
    profile: profiler.Profile
    seconds: float


def measure(name: str, dims: dict[str, int], args: argparse.Namespace) -> Measured:
    path = zoo.get(name)
    binding = shapes.ShapeBinding(dims=dims)
    say(f"{name}: profiling at {dims_text(dims)}")
    t0 = time.perf_counter()
    prof = profiler.measure(
        path, binding=binding, runs=args.runs, segments=args.segments, threads=args.threads, progress=lambda _m: None
    )
    return Measured(dims=dims, graph=graph.load(path, binding), profile=prof, seconds=time.perf_counter() - t0)


def warm_up(name: str, dims: dict[str, int], seconds: float, threads: int | None) -> None:
    """Run the model for a while first: a cold host (frequency, caches, first-session page faults) makes the
    first profile of a run slower than the rest."""
    path = zoo.get(name)
    feeds = zoo.random_inputs(path, binding=shapes.ShapeBinding(dims=dims))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads or profiler.default_threads()
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sess.run(None, feeds)


def _rel(pred: np.ndarray, real: np.ndarray) -> np.ndarray:
    return np.abs(pred - real) / real


def compare(pred: CostTable, real: CostTable, args: argparse.Namespace) -> dict[str, Any]:
    """Per-cut time errors and plan errors of ``pred`` against ``real`` (same cut ids)."""
    assert pred.ids == real.ids
    heads = [i for i, c in enumerate(real.ids) if c != "cloud" and real.head_ms[i] > 0]
    tails = [i for i, c in enumerate(real.ids) if c != "device" and real.tail_ms[i] > 0]
    head_err = _rel(pred.head_ms[heads], real.head_ms[heads])
    tail_err = _rel(pred.tail_ms[tails], real.tail_ms[tails])
    full = real.index("device")
    plans = []
    for bw in args.bandwidths:
        cond = Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=args.rtt_ms))
        mine, best = solve(pred, cond, codecs=["fp32"]), solve(real, cond, codecs=["fp32"])
        really = evaluate(real, mine.key, cond).predicted_ms
        plans.append(
            {
                "bandwidth_mbps": bw,
                "plan": mine.key,
                "real_plan": best.key,
                "predicted_ms": mine.predicted_ms,
                "real_best_ms": best.predicted_ms,
                "plan_real_ms": really,
                "pred_err": abs(mine.predicted_ms - best.predicted_ms) / best.predicted_ms,
                "regret": really / best.predicted_ms - 1.0,
            }
        )
    pred_err = np.array([p["pred_err"] for p in plans])
    return {
        "head_med": float(np.median(head_err)),
        "head_p90": float(np.percentile(head_err, 90)),
        "tail_med": float(np.median(tail_err)),
        "tail_p90": float(np.percentile(tail_err, 90)),
        "full_err": float(abs(pred.head_ms[full] - real.head_ms[full]) / real.head_ms[full]),
        "bytes_diff": int(np.max(np.abs(pred.bytes - real.bytes))),
        "pred_med": float(np.median(pred_err)),
        "pred_p90": float(np.percentile(pred_err, 90)),
        "regret_max": float(max(p["regret"] for p in plans)),
        "same_plan": sum(p["plan"] == p["real_plan"] for p in plans),
        "plans": plans,
    }


def bench_model(name: str, args: argparse.Namespace, factor: float) -> list[dict[str, Any]]:
    a_dims, targets = CASES[name]
    warm_up(name, a_dims, args.warmup_s, args.threads)
    a = measure(name, a_dims, args)
    again = measure(name, a_dims, args)

    def table(m: Measured) -> CostTable:
        return profiler.cost_table(m.profile, m.profile, device_speed_factor=factor)

    t_a = table(a)
    at_a = rebind.cut_costs(a.graph)
    rows = [
        {
            "model": name,
            "from": dims_text(a_dims),
            "to": dims_text(a_dims),
            "method": "A again",
            "total_ms_a": a.profile.total_ms,
            "total_ms_b": again.profile.total_ms,
            "load1": os.getloadavg()[0],
            **compare(t_a, table(again), args),
        }
    ]
    for b_dims in targets:
        b = measure(name, b_dims, args)
        t_b = table(b)
        assert b.graph.input_shapes is not None
        t0 = time.perf_counter()
        at_b = rebind.cut_costs_at(a.graph, b.graph.input_shapes)  # as the runtime gets it: re-binding A's graph
        scaled = scale_table(t_a, at_a, at_b)
        scale_ms = (time.perf_counter() - t0) * 1e3
        load1 = os.getloadavg()[0]
        common = {
            "model": name,
            "from": dims_text(a_dims),
            "to": dims_text(b_dims),
            "total_ms_a": a.profile.total_ms,
            "total_ms_b": b.profile.total_ms,
            "flops_ratio": at_b.flops / at_a.flops,
            "load1": load1,
        }
        rows.append({**common, "method": "scaled", "scale_ms": round(scale_ms, 2), **compare(scaled, t_b, args)})
        rows.append({**common, "method": "unscaled", **compare(t_a, t_b, args)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(CASES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--board", default="rpi4", help="the device: this host times its cpu_speed_factor")
    ap.add_argument("--bandwidths", default="5,20,100", help="Mbit/s, comma separated")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.bandwidths = [float(b) for b in args.bandwidths.split(",")]
    factor = boards.load_board(args.board).cpu_speed_factor
    t0 = time.perf_counter()
    rows = [r for m in args.models.split(",") for r in bench_model(m, args, factor)]
    say(f"done in {time.perf_counter() - t0:.0f} s")
    meta = {
        "board": args.board,
        "device_speed_factor": factor,
        "runs": args.runs,
        "segments": args.segments,
        "rtt_ms": args.rtt_ms,
        "bandwidths_mbps": args.bandwidths,
        "load1_end": os.getloadavg()[0],
        "threads": args.threads or profiler.default_threads(),
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return 0
    pct = "{:.1%}".format
    print(
        f"device = this host x {factor:.1f} ({args.board}), cloud = this host; fp32; rtt {args.rtt_ms:g} ms; "
        f"bandwidths {', '.join(f'{b:g}' for b in args.bandwidths)} Mbit/s; runs {args.runs}, "
        f"segments {args.segments}, {meta['threads']} threads"
    )
    print(
        render(
            [
                "model",
                "A",
                "B",
                "table",
                "A ms",
                "B ms",
                "head med",
                "head p90",
                "tail med",
                "tail p90",
                "full",
                "bytes",
                "pred med",
                "pred p90",
                "regret max",
                "same plan",
                "load1",
            ],
            [
                [
                    r["model"],
                    r["from"],
                    r["to"],
                    r["method"],
                    f"{r['total_ms_a']:.2f}",
                    f"{r['total_ms_b']:.2f}",
                    pct(r["head_med"]),
                    pct(r["head_p90"]),
                    pct(r["tail_med"]),
                    pct(r["tail_p90"]),
                    pct(r["full_err"]),
                    r["bytes_diff"],
                    pct(r["pred_med"]),
                    pct(r["pred_p90"]),
                    pct(r["regret_max"]),
                    f"{r['same_plan']}/{len(r['plans'])}",
                    f"{r['load1']:.2f}",
                ]
                for r in rows
            ],
        )
    )
    print()
    print(
        render(
            ["model", "B", "Mbit/s", "scaled plan", "real plan", "predicted ms", "real best ms", "pred err", "regret"],
            [
                [
                    r["model"],
                    r["to"],
                    f"{p['bandwidth_mbps']:g}",
                    p["plan"],
                    p["real_plan"],
                    f"{p['predicted_ms']:.1f}",
                    f"{p['real_best_ms']:.1f}",
                    pct(p["pred_err"]),
                    pct(p["regret"]),
                ]
                for r in rows
                if r["method"] == "scaled"
                for p in r["plans"]
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
