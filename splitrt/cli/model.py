"""`splitrt inspect`, `splitrt split`, `splitrt zoo`: look at a model, cut it, get test models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from splitrt.cli.inputs import add_shape_arguments, load_graph
from splitrt.cli.tables import human_bytes, render, short
from splitrt.graph import model as graph
from splitrt.graph import partition, zoo


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="list every place the model can be cut and what crosses it")
    p.add_argument("model", help="path to an .onnx file (or zoo:NAME)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--all", action="store_true", help="table: show every cut (default: single-tensor cuts)")
    p.add_argument(
        "--board",
        default="rpi4",
        help="board for the split-vs-route line (devices/<NAME>.toml; default rpi4); 'none' to skip",
    )
    add_shape_arguments(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("split", help="write head/tail (or N-way chain) segments of a model")
    p.add_argument("model")
    p.add_argument(
        "--cut",
        action="append",
        required=True,
        metavar="ID",
        help="cut id from `splitrt inspect`; repeat for a chain device -> edge -> cloud",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--json", action="store_true")
    add_shape_arguments(p)
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("zoo", help="test and demo models with seeded random weights")
    zs = p.add_subparsers(dest="zoo_cmd", required=True)
    zl = zs.add_parser("list", help="list the zoo models")
    zl.add_argument("--json", action="store_true")
    zl.set_defaults(func=cmd_zoo_list)
    zg = zs.add_parser("get", help="write a zoo model to a file")
    zg.add_argument("name", choices=zoo.names())
    zg.add_argument("--out", required=True, type=Path)
    zg.set_defaults(func=cmd_zoo_get)


def inspect_dict(mg: graph.ModelGraph) -> dict[str, object]:
    return {
        "model": {
            "path": str(mg.path),
            "sha256": mg.sha256,
            "nodes": len(mg.nodes),
            "inputs": [t.as_dict() for t in mg.inputs],
            "outputs": [t.as_dict() for t in mg.outputs],
            "flops": mg.flops,
            "input_shapes": {k: list(v) for k, v in (mg.input_shapes or {}).items()},
            "binding": mg.binding.as_dict() if mg.binding is not None else None,
        },
        "cuts": [c.as_dict() for c in mg.cuts()],
        "excluded": list(mg.excluded),
    }


def routing_verdict(mg: graph.ModelGraph, board_name: str) -> tuple[dict[str, object] | None, str]:
    """`plan --explain`'s verdict at its defaults (every codec), for one line: (JSON, text)."""
    from splitrt.cli import explain as explaincli
    from splitrt.errors import SplitrtError
    from splitrt.profile import boards

    if board_name == "none":
        return None, ""
    try:
        board = boards.load_board(board_name)
        costs = explaincli.table_for(mg, argparse.Namespace(device=None, cloud=None), board)
        table, source = costs.table, costs.source
        v = explaincli.verdict(
            table,
            rtt_ms=explaincli.DEFAULT_RTT_MS,
            min_mbps=0.1,
            max_mbps=explaincli.DEFAULT_MAX_MBPS,
            loads=[1.0, 2.0, 4.0],
            power=board.power,
            codecs=None,
        )
    except (SplitrtError, ValueError) as exc:
        return {"error": str(exc)}, f"split vs route: not computed ({exc})"
    return (
        {**v.to_json(), "board": board.name, "table": source},
        f"split vs route on {board.name} (every codec; details: splitrt plan MODEL --explain): {v.summary}",
    )


def cmd_inspect(args: argparse.Namespace) -> int:
    mg = load_graph(args)
    routing, line = routing_verdict(mg, args.board)
    if args.json:
        json.dump({**inspect_dict(mg), **({"routing": routing} if routing is not None else {})}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    cuts = mg.cuts()
    shown = cuts if args.all else [c for c in cuts if len(c.tensors) <= 1 or c.id in ("cloud", "device")]
    rows = [
        (
            c.id,
            c.head_nodes,
            f"{100 * c.head_flops_fraction:.1f}%",
            human_bytes(c.bytes),
            ", ".join(short(t.name) for t in c.tensors[:3]) + (" ..." if len(c.tensors) > 3 else ""),
        )
        for c in shown
    ]
    hidden = len(cuts) - len(shown)
    print(
        f"{mg.path}  sha256 {mg.sha256[:16]}{mg.sha256[64:]}  nodes {len(mg.nodes)}{_node_note(mg)}  "
        f"GFLOPs {mg.flops / 1e9:.2f}  cuts {len(cuts)} ("
        + (
            f"{len(shown)} shown; {hidden} hidden: they send several tensors at once; --all shows every cut)"
            if hidden
            else "all shown)"
        )
    )
    if mg.specialisation is not None:
        steps = "; ".join(
            f"If {st.node!r} -> {st.branch}"
            + (
                f" ({', '.join(f'{k}={v}' for k, v in st.values.items())})"
                if st.values
                else f" (shapes of {', '.join(st.inputs)})"
            )
            for st in mg.specialisation.steps
        )
        print(f"specialised on the sample: {steps}; requests taking another branch run the whole model")
    for why in mg.excluded[:5]:
        print(f"left out: {why}", file=sys.stderr)
    print(render(["cut", "head nodes", "head FLOPs", "bytes", "crossing tensors"], rows))
    if line:
        print(line)
    return 0


def _node_note(mg: graph.ModelGraph) -> str:
    """Why the node count is not the file's (normalisation folds constants, prunes dead nodes, gives
    weights that are outputs an Identity); empty when they agree."""
    import onnx

    try:
        in_file = len(onnx.load(str(mg.path), load_external_data=False).graph.node)
    except Exception:  # the count is a courtesy: a file that loaded once but not now says nothing
        return ""
    if in_file == len(mg.nodes):
        return ""
    return (
        f" (the file has {in_file}: Constant and all-constant nodes folded into weights, dead nodes pruned, "
        "Identity nodes for weights that are outputs)"
    )


def cmd_split(args: argparse.Namespace) -> int:
    mg = load_graph(args)
    plan = partition.write_segments(mg, args.cut, args.out)
    if args.json:
        print(json.dumps(plan))
    else:
        segs = plan["segments"]
        assert isinstance(segs, list)
        rows = [(s["file"], s["nodes"], ", ".join(s["inputs"])[:60], ", ".join(s["outputs"])[:60]) for s in segs]
        print(render(["segment", "nodes", "inputs", "outputs"], rows))
        print(f"wrote {len(segs)} segments and plan.json to {args.out}")
    return 0


def cmd_zoo_list(args: argparse.Namespace) -> int:
    names = zoo.names()
    if args.json:
        print(json.dumps({"models": names}))
    else:
        print("\n".join(names))
    return 0


def cmd_zoo_get(args: argparse.Namespace) -> int:
    path = zoo.get(args.name, args.out)
    print(path)
    return 0
