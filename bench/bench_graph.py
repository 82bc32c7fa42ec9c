"""Issue 2 figures: cut enumeration and splitting speed, and exactness of every cut of every zoo model.

    python bench/bench_graph.py [--models a,b] [--json] [--quick]

Targets: enumerate densenet121's cuts < 1 s; split one cut < 0.5 s plus model I/O; every cut's
head-then-tail output within 1e-5 relative of the full model.

Models with free dims (bert_tiny, vit_tiny, yolo_tiny) are bound at ``zoo.default_binding`` (load s includes
sizing every tensor there); each row says the model's free dims, the binding, and how the tensors crossing
its cuts were sized: ``static`` (the model alone), ``bound`` (inference at the bound shapes) or ``measured``
(one onnxruntime run). The host's 1-minute load average is read after each model's timings: timings taken
on a busy host are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

import numpy as np
import onnxruntime as ort

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes, zoo


def _session(model: object) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def free_dims(mg: graph.ModelGraph) -> list[str]:
    """``input[k] symbol`` for every input dim the model leaves free (anonymous ones as ``?``)."""
    out = []
    for vi in mg.model.graph.input:
        for k, d in enumerate(shapes.declared_dims(vi) or []):
            if not isinstance(d, int):
                out.append(f"{vi.name}[{k}] {d or '?'}")
    return out


def sizing(mg: graph.ModelGraph) -> dict[str, int]:
    """How the distinct tensors crossing any cut were sized: counts by source."""
    crossing = {t.name: t.source for c in mg.cuts() for t in c.tensors}
    counts = Counter(crossing.values())
    return {k: counts.get(k, 0) for k in ("static", "bound", "measured")}


def bench_model(name: str, quick: bool) -> dict[str, object]:
    p = zoo.get(name)
    binding = zoo.default_binding(p)
    t0 = time.perf_counter()
    mg = graph.load(p, binding)
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
    load1 = os.getloadavg()[0]  # beside the timings just taken
    feeds = zoo.random_inputs(p, seed=7, binding=binding)
    full = _session(p).run(None, feeds)
    checked = cuts if not quick else cuts[:: max(1, len(cuts) // 12)]
    worst = 0.0
    for k, c in enumerate(checked):
        print(f"\r{name}: checking cut {k + 1}/{len(checked)}", end="", file=sys.stderr, flush=True)
        head, tail = partition.head_tail(mg, c.id)
        mid_t = dict(zip(head.outputs, _session(head.model).run(list(head.outputs), feeds), strict=True))
        # Graph outputs the head already made stay on the device: the tail makes only the rest.
        tail_out = _session(tail.model).run(list(tail.outputs), {k_: mid_t[k_] for k_ in tail.inputs})
        got = {**mid_t, **dict(zip(tail.outputs, tail_out, strict=True))}
        out = [got[o.name] for o in mg.outputs]
        for a, b in zip(full, out, strict=True):
            worst = max(worst, float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) or 1.0)))
    print(file=sys.stderr)
    return {
        "model": name,
        "nodes": len(mg.nodes),
        "cuts": len(cuts),
        "excluded": len(mg.excluded),
        "sized": mg.sized,
        "free_dims": free_dims(mg),
        "input_shapes": {k: list(v) for k, v in (mg.input_shapes or {}).items()},
        "binding": binding.as_dict(),
        "crossing_sized": sizing(mg),
        "single_tensor_cuts": sum(1 for c in cuts if len(c.tensors) == 1),
        "load_s": load_s,
        "enumerate_ms": 1e3 * statistics.median(enum),
        "split_ms": 1e3 * statistics.median(split_times),
        "load1": load1,
        "cuts_checked": len(checked),
        "max_rel_err": worst,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="check ~12 cuts per model instead of all")
    args = ap.parse_args()
    load1_start = os.getloadavg()[0]
    rows = [bench_model(n, args.quick) for n in args.models.split(",")]
    load1_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"bench": "graph", "load1_start": load1_start, "load1_end": load1_end, "rows": rows}))
        return 0
    headers = [
        "model",
        "nodes",
        "cuts",
        "single",
        "free dims",
        "bound at",
        "static/bound/measured",
        "load s",
        "enumerate ms",
        "split ms",
        "load1",
        "checked",
        "max rel err",
    ]
    print(
        render(
            headers,
            [
                (
                    r["model"],
                    r["nodes"],
                    r["cuts"],
                    r["single_tensor_cuts"],
                    _free(r),
                    _bound(r),
                    _sized(r),
                    r["load_s"],
                    r["enumerate_ms"],
                    r["split_ms"],
                    f"{r['load1']:.2f}",
                    r["cuts_checked"],
                    f"{r['max_rel_err']:.1e}",
                )
                for r in rows
            ],
        )
    )
    print(f"host load average (1 min): {load1_start:.2f} at start, {load1_end:.2f} at end; {os.cpu_count()} cores")
    return 0


def _free(r: dict[str, object]) -> str:
    dims = r["free_dims"]
    assert isinstance(dims, list)
    return ", ".join(dict.fromkeys(d.split(" ", 1)[1] for d in dims)) or "-"


def _sized(r: dict[str, object]) -> str:
    counts = r["crossing_sized"]
    assert isinstance(counts, dict)
    return "/".join(str(counts[k]) for k in ("static", "bound", "measured"))


def _bound(r: dict[str, object]) -> str:
    shapes_ = r["input_shapes"] if r["free_dims"] else {}
    assert isinstance(shapes_, dict)
    return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes_.items()) or "-"


if __name__ == "__main__":
    sys.exit(main())
