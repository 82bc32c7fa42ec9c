"""Materialise the segments of a model split at one cut (head/tail) or a chain of nested cuts.

Segment i runs the nodes between cut i-1 and cut i. Its inputs are the tensors crossing cut i-1
(segment 0: the graph inputs) and its outputs the tensors crossing cut i plus the graph outputs its own
nodes make (the last segment: only those). A graph output the device already holds never crosses and
never comes back: whoever runs the head assembles the outputs (``Cut.kept`` + the reply). A tensor
crossing both cuts passes straight through (ONNX allows a graph input to be a graph output), which is
how a skip connection or a late graph input travels device -> edge -> cloud.
Each segment carries only the initializers its nodes (and their subgraphs) read.

- ``split(graph, cut_ids) -> list[Segment]``: cut ids must be nested (each head contains the previous); returns
  len(cut_ids)+1 segments; segment 0 takes the graph inputs; segment i yields the tensors crossing cut i plus
  the graph outputs its own nodes make (the last one: only those). ``Segment(index, model, inputs, outputs)``:
  ``model`` an ``onnx.ModelProto`` that passes the checker; ``inputs``/``outputs`` tuples of tensor names. The
  tail of ``device`` is empty (no inputs, no outputs: nothing runs it). Every crossing tensor is declared with
  its rank: a bound graph's ``generic_shape`` is the model's declaration where the measurement agrees, else the
  measured rank with a generated symbol per dim (``shapes.declaration``); ``declared_inputs(model)`` reads a
  segment's inputs as declared (None: no shape, ``()``: a scalar; onnxruntime reports both as ``[]``), which is
  what the server checks.
- ``head_tail(graph, cut_id) -> tuple[Segment, Segment]``.
- ``SegmentCache(root_dir)``: ``.paths(graph, cut_ids) -> list[Path]`` writes segments once, keyed by model
  sha256 + cut ids.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from splitrt.errors import CutError
from splitrt.graph.cuts import Cut, bits
from splitrt.graph.model import ModelGraph
from splitrt.graph.normalise import all_inputs


@dataclass(frozen=True)
class Segment:
    index: int
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    node_count: int


Declared = tuple[int | str | None, ...] | None


def declared_inputs(model: onnx.ModelProto) -> list[tuple[str, str, Declared]]:
    """``(name, dtype, shape)`` of each graph input as the model declares it: ``shape`` is None when no
    shape is declared (any rank), ``()`` for a scalar. onnxruntime reports both as ``[]``, so whoever
    checks a request's tensors reads the declaration here, not from a session."""
    out: list[tuple[str, str, Declared]] = []
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
        shape = (
            tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                for d in tt.shape.dim
            )
            if tt.HasField("shape")
            else None
        )
        out.append((vi.name, dtype, shape))
    return out


def _graph_input_crossing(graph: ModelGraph) -> tuple[str, ...]:
    return tuple(t.name for t in graph.cut("cloud").tensors)


def chain(graph: ModelGraph, cut_ids: Sequence[str]) -> list[Cut]:
    """The cuts named by ``cut_ids``, checked to be nested (each head contains the previous one)."""
    cuts = [graph.cut(c) for c in cut_ids]
    for a, b in itertools.pairwise(cuts):
        if a.head_mask & ~b.head_mask:
            raise CutError(f"cuts must be nested in device -> cloud order: head of {a.id} is not inside head of {b.id}")
    return cuts


def split(graph: ModelGraph, cut_ids: Sequence[str]) -> list[Segment]:
    """``len(cut_ids) + 1`` standalone segments; their composition computes the whole model."""
    if not cut_ids:
        raise CutError("expected at least one cut id to split at, got none")
    cuts = chain(graph, cut_ids)
    boundaries: list[tuple[int, tuple[str, ...]]] = [(0, _graph_input_crossing(graph))]
    boundaries += [(c.head_mask, c.tensor_names) for c in cuts]
    full = (1 << len(graph.nodes)) - 1
    boundaries.append((full, ()))
    segments = []
    for i in range(len(boundaries) - 1):
        (lo_mask, ins), (hi_mask, sent) = boundaries[i], boundaries[i + 1]
        nodes = [graph.nodes[k] for k in bits(hi_mask & ~lo_mask)]
        # What the next segment needs, and the graph outputs made here (they go back to the device, never
        # further down the chain).
        made = {o for n in nodes for o in n.output}
        outs = tuple(dict.fromkeys([*sent, *(o.name for o in graph.outputs if o.name in made)]))
        segments.append(Segment(i, _segment_model(graph, nodes, ins, outs, f"segment{i}"), ins, outs, len(nodes)))
    return segments


def head_tail(graph: ModelGraph, cut_id: str) -> tuple[Segment, Segment]:
    head, tail = split(graph, [cut_id])
    return head, tail


def _value_info(graph: ModelGraph, name: str) -> onnx.ValueInfoProto:
    # The shape the model declares (symbolic dims kept), not the bound one: one segment pair serves
    # every input shape the full model accepts.
    t = graph.tensor(name)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
    shape = graph.generic_shape(name)
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _segment_model(
    graph: ModelGraph,
    nodes: list[onnx.NodeProto],
    inputs: Sequence[str],
    outputs: Sequence[str],
    name: str,
) -> onnx.ModelProto:
    src = graph.model
    needed = {i for n in nodes for i in all_inputs(n)}
    inits = [t for t in src.graph.initializer if t.name in needed]
    produced = {o for n in nodes for o in n.output} | set(inputs)
    vis = [vi for vi in src.graph.value_info if vi.name in produced and vi.name not in outputs]
    g = helper.make_graph(
        nodes,
        f"{src.graph.name or 'model'}_{name}",
        [_value_info(graph, i) for i in inputs],
        [_value_info(graph, o) for o in outputs],
        inits,
        value_info=vis,
    )
    m = helper.make_model(g, opset_imports=list(src.opset_import), producer_name="splitrt.partition")
    m.ir_version = src.ir_version
    m.functions.extend(src.functions)
    if src.domain:
        m.domain = src.domain
    return m


# ----------------------------------------------------------------------------------------------------


class SegmentCache:
    """On-disk cache of segment files keyed by model sha256 and the cut chain.

    Layout: ``root/<sha256[:16]>/<cut ids joined by '_'>/segment<i>.onnx`` plus ``plan.json``. Writes
    go to a temporary directory renamed into place, so concurrent processes never see half a chain.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def dir_for(self, graph: ModelGraph, cut_ids: Sequence[str]) -> Path:
        # a specialised graph (``<sha256>~<steps>``) has cut ids of its own: keep its steps in the key
        base, sep, steps = graph.sha256.partition("~")
        return self.root / (base[:16] + sep + steps) / "_".join(cut_ids)

    def paths(self, graph: ModelGraph, cut_ids: Sequence[str]) -> list[Path]:
        target = self.dir_for(graph, cut_ids)
        count = len(cut_ids) + 1
        files = [target / f"segment{i}.onnx" for i in range(count)]
        if all(f.exists() for f in files):
            return files
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        write_segments(graph, cut_ids, tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: use its copy
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
        return files


def write_segments(graph: ModelGraph, cut_ids: Sequence[str], out_dir: str | Path) -> dict[str, object]:
    """Write ``segment<i>.onnx`` files and ``plan.json`` into ``out_dir``; return the plan."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    segments = split(graph, cut_ids)
    for s in segments:
        onnx.save_model(s.model, str(out / f"segment{s.index}.onnx"))
    plan: dict[str, object] = {
        "model": str(graph.path),
        "sha256": graph.sha256,
        "cuts": list(cut_ids),
        # What the sizes were computed at; the segments themselves keep the model's free dims.
        "binding": graph.binding.as_dict() if graph.binding is not None else None,  # with its specialisation
        "input_shapes": {k: list(v) for k, v in (graph.input_shapes or {}).items()},
        "segments": [
            {
                "file": f"segment{s.index}.onnx",
                "inputs": list(s.inputs),
                "outputs": list(s.outputs),
                "nodes": s.node_count,
            }
            for s in segments
        ],
    }
    (out / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    return plan


def pass_through(outputs: Sequence[str], feeds: Mapping[str, Any], values: Sequence[Any]) -> list[Any]:
    """A segment's run results with every output that is also one of its inputs replaced by that input.

    A middle segment forwards some crossing tensors unchanged (graph input -> graph output, no node).
    onnxruntime 1.23 (the newest for Python 3.10) can hand such an output back as memory it no longer
    owns: seen on a resnet50 chain segment, relative error 36 once the next session ran. The value is the
    input by definition, so it is taken from the feeds.
    """
    return [feeds.get(name, value) for name, value in zip(outputs, values, strict=True)]
