"""FLOPs of every op that computes (issue 22, item 3): no op type of the zoo or of the real-weights models
counts less than one FLOP per output element unless it only moves data (``flops.ZERO_COST``); quantized,
fused and Einsum forms count what their float / unfused equivalents count; recurrent cells count their
matrix products; an ``If`` counts its branch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from splitrt.graph import flops, zoo
from splitrt.graph import model as graph
from tests.realmodels import MODELS, bound

MS = "com.microsoft"


def _shapes_of(model: onnx.ModelProto) -> dict[str, tuple[int | str, ...]]:
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    g = inferred.graph
    out: dict[str, tuple[int | str, ...]] = {i.name: tuple(i.dims) for i in g.initializer}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = tuple(
                d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim
            )
    return out


def _undercounted(nodes: list[onnx.NodeProto], node_flops: list[float], shape_of: object) -> dict[str, float]:
    """Op types (not data movement) with a node counting fewer FLOPs than its output has elements."""
    bad: dict[str, float] = {}
    for n, f in zip(nodes, node_flops, strict=True):
        shape = shape_of(n.output[0])  # type: ignore[operator]
        need = max(1, math.prod(d if isinstance(d, int) and d > 0 else 1 for d in shape) if shape else 1)
        if n.op_type not in flops.ZERO_COST and f < need:
            bad[n.op_type] = f
    return bad


@pytest.mark.slow
def test_no_op_that_computes_counts_zero_in_the_zoo_or_the_real_models() -> None:
    seen: set[str] = set()
    bad: dict[str, dict[str, float]] = {}
    for name in zoo.names():
        if name in zoo._LIGHT:  # structure only: the light file's weights are ConstantOfShape, not data
            m = onnx.load(str(zoo.light_dir() / f"light_{name}.onnx"))
            shapes = _shapes_of(m)
            nodes = [n for n in m.graph.node if n.op_type != "ConstantOfShape"]
            counted = [flops.node_flops(n, shapes.get) for n in nodes]
            wrong = _undercounted(nodes, counted, shapes.get)
        else:
            p = zoo.get(name)
            mg = graph.load(p, zoo.default_binding(p))
            nodes = mg.nodes
            wrong = _undercounted(nodes, mg.node_flops, lambda t, mg=mg: mg.tensor(t).shape)
        seen |= {n.op_type for n in nodes}
        if wrong:
            bad[name] = wrong
    for m in MODELS:
        mg = bound(m.name)
        seen |= {n.op_type for n in mg.nodes}
        wrong = _undercounted(mg.nodes, mg.node_flops, lambda t, mg=mg: mg.tensor(t).shape)
        if wrong:
            bad[m.name] = wrong
    assert not bad, f"ops that compute but count (almost) no FLOPs: {bad}"
    # The universe covers what issue 22 found counted as 0.
    assert {
        "LSTM",
        "DynamicQuantizeLSTM",
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
        "If",
        "LayerNormalization",
        "Softmax",
        "Resize",
    } <= seen


def test_the_quantized_crnn_counts_what_its_float_twin_counts() -> None:
    # ddddocr ships the same CRNN twice: float (Conv, Gemm, LSTM) and dynamically quantized (ConvInteger,
    # MatMulInteger, DynamicQuantizeLSTM); before issue 22 the quantized one counted 0 GFLOPs.
    fp, q = bound("dddd_crnn"), bound("dddd_quant")

    def by_op(mg: graph.ModelGraph) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, f in zip(mg.nodes, mg.node_flops, strict=True):
            out[n.op_type] = out.get(n.op_type, 0.0) + f
        return out

    a, b = by_op(fp), by_op(q)
    assert b["ConvInteger"] == pytest.approx(a["Conv"], rel=1e-9)
    assert b["MatMulInteger"] == pytest.approx(a["Gemm"], rel=1e-9)
    assert b["DynamicQuantizeLSTM"] == pytest.approx(a["LSTM"], rel=1e-9)
    assert q.flops == pytest.approx(fp.flops, rel=0.02) and q.flops > 1e8
    # and a cut's share follows: the quantized head of the same depth is priced like the float one
    assert 0.0 < q.cuts()[len(q.cuts()) // 2].head_flops_fraction < 1.0


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
    tmp_path: Path,
    name: str,
) -> graph.ModelGraph:
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return graph.load(p)


def _vi(name: str, elem: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(a, name)


def _one(mg: graph.ModelGraph, op: str) -> float:
    return sum(f for n, f in zip(mg.nodes, mg.node_flops, strict=True) if n.op_type == op)


def test_quantized_and_einsum_products_count_like_matmul_and_conv(tmp_path: Path) -> None:
    f, u8 = TensorProto.FLOAT, TensorProto.UINT8
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    wq = rng.integers(0, 255, (4, 5), dtype=np.uint8)
    s, z = _init("s", np.array(0.1, np.float32)), _init("z", np.array(128, np.uint8))
    mm = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [_vi("x", f, [2, 3, 4])],
        [_vi("y", f, [2, 3, 5])],
        [_init("w", w)],
        tmp_path,
        "mm",
    )
    mmi = _model(
        [helper.make_node("MatMulInteger", ["x", "w"], ["y"])],
        [_vi("x", u8, [2, 3, 4])],
        [_vi("y", TensorProto.INT32, [2, 3, 5])],
        [_init("w", wq)],
        tmp_path,
        "mmi",
    )
    qmm = _model(
        [helper.make_node("QLinearMatMul", ["x", "s", "z", "w", "s", "z", "s", "z"], ["y"])],
        [_vi("x", u8, [2, 3, 4])],
        [_vi("y", u8, [2, 3, 5])],
        [_init("w", wq), s, z],
        tmp_path,
        "qmm",
    )
    ein = _model(
        [helper.make_node("Einsum", ["x", "w"], ["y"], equation="bij,jk->bik")],
        [_vi("x", f, [2, 3, 4])],
        [_vi("y", f, [2, 3, 5])],
        [_init("w", w)],
        tmp_path,
        "ein",
    )
    ell = _model(
        [helper.make_node("Einsum", ["x", "w"], ["y"], equation="...ij,jk->...ik")],
        [_vi("x", f, [2, 3, 4])],
        [_vi("y", f, [2, 3, 5])],
        [_init("w", w)],
        tmp_path,
        "ell",
    )
    expect = 2 * 2 * 3 * 5 * 4
    assert _one(mm, "MatMul") == expect
    assert (
        _one(mmi, "MatMulInteger") == _one(qmm, "QLinearMatMul") == _one(ein, "Einsum") == _one(ell, "Einsum") == expect
    )
    # an Einsum that sums nothing (an outer product) costs one multiply per output element
    outer = _model(
        [helper.make_node("Einsum", ["x", "v"], ["y"], equation="i,j->ij")],
        [_vi("x", f, [3])],
        [_vi("y", f, [3, 4])],
        [_init("v", np.ones(4, np.float32))],
        tmp_path,
        "outer",
    )
    assert _one(outer, "Einsum") == 12

    k = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    kq = rng.integers(0, 255, (6, 2, 3, 3), dtype=np.uint8)
    conv = _model(
        [helper.make_node("Conv", ["x", "k"], ["y"])],
        [_vi("x", f, [1, 2, 8, 8])],
        [_vi("y", f, [1, 6, 6, 6])],
        [_init("k", k)],
        tmp_path,
        "conv",
    )
    convi = _model(
        [helper.make_node("ConvInteger", ["x", "k"], ["y"])],
        [_vi("x", u8, [1, 2, 8, 8])],
        [_vi("y", TensorProto.INT32, [1, 6, 6, 6])],
        [_init("k", kq)],
        tmp_path,
        "convi",
    )
    qconv = _model(
        [helper.make_node("QLinearConv", ["x", "s", "z", "k", "s", "z", "s", "z"], ["y"])],
        [_vi("x", u8, [1, 2, 8, 8])],
        [_vi("y", u8, [1, 6, 6, 6])],
        [_init("k", kq), s, z],
        tmp_path,
        "qc",
    )
    expect = 2 * 6 * 6 * 6 * (2 * 3 * 3)
    assert _one(conv, "Conv") == _one(convi, "ConvInteger") == _one(qconv, "QLinearConv") == expect


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrent_cells_count_their_matrix_products(op: str, gates: int, tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    steps, batch, feat, hidden = 7, 2, 5, 6
    rng = np.random.default_rng(1)

    def build(direction: str, layout: int) -> float:
        dirs = 2 if direction == "bidirectional" else 1
        w = rng.standard_normal((dirs, gates * hidden, feat)).astype(np.float32)
        r = rng.standard_normal((dirs, gates * hidden, hidden)).astype(np.float32)
        x = [batch, steps, feat] if layout else [steps, batch, feat]
        y = [batch, steps, dirs, hidden] if layout else [steps, dirs, batch, hidden]
        node = helper.make_node(op, ["x", "w", "r"], ["y"], hidden_size=hidden, direction=direction, layout=layout)
        return _one(
            _model(
                [node],
                [_vi("x", f, x)],
                [_vi("y", f, y)],
                [_init("w", w), _init("r", r)],
                tmp_path,
                f"{op}{direction}{layout}",
            ),
            op,
        )

    fwd = build("forward", 0)
    products = 2 * steps * batch * gates * hidden * (feat + hidden)  # input and recurrent matmuls
    assert products <= fwd <= 1.5 * products
    assert build("bidirectional", 0) == 2 * fwd
    assert build("forward", 1) == fwd  # batch-first: the same work


def test_attention_ops_count_like_their_unfused_graph(tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    b, s, d, heads = 2, 10, 16, 4
    rng = np.random.default_rng(2)
    w = rng.standard_normal((d, 3 * d)).astype(np.float32)
    fused = _model(
        [helper.make_node("Attention", ["x", "w"], ["y"], domain=MS, num_heads=heads)],
        [_vi("x", f, [b, s, d])],
        [_vi("y", f, [b, s, d])],
        [_init("w", w)],
        tmp_path,
        "att",
    )
    unfused = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["qkv"]),
            helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["scores"]),
            helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        [_vi("x", f, [b, s, d])],
        [_vi("y", f, [b, s, d])],
        [_init("w", w)],
        tmp_path,
        "att_unfused",
    )
    assert _one(fused, "Attention") == pytest.approx(unfused.flops, rel=0.05)

    mha = _model(
        [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS, num_heads=heads)],
        [_vi("q", f, [b, s, d]), _vi("k", f, [b, 3, d]), _vi("v", f, [b, 3, d])],
        [_vi("y", f, [b, s, d])],
        [],
        tmp_path,
        "mha",
    )
    plain = _model(
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["scores"]),
            helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["y"]),
        ],
        [_vi("q", f, [b, s, d]), _vi("k", f, [b, 3, d]), _vi("v", f, [b, 3, d])],
        [_vi("y", f, [b, s, d])],
        [],
        tmp_path,
        "mha_unfused",
    )
    assert _one(mha, "MultiHeadAttention") == pytest.approx(plain.flops, rel=0.05)


def test_an_if_counts_its_dearer_branch(tmp_path: Path) -> None:
    f = TensorProto.FLOAT
    w = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [], [_vi("t", f, [4, 16])])
    other = helper.make_graph([helper.make_node("Identity", ["z"], ["e"])], "else", [], [_vi("e", f, [4, 16])])
    mg = _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [_vi("c", TensorProto.BOOL, []), _vi("x", f, [4, 8]), _vi("z", f, [4, 16])],
        [_vi("y", f, [4, 16])],
        [_init("w", w)],
        tmp_path,
        "if",
    )
    assert _one(mg, "If") == 2 * 4 * 16 * 8
