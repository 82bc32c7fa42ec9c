"""Inputs whose *values* decide sizes: a small integer tensor crossing a cut can decide how much the tail
allocates (a batch count feeding ``Expand``, a shape feeding ``ConstantOfShape``), so the peak estimate
(``peak``) takes such values as constants before shape inference.

Only inputs that reach an operand whose values decide a size (``SIZE_OPERANDS``: Expand's shape, Reshape's,
ConstantOfShape's, Tile's repeats, Range's bounds, a Loop's trip count, any input of a node with a
subgraph...) through any path not cut by ``Shape``/``Size`` count: token ids (data) do not, so a request
of ids is not estimated again per value.

- ``sizing_inputs(model) -> frozenset``: the graph inputs whose values may decide a size.
- ``fold(model, values)``: what small nodes compute from them; ``told_elements(node, consts)``: an output's
  size told by operand values where onnx's shape inference does not tell it (MaxUnpool);
  ``worst_elements(node, elements, ranks)``: the most a data-dependent output (NonZero...) can hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SIZE_OPERANDS", "fold", "sizing_inputs", "told_elements", "worst_elements"]

#: (op, input index) whose values decide the size of an output (or the work: a Loop's trip count).
SIZE_OPERANDS = frozenset(
    [("Expand", 1), ("Reshape", 1), ("ConstantOfShape", 0), ("Tile", 1), ("Pad", 1), ("TopK", 1), ("OneHot", 1)]
    + [("Range", i) for i in range(3)]
    + [("Slice", i) for i in range(1, 5)]
    + [("Resize", i) for i in range(1, 4)]
    + [("Upsample", 1), ("Split", 1), ("Unsqueeze", 1), ("Squeeze", 1), ("Loop", 0), ("CenterCropPad", 1)]
    + [("NonMaxSuppression", 2), ("RandomNormalLike", 0), ("Trilu", 1), ("Compress", 1), ("GridSample", 1)]
    # Signal and image ops whose output is sized by an operand's value (onnxruntime allocates it: 8 bytes
    # asking for 1 GiB ran in 2-155 s each, 1.1-2.1 GB RSS): a window's length, DFT's length, STFT's step
    # and frame, the mel matrix's bins and length, AffineGrid's size, MaxUnpool's output shape, Col2Im's.
    + [("HannWindow", 0), ("HammingWindow", 0), ("BlackmanWindow", 0), ("DFT", 1), ("STFT", 1), ("STFT", 3)]
    + [("MelWeightMatrix", i) for i in range(5)]
    + [("AffineGrid", 1), ("MaxUnpool", 2), ("Col2Im", 1), ("Col2Im", 2)]
)
# Outputs that depend on their input's shape only, never its values: a path through them carries no value.
_SHAPE_ONLY = frozenset(("Shape", "Size"))


def _subgraph_names(node: Any) -> set[str]:
    """Every name a node's subgraphs (If/Loop/Scan bodies, at any depth) read."""
    import onnx

    names: set[str] = set()
    stack = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    stack += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    while stack:
        g = stack.pop()
        for n in g.node:
            names.update(n.input)
            stack += [a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack += [sg for a in n.attribute if a.type == onnx.AttributeProto.GRAPHS for sg in a.graphs]
    return names


def sizing_inputs(model: Any) -> frozenset[str]:
    """The graph inputs of ``model`` (an ``onnx.ModelProto``) from which a path not through ``Shape``/``Size``
    reaches a size operand (``SIZE_OPERANDS``) or a node with a subgraph."""
    import onnx

    graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    nodes = list(model.graph.node)
    reads: list[set[str]] = []  # per node: what it reads (its subgraphs' outer names included)
    sinks: list[set[str]] = []  # per node: what of it decides a size
    for n in nodes:
        inner = _subgraph_names(n)
        reads.append(set(n.input) | inner)
        if inner or any(a.type in graphs for a in n.attribute):  # a body can size anything
            sinks.append(reads[-1])
        else:
            sinks.append({name for i, name in enumerate(n.input) if name and (n.op_type, i) in SIZE_OPERANDS})
    found: set[str] = set()
    for start in (vi.name for vi in model.graph.input):
        reach = {start}
        for n, read, sink in zip(nodes, reads, sinks, strict=True):  # topological order (onnx's rule)
            fed = reach & read
            if not fed:
                continue
            if fed & sink:
                found.add(start)
                break
            if n.op_type not in _SHAPE_ONLY:
                reach.update(o for o in n.output if o)
    return frozenset(found)


def told_elements(node: Any, consts: Mapping[str, np.ndarray]) -> int | None:
    """The element count of ``node``'s first output where its operands' known values (``consts``) tell it
    and onnx's shape inference does not (MaxUnpool's ``output_shape``); None otherwise."""
    if node.op_type == "MaxUnpool" and len(node.input) > 2 and node.input[2] in consts:
        dims = [int(d) for d in np.asarray(consts[node.input[2]]).reshape(-1)]
        return 0 if any(d < 0 for d in dims) else int(np.prod(dims, dtype=object))
    return None


def worst_elements(node: Any, elements: Mapping[str, int], ranks: Mapping[str, int]) -> int | None:
    """At most how many elements each output of ``node`` holds when its size depends on the data (NonZero,
    Compress, Unique, TopK with an unknown k, NonMaxSuppression), from its inputs' element counts and ranks;
    None when that does not bound it (a Loop's outputs). onnxruntime allocates what the data asks: NonZero
    of a 64 MB all-true bool tensor (a 2 KB zstd payload) is a 2 GiB int64 output."""
    ins = [i for i in node.input]
    first = elements.get(ins[0]) if ins and ins[0] else None
    if first is None:
        return None
    if node.op_type == "NonZero":
        return max(1, ranks.get(ins[0], 1)) * first
    if node.op_type in ("Compress", "Unique", "TopK"):  # every element kept (Unique's indices: one each)
        return first
    if node.op_type == "NonMaxSuppression" and len(ins) > 1 and ins[1] in elements:
        return 3 * elements[ins[1]]  # [selected, 3]: at most every (batch, class, box) of the scores
    return None


# Ops evaluated on small known values (``fold``): arithmetic and indexing whose output is no larger than
# what they read (Range is checked first). ConstantOfShape, Expand, Tile and the like are not: they are
# the allocations, sized by shape inference once their operands are constants.
_FOLDABLE = frozenset(
    [
        "Identity",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Mod",
        "Abs",
        "Neg",
        "Max",
        "Min",
        "Sum",
        "Cast",
        "Floor",
        "Ceil",
        "Round",
        "Sqrt",
        "Pow",
        "Reciprocal",
        "Sign",
        "Clip",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Gather",
        "Slice",
        "Reshape",
        "Flatten",
        "Transpose",
        "ReduceProd",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceMean",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Where",
        "Range",
    ]
)
# What a folded tensor may hold; past it a result is not kept (a size is a few numbers).
FOLD_MAX_ELEMENTS = 1024
FOLD_MAX_NODES = 256


def _range_count(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> float:
    s, l_, d = (float(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
    return float("inf") if d == 0 else max(0.0, np.ceil((l_ - s) / d))


def fold(model: Any, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors of ``model`` (an ``onnx.ModelProto``) computed from ``values`` and its small initializers
    by ``_FOLDABLE`` nodes, in graph order (onnx's reference evaluator, one node at a time; at most
    ``FOLD_MAX_NODES`` nodes, no result over ``FOLD_MAX_ELEMENTS``). What onnx's data propagation does not
    carry (Identity, Div, Abs, Max...) becomes a constant its shape inference reads."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    known: dict[str, np.ndarray] = dict(values)
    for init in model.graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= FOLD_MAX_ELEMENTS:
            known[init.name] = numpy_helper.to_array(init)
    tainted, out, evaluated = set(values), {}, 0
    for node in model.graph.node:
        ins = [i for i in node.input if i]
        if node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx") or not set(ins) & tainted:
            continue
        if not all(i in known for i in ins) or evaluated >= FOLD_MAX_NODES:
            continue
        args = [known[i] for i in ins]
        if node.op_type == "Range" and _range_count(*args[:3]) > FOLD_MAX_ELEMENTS:
            continue
        evaluated += 1
        try:
            results = ReferenceEvaluator(node).run(None, dict(zip(ins, args, strict=True)))
        except Exception:  # what the evaluator cannot do, shape inference is left to
            continue
        for name, r in zip(node.output, results, strict=False):
            r = np.asarray(r)
            if name and r.size <= FOLD_MAX_ELEMENTS:
                known[name] = out[name] = r
                tainted.add(name)
    return out
