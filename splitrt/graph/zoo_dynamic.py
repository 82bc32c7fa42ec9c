"""Zoo models with free (symbolic) dims: a BERT-style text encoder, a ViT-style image encoder and a
YOLO-style detector, built in-tree with ``onnx.helper`` (seeded random weights, nothing downloaded).

Deployed exports leave sizes open (batch, sequence length, image height/width) and compute what depends
on them inside the graph (Shape/Gather/Concat, Range, Expand, Reshape with 0/-1 entries). These builders
do the same on purpose, so a split has to carry those shape subgraphs like it would for a real export.
Weights are scaled so activations stay near unit scale through every layer: outputs are finite,
input-dependent and neither saturated nor flat. ``zoo.build`` passes ``zoo.SEED`` (taking it as an argument
keeps this module from importing ``zoo``, which imports it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization needs 17; Gelu (20) is spelled with Erf so older runtimes load the model
IR_VERSION = 8


class _Builder:
    """Nodes and initializers under unique, deterministic names (a node's output is named after it)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        self._used: set[str] = set()

    def _unique(self, hint: str) -> str:
        name, k = hint, 1
        while name in self._used:
            name, k = f"{hint}_{k}", k + 1
        self._used.add(name)
        return name

    def param(self, hint: str, value: np.ndarray) -> str:
        name = self._unique(hint)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def normal(self, hint: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> str:
        return self.param(hint, self.rng.normal(mean, std, size=shape).astype(np.float32))

    def const(self, value: Sequence[int] | Sequence[float] | int | float, dtype: type = np.int64) -> str:
        """A small constant, shared by every node that needs the same value."""
        arr: np.ndarray = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.param(f"const{len(self._consts)}", arr)
        return self._consts[key]

    def op(self, op_type: str, inputs: Sequence[str], hint: str, **attrs: Any) -> str:
        return self.ops(op_type, inputs, hint, 1, **attrs)[0]

    def ops(self, op_type: str, inputs: Sequence[str], hint: str, n_out: int, **attrs: Any) -> list[str]:
        name = self._unique(hint)
        outs = [name] if n_out == 1 else [self._unique(f"{name}_out{k}") for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def model(
        self,
        name: str,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
    ) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="splitrt.zoo")
        m.ir_version = IR_VERSION
        onnx.checker.check_model(m, full_check=True)
        return m


# ----------------------------------------------------------------------------------------------------
# Transformer pieces (shared by bert_tiny and vit_tiny)


def _linear(b: _Builder, x: str, d_in: int, d_out: int, name: str) -> str:
    # std 1/sqrt(d_in): a unit-scale input gives a unit-scale output.
    w = b.normal(f"{name}.weight", (d_in, d_out), 1.0 / np.sqrt(d_in))
    bias = b.normal(f"{name}.bias", (d_out,), 0.02)
    return b.op("Add", [b.op("MatMul", [x, w], f"{name}.matmul"), bias], f"{name}.add")


def _layer_norm(b: _Builder, x: str, d: int, name: str) -> str:
    scale = b.normal(f"{name}.weight", (d,), 0.05, mean=1.0)
    bias = b.normal(f"{name}.bias", (d,), 0.02)
    return b.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=1e-5)


def _gelu(b: _Builder, x: str, name: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))): the exact Gelu as torch exports it below opset 20."""
    e = b.op("Erf", [b.op("Div", [x, b.const(np.sqrt(2.0), np.float32)], f"{name}.div")], f"{name}.erf")
    y = b.op("Mul", [x, b.op("Add", [e, b.const(1.0, np.float32)], f"{name}.add")], f"{name}.mul")
    return b.op("Mul", [y, b.const(0.5, np.float32)], f"{name}.half")


# to_heads(x [b, s, D]) -> [b, s, H, D/H] and merge(x [b, s, H, D/H]) -> [b, s, D].
_HeadShapes = tuple[Callable[[str], str], Callable[[str], str]]


def _attention(
    b: _Builder, x: str, d: int, heads: int, name: str, shapes: _HeadShapes, mask_bias: str | None = None
) -> str:
    to_heads, merge = shapes
    q, k, v = (to_heads(_linear(b, x, d, d, f"{name}.{p}")) for p in "qkv")
    q = b.op("Transpose", [q], f"{name}.q_t", perm=[0, 2, 1, 3])  # [b, H, s, dh]
    k = b.op("Transpose", [k], f"{name}.k_t", perm=[0, 2, 3, 1])  # [b, H, dh, s]
    v = b.op("Transpose", [v], f"{name}.v_t", perm=[0, 2, 1, 3])
    scores = b.op("MatMul", [q, k], f"{name}.qk")
    scores = b.op("Div", [scores, b.const(np.sqrt(d // heads), np.float32)], f"{name}.scale")
    if mask_bias is not None:
        scores = b.op("Add", [scores, mask_bias], f"{name}.mask")
    probs = b.op("Softmax", [scores], f"{name}.softmax", axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v], f"{name}.pv")], f"{name}.ctx_t", perm=[0, 2, 1, 3])
    return _linear(b, merge(ctx), d, d, f"{name}.out")


def _mlp(b: _Builder, x: str, d: int, ffn: int, name: str) -> str:
    return _linear(b, _gelu(b, _linear(b, x, d, ffn, f"{name}.fc1"), f"{name}.gelu"), ffn, d, f"{name}.fc2")


# ----------------------------------------------------------------------------------------------------
# bert_tiny


def bert_tiny(
    seed: int,
    vocab: int = 1000,
    max_positions: int = 512,
    hidden: int = 64,
    heads: int = 4,
    ffn: int = 128,
    layers: int = 2,
) -> onnx.ModelProto:
    """BERT-style encoder, post-LN: ``input_ids``, ``attention_mask`` [batch, seq] (int64) ->
    ``last_hidden_state`` [batch, seq, hidden], ``pooled`` [batch, hidden]."""
    b = _Builder(seed + 10)
    ids, mask = "input_ids", "attention_mask"
    tok = b.op("Gather", [b.normal("embeddings.word", (vocab, hidden), 1.0), ids], "embeddings.word_lookup")
    # Positions 0..seq-1 from the ids' runtime shape, as torch exports them: seq is never baked in.
    seq_len = b.op("Gather", [b.op("Shape", [ids], "embeddings.ids_shape"), b.const(1)], "embeddings.seq_len")
    positions = b.op("Range", [b.const(0), seq_len, b.const(1)], "embeddings.positions")
    pos = b.op(
        "Gather",
        [b.normal("embeddings.position", (max_positions, hidden), 0.5), positions],
        "embeddings.position_lookup",
    )
    x = _layer_norm(b, b.op("Add", [tok, pos], "embeddings.sum"), hidden, "embeddings.norm")
    # Padding -> -1e4 before the softmax, broadcast over heads and query positions: [batch, 1, 1, seq].
    keep = b.op("Cast", [mask], "mask.float", to=TensorProto.FLOAT)
    bias = b.op(
        "Mul", [b.op("Sub", [b.const(1.0, np.float32), keep], "mask.invert"), b.const(-1e4, np.float32)], "mask.scale"
    )
    bias = b.op("Unsqueeze", [bias, b.const([1, 2])], "mask.bias")
    for i in range(layers):
        x = _bert_layer(b, x, bias, hidden, heads, ffn, f"encoder.{i}")
    first = b.op("Gather", [x, b.const(0)], "pooler.first_token", axis=1)
    pooled = b.op("Tanh", [_linear(b, first, hidden, hidden, "pooler.dense")], "pooled")
    b.op("Identity", [x], "last_hidden_state")
    return b.model(
        "bert_tiny",
        [
            helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden]),
            helper.make_tensor_value_info(pooled, TensorProto.FLOAT, ["batch", hidden]),
        ],
    )


def _bert_layer(b: _Builder, x: str, mask_bias: str, d: int, heads: int, ffn: int, name: str) -> str:
    # Head reshapes take [batch, seq] from the layer input's runtime shape (Shape -> Gather -> Concat),
    # the pattern torch.onnx emits for dynamic axes.
    batch_seq = b.op("Gather", [b.op("Shape", [x], f"{name}.shape"), b.const([0, 1])], f"{name}.batch_seq")
    split_shape = b.op("Concat", [batch_seq, b.const([heads, d // heads])], f"{name}.heads_shape", axis=0)
    merge_shape = b.op("Concat", [batch_seq, b.const([d])], f"{name}.merge_shape", axis=0)

    def to_heads(t: str) -> str:
        return b.op("Reshape", [t, split_shape], f"{name}.to_heads")

    def merge(t: str) -> str:
        return b.op("Reshape", [t, merge_shape], f"{name}.merge_heads")

    attn = _attention(b, x, d, heads, f"{name}.attn", (to_heads, merge), mask_bias)
    x = _layer_norm(b, b.op("Add", [x, attn], f"{name}.attn_residual"), d, f"{name}.attn_norm")
    ff = _mlp(b, x, d, ffn, f"{name}.mlp")
    return _layer_norm(b, b.op("Add", [x, ff], f"{name}.mlp_residual"), d, f"{name}.mlp_norm")


# ----------------------------------------------------------------------------------------------------
# vit_tiny


def vit_tiny(
    seed: int,
    image: int = 32,
    patch: int = 8,
    hidden: int = 64,
    heads: int = 4,
    ffn: int = 128,
    layers: int = 2,
    classes: int = 10,
) -> onnx.ModelProto:
    """ViT-style encoder, pre-LN: ``pixel_values`` [batch, 3, 32, 32] -> ``logits`` [batch, classes]."""
    b = _Builder(seed + 11)
    px = "pixel_values"
    tokens = (image // patch) ** 2
    w = b.normal("patch.weight", (hidden, 3, patch, patch), 1.0 / np.sqrt(3 * patch * patch))
    x = b.op(
        "Conv",
        [px, w, b.normal("patch.bias", (hidden,), 0.02)],
        "patch.conv",
        kernel_shape=[patch, patch],
        strides=[patch, patch],
    )
    x = b.op("Reshape", [x, b.const([0, 0, -1])], "patch.flatten")  # [b, D, tokens]
    x = b.op("Transpose", [x], "patch.tokens", perm=[0, 2, 1])  # [b, tokens, D]
    # The learned CLS token is broadcast to the runtime batch: Expand to Concat(Shape(px)[:1], [1, D]).
    # CLS and positions start small, as ViT initialises them: a large constant in the CLS stream would
    # drown what attention brings in from the image, and the logits would barely depend on the input.
    batch = b.op("Shape", [px], "cls.batch", start=0, end=1)
    cls_shape = b.op("Concat", [batch, b.const([1, hidden])], "cls.shape", axis=0)
    cls = b.op("Expand", [b.normal("cls.token", (1, 1, hidden), 0.02), cls_shape], "cls.expand")
    x = b.op("Concat", [cls, x], "cls.concat", axis=1)
    x = b.op("Add", [x, b.normal("position", (1, tokens + 1, hidden), 0.1)], "position.add")
    for i in range(layers):
        name = f"block.{i}"
        attn = _attention(
            b,
            _layer_norm(b, x, hidden, f"{name}.norm1"),
            hidden,
            heads,
            f"{name}.attn",
            _constant_head_shapes(b, heads, hidden // heads, f"{name}.attn"),
        )
        x = b.op("Add", [x, attn], f"{name}.attn_residual")
        ff = _mlp(b, _layer_norm(b, x, hidden, f"{name}.norm2"), hidden, ffn, f"{name}.mlp")
        x = b.op("Add", [x, ff], f"{name}.mlp_residual")
    x = _layer_norm(b, x, hidden, "final_norm")
    first = b.op("Gather", [x, b.const(0)], "cls.select", axis=1)
    # Head std 1/sqrt(D) on unit-scale features: logits std ~1, a softmax neither one-hot nor flat.
    head_w = b.normal("head.weight", (hidden, classes), 1.0 / np.sqrt(hidden))
    b.op("Add", [b.op("MatMul", [first, head_w], "head.matmul"), b.normal("head.bias", (classes,), 0.02)], "logits")
    return b.model(
        "vit_tiny",
        [helper.make_tensor_value_info(px, TensorProto.FLOAT, ["batch", 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
    )


def _constant_head_shapes(b: _Builder, heads: int, head_dim: int, name: str) -> _HeadShapes:
    """Head reshapes that keep [batch, seq] through 0 entries (copy the input's dim) and -1."""

    def to_heads(t: str) -> str:
        return b.op("Reshape", [t, b.const([0, 0, heads, head_dim])], f"{name}.to_heads")

    def merge(t: str) -> str:
        return b.op("Reshape", [t, b.const([0, 0, -1])], f"{name}.merge_heads")

    return to_heads, merge


# ----------------------------------------------------------------------------------------------------
# yolo_tiny
#
# Random convs stacked 30 deep drift (SiLU's gain grows with scale; residual adds and max-pools add
# more), so each conv gets a folded BatchNorm as trained detectors have: its "running" mean/std are
# measured on a seeded calibration image while the graph is built. That forward pass runs in float64
# numpy beside the graph, and the folded factors are rounded to 3 significant digits, so the model's
# bytes do not depend on the BLAS kernels of the machine that builds it.

# A graph tensor and its float64 value on the calibration image.
_Act = tuple[str, np.ndarray]


def _round_sig(a: np.ndarray, digits: int = 3) -> np.ndarray:
    return np.array([float(f"{v:.{digits}g}") for v in a.ravel()], dtype=np.float64).reshape(a.shape)


def _np_conv(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    k, pad = w.shape[-1], w.shape[-1] // 2
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _conv(
    b: _Builder, x: _Act, c_out: int, name: str, k: int = 1, s: int = 1, act: bool = True, out_mean: float = 0.0
) -> _Act:
    """Conv with its BatchNorm folded into weight and bias (as exports do), then SiLU as x * Sigmoid(x).

    On the calibration image the folded BN centres each channel at beta and scales the layer to std ~gamma;
    a head's last conv (no BN, no activation) to mean ``out_mean``, std ~1."""
    c_in = x[1].shape[1]
    w = b.rng.normal(0.0, 1.0, size=(c_out, c_in, k, k))
    y = _np_conv(x[1], w, s)
    gamma = b.rng.uniform(0.5, 1.5, size=c_out) if act else np.ones(c_out)
    beta = b.rng.normal(0.0, 0.5, size=c_out) if act else np.full(c_out, out_mean)
    # One std for the whole layer, not per channel: a channel nearly constant on the calibration image
    # would get a huge factor and blow up on any other image. Means are removed per channel.
    scale = _round_sig(gamma / np.sqrt(np.mean(y.var(axis=(0, 2, 3)))))
    shift = _round_sig(beta - y.mean(axis=(0, 2, 3)) * scale)
    weight = b.param(f"{name}.weight", (w * scale[:, None, None, None]).astype(np.float32))
    bias = b.param(f"{name}.bias", shift.astype(np.float32))
    out = b.op("Conv", [x[0], weight, bias], f"{name}.conv", kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
    value = y * scale[None, :, None, None] + shift[None, :, None, None]
    if not act:
        return out, value
    return b.op("Mul", [out, b.op("Sigmoid", [out], f"{name}.sigmoid")], f"{name}.silu"), value * _sigmoid(value)


def _concat(b: _Builder, xs: Sequence[_Act], name: str) -> _Act:
    return b.op("Concat", [t for t, _ in xs], name, axis=1), np.concatenate([v for _, v in xs], axis=1)


def _c2f(b: _Builder, x: _Act, c_out: int, name: str, n: int = 1, shortcut: bool = True) -> _Act:
    """CSP block as in YOLOv8's C2f: split in halves, bottlenecks on one half, concat every stage."""
    y = _conv(b, x, c_out, f"{name}.cv1")
    a_name, h_name = b.ops("Split", [y[0]], f"{name}.split", 2, axis=1)
    a_val, h_val = np.split(y[1], 2, axis=1)
    stages: list[_Act] = [(a_name, a_val), (h_name, h_val)]
    h = stages[-1]
    for i in range(n):
        t = _conv(b, _conv(b, h, c_out // 2, f"{name}.m{i}.cv1", k=3), c_out // 2, f"{name}.m{i}.cv2", k=3)
        h = (b.op("Add", [h[0], t[0]], f"{name}.m{i}.add"), h[1] + t[1]) if shortcut else t
        stages.append(h)
    return _conv(b, _concat(b, stages, f"{name}.concat"), c_out, f"{name}.cv2")


def _sppf(b: _Builder, x: _Act, name: str) -> _Act:
    c = x[1].shape[1]
    pools = [_conv(b, x, c // 2, f"{name}.cv1")]
    for i in range(3):
        v = np.pad(pools[-1][1], ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=-np.inf)
        v = np.lib.stride_tricks.sliding_window_view(v, (5, 5), axis=(2, 3)).max(axis=(4, 5))
        pools.append((b.op("MaxPool", [pools[-1][0]], f"{name}.pool{i}", kernel_shape=[5, 5], pads=[2] * 4), v))
    return _conv(b, _concat(b, pools, f"{name}.concat"), c, f"{name}.cv2")


def _upsample(b: _Builder, x: _Act, name: str) -> _Act:
    # Scales, not sizes: the output size follows the runtime input. Asymmetric/floor as torch exports it.
    out = b.op(
        "Resize",
        [x[0], "", b.const([1.0, 1.0, 2.0, 2.0], np.float32)],
        name,
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )
    return out, x[1].repeat(2, axis=2).repeat(2, axis=3)


def _detect(b: _Builder, x: _Act, classes: int, name: str, width: int = 16) -> str:
    """Decoupled head: box and class branches -> [batch, 4 + classes, h * w]."""
    box = _conv(b, _conv(b, x, width, f"{name}.box0", k=3), width, f"{name}.box1", k=3)
    box = _conv(b, box, 4, f"{name}.box2", act=False)
    cls = _conv(b, _conv(b, x, width, f"{name}.cls0", k=3), width, f"{name}.cls1", k=3)
    # Logits ~ N(-2, 1): most scores low, some high, as a detector's are; none pinned at 0 or 1.
    logits = _conv(b, cls, classes, f"{name}.cls2", act=False, out_mean=-2.0)
    scores = b.op("Sigmoid", [logits[0]], f"{name}.scores")
    y = b.op("Concat", [box[0], scores], f"{name}.concat", axis=1)
    return b.op("Reshape", [y, b.const([0, 4 + classes, -1])], f"{name}.flatten")


def yolo_tiny(seed: int, classes: int = 80) -> onnx.ModelProto:
    """YOLOv8-style detector: ``images`` [batch, 3, height, width] (height, width multiples of 32) ->
    ``output0`` [batch, 4 + classes, anchors], anchors = (h/8 * w/8) + (h/16 * w/16) + (h/32 * w/32)."""
    b = _Builder(seed + 12)
    # Calibration image: pixels in [0, 1) like a preprocessed photo; 320 px leaves 10x10 at stride 32,
    # enough that SPPF's 5x5 pools see an interior (at 5x5 they see everything and the stats skew).
    x: _Act = ("images", np.random.default_rng(seed).random((4, 3, 256, 256)))
    x = _conv(b, x, 8, "backbone.stem", k=3, s=2)  # /2
    x = _c2f(b, _conv(b, x, 16, "backbone.down1", k=3, s=2), 16, "backbone.c2f1")  # /4
    p3 = _c2f(b, _conv(b, x, 32, "backbone.down2", k=3, s=2), 32, "backbone.c2f2")  # /8
    p4 = _c2f(b, _conv(b, p3, 32, "backbone.down3", k=3, s=2), 32, "backbone.c2f3")  # /16
    p5 = _c2f(b, _conv(b, p4, 32, "backbone.down4", k=3, s=2), 32, "backbone.c2f4")  # /32
    p5 = _sppf(b, p5, "backbone.sppf")
    # FPN top-down, then PAN bottom-up; each merge is a Concat with the skip at the same stride.
    n4 = _c2f(b, _concat(b, [_upsample(b, p5, "neck.up4"), p4], "neck.cat4"), 32, "neck.c2f4", shortcut=False)
    n3 = _c2f(b, _concat(b, [_upsample(b, n4, "neck.up3"), p3], "neck.cat3"), 16, "neck.c2f3", shortcut=False)
    d4 = _concat(b, [_conv(b, n3, 16, "neck.down4", k=3, s=2), n4], "neck.pan4")
    o4 = _c2f(b, d4, 32, "neck.pan_c2f4", shortcut=False)  # /16
    d5 = _concat(b, [_conv(b, o4, 32, "neck.down5", k=3, s=2), p5], "neck.pan5")
    o5 = _c2f(b, d5, 32, "neck.pan_c2f5", shortcut=False)  # /32
    heads = [_detect(b, t, classes, f"head.{i}") for i, t in enumerate([n3, o4, o5])]
    b.op("Concat", heads, "output0", axis=2)
    return b.model(
        "yolo_tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 4 + classes, "anchors"])],
    )
