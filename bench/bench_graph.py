"""Issue 2 figures: cut enumeration and splitting speed, and exactness of every cut of every zoo model.

    python bench/bench_graph.py [--models a,b] [--json] [--quick]

Targets: enumerate densenet121's cuts < 1 s; split one cut < 0.5 s plus model I/O; every cut's
head-then-tail output within 1e-5 relative of the full model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph import partition, zoo


def _session(model: object) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def bench_model(name: str, quick: bool) -> dict[str, object]:
    p = zoo.get(name)
    t0 = time.perf_counter()
    mg = graph.load(p)
    load_s = time.perf_counter() - t0
    enum = []
    for _ in range(5):
        mg._cuts = None
        t0 = time.perf_counter()
        cuts = mg.cuts()
        enum.append(time.perf_counter() - t0)
    mid = cuts[len(cuts) // 2].id
    split_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        partition.head_tail(mg, mid)
        split_times.append(time.perf_counter() - t0)
    feeds = zoo.random_inputs(p, seed=7)
    full = _session(p).run(None, feeds)
    checked = cuts if not quick else cuts[:: max(1, len(cuts) // 12)]
    worst = 0.0
    for k, c in enumerate(checked):
        print(f"\r{name}: checking cut {k + 1}/{len(checked)}", end="", file=sys.stderr, flush=True)
        head, tail = partition.head_tail(mg, c.id)
        mid_t = dict(zip(head.outputs, _session(head.model).run(list(head.outputs), feeds), strict=True))
        out = _session(tail.model).run([o.name for o in mg.outputs], {k_: mid_t[k_] for k_ in tail.inputs})
        for a, b in zip(full, out, strict=True):
            worst = max(worst, float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) or 1.0)))
    print(file=sys.stderr)
    return {
        "model": name, "nodes": len(mg.nodes), "cuts": len(cuts),
        "single_tensor_cuts": sum(1 for c in cuts if len(c.tensors) == 1),
        "load_s": load_s, "enumerate_ms": 1e3 * statistics.median(enum),
        "split_ms": 1e3 * statistics.median(split_times), "cuts_checked": len(checked),
        "max_rel_err": worst,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="check ~12 cuts per model instead of all")
    args = ap.parse_args()
    rows = [bench_model(n, args.quick) for n in args.models.split(",")]
    if args.json:
        print(json.dumps({"bench": "graph", "rows": rows}))
        return 0
    headers = ["model", "nodes", "cuts", "single", "load s", "enumerate ms", "split ms", "checked", "max rel err"]
    print(render(headers, [
        (r["model"], r["nodes"], r["cuts"], r["single_tensor_cuts"], r["load_s"], r["enumerate_ms"],
         r["split_ms"], r["cuts_checked"], f"{r['max_rel_err']:.1e}") for r in rows
    ]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
