"""`splitrt demo`: the main job on an embedded default, for a new user's first `make demo`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TypedDict

import numpy as np

from splitrt.cli.tables import human_bytes, render
from splitrt.graph import model as graph
from splitrt.graph import partition, zoo

DEFAULT_MODEL = "resnet50"
# The rig part: one HSDPA (3G) trace window where the link crosses the device/cloud break-even of
# resnet50 on a Raspberry Pi 4; 5 measured strategies x 6 s, in 2 s turns (each turn ends when its
# last request and probe do: fewer turns, less wall time), keep the whole demo under 90 s on 2 vCPUs.
DEMO_TRACE = "hsdpa/car"
DEMO_OFFSET_S = 43.0
DEMO_DURATION_S = 6.0
DEMO_TURN_S = 2.0
DEMO_WARMUP_S = 1.0  # the bench's 2 s, halved: the warm-up starts with a probe, the estimate is right at once
DEMO_BOARD = "rpi4"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded default model")
    p.add_argument("--model", default=DEFAULT_MODEL, choices=zoo.names())
    p.add_argument("--cuts", type=int, default=6, help="how many single-tensor cuts to prove exact")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-rig", action="store_true", help="only the exactness table (skip the rig run)")
    p.add_argument("--trace", default=DEMO_TRACE, help=f"bandwidth trace for the rig run (default {DEMO_TRACE})")
    p.add_argument("--trace-offset", type=float, default=DEMO_OFFSET_S)
    p.add_argument("--duration", type=float, default=DEMO_DURATION_S, help="seconds per strategy in the rig")
    p.add_argument("--plot", default="splitrt-demo.png", help="timeline PNG ('' for none)")
    p.add_argument("--link", default="auto", choices=["auto", "kernel", "userspace"])
    p.set_defaults(func=cmd_demo)


class SplitCheck(TypedDict):
    cut: str
    tensor: str
    bytes: int
    head_flops_fraction: float
    max_rel_err: float
    exact: bool


def exactness_rows(model: str, count: int) -> list[SplitCheck]:
    """Split ``model`` at ``count`` evenly spread single-tensor cuts; compare with the full model."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    path = zoo.get(model)
    mg = graph.load(path)
    feeds = zoo.random_inputs(path, seed=1)
    full = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    single = [c for c in mg.cuts() if len(c.tensors) == 1 and c.id not in ("cloud", "device")]
    picks = [single[round(i * (len(single) - 1) / max(count - 1, 1))] for i in range(min(count, len(single)))]
    rows = []
    for k, c in enumerate(dict.fromkeys(picks)):
        print(f"\rsplitting {model} at {c.id} ({k + 1}/{len(picks)})", end="", file=sys.stderr, flush=True)
        head, tail = partition.head_tail(mg, c.id)
        hs = ort.InferenceSession(head.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        ts = ort.InferenceSession(tail.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        mid = dict(zip(head.outputs, hs.run(list(head.outputs), feeds), strict=True))
        out = ts.run([o.name for o in mg.outputs], {n: mid[n] for n in tail.inputs})
        err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) or 1.0)) for a, b in zip(full, out, strict=True))
        rows.append(SplitCheck(cut=c.id, tensor=c.tensors[0].name, bytes=c.bytes,
                               head_flops_fraction=c.head_flops_fraction, max_rel_err=err, exact=err <= 1e-5))
    print(file=sys.stderr)
    return rows


def cmd_demo(args: argparse.Namespace) -> int:
    rows = exactness_rows(args.model, args.cuts)
    if args.json:
        out: dict[str, Any] = {"model": args.model, "splits": rows}
        if not args.no_rig:
            out["rig"] = rig_part(args, quiet=True)
        print(json.dumps(out, default=float))
    else:
        print(f"{args.model}: head on the device, tail in the cloud, at {len(rows)} cuts")
        print(render(["cut", "crossing tensor", "bytes sent", "head FLOPs", "max rel err", "exact"], [
            (r["cut"], r["tensor"], human_bytes(r["bytes"]), f"{100 * r['head_flops_fraction']:.0f}%",
             f"{r['max_rel_err']:.1e}", "yes" if r["exact"] else "NO") for r in rows
        ]))
        if not args.no_rig:
            print(flush=True)
            rig_part(args, quiet=False)
    return 0 if all(r["exact"] for r in rows) else 1


def rig_part(args: argparse.Namespace, *, quiet: bool) -> dict[str, Any]:
    """The main job: every strategy in the rig on a real 3G trace, the table and the timeline."""
    from splitrt.cli import bench as cmd_bench
    from splitrt.rig import bench as rigbench

    cfg = rigbench.BenchConfig(model=args.model, trace=args.trace, trace_offset_s=args.trace_offset,
                               duration_s=args.duration, turn_s=DEMO_TURN_S,
                               warmup_s=DEMO_WARMUP_S, rate_hz=4.0)
    print(f"rig: {args.model} on an emulated {DEMO_BOARD}, {cfg.trace} from {cfg.trace_offset_s:g} s, "
          f"{len(cfg.strategies) - 1} strategies x {cfg.duration_s:g} s, then the oracle", file=sys.stderr)
    result = cmd_bench.run(cfg, board=DEMO_BOARD, link=args.link)
    if not quiet:
        cmd_bench.report(result, json_path=None, plot_path=args.plot or None)
    else:
        result["verdict"] = cmd_bench.verdict(result)
    return result
