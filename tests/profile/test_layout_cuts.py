"""Cuts that only move or reshape the input (an NHWC classifier's Transpose to NCHW, a Cast, a Reshape)
send the input's data again: they are ``cloud`` for plans and verdicts (issue 33), in `plan`,
`plan --explain`, `sim` and the daemon (all through ``cutfacts.allowed_for``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.cli import app as cli
from splitrt.graph import memory
from splitrt.graph import model as graph
from splitrt.plan.constraints import LAYOUT_OF_INPUT, Constraints
from splitrt.profile import cutfacts, priors


def _nhwc_classifier(path: Path) -> Path:
    """x [1, 64, 64, 3] -> Transpose -> Cast(float) -> Conv 3->16 -> Relu -> MaxPool -> Conv -> GAP -> Flatten."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 16, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["t"], ["tc"], to=TensorProto.FLOAT),
        helper.make_node("Conv", ["tc", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "nhwc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 64, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w1, w2],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_the_transpose_and_cast_of_the_input_are_cloud(tmp_path: Path) -> None:
    mg = graph.load(_nhwc_classifier(tmp_path / "nhwc.onnx"))
    cuts = mg.cuts()
    layout = dict(zip([c.id for c in cuts], memory.input_layout(mg), strict=True))
    aliases = [c for c, yes in layout.items() if yes]
    assert len(aliases) == 2 and all(c.startswith("c") for c in aliases)  # after the Transpose, after the Cast
    assert not layout["cloud"] and not layout["device"]
    table = priors.flops_table(mg, device_gflops=1.0, cloud_gflops=80.0)
    allowed = cutfacts.allowed_for(mg, table, Constraints())
    assert allowed is not None
    assert {c: allowed.excluded[c] for c in aliases} == dict.fromkeys(aliases, LAYOUT_OF_INPUT)
    assert "cloud" in allowed.cuts and not set(aliases) & set(allowed.cuts)


def test_plan_explain_and_sim_never_pick_a_layout_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _nhwc_classifier(tmp_path / "nhwc.onnx")
    aliases = {
        c.id for c, yes in zip(graph.load(path).cuts(), memory.input_layout(graph.load(path)), strict=True) if yes
    }
    assert cli.main(["plan", str(path), "--explain", "--board", "rpi4", "--codec", "all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plans = {p.split("@")[0] for b in doc["explain"]["bands"] for p in b["plans"]}
    assert not plans & aliases
    assert set(doc["constraints"]["excluded"]) == aliases
    assert cli.main(["sim", "--model", str(path), "--board", "rpi4", "--duration", "10", "--json", "-"]) == 0
    sim = json.loads(capsys.readouterr().out)
    used = {p.split("@")[0] for s in sim["strategies"].values() for p in s["plans"]}
    assert not used & aliases and set(sim["cuts_excluded"]) == aliases
