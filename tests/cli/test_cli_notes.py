"""The CLI says what a user would otherwise guess at (issue 33): `profile` warns when its codec ratios come
from random input; `inspect` says why cuts are hidden and why its node count is not the file's; long
tensor names are shortened in tables (whole in --json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.cli import app as cli
from splitrt.cli.tables import NAME_WIDTH, short

LONG = "encoder/" + "/".join(f"layer_{i}/block/attention/projection" for i in range(10)) + "/MatMul:0"


def _branchy(path: Path) -> Path:
    """x -> Constant-fed Mul -> two branches (Relu, Sigmoid) -> Add -> y; a 350-char tensor name."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0).reshape(()), "kv")),
        helper.make_node("MatMul", ["x", "w"], [LONG]),
        helper.make_node("Mul", [LONG, "k"], ["m"]),
        helper.make_node("Relu", ["m"], ["a"]),
        helper.make_node("Sigmoid", ["m"], ["b"]),
        helper.make_node("MatMul", ["a", "w"], ["a2"]),
        helper.make_node("MatMul", ["b", "w"], ["b2"]),
        helper.make_node("Add", ["a2", "b2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_inspect_says_why_cuts_are_hidden_and_nodes_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _branchy(tmp_path / "branchy.onnx")
    assert cli.main(["inspect", str(path), "--board", "none"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert "hidden: they send several tensors at once; --all shows every cut" in header
    assert "(the file has 8:" in header and "folded" in header
    assert LONG not in out and short(LONG) in out
    assert max(len(line) for line in out.splitlines()[1:]) < 160
    assert cli.main(["inspect", str(path), "--board", "none", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any(LONG in [t["name"] for t in c["tensors"]] for c in doc["cuts"])  # whole in --json


def test_short_keeps_both_ends() -> None:
    s = short(LONG)
    assert len(s) == NAME_WIDTH and s.startswith("encoder/layer_0") and s.endswith("MatMul:0")
    assert short("conv1") == "conv1"


def test_profile_warns_about_random_codec_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _branchy(tmp_path / "branchy.onnx")
    argv = ["profile", str(path), "--out", str(tmp_path / "p.json"), "--runs", "1", "--warmup", "0"]
    assert cli.main([*argv, "--segments", "2", "--power-reader", "none"]) == 0
    assert "codec ratios measured on random input (no --sample)" in capsys.readouterr().err
    np.savez(tmp_path / "s.npz", x=np.ones((1, 16), np.float32))
    assert cli.main([*argv, "--segments", "2", "--power-reader", "none", "--sample", str(tmp_path / "s.npz")]) == 0
    assert "random input" not in capsys.readouterr().err
