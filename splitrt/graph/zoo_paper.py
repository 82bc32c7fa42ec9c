"""The seed paper's models the ``onnx`` wheel does not ship: VGG16 and MobileNetV2 (ImageNet shapes,
1x3x224x224 in, 1000 softmax scores out), built in-tree with ``onnx.helper``, seeded random weights.

The structure is the torchvision one as deployed exports have it: VGG16's 13 3x3 convolutions in five
max-pooled stages and its three fully-connected layers (dropout is gone at inference); MobileNetV2's
stem, 17 inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear projection; ReLU6 as
``Clip(0, 6)``; batch norm folded into the convolutions, as an export folds it) and its 1280-wide head.
Weights are He-normal, so activations keep their scale through the depth; ``zoo`` then rescales the
classifier so the softmax is neither one-hot nor flat. ``zoo.build`` passes ``zoo.SEED``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from splitrt.graph.zoo_dynamic import _Builder

OPSET = 13
IMAGE = 224
CLASSES = 1000
_VGG16: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
# MobileNetV2's inverted-residual settings: expansion t, output channels c, repeats n, first stride s.
_MBV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _conv(b: _Builder, x: str, c_in: int, c_out: int, name: str, *, k: int = 3, s: int = 1, groups: int = 1) -> str:
    fan_in = (c_in // groups) * k * k
    w = b.normal(f"{name}_w", (c_out, c_in // groups, k, k), float(np.sqrt(2.0 / fan_in)))
    bias = b.normal(f"{name}_b", (c_out,), 0.01)
    return b.op("Conv", [x, w, bias], name, kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, group=groups)


def _gemm(b: _Builder, x: str, d_in: int, d_out: int, name: str) -> str:
    w = b.normal(f"{name}_w", (d_out, d_in), float(np.sqrt(2.0 / d_in)))
    bias = b.normal(f"{name}_b", (d_out,), 0.01)
    return b.op("Gemm", [x, w, bias], name, transB=1)


def _model(b: _Builder, name: str, logits: str) -> onnx.ModelProto:
    b.op("Softmax", [logits], "prob", axis=1)
    g = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, IMAGE, IMAGE])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, CLASSES])],
        b.inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="splitrt.zoo")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def vgg16(seed: int) -> onnx.ModelProto:
    """VGG16 (configuration D): 138 M parameters, 15.5 GFLOPs (multiply-adds) at 224x224."""
    b = _Builder(seed)
    x, c = "data", 3
    for i, v in enumerate(_VGG16):
        if isinstance(v, str):  # "M": max pool
            x = b.op("MaxPool", [x], f"pool{i}", kernel_shape=[2, 2], strides=[2, 2])
            continue
        x = b.op("Relu", [_conv(b, x, c, v, f"conv{i}")], f"relu{i}")
        c = v
    x = b.op("Flatten", [x], "flatten", axis=1)
    x = b.op("Relu", [_gemm(b, x, c * 7 * 7, 4096, "fc6")], "relu6")
    x = b.op("Relu", [_gemm(b, x, 4096, 4096, "fc7")], "relu7")
    return _model(b, "vgg16", _gemm(b, x, 4096, CLASSES, "fc8"))


def mobilenet_v2(seed: int) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0): 3.5 M parameters, 0.3 GFLOPs (multiply-adds) at 224x224."""
    b = _Builder(seed)
    lo, hi = b.const(0.0, np.float32), b.const(6.0, np.float32)

    def relu6(t: str, name: str) -> str:
        return b.op("Clip", [t, lo, hi], name)

    x = relu6(_conv(b, "data", 3, 32, "stem", s=2), "stem_relu")
    c = 32
    k = 0
    for t, c_out, n, s in _MBV2:
        for r in range(n):
            k += 1
            stride = s if r == 0 else 1
            hidden = c * t
            y = x
            if t != 1:
                y = relu6(_conv(b, y, c, hidden, f"b{k}_expand", k=1), f"b{k}_expand_relu")
            y = relu6(_conv(b, y, hidden, hidden, f"b{k}_dw", s=stride, groups=hidden), f"b{k}_dw_relu")
            y = _conv(b, y, hidden, c_out, f"b{k}_project", k=1)
            x = b.op("Add", [x, y], f"b{k}_add") if stride == 1 and c == c_out else y
            c = c_out
    x = relu6(_conv(b, x, c, 1280, "head", k=1), "head_relu")
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    return _model(b, "mobilenetv2", _gemm(b, x, 1280, CLASSES, "classifier"))
