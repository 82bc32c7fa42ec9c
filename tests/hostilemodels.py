"""Small ONNX models that never finish, shared by the hostile-server tests and ``attacks/bench_attack.py``."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def loop_model(trips: int = 2**62) -> onnx.ModelProto:
    """300 bytes: a Loop adding 1 to x ``trips`` times (for ever, in practice)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
