"""Normalisation: make any ONNX model safe to cut, then check it and infer its shapes.

``normalise`` drops IR<4 initializer-inputs, folds ``Constant`` nodes and all-constant nodes into
initializers (bounded in size *before* computing: a 181-byte ConstantOfShape asking for 2 GB is never
evaluated), gives initializer outputs an Identity node, prunes dead nodes and sorts the nodes
topologically (stable; a cycle is a ``ModelError``). ``check_and_infer`` runs the ONNX checker and shape
inference without the large weights' bytes. ``splitrt.graph.model.load`` applies both.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from splitrt.errors import ModelError

MIN_OPSET = 9
# Nodes never folded even when every input is constant: their result is not a function of the inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
# Folding a node whose output is bigger than this would bloat every segment that needs it.
_FOLD_MAX_ELEMENTS = 1 << 24
# Initializers whose bytes shape inference does without (``check_and_infer``).
_STRIP_BYTES = 1024


def check_and_infer(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """The ONNX checker, then shape inference (with data propagation); ``ModelError`` naming ``path``."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{path}: fails the ONNX checker: {short_error(exc)}") from exc
    # Without the large weights' bytes (their types and dims stay; small ones, shapes among them, keep
    # their values for data propagation): shape inference copies the model several times over.
    stash = {}
    for t in model.graph.initializer:
        if len(t.raw_data) > _STRIP_BYTES:
            stash[t.name] = t.raw_data
            t.raw_data = b""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ModelError(f"{path}: shape inference failed: {short_error(exc)}") from exc
    finally:
        for t in model.graph.initializer:
            if t.name in stash:
                t.raw_data = stash[t.name]
    for t in inferred.graph.initializer:
        if t.name in stash:
            t.raw_data = stash.pop(t.name)
    return inferred


def short_error(exc: BaseException) -> str:
    """A third-party error's first line, bounded: what an error message of ours quotes as the cause."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0 if not model.opset_import else MIN_OPSET


def normalise(model: onnx.ModelProto, *, in_place: bool = False) -> onnx.ModelProto:
    """Make a model safe to cut: deterministic, IR >= 4, constants as initializers, sorted nodes.

    - IR < 4 lists every initializer as a graph input too; those are weights, not inputs: drop them
      (``onnx.utils.extract_model`` and our partitioner need IR >= 4 semantics).
    - ``Constant`` nodes and nodes whose inputs are all constant are folded into initializers, so
      weights never "cross" a cut: initializers live on every side that needs them.
    """
    if in_place:
        m = model
    else:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    g = m.graph
    init_names = {i.name for i in g.initializer}
    if any(i.name in init_names for i in g.input):
        keep = [i for i in g.input if i.name not in init_names]
        del g.input[:]
        g.input.extend(keep)
    m.ir_version = max(m.ir_version, 4)
    _fold_constants(m)
    _outputs_from_nodes(m)
    _prune_dead(m)
    _toposort(m)
    return m


def _outputs_from_nodes(m: onnx.ModelProto) -> None:
    """A graph output that is an initializer is produced by no node, so no segment could yield it:
    give it an Identity node (from a renamed copy of the initializer)."""
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    for o in g.output:
        if o.name in inits:
            src_name = f"{o.name}__splitrt_const"
            inits[o.name].name = src_name
            for n in g.node:
                for k, i in enumerate(n.input):
                    if i == o.name:
                        n.input[k] = src_name
            g.node.append(helper.make_node("Identity", [src_name], [o.name]))


def _prune_dead(m: onnx.ModelProto) -> None:
    """Drop nodes no graph output depends on: they cost compute and would make two cuts with the
    same crossing set."""
    g = m.graph
    producer = {o: n for n in g.node for o in n.output if o}
    needed: set[str] = {o.name for o in g.output}
    live: set[int] = set()
    stack = list(needed)
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        stack.extend(i for i in all_inputs(n) if i)
    if len(live) != len(g.node):
        keep = [n for n in g.node if id(n) in live]
        del g.node[:]
        g.node.extend(keep)


def _fold_constants(m: onnx.ModelProto) -> None:
    g = m.graph
    consts: dict[str, onnx.TensorProto] = {i.name: i for i in g.initializer}
    graph_outputs = {o.name for o in g.output}
    kept: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for node in g.node:
        folded = None
        if node.domain in ("", "ai.onnx") and not any(o in graph_outputs for o in node.output):
            if node.op_type == "Constant":
                folded = _constant_value(node)
            elif (
                node.input
                and all(i == "" or i in consts for i in node.input)
                and node.op_type not in _NONDETERMINISTIC
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
            ):
                folded = _evaluate(node, consts, m)
        if folded is None:
            kept.append(node)
            continue
        for name, arr in folded.items():
            t = numpy_helper.from_array(arr, name)
            consts[name] = t
            new_inits.append(t)
    if new_inits:
        used = {i for n in kept for i in all_inputs(n)} | graph_outputs
        old = [i for i in g.initializer if i.name in used]
        del g.initializer[:]
        g.initializer.extend(old + [t for t in new_inits if t.name in used])
        del g.node[:]
        g.node.extend(kept)


def _constant_value(node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
    for a in node.attribute:
        if a.name == "value":
            return {node.output[0]: numpy_helper.to_array(a.t)}
        if a.name == "value_float":
            return {node.output[0]: np.array(a.f, dtype=np.float32)}
        if a.name == "value_floats":
            return {node.output[0]: np.array(list(a.floats), dtype=np.float32)}
        if a.name == "value_int":
            return {node.output[0]: np.array(a.i, dtype=np.int64)}
        if a.name == "value_ints":
            return {node.output[0]: np.array(list(a.ints), dtype=np.int64)}
    return None  # sparse_value / strings: leave the node in place


def _evaluate(
    node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], m: onnx.ModelProto
) -> dict[str, np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    try:
        if sum(int(np.prod(consts[i].dims, dtype=np.int64)) for i in node.input if i) > _FOLD_MAX_ELEMENTS:
            return None
        # Bounded before computing: a 181-byte ConstantOfShape asking for 2 GB must not be evaluated.
        size = _output_elements(node, consts, m)
        if size is None or size > _FOLD_MAX_ELEMENTS:
            return None
        feeds = {i: numpy_helper.to_array(consts[i]) for i in node.input if i}
        inputs = [helper.make_tensor_value_info(k, consts[k].data_type, None) for k in feeds]
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
        g = helper.make_graph([node], "fold", inputs, outputs)
        single = helper.make_model(g, opset_imports=list(m.opset_import))
        results = ReferenceEvaluator(single).run(None, feeds)
    except Exception:
        return None  # not foldable here (custom op, reference gap): keep the node, it is still correct
    out = {o: np.asarray(r) for o, r in zip([o for o in node.output if o], results, strict=True)}
    if any(v.size > _FOLD_MAX_ELEMENTS for v in out.values()):
        return None
    return out


def _output_elements(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], m: onnx.ModelProto) -> int | None:
    """Elements of the node's outputs as shape inference (with its constant inputs' values) tells them,
    or None when it cannot (then the node is not folded: nothing computes an unbounded size)."""
    names = [i for i in node.input if i]
    outs = [o for o in node.output if o]
    g = helper.make_graph(
        [node],
        "bound",
        [],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
        [consts[i] for i in dict.fromkeys(names)],
    )
    single = helper.make_model(g, opset_imports=list(m.opset_import))
    single.ir_version = max(m.ir_version, 4)
    inferred = shape_inference.infer_shapes(single, strict_mode=False, data_prop=True)
    shapes = {vi.name: vi.type.tensor_type for vi in list(inferred.graph.output) + list(inferred.graph.value_info)}
    total = 0
    for o in outs:
        n = None if (tt := shapes.get(o)) is None else static_elements(tt)
        if n is None:
            return None
        total += n
    return total


def static_elements(tt: Any) -> int | None:
    """The element count of an ``onnx.TypeProto.Tensor`` whose every dimension is a known value, else None."""
    if not tt.HasField("shape"):
        return None
    n = 1
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        n *= int(d.dim_value)
    return n


def _subgraph_captures(node: onnx.NodeProto) -> set[str]:
    """Outer-scope tensors a node's subgraphs (If/Loop/Scan bodies) read."""
    captured: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for sg in graphs:
            local = {i.name for i in sg.input} | {i.name for i in sg.initializer}
            for n in sg.node:
                for i in list(n.input) + sorted(_subgraph_captures(n)):
                    if i and i not in local:
                        captured.add(i)
                local.update(o for o in n.output if o)
    return captured


def all_inputs(node: onnx.NodeProto) -> list[str]:
    extra = sorted(_subgraph_captures(node) - set(node.input))
    return [i for i in list(node.input) + extra if i]


def producers(nodes: Sequence[onnx.NodeProto]) -> dict[str, int]:
    """Each tensor a node makes, by name: the index of that node in ``nodes``."""
    return {o: idx for idx, n in enumerate(nodes) for o in n.output if o}


def _toposort(m: onnx.ModelProto) -> None:
    """Stable topological sort (Kahn, ties by original position); rejects cycles."""
    g = m.graph
    nodes = list(g.node)
    produced_by = producers(nodes)
    preds = [{produced_by[i] for i in all_inputs(n) if i in produced_by} - {idx} for idx, n in enumerate(nodes)]
    succs: list[list[int]] = [[] for _ in nodes]
    for idx, ps in enumerate(preds):
        for p in ps:
            succs[p].append(idx)
    indeg = [len(ps) for ps in preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != len(nodes):
        raise ModelError("graph has a cycle (expected a DAG)")
    if order != list(range(len(nodes))):
        del g.node[:]
        g.node.extend(nodes[i] for i in order)
