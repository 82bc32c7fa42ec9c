"""Binding free dims: flags parse, a leading dim defaults to 1 with a notice, and every wrong binding
is one clear error naming the input, the dim and the fix; nothing is fixed behind the user's back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from splitrt.errors import ConfigError, InputError, ModelError
from splitrt.graph import model as graph
from splitrt.graph import shapes


def _model(tmp_path: Path) -> Path:
    """x [batch, 3, height, width] -> Relu -> GlobalAveragePool -> y [batch, 3, 1, 1]."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 1, 1])],
    )
    p = tmp_path / "free.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), p)
    return p


def test_flags_parse_and_bad_flags_name_the_form() -> None:
    assert shapes.parse_shape("images=1x3x640x640") == ("images", (1, 3, 640, 640))
    assert shapes.parse_shape("sr=") == ("sr", ())
    assert shapes.parse_dim("height=640") == ("height", 640)
    with pytest.raises(ConfigError, match="expected NAME=D1xD2"):
        shapes.parse_shape("1x3x640x640")
    with pytest.raises(ConfigError, match="expected SYMBOL=N"):
        shapes.parse_dim("height=tall")


def test_dims_bind_everywhere_and_the_leading_dim_defaults_with_a_notice(tmp_path: Path) -> None:
    said: list[str] = []
    mg = graph.load(_model(tmp_path), shapes.binding_from(dims=["height=32", "width=48"]), notice=said.append)
    assert mg.input_shapes == {"x": (1, 3, 32, 48)}
    assert mg.tensor("r").shape == (1, 3, 32, 48) and mg.tensor("r").bytes == 4 * 3 * 32 * 48
    assert len(said) == 1 and "x[0] 'batch' set to 1" in said[0]
    # the default that applied is recorded with the binding, not an empty {}
    assert mg.binding is not None and mg.binding.as_dict()["defaults"] == {"x[0]": 1}
    assert mg.binding.as_dict()["dims"] == {"height": 32, "width": 48}
    # FLOPs and sizes follow the binding; the model keeps its free dims.
    big = graph.load(_model(tmp_path), shapes.binding_from(shapes=["x=4x3x64x64"]))
    assert big.binding is not None and big.binding.as_dict()["defaults"] == {}  # nothing defaulted
    assert big.tensor("r").bytes == 4 * 4 * 3 * 64 * 64
    assert [d.dim_param for d in big.model.graph.input[0].type.tensor_type.shape.dim] == [
        "batch",
        "",
        "height",
        "width",
    ]


def test_a_binding_of_only_the_batch_default_is_recorded(tmp_path: Path) -> None:
    """A model whose only free dim is the batch: no flag given, yet profiles and plan.json say batch 1."""
    from splitrt.graph import partition

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    p = tmp_path / "batch.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), p)
    mg = graph.load(p, shapes.ShapeBinding())
    plan = partition.write_segments(mg, ["c1"], tmp_path / "out")
    assert plan["binding"] == {"shapes": {}, "dims": {}, "sample": None, "defaults": {"x[0]": 1}}
    assert plan["input_shapes"] == {"x": [1, 4]}


def test_unbound_dims_list_every_input_dim_and_the_flag_line(tmp_path: Path) -> None:
    with pytest.raises(
        ModelError,
        match=r"free.onnx: free dims without a value: x\[2\] 'height', x\[3\] 'width'\. "
        r"Bind them: --dim height=N --dim width=N, or --shape x=1x3xNxN",
    ):
        graph.load(_model(tmp_path), shapes.ShapeBinding())


def test_wrong_bindings_are_clear_errors(tmp_path: Path) -> None:
    p = _model(tmp_path)
    with pytest.raises(ConfigError, match=r"--shape images: the model has no input 'images'; expected one of \['x'\]"):
        graph.load(p, shapes.binding_from(shapes=["images=1x3x8x8"]))
    with pytest.raises(ConfigError, match=r"--dim depth: no input dim is named 'depth'"):
        graph.load(p, shapes.binding_from(dims=["depth=3"]))
    with pytest.raises(
        InputError,
        match=r"input 'x': the model expects shape \(batch, 3, height, width\), --shape "
        r"gives 1x4x8x8",
    ):
        graph.load(p, shapes.binding_from(shapes=["x=1x4x8x8"]))
    with pytest.raises(ModelError, match=r"the sample has no array for x"):
        graph.load(p, shapes.ShapeBinding(sample={"other": np.zeros(3, np.float32)}, sample_path="s.npz"))


def test_sample_binds_shapes_and_is_recorded(tmp_path: Path) -> None:
    f = tmp_path / "s.npz"
    np.savez(f, x=np.ones((2, 3, 8, 16), np.float32))
    mg = graph.load(_model(tmp_path), shapes.binding_from(sample=str(f)))
    assert mg.input_shapes == {"x": (2, 3, 8, 16)}
    assert mg.binding is not None and mg.binding.as_dict()["sample"] == str(f)
