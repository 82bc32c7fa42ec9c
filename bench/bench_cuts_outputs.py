"""Cut enumeration time against the number of graph outputs: this tree's ``graph.cuts`` beside REV's.

    .venv/bin/python bench/bench_cuts_outputs.py [--before REV] [--outputs 256,1024,4096] [--json]

Two shapes of model with N outputs, made here: ``star`` (N Identity nodes of one input, each a graph output:
``attacks/attack_hostile.py``'s ``many_outputs``) and ``chain`` (an N-node Relu chain, every node's output
also a graph output). Each is loaded once (``graph.model.load``: not timed), then ``enumerate_cuts`` of REV
(its ``splitrt/graph/cuts.py``, by ``git show``) and of this tree run on the same graph, alternately,
``--repeats`` times (REV's once past ``--before-max`` outputs: it is quadratic); the median and the range
of the repeats, the load average beside each row (a shared host: compare within a row). Both must list
the same cuts (ids, tensors, bytes, kept outputs, reply bytes), or the bench fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from splitrt.cli.tables import render
from splitrt.graph import cuts as this_cuts
from splitrt.graph import model as graph

ROOT = Path(__file__).resolve().parents[1]


def _model(kind: str, n: int) -> onnx.ModelProto:
    def v(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])

    if kind == "star":
        nodes = [helper.make_node("Identity", ["x"], [f"y{i}"]) for i in range(n)]
    else:
        nodes = [helper.make_node("Relu", ["x" if i == 0 else f"y{i - 1}"], [f"y{i}"]) for i in range(n)]
    m = helper.make_model(
        helper.make_graph(nodes, kind, [v("x")], [v(f"y{i}") for i in range(n)]),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    m.ir_version = 7
    return m


def _before(rev: str, tmp: str) -> Any:
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:splitrt/graph/cuts.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tmp) / "cuts_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("cuts_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cuts_before"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _facts(cs: list[Any]) -> list[tuple[Any, ...]]:
    return [(c.id, c.tensor_names, c.bytes, c.head_nodes, c.kept, c.reply_bytes) for c in cs]


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench(kind: str, n: int, before: Any, repeats: int, before_max: int, tmp: str) -> dict[str, Any]:
    path = Path(tmp) / f"{kind}{n}.onnx"
    onnx.save(_model(kind, n), str(path))
    g = graph.load(path)
    load1 = os.getloadavg()[0]
    new_s: list[float] = []
    old_s: list[float] = []
    for r in range(repeats):
        t, got = _time(lambda: this_cuts.enumerate_cuts(g))
        new_s.append(t)
        if before is not None and (n <= before_max or r == 0):
            t, was = _time(lambda: before.enumerate_cuts(g))
            old_s.append(t)
            if _facts(was) != _facts(got):
                raise SystemExit(f"{kind} {n}: the two enumerations differ")
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    return {
        "model": kind,
        "outputs": n,
        "cuts": len(got),
        "before_s": med(old_s),
        "before_range_s": [min(old_s), max(old_s)] if old_s else None,
        "after_s": med(new_s),
        "after_range_s": [min(new_s), max(new_s)],
        "load1_before": load1,
        "load1_after": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=None, metavar="REV", help="compare with REV's graph/cuts.py")
    ap.add_argument("--outputs", default="256,512,1024,2048,4096")
    ap.add_argument("--models", default="star,chain")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before-max", type=int, default=1024, help="REV timed once above this many outputs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="splitrt-cuts-") as tmp:
        before = _before(args.before, tmp) if args.before else None
        for kind in args.models.split(","):
            for n in (int(x) for x in args.outputs.split(",")):
                rows.append(bench(kind, n, before, args.repeats, args.before_max, tmp))
                print(f"[bench] {kind} {n}: {rows[-1]['after_s']:.3f} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0

    def cell(x: float | None, rng: list[float] | None) -> str:
        return "-" if x is None or rng is None else f"{x:.3f} ({rng[0]:.3f}-{rng[1]:.3f})"

    print(
        render(
            ["model", "outputs", "cuts", f"before {args.before or '-'} s", "after s", "before/after", "load1 b>a"],
            [
                (
                    r["model"],
                    r["outputs"],
                    r["cuts"],
                    cell(r["before_s"], r["before_range_s"]),
                    cell(r["after_s"], r["after_range_s"]),
                    f"{r['before_s'] / r['after_s']:.1f}x" if r["before_s"] else "-",
                    f"{r['load1_before']:.1f}>{r['load1_after']:.1f}",
                )
                for r in rows
            ],
        )
    )
    print("median (min-max) of the repeats; REV timed once past --before-max outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
