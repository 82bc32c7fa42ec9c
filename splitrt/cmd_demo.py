"""`splitrt demo`: the main job on an embedded default, for a new user's first `make demo`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TypedDict

import numpy as np

from splitrt import graph, partition, zoo
from splitrt.tables import human_bytes, render

DEFAULT_MODEL = "resnet50"


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded default model")
    p.add_argument("--model", default=DEFAULT_MODEL, choices=zoo.names())
    p.add_argument("--cuts", type=int, default=6, help="how many single-tensor cuts to prove exact")
    p.add_argument("--json", action="store_true")
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
        print(json.dumps({"model": args.model, "splits": rows}))
    else:
        print(f"{args.model}: head on the device, tail in the cloud, at {len(rows)} cuts")
        print(render(["cut", "crossing tensor", "bytes sent", "head FLOPs", "max rel err", "exact"], [
            (r["cut"], r["tensor"], human_bytes(r["bytes"]), f"{100 * r['head_flops_fraction']:.0f}%",
             f"{r['max_rel_err']:.1e}", "yes" if r["exact"] else "NO") for r in rows
        ]))
    return 0 if all(r["exact"] for r in rows) else 1
