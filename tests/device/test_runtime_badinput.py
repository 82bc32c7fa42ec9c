"""A bad input the cloud refuses (INVALID_ARGUMENT: its tail fails on these tensors) is the request's
fault: the adaptive runtime raises ``InputError`` at once without running the tail again here, counts
it as failed, and keeps the cloud (the next request is served there). A real server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import DeviceConfig
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import InputError
from splitrt.graph import model as graph
from splitrt.profile.priors import flops_table


def lookup_model() -> onnx.ModelProto:
    """ids [1, 4] -> rows of a 10 x 4 table -> relu: an id out of the table fails the run."""
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32), "table")
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Relu", ["rows"], ["y"])],
        "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4])],
        [table],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_input_the_cloud_refuses_fails_once_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "lookup.onnx"
    onnx.save(lookup_model(), str(path))
    mg = graph.load(path)
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cfg = RuntimeConfig(deadline_ms=60_000, policy="fixed:cloud", backoff_initial_s=30, backoff_max_s=60)
    with (
        CloudServer(ServerConfig(models_dir=tmp_path, workers=1, intra_op_threads=1)) as s,
        AdaptiveDevice(
            mg, table, [s.address], config=cfg, device_config=DeviceConfig(intra_op_threads=1), start_prober=False
        ) as dev,
    ):
        good = {"ids": np.array([[1, 2, 3, 4]], np.int64)}
        first = dev.infer(good)
        assert first.server == s.address and not first.fallback
        bad = {"ids": np.array([[1, 2, 3, 10**6]], np.int64)}  # beyond the table: Gather fails
        with pytest.raises(InputError, match=f"{s.address} refused the request's tensors"):  # not run here again
            dev.infer(bad)
        assert dev.stats["failed"] == 1
        again = dev.infer(good)  # the cloud was not marked failed: no backoff, no fallback
        assert again.server == s.address and not again.fallback, again.fallback_reason
