"""`splitrt export-repository`: a model's tails as a Triton/MLServer model repository (see
``splitrt.export.v2repo``), for devices that run with ``--cloud v2://host:port``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from splitrt.cli.inputs import add_shape_arguments, load_graph
from splitrt.cli.tables import render
from splitrt.export import v2repo


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export-repository",
        help="write the tails of some cuts as a Triton/MLServer (Open Inference Protocol v2) model repository",
    )
    p.add_argument("--model", required=True, help="path to an .onnx file (or zoo:NAME)")
    p.add_argument(
        "--cuts",
        required=True,
        metavar="c3,c7",
        help="comma-separated cut ids (from `splitrt inspect`): one v2 model per cut",
    )
    p.add_argument("--out", required=True, type=Path, help="repository directory (created)")
    p.add_argument(
        "--fixed-shapes",
        action="store_true",
        help="declare the bound shapes (--shape/--dim) instead of -1 for free dims: the server "
        "then refuses other shapes",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="onnxruntime intra-op threads per tail under MLServer (0: onnxruntime decides)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_shape_arguments(p)
    p.set_defaults(func=cmd_export_repository)


def cmd_export_repository(args: argparse.Namespace) -> int:
    mg = load_graph(args, args.model)
    cuts = [c.strip() for c in args.cuts.split(",") if c.strip()]
    tails = v2repo.export_repository(mg, cuts, args.out, fixed_shapes=args.fixed_shapes, intra_op_threads=args.threads)
    if args.json:
        print(json.dumps({"repository": str(args.out), "sha256": mg.sha256, "models": [t.as_dict() for t in tails]}))
        return 0

    def tensors(ts: tuple[v2repo.V2Tensor, ...]) -> str:
        text = ", ".join(f"{t.name}:{t.datatype}{list(t.dims)}" for t in ts[:2])
        return text + (f" (+{len(ts) - 2})" if len(ts) > 2 else "")

    rows = [(t.name, t.cut_id, t.nodes, tensors(t.inputs), tensors(t.outputs)) for t in tails]
    print(render(["v2 model", "cut", "tail nodes", "inputs", "outputs"], rows))
    print(
        f"wrote {len(tails)} models to {args.out}: serve it with `tritonserver --model-repository {args.out}` "
        f"or `mlserver start {args.out}`, then run devices with --cloud v2://HOST:PORT"
    )
    return 0
