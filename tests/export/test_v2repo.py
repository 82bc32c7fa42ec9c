"""`splitrt export-repository`: the Triton/MLServer layout, the configs, and tails that compute the model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest

from splitrt.cli.app import main as cli_main
from splitrt.errors import ConfigError, CutError
from splitrt.export import v2repo
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes, zoo
from tests.conftest import rel_err, run_segments


@pytest.fixture(scope="module")
def chain() -> graph.ModelGraph:
    return graph.load(zoo.get("tiny_chain"))


def test_layout_for_triton_and_mlserver(chain: graph.ModelGraph, tmp_path: Path) -> None:
    tails = v2repo.export_repository(chain, ["c3", "c5", "c3"], tmp_path)
    assert [t.name for t in tails] == [f"{chain.sha256[:12]}-c3", f"{chain.sha256[:12]}-c5"]
    for t in tails:
        assert sorted(p.relative_to(t.directory).as_posix() for p in t.directory.rglob("*")) == [
            "1",
            "1/model.onnx",
            "config.pbtxt",
            "model-settings.json",
        ]
        onnx.checker.check_model(onnx.load(str(t.directory / "1" / "model.onnx")))
    assert (tmp_path / "splitrt_v2_runtime.py").read_text() == v2repo.RUNTIME_SOURCE.read_text()
    manifest = json.loads((tmp_path / v2repo.MANIFEST).read_text())
    assert manifest["sha256"] == chain.sha256 and [m["cut"] for m in manifest["models"]] == ["c3", "c5"]


def test_config_pbtxt_and_model_settings_declare_the_crossing_tensors(chain: graph.ModelGraph, tmp_path: Path) -> None:
    (tail,) = v2repo.export_repository(chain, ["c3"], tmp_path)
    crossing = chain.cut("c3").tensors
    text = (tail.directory / "config.pbtxt").read_text()
    assert f'name: "{tail.name}"' in text and 'platform: "onnxruntime_onnx"' in text
    assert "max_batch_size: 0" in text
    dims = ", ".join(["-1", *(str(d) for d in crossing[0].shape[1:])])  # the batch dim stays free
    assert re.search(
        rf'input \[\s*\{{\s*name: "{crossing[0].name}"\s*data_type: TYPE_FP32\s*dims: \[ {dims} \]', text
    ), text
    assert re.search(r'output \[\s*\{\s*name: "y"\s*data_type: TYPE_FP32\s*dims: \[ -1, 10 \]', text), text
    settings = json.loads((tail.directory / "model-settings.json").read_text())
    assert settings["name"] == tail.name and settings["implementation"] == v2repo.RUNTIME_CLASS
    assert settings["parameters"]["uri"] == "./1/model.onnx"
    assert settings["inputs"] == [{"name": crossing[0].name, "datatype": "FP32", "shape": [-1, *crossing[0].shape[1:]]}]


def test_exported_tail_after_the_head_equals_the_model(chain: graph.ModelGraph, tmp_path: Path) -> None:
    (tail,) = v2repo.export_repository(chain, ["c5"], tmp_path)
    head, _ = partition.head_tail(chain, "c5")
    exported = onnx.load(str(tail.directory / "1" / "model.onnx"))
    seg = partition.Segment(
        1,
        exported,
        tuple(i.name for i in exported.graph.input),
        tuple(o.name for o in exported.graph.output),
        len(exported.graph.node),
    )
    x = zoo.random_inputs(chain.path, seed=2)
    whole = run_segments(partition.split(chain, ["device"])[:1], x)
    split = run_segments([head, seg], x)
    assert rel_err(whole["y"], split["y"]) < 1e-6


def test_fixed_shapes_scalars_and_int64(tmp_path: Path) -> None:
    bert = graph.load(zoo.get("bert_tiny"), shapes.binding_from([], ["batch=2", "seq=6"], None))
    (tail,) = v2repo.export_repository(bert, ["c3"], tmp_path, fixed_shapes=True)
    by_name = {t.name: t for t in tail.inputs}
    assert by_name["attention_mask"].datatype == "INT64" and by_name["attention_mask"].dims == (2, 6)
    assert by_name["embeddings.seq_len"].dims == ()
    text = (tail.directory / "config.pbtxt").read_text()
    # Triton takes no empty dims: a scalar is [1] reshaped to [].
    assert re.search(
        r'name: "embeddings.seq_len"\s*data_type: TYPE_INT64\s*dims: \[ 1 \]\s*reshape: '
        r"\{ shape: \[ \] \}",
        text,
    ), text


def test_bad_cuts_are_refused(chain: graph.ModelGraph, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="got 'device'"):
        v2repo.export_repository(chain, ["device"], tmp_path)
    with pytest.raises(CutError):
        v2repo.export_repository(chain, ["c999"], tmp_path)
    with pytest.raises(ConfigError, match="at least one cut"):
        v2repo.export_repository(chain, [], tmp_path)


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli_main(
            ["export-repository", "--model", "zoo:tiny_chain", "--cuts", "c2, c4", "--out", str(tmp_path), "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [m["cut"] for m in out["models"]] == ["c2", "c4"]
    assert all((tmp_path / m["name"] / "config.pbtxt").exists() for m in out["models"])
