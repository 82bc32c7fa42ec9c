"""A request's peak activation memory, estimated from its segment's graph at the request's shapes.

Tail segments are shape-generic: a free dimension (a batch, a sequence length) is bound by each
request, and what a bound dimension costs is only known at its value (a 1.56 MB request binding
sequence 6000 on an encoder needed 1.9 GB). Before a request runs, its input shapes are propagated
through the segment (onnx shape inference with data propagation, on a *skeleton* of the segment: the
graph with its large weights turned into inputs, so nothing big is copied), and the tensors are walked
in the segment's order, each alive from its producer to its last consumer; the largest sum alive is the
estimate. onnxruntime plans its buffers the same way (freed after the last use), so this is the memory
the run needs give or take kernels' scratch space. A tensor whose size shape inference cannot tell (data
dependent: NonZero, a Loop's outputs) counts 0 and is reported in ``Estimate.unknown``; those are bounded
by the process's memory watch instead (``splitrt.cloud.capacity.cancel``).

Sizes may also come from a request's *values*: a small integer tensor crossing the cut (a batch count
feeding ``Expand``, a shape feeding ``ConstantOfShape``/``Reshape``/``Tile``/``Range``) decides how much
its tail allocates (vit_tiny at c4: 8 bytes asking for 7.4 GB). Such tensors (``sizing``) are put in
the skeleton as constants before shape inference, so data propagation carries their values to the sizes
they imply and the estimate sees the allocation before it happens.

- ``peak.skeleton(model)`` (the segment without large weights' data), ``PeakEstimator.estimate(key, skeleton,
  shapes, values) -> Estimate(peak_bytes, unknown)``: tensors alive from producer to last consumer at the
  request's shapes and small integer inputs' values (those that may decide a size: ``.sizing``);
  the server refuses a request beyond its ``max_request_bytes`` (x1.2 for kernels' scratch).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from splitrt.graph.normalise import static_elements

# Initializers larger than this many elements become inputs of the skeleton (their values never
# decide a shape; small ones, like Reshape's target, do and are kept).
_KEEP_ELEMENTS = 1024
_CACHE_ENTRIES = 32
#: A request's small integer inputs by name (``sizing``).
Values = dict[str, np.ndarray]


@dataclass(frozen=True)
class Estimate:
    peak_bytes: int
    unknown: int  # tensors whose size could not be told


def skeleton(model: Any) -> Any:
    """The segment without its large weights' data (they become graph inputs of the same type)."""
    import onnx
    from onnx import helper

    g = model.graph
    skel = onnx.ModelProto()
    skel.ir_version = model.ir_version
    skel.opset_import.extend(model.opset_import)
    sg = skel.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    for o in g.output:  # element type only: shapes come from the request's
        sg.output.append(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None))
    for init in g.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= _KEEP_ELEMENTS:
            sg.initializer.append(init)
        else:
            sg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return skel


class PeakEstimator:
    """Estimates per (segment, input shapes), the last few cached (a client's shapes rarely change)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[Any, ...], Estimate] = OrderedDict()
        self._sizing: OrderedDict[str, frozenset[str]] = OrderedDict()

    def sizing(self, segment: str, skel: Any, known: frozenset[str] | None = None) -> frozenset[str]:
        """The skeleton's inputs whose values may decide a size (``sizing.sizing_inputs``), cached; ``known``:
        that answer, worked out elsewhere (where the segment was made), taken as is."""
        from splitrt.graph.sizing import sizing_inputs

        with self._lock:
            hit = self._sizing.get(segment)
        if hit is None:
            hit = known if known is not None else sizing_inputs(skel)
            with self._lock:
                self._sizing[segment] = hit
                while len(self._sizing) > _CACHE_ENTRIES:
                    self._sizing.popitem(last=False)
        return hit

    def estimate(
        self, segment: str, skel: Any, shapes: dict[str, tuple[int, ...]], values: Values | None = None
    ) -> Estimate:
        """``segment`` names the skeleton (model sha256 and cut) in the cache; ``values``: the request's small
        integer inputs (``sizing``), taken as constants where they may decide a size."""
        sizing = self.sizing(segment, skel) if values else frozenset()
        values = {k: v for k, v in (values or {}).items() if k in sizing}
        shown = tuple(sorted((k, v.dtype.str, v.tobytes()) for k, v in values.items()))
        key = (segment, tuple(sorted(shapes.items())), shown)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        est = peak_bytes(skel, shapes, values)
        with self._lock:
            self._cache[key] = est
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return est


def peak_bytes(skel: Any, shapes: dict[str, tuple[int, ...]], values: Values | None = None) -> Estimate:
    """Peak bytes of the activations (inputs included) of ``skel`` run at input ``shapes``, the inputs in
    ``values`` taken as those constants."""
    import onnx
    from onnx import numpy_helper, shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(skel)
    weights = {i.name for i in m.graph.initializer}
    consts: Values = {}
    if values:  # constants now: shape inference's data propagation reads them
        from splitrt.graph.sizing import fold

        kept = [vi for vi in m.graph.input if vi.name not in values]
        del m.graph.input[:]
        m.graph.input.extend(kept)
        folded = fold(m, values)  # and what small nodes compute from them, where propagation stops
        if folded:
            nodes = [n for n in m.graph.node if not any(o in folded for o in n.output)]
            del m.graph.node[:]
            m.graph.node.extend(nodes)
        consts = {**values, **folded}
        m.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items())
    for vi in m.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                dims.add().dim_value = int(d)
    with contextlib.suppress(Exception):  # an inconsistent segment: onnxruntime says so when it runs
        m = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    sizes: dict[str, int | None] = {}
    itemsizes: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
        sizes[vi.name] = _bytes(vi)
        itemsizes[vi.name] = _itemsize(vi.type.tensor_type.elem_type)
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    big_weights = {vi.name for vi in skel.graph.input} - set(shapes)
    nodes = list(m.graph.node)
    last: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for i in n.input:
            last[i] = idx
    outputs = {o.name for o in m.graph.output}
    unknown = 0
    live = {name: sizes.get(name) or 0 for name in shapes}
    cur = sum(live.values())
    peak = cur
    for idx, n in enumerate(nodes):
        for o in n.output:
            if not o:
                continue
            size = sizes.get(o)
            if size is None:  # told by operand values, or data dependent: at its worst
                from splitrt.graph.sizing import told_elements, worst_elements

                told = told_elements(n, consts) if o == n.output[0] and consts else None
                if told is None:
                    known = [i for i in n.input if sizes.get(i) is not None]
                    elements = {i: (sizes.get(i) or 0) // itemsizes.get(i, 1) for i in known}
                    told = worst_elements(n, elements, ranks)
                size = None if told is None else told * itemsizes.get(o, 8)
            if size is None:
                unknown += 1
                size = 0
            live[o] = size
            cur += size
        peak = max(peak, cur)
        for i in set(n.input):
            if i in live and last.get(i) == idx and i not in outputs and i not in weights and i not in big_weights:
                cur -= live.pop(i)
    return Estimate(peak_bytes=int(peak), unknown=unknown)


def _bytes(vi: Any) -> int | None:
    tt = vi.type.tensor_type
    n = static_elements(tt)
    return None if n is None else n * _itemsize(tt.elem_type)


def _itemsize(elem_type: int) -> int:
    from onnx import helper

    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except Exception:  # strings, undefined and the like: a guess of 8 bytes per element
        return 8
