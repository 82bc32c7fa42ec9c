"""The CLI contract of `splitrt inspect`, `split` and `zoo` (other tools parse these shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from splitrt.cli import app as cli
from splitrt.graph import model as graph
from splitrt.graph import zoo


def test_inspect_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "zoo:inception_v1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["model"]) >= {"path", "sha256", "nodes", "inputs", "outputs", "flops"}
    assert doc["model"]["inputs"][0] == {
        "name": "data_0",
        "dtype": "float32",
        "shape": [1, 3, 224, 224],
        "sized_by": "static",
        "bytes": 602112,
    }
    cuts = doc["cuts"]
    assert cuts[0]["id"] == "cloud" and cuts[-1]["id"] == "device"
    for c in cuts:
        assert set(c) == {"id", "tensors", "bytes", "head_nodes", "head_flops_fraction", "kept", "reply_bytes"}
        assert c["bytes"] == sum(t["bytes"] for t in c["tensors"])
    assert [c["head_nodes"] for c in cuts] == sorted(c["head_nodes"] for c in cuts)


def test_inspect_table_and_bad_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "zoo:squeezenet"]) == 0
    out = capsys.readouterr().out
    assert "cloud" in out and "device" in out and "crossing tensors" in out
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    assert cli.main(["inspect", str(bad)]) == 2
    assert "bad.onnx" in capsys.readouterr().err


def test_split_writes_segments_and_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mg = graph.load(zoo.get("squeezenet"))
    a, b = mg.cuts()[10].id, mg.cuts()[40].id
    assert cli.main(["split", "zoo:squeezenet", "--cut", a, "--cut", b, "--out", str(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["cuts"] == [a, b] and len(plan["segments"]) == 3
    for i, seg in enumerate(plan["segments"]):
        f = tmp_path / f"segment{i}.onnx"
        onnx.checker.check_model(onnx.load(str(f)))
        assert seg["file"] == f.name and seg["inputs"] and seg["outputs"]
    assert json.loads((tmp_path / "plan.json").read_text()) == plan
    assert cli.main(["split", "zoo:squeezenet", "--cut", "c999", "--out", str(tmp_path)]) == 2


def test_zoo_list_and_get(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["zoo", "list", "--json"]) == 0
    assert "resnet50" in json.loads(capsys.readouterr().out)["models"]
    out = tmp_path / "m.onnx"
    assert cli.main(["zoo", "get", "tiny_chain", "--out", str(out)]) == 0
    assert graph.load(out).sha256 == graph.load(zoo.get("tiny_chain")).sha256  # deterministic bytes
