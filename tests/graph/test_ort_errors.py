"""graph.ort_errors: onnxruntime's exceptions, raised by real sessions, become splitrt's tree with a
message naming what failed, what was expected and what came; anything else passes through."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from splitrt.device.client.sessions import build_session, run_session
from splitrt.errors import InputError, ModelError
from splitrt.graph import onnxruntime_errors
from splitrt.graph.ort_errors import mapped


def _reshape_model() -> onnx.ModelProto:
    """y = Reshape(x, shape): a shape the data does not fit fails inside the kernel, at run time."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape", [x, shape], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_model_onnxruntime_cannot_build_is_a_model_error_naming_the_cause() -> None:
    mapping = onnxruntime_errors("the tail of cut 'c3'", stage="build")
    with pytest.raises(ModelError) as info, mapping:
        ort.InferenceSession(b"not an onnx model at all", providers=["CPUExecutionProvider"])
    text = str(info.value)
    assert text.startswith("the tail of cut 'c3' does not load in onnxruntime: expected a model it can build, got ")
    assert type(info.value.__cause__).__module__.startswith("onnxruntime")
    assert type(info.value.__cause__).__name__ in text and "[ONNXRuntimeError]" not in text


def test_a_feed_of_the_wrong_shape_is_an_input_error_with_the_shapes() -> None:
    sess = _session(_reshape_model())
    feeds = {"x": np.ones((2, 5), np.float32), "shape": np.array([5, 2], np.int64)}
    mapping = onnxruntime_errors("the model", stage="run", feeds=feeds, where=" on this device")
    with pytest.raises(InputError) as info, mapping:
        sess.run(None, feeds)
    text = str(info.value)
    assert "the model failed in onnxruntime on this device at x=[2, 5], shape=[2]" in text
    assert "expected inputs every node accepts, got InvalidArgument" in text


def test_a_kernel_refusing_its_data_is_an_input_error() -> None:
    sess = _session(_reshape_model())
    feeds = {"x": np.ones((2, 4), np.float32), "shape": np.array([3, 3], np.int64)}
    mapping = onnxruntime_errors("the model", stage="run", feeds=feeds)
    with pytest.raises(InputError, match=r"at x=\[2, 4\], shape=\[2\]: expected inputs every node accepts"), mapping:
        sess.run(None, feeds)


def test_a_missing_feed_from_the_python_wrapper_is_mapped_too() -> None:
    sess = _session(_reshape_model())
    feeds = {"x": np.ones((2, 4), np.float32)}
    mapping = onnxruntime_errors("the model", stage="run", feeds=feeds)
    with pytest.raises(InputError, match=r"got ValueError: Required inputs \(\['shape'\]\) are missing"), mapping:
        sess.run(None, feeds)


def test_error_forces_the_class_and_a_model_fault_at_run_is_a_model_error() -> None:
    sess = _session(_reshape_model())
    feeds = {"x": np.ones((2, 4), np.float32), "shape": np.array([3, 3], np.int64)}
    mapping = onnxruntime_errors("the sample", stage="run", feeds=feeds, error=ModelError)
    with pytest.raises(ModelError, match="the sample failed in onnxruntime"), mapping:
        sess.run(None, feeds)
    # onnxruntime's own type for a missing kernel says the model is at fault, not the inputs.
    err = mapped(ort_state.NotImplemented("no kernel for Foo(7)"), "the tail", stage="run", feeds={})
    assert isinstance(err, ModelError) and "expected a model whose every op it runs, got NotImplemented" in str(err)


def test_other_errors_pass_through_untouched() -> None:
    mapping = onnxruntime_errors("the model", stage="run")
    with pytest.raises(KeyError), mapping:
        raise KeyError("ours")
    mapping = onnxruntime_errors("the model", stage="run")
    with pytest.raises(InputError, match=r"^ours$"), mapping:
        raise InputError("ours")


def test_the_device_builds_and_runs_through_the_mapping() -> None:
    broken = _reshape_model()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(ModelError, match="the whole model does not load in onnxruntime on this device"):
        build_session(broken, 1, "the whole model")
    sess = build_session(_reshape_model(), 1)
    feeds = {"x": np.ones((2, 4), np.float32), "shape": np.array([3, 3], np.int64)}
    with pytest.raises(InputError, match="the head of cut 'c1' failed in onnxruntime on this device at x="):
        run_session(sess, ["y"], feeds, "the head of cut 'c1'")
    ok = run_session(sess, ["y"], {**feeds, "shape": np.array([4, 2], np.int64)}, "the head")
    assert ok[0].shape == (4, 2)
