"""FLOPs of one ONNX node from the shapes of its tensors: the cost prior of every plan made without a profile.

Multiply-adds count 2 (convolutions, matrix products, recurrent cells, attention, Einsum, and their
quantized forms, which do the same arithmetic in integers); elementwise, normalisation, pooling, reduction,
resize and (de)quantization ops count a few FLOPs per element they touch; an ``If`` counts its dearer
branch, a ``Loop``/``Scan`` its body once. Only ops that move or
describe data without arithmetic (``ZERO_COST``) count 0: ``tests/graph/test_flops.py`` fails for any other
op type in the zoo or the real-weights models that counts 0.

Symbolic dims count as 1 (unbound graphs); an unknown shape falls back to the largest known operand.

- ``nodes_flops(nodes, shapes) -> list[float]``: ``node_flops`` of each node at ``shapes`` (name -> shape).
- ``node_flops(node, shape_of) -> float`` (what ``.node_flops`` holds): multiply-adds x2 for convolutions,
  matrix products, recurrent cells (LSTM/GRU/RNN, DynamicQuantizeLSTM), attention (``com.microsoft``
  Attention/MultiHeadAttention, ONNX Attention), Einsum and their integer/QLinear forms (the same count as the
  float op); a few FLOPs per element for elementwise, normalisation, pooling, reduction, resize and
  (de)quantization ops; an ``If`` its dearer branch. Only ``ZERO_COST`` ops (layout, indexing, shapes) count 0;
  ``tests/graph/test_flops.py`` fails for any other op type of the zoo or the real-weights models that counts
  less than one FLOP per output element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import onnx

Shape = Sequence[int | str] | None
ShapeOf = Callable[[str], Shape]

# Layout, indexing and metadata: no arithmetic on the elements.
ZERO_COST = frozenset(
    {
        "Identity",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Shape",
        "Size",
        "Constant",
        "ConstantOfShape",
        "Gather",
        "GatherElements",
        "GatherND",
        "Slice",
        "Concat",
        "Split",
        "SplitToSequence",
        "Expand",
        "Tile",
        "Pad",
        "Range",
        "Dropout",
        "DepthToSpace",
        "SpaceToDepth",
        "ScatterND",
        "ScatterElements",
        "Scatter",
        "EyeLike",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceLength",
        "ConcatFromSequence",
        "Compress",
        "NonZero",
        "OneHot",
        "Trilu",
    }
)
# FLOPs per output element, for ops dearer than one arithmetic operation an element.
_PER_ELEMENT = {
    "Sigmoid": 4,
    "Tanh": 6,
    "Erf": 6,
    "Exp": 4,
    "Log": 4,
    "Sqrt": 2,
    "Pow": 4,
    "Gelu": 8,
    "FastGelu": 8,
    "BiasGelu": 9,
    "QuickGelu": 5,
    "HardSwish": 4,
    "HardSigmoid": 3,
    "Swish": 5,
    "Mish": 10,
    "Softplus": 5,
    "Elu": 4,
    "Selu": 4,
    "Celu": 4,
    "Softmax": 5,
    "LogSoftmax": 6,
    "Hardmax": 2,
    "Clip": 2,
    "BatchNormalization": 2,
    "InstanceNormalization": 5,
    "LayerNormalization": 8,
    "SimplifiedLayerNormalization": 6,
    "SkipLayerNormalization": 9,
    "SkipSimplifiedLayerNormalization": 7,
    "GroupNormalization": 5,
    "LpNormalization": 3,
    "MeanVarianceNormalization": 5,
    "RMSNormalization": 6,
    "QuantizeLinear": 3,
    "DequantizeLinear": 2,
    "DynamicQuantizeLinear": 4,
    "Resize": 4,
    "Upsample": 4,
    "GridSample": 8,
    "Sin": 6,
    "Cos": 6,
    "Reciprocal": 2,
    "Div": 2,
}
_GATES = {"LSTM": 4, "DynamicQuantizeLSTM": 4, "GRU": 3, "RNN": 1}
# Elementwise work per gate and hidden unit and step (activations, the cell update).
_GATE_ELEMENTWISE = {"LSTM": 12, "DynamicQuantizeLSTM": 12, "GRU": 12, "RNN": 3}


def _numel(shape: Shape) -> int:
    if shape is None:
        return 0
    return math.prod(d if isinstance(d, int) and d >= 0 else 1 for d in shape)


def _dim(shape: Shape, i: int) -> int:
    if shape is None or not shape or not -len(shape) <= i < len(shape):
        return 1
    d = shape[i]
    return d if isinstance(d, int) and d > 0 else 1


def _attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _largest(node: onnx.NodeProto, shape_of: ShapeOf) -> int:
    """Elements of the biggest operand: the output's, or an input's when the output is unknown."""
    names = [n for n in list(node.output) + list(node.input) if n]
    return max((_numel(shape_of(n)) for n in names), default=0)


def node_flops(node: onnx.NodeProto, shape_of: ShapeOf) -> float:
    """FLOPs of ``node``; ``shape_of(name)`` gives a tensor's shape (symbolic dims allowed) or None."""
    op = node.op_type
    if op in ZERO_COST:
        return 0.0
    out = shape_of(node.output[0]) if node.output else None
    if op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "NhwcConv", "FusedConv"):
        w = shape_of(node.input[3 if op == "QLinearConv" else 1]) if len(node.input) > 1 else None
        # Weight [Cout, Cin/groups, k...]: each output element costs prod(w[1:]) MACs (ConvTranspose: the
        # input elements do, times Cout/groups).
        if w is not None:
            if op == "ConvTranspose":
                return 2.0 * _numel(shape_of(node.input[0])) * _numel(w[1:])
            return 2.0 * _numel(out) * _numel(w[1:])
    if (
        op
        in (
            "Gemm",
            "MatMul",
            "MatMulInteger",
            "QLinearMatMul",
            "MatMulIntegerToFloat",
            "DynamicQuantizeMatMul",
            "FusedMatMul",
            "QGemm",
            "MatMulNBits",
            "MatMulFpQ4",
            "QAttention",
        )
        and node.input
    ):
        a = shape_of(node.input[0])
        if a is not None and len(a) > 0:
            k = _dim(a, 0) if op == "Gemm" and _attr(node, "transA", 0) else _dim(a, -1)
            return 2.0 * max(_numel(out), 1) * k
    if op in _GATES:
        return _recurrent(node, shape_of)
    if op == "Einsum":
        return _einsum(node, shape_of)
    if op in ("Attention", "MultiHeadAttention", "GroupQueryAttention", "DecoderMaskedMultiHeadAttention"):
        return _attention(node, shape_of)
    if op in ("MaxPool", "AveragePool", "LpPool", "MaxRoiPool"):
        return float(max(_numel(out), 1) * max(_numel(_attr(node, "kernel_shape", []) or []), 1))  # type: ignore[arg-type]
    if op.startswith(("Global", "Reduce", "ArgM")) or op in ("TopK", "CumSum"):
        return float(max(_numel(shape_of(node.input[0])) if node.input else 0, 1))
    if op in ("If", "Loop", "Scan"):
        return _control_flow(node, shape_of)
    return float(_PER_ELEMENT.get(op, 1) * max(_largest(node, shape_of), 1))


def _recurrent(node: onnx.NodeProto, shape_of: ShapeOf) -> float:
    """LSTM/GRU/RNN (and DynamicQuantizeLSTM): per step and direction, the input and recurrent matrix
    products (gates x hidden x (input + hidden) MACs per batch row) plus the gates' elementwise work."""
    op = node.op_type
    x = shape_of(node.input[0])
    hidden = int(_attr(node, "hidden_size", 0) or 0)  # type: ignore[call-overload]
    if hidden <= 0:
        r = shape_of(node.input[2]) if len(node.input) > 2 else None
        hidden = _dim(r, -1) if op != "DynamicQuantizeLSTM" else _dim(r, 1)
    dirs = 2 if _attr(node, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    layout = int(_attr(node, "layout", 0) or 0)  # type: ignore[call-overload]
    steps, batch = (_dim(x, 1), _dim(x, 0)) if layout else (_dim(x, 0), _dim(x, 1))
    feat = _dim(x, -1)
    gates = _GATES[op]
    macs = gates * hidden * (feat + hidden)
    return float(steps * batch * dirs * (2 * macs + _GATE_ELEMENTWISE[op] * hidden))


def _einsum(node: onnx.NodeProto, shape_of: ShapeOf) -> float:
    """Product of every index's size (the loop nest), x2 when something is summed."""
    eq = _attr(node, "equation", b"")
    text = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")
    lhs, _, rhs = text.partition("->")
    sizes: dict[str, int] = {}
    for term, name in zip(lhs.split(","), node.input, strict=False):
        shape = shape_of(name)
        if shape is None:
            continue
        labels = list(term.replace("...", ""))
        n_ell = len(shape) - len(labels) if "..." in term else 0
        before = term.split("...")[0] if "..." in term else term
        # Ellipsis dims get labels of their own, aligned from the right like broadcasting.
        full = list(before) + [f"...{i}" for i in range(n_ell)] + (list(term.split("...")[1]) if "..." in term else [])
        for lab, i in zip(full, range(len(shape)), strict=False):
            if lab.startswith("..."):
                lab = f"...{n_ell - 1 - int(lab[3:])}"
            sizes[lab] = max(sizes.get(lab, 1), _dim(shape, i))
    if not sizes:
        return float(max(_largest(node, shape_of), 1))
    kept = set(rhs.replace("...", "")) if "->" in text else {c for c in lhs if lhs.count(c) == 1 and c.isalpha()}
    summed = any(lab not in kept and not lab.startswith("...") for lab in sizes)
    return float((2 if summed else 1) * math.prod(sizes.values()))


def _attention(node: onnx.NodeProto, shape_of: ShapeOf) -> float:
    """Q.K^T and attention x V (2 x 2 x batch x q_len x kv_len x hidden), softmax, and for the packed
    ``com.microsoft`` Attention the QKV projection (its input [B, S, D_in] times weights [D_in, 3D])."""
    q = shape_of(node.input[0])
    if q is None:
        return float(max(_largest(node, shape_of), 1))
    if node.op_type == "Attention" and node.domain == "com.microsoft":
        w = shape_of(node.input[1]) if len(node.input) > 1 else None
        b, s, d_in = _dim(q, 0), _dim(q, 1), _dim(q, -1)
        d3 = _dim(w, -1) if w is not None else 3 * d_in
        return float(2 * b * s * d_in * d3 + 4 * b * s * s * (d3 // 3) + 5 * b * s * s)
    k = shape_of(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if len(q) == 4:  # [B, heads, S, head_dim] (ONNX Attention-23)
        b, s, hd = _dim(q, 0) * _dim(q, 1), _dim(q, 2), _dim(q, 3)
        kv = _dim(k, -2) if k is not None else s
    else:  # [B, S, hidden]
        b, s, hd = _dim(q, 0), _dim(q, 1), _dim(q, -1)
        kv = _dim(k, 1) if k is not None and len(k) == 3 else s
    return float(4 * b * s * kv * hd + 5 * b * s * kv)


def _control_flow(node: onnx.NodeProto, shape_of: ShapeOf) -> float:
    """An If's dearer branch; a Loop/Scan body once (its trip count is data: a floor, not an estimate)."""
    bodies = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    costs = [graph_flops(g, shape_of) for g in bodies]
    cost = max(costs, default=0.0)
    return max(cost, float(max(_largest(node, shape_of), 1)))


def nodes_flops(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, Shape]) -> list[float]:
    """FLOPs of each of ``nodes`` at ``shapes`` (tensor name -> shape; a name not in it: unknown)."""
    return [node_flops(n, shapes.get) for n in nodes]


def graph_flops(g: onnx.GraphProto, outer: ShapeOf) -> float:
    """FLOPs of a (sub)graph: its own declared shapes first, then the enclosing graph's."""
    own: dict[str, Shape] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            own[vi.name] = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim
            )
    for init in g.initializer:
        own[init.name] = tuple(init.dims)

    def shape_of(name: str) -> Shape:
        return own[name] if name in own else outer(name)

    return sum(node_flops(n, shape_of) for n in g.node)
