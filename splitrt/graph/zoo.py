"""Test and demo models: real architectures from the ``onnx`` wheel, with seeded random weights.

The wheel ships ``light_*.onnx`` models whose weights are ``ConstantOfShape`` fills (all 0.02), so every
output is the same constant and a wrong split would still "match". We replace each fill with seeded
random values scaled by role (He-normal for conv/linear weights, positive BatchNorm variances...), which
keeps activations in a sane range through 100+ layers. Nothing is downloaded.

- ``names() -> list[str]``, ``get(name, out_path=None) -> Path`` writes (and caches) the model with seeded
  random weights; names like ``resnet50``, ``squeezenet``, ``inception_v1``, ``densenet121``, ... plus
  ``multi_io`` (small 2-input/2-output model) and ``tiny_chain`` (a few layers, for fast tests); ``vgg16`` and
  ``mobilenetv2`` (the seed paper's models, built in ``graph.zoo_paper`` with ``onnx.helper``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from splitrt.errors import ModelError

if TYPE_CHECKING:
    from splitrt.graph.shapes import ShapeBinding
from splitrt.graph import zoo_dynamic, zoo_paper
from splitrt.graph.ort_errors import onnxruntime_errors

SEED = 20261202
BUILD_VERSION = 2
_LIGHT = (
    "resnet50",
    "inception_v1",
    "inception_v2",
    "densenet121",
    "squeezenet",
    "shufflenet",
    "vgg19",
    "bvlc_alexnet",
    "zfnet512",
)
# Built in zoo_paper: the seed paper's models the onnx wheel does not ship.
_PAPER = ("vgg16", "mobilenetv2")
_SMALL = ("tiny_chain", "multi_io", "branchy")
# Built in zoo_dynamic: free (symbolic) batch / sequence / image dims, as deployed exports have them.
_DYNAMIC = ("bert_tiny", "vit_tiny", "yolo_tiny")


def names() -> list[str]:
    return list(_LIGHT) + list(_PAPER) + list(_SMALL) + list(_DYNAMIC)


def resolve(spec: str | Path) -> Path:
    """A model argument as the CLI takes it: a file path, ``zoo:NAME``, or a bare zoo name (when no
    file of that name exists). Zoo models are written to the cache on first use."""
    text = str(spec)
    if text.startswith("zoo:"):
        return get(text[4:])
    p = Path(text)
    if not p.exists() and text in names():
        return get(text)
    return p


def light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def cache_dir() -> Path:
    root = os.environ.get("SPLITRT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "splitrt"
    )
    # Versioned: a cache written by an older builder must not pass for today's model (profiles are keyed
    # by the model's sha256). Bump when a builder's output changes.
    return Path(root) / "zoo" / f"v{BUILD_VERSION}"


def get(name: str, out_path: str | Path | None = None) -> Path:
    """Write the zoo model ``name`` (cached) and return its path. Deterministic bytes for a name."""
    if name not in names():
        raise ModelError(f"unknown zoo model {name!r}; expected one of: {', '.join(names())}")
    target = Path(out_path) if out_path else cache_dir() / f"{name}.onnx"
    if out_path is None and target.exists():
        return target
    model = build(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write atomically: several test processes may build the same model at once.
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(model.SerializeToString())
    os.replace(tmp, target)
    return target


def build(name: str) -> onnx.ModelProto:
    if name in _LIGHT:
        return _randomised_light(name)
    if name in _PAPER:
        m = zoo_paper.vgg16(SEED) if name == "vgg16" else zoo_paper.mobilenet_v2(SEED)
        _calibrate_logits(m)
        return m
    if name in _DYNAMIC:
        dynamic: dict[str, Callable[[int], onnx.ModelProto]] = {
            "bert_tiny": zoo_dynamic.bert_tiny,
            "vit_tiny": zoo_dynamic.vit_tiny,
            "yolo_tiny": zoo_dynamic.yolo_tiny,
        }
        return dynamic[name](SEED)
    builders: dict[str, Callable[[], onnx.ModelProto]] = {
        "tiny_chain": _tiny_chain,
        "multi_io": _multi_io,
        "branchy": _branchy,
    }
    return builders[name]()


# ----------------------------------------------------------------------------------------------------


def _randomised_light(name: str) -> onnx.ModelProto:
    path = light_dir() / f"light_{name}.onnx"
    if not path.exists():
        raise ModelError(f"{path}: the installed onnx wheel does not ship light_{name}.onnx")
    m = onnx.load(str(path))
    g = m.graph
    rng = np.random.default_rng(SEED + sum(map(ord, name)))
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, k))
    kept, new_inits = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            role = _role(n.output[0], consumers)
            new_inits.append(numpy_helper.from_array(_sample(role, shape, rng), n.output[0]))
        else:
            kept.append(n)
    used = {i for n in kept for i in n.input}
    old = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(old + new_inits)
    del g.node[:]
    g.node.extend(kept)
    names_ = {i.name for i in g.initializer}
    real_inputs = [i for i in g.input if i.name not in names_ and i.name in used]
    del g.input[:]
    g.input.extend(real_inputs)
    m.ir_version = 4
    _calibrate_logits(m)
    return m


def _calibrate_logits(m: onnx.ModelProto, target_std: float = 2.0) -> None:
    """Rescale the classifier so softmax inputs have std ~2: neither one-hot nor uniform outputs.

    Random deep nets drift in scale; without this, resnet50's softmax saturates to exactly 0/1 and
    inception_v1's is flat, and either hides numerical differences.
    """
    import onnxruntime as ort

    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    for sm in [n for n in g.node if n.op_type == "Softmax"]:
        logits = sm.input[0]
        node = producer.get(logits)
        while node is not None and node.op_type in ("Reshape", "Flatten", "Dropout", "Squeeze"):
            logits = node.input[0]
            node = producer.get(logits)
        if node is None or node.op_type not in ("Gemm", "Conv") or node.input[1] not in inits:
            continue
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        probe.graph.output.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, None))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        with onnxruntime_errors(f"zoo model {m.graph.name} (its logits probe)", stage="build"):
            sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feeds = {}
        rng = np.random.default_rng(SEED)
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        with onnxruntime_errors(f"zoo model {m.graph.name} (its logits probe)", stage="run", feeds=feeds):
            std = float(np.std(sess.run([logits], feeds)[0]))
        if not np.isfinite(std) or std == 0.0:
            continue
        # Two significant digits: the logits' std differs in the last bits between CPUs (MLAS picks
        # kernels by instruction set), and the model's bytes (its sha256, which profiles are keyed
        # by) must not depend on the machine that built it.
        factor = float(f"{target_std / std:.2g}")
        for name in node.input[1:3]:
            if name in inits:
                arr = numpy_helper.to_array(inits[name]) * np.float32(factor)
                inits[name].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), name))


def _role(tensor: str, consumers: dict[str, list[tuple[onnx.NodeProto, int]]]) -> str:
    """What a weight is used for, looking through Unsqueeze/Reshape (DenseNet's BN scale path)."""
    for node, k in consumers.get(tensor, []):
        if node.op_type in ("Unsqueeze", "Reshape", "Squeeze") and k == 0:
            return _role(node.output[0], consumers)
        if node.op_type in ("Conv", "Gemm", "MatMul") and k == 1:
            return "weight"
        if node.op_type == "BatchNormalization":
            return {1: "scale", 2: "shift", 3: "shift", 4: "variance"}.get(k, "shift")
        if node.op_type == "Mul":
            return "scale"
    return "shift"


def _sample(role: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if role == "weight":
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(shape[0], 1)
        # Gemm weights here are [out, in] with transB=1, conv [out, in/g, kh, kw]: fan-in is the rest.
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape).astype(np.float32)
    if role == "scale":
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    if role == "variance":
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    return rng.normal(0.0, 0.1, size=shape).astype(np.float32)


def _tiny_chain() -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-Pool-Gemm: small and fast, for unit tests."""
    rng = np.random.default_rng(SEED)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 0.2, (10, 16)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["a2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "tiny_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(fc, "fc")],
    )
    return _finish(g, 13)


def _multi_io() -> onnx.ModelProto:
    """Two inputs, two outputs; one output is ready early, one input is only needed late."""
    rng = np.random.default_rng(SEED + 1)
    w = rng.normal(0, 0.5, (16, 16)).astype(np.float32)
    v = rng.normal(0, 0.5, (16, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["early"]),
        helper.make_node("MatMul", ["early", "w"], ["h2"]),
        helper.make_node("Add", ["h2", "b"], ["h3"]),
        helper.make_node("Relu", ["h3"], ["h4"]),
        helper.make_node("MatMul", ["h4", "v"], ["late"]),
    ]
    g = helper.make_graph(
        nodes,
        "multi_io",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 16]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 16]),
        ],
        [
            helper.make_tensor_value_info("early", TensorProto.FLOAT, [4, 16]),
            helper.make_tensor_value_info("late", TensorProto.FLOAT, [4, 8]),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")],
    )
    return _finish(g, 13)


def _branchy() -> onnx.ModelProto:
    """A YOLO-like DAG: a residual block, two scales, a Constant node and an If whose branches
    capture outer tensors."""
    rng = np.random.default_rng(SEED + 2)
    wa = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    wb = rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32)
    wc = rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32)
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["s2", "k"], ["t_out"])],
        "then_b",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["s2", "k"], ["e_out"])],
        "else_b",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Conv", ["ra", "wb"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["rb"]),
        helper.make_node("Add", ["ra", "rb"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["s1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["s1", "wc"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["s2"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("ReduceMean", ["s2"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "k"], ["cond"]),
        helper.make_node("If", ["cond"], ["head_small"], then_branch=then_g, else_branch=else_g),
        helper.make_node("GlobalAveragePool", ["res"], ["head_large"]),
    ]
    g = helper.make_graph(
        nodes,
        "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [
            helper.make_tensor_value_info("head_large", TensorProto.FLOAT, [1, 8, 1, 1]),
            helper.make_tensor_value_info("head_small", TensorProto.FLOAT, [1, 8, 8, 8]),
        ],
        [numpy_helper.from_array(wa, "wa"), numpy_helper.from_array(wb, "wb"), numpy_helper.from_array(wc, "wc")],
    )
    return _finish(g, 13)


def _finish(g: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="splitrt.zoo")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


# The shapes the dynamic zoo models are exercised at by default (tests, demo, benches): a model with a
# free H/W has no natural "1" for them. Users bind their own with --shape/--dim/--sample.
DEFAULT_DIMS: dict[str, dict[str, int]] = {"bert_tiny": {"seq": 16}, "yolo_tiny": {"height": 320, "width": 320}}


def default_binding(model_path: str | Path) -> ShapeBinding:
    """The zoo's default binding for a zoo model file (by its name), else the empty binding."""
    from splitrt.graph.shapes import ShapeBinding

    return ShapeBinding(dims=DEFAULT_DIMS.get(Path(model_path).stem, {}))


def random_inputs(model_path: str | Path, seed: int = 0, binding: ShapeBinding | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for a model's inputs at ``binding`` (default: ``default_binding``; a leading
    free dim is 1, other free dims must be bound)."""
    from splitrt.graph import model as graph

    mg = graph.load(model_path, binding if binding is not None else default_binding(model_path))
    assert mg.input_shapes is not None
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for t in mg.inputs:
        shape = mg.input_shapes[t.name]
        dt = np.dtype(t.dtype)
        if dt.kind == "f":
            feeds[t.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            feeds[t.name] = rng.integers(0, 10, size=shape).astype(dt)
        elif dt.kind == "b":
            feeds[t.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise ModelError(f"{model_path}: cannot make random input for dtype {t.dtype} of {t.name!r}")
    return feeds
