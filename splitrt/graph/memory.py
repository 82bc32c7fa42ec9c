"""What each cut's head holds in memory on the device, and whether it sends the raw input.

A head's memory is its weights (every initializer a head node reads, once) plus its peak activations:
the head's nodes run in topological order; a tensor is live from when it is produced (graph inputs:
from the start) until its last consumer in the head has run, and a crossing tensor until it is sent.
The peak is the largest sum of live tensors while a node runs (its inputs and outputs together). It is
the model's figure, not the runtime's (onnxruntime's arena and session add to it).

``splitrt.graph.memory``: ``head_memory_bytes(mg, cuts=None) -> [bytes]`` (a head's weights + peak live
activations, nodes in topological order, crossing tensors live until sent); ``sends_input(mg, cuts=None) ->
[bool]`` (a graph input among the crossing tensors); ``input_layout(mg, cuts=None) -> [bool]`` (every crossing
tensor is a graph input or only moved/reshaped/cast from one: the same data as the cut ``cloud`` sends, so such
a cut is ``cloud`` for plans); ``tensor_bytes(t)`` (an initializer's bytes from its dims and type).
``profile.cutfacts.cut_facts(mg, ids) -> CutFacts``,
``allowed_for(mg, table, Constraints) -> Allowed | None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from splitrt.graph.model import Cut, ModelGraph


def _bytes(mg: ModelGraph, name: str) -> int:
    try:
        return max(int(mg.tensor(name).bytes), 0)
    except Exception:  # a name the graph has no facts for (an optional empty input)
        return 0


def head_memory_bytes(mg: ModelGraph, cuts: Sequence[Cut] | None = None) -> list[int]:
    """Weights + peak activations of each cut's head (``cuts``: default every cut), in bytes."""
    cuts = list(cuts) if cuts is not None else mg.cuts()
    inits = {i.name: tensor_bytes(i) for i in mg.model.graph.initializer}
    inputs = {t.name for t in mg.inputs}
    out = []
    for cut in cuts:
        head = sorted(cut.head)
        if not head:
            out.append(0)
            continue
        weights = sum(inits[n] for n in {i for k in head for i in mg.nodes[k].input if i in inits})
        last_use: dict[str, int] = {}
        for pos, k in enumerate(head):
            for i in mg.nodes[k].input:
                if i and i not in inits:
                    last_use[i] = pos
        keep = set(cut.tensor_names)
        live = {n: _bytes(mg, n) for n in inputs}
        peak = sum(live.values())
        for pos, k in enumerate(head):
            for o in mg.nodes[k].output:
                if o:
                    live[o] = _bytes(mg, o)
            peak = max(peak, sum(live.values()))
            for name in [n for n in live if last_use.get(n, -1) <= pos and n not in keep]:
                del live[name]
        out.append(weights + peak)
    return out


def tensor_bytes(t: Any) -> int:
    """An ``onnx.TensorProto``'s data bytes, from its dims and type (its data is never read or copied)."""
    import numpy as np
    from onnx import helper

    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:  # strings and odd types: count a byte per element
        itemsize = 1
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def sends_input(mg: ModelGraph, cuts: Sequence[Cut] | None = None) -> list[bool]:
    """Whether a graph input (the raw data) is among each cut's crossing tensors."""
    cuts = list(cuts) if cuts is not None else mg.cuts()
    inputs = {t.name for t in mg.inputs}
    return [any(n in inputs for n in c.tensor_names) for c in cuts]


#: Ops that move, reshape or re-type a tensor without computing anything from its values.
LAYOUT_OPS = frozenset(
    {"Transpose", "Reshape", "Cast", "CastLike", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Expand"}
)


def input_layout(mg: ModelGraph, cuts: Sequence[Cut] | None = None) -> list[bool]:
    """Whether each cut (other than ``cloud`` and ``device``) sends only graph inputs or layout ops of
    them (``LAYOUT_OPS`` whose other inputs are initializers or constants): ``cloud`` in disguise."""
    cuts = list(cuts) if cuts is not None else mg.cuts()
    fixed = {i.name for i in mg.model.graph.initializer}
    fixed |= {o for n in mg.nodes if n.op_type == "Constant" for o in n.output}
    derived = {t.name for t in mg.inputs}
    for node in mg.nodes:  # topological order
        if node.op_type not in LAYOUT_OPS or not node.input or node.input[0] not in derived:
            continue
        if all((not i) or i in fixed for i in node.input[1:]):
            derived.update(o for o in node.output if o)
    return [
        c.id not in ("cloud", "device") and bool(c.tensor_names) and all(n in derived for n in c.tensor_names)
        for c in cuts
    ]
