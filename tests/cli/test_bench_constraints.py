"""`splitrt bench --no-raw-input / --device-memory-mb`: the rig's runtime strategies plan within the cuts
the constraints leave (the worker's controller takes them from the bench config)."""

from __future__ import annotations

from splitrt.cli import app
from splitrt.cli import bench as benchcli


def _config(*flags: str) -> object:
    args = app.build_parser().parse_args(["bench", "--model", "squeezenet", *flags])
    return benchcli.bench_config(args)


def test_no_constraint_leaves_every_cut() -> None:
    assert _config().cuts is None  # type: ignore[attr-defined]


def test_no_raw_input_drops_the_cut_that_sends_the_input() -> None:
    cuts = _config("--no-raw-input").cuts  # type: ignore[attr-defined]
    assert cuts is not None and "cloud" not in cuts and "device" in cuts and "c5" in cuts


def test_a_memory_ceiling_drops_the_heads_that_do_not_fit() -> None:
    every = _config("--min-head-flops", "0.0001").cuts  # type: ignore[attr-defined]
    small = _config("--device-memory-mb", "3").cuts  # type: ignore[attr-defined]
    assert every is not None and small is not None
    assert "cloud" in small and "device" not in small and len(small) < len(every)


def test_a_profile_and_a_model_file_are_taken(tmp_path: object) -> None:
    """`bench --model FILE.onnx --profile P` (issue 33): the rig plans from that profile; a cut that only
    moves the input is left out, as in `plan` and `sim`."""
    from pathlib import Path

    from tests.profile.test_layout_cuts import _nhwc_classifier

    path = _nhwc_classifier(Path(str(tmp_path)) / "nhwc.onnx")
    cfg = _config(
        "--model", str(path), "--profile", "p.json", "--codecs", "fp32,int8c+zstd", "--strategies", "adaptive,route"
    )
    assert cfg.profile_path == "p.json"  # type: ignore[attr-defined]
    assert cfg.codecs == ("fp32", "int8c+zstd") and cfg.strategies == ("adaptive", "route")  # type: ignore[attr-defined]
    assert cfg.cuts is not None and "cloud" in cfg.cuts and "c1" not in cfg.cuts  # type: ignore[attr-defined]


def test_shape_flags_bind_the_model_every_part_of_the_rig_loads() -> None:
    """`bench --shape/--dim` (as `plan`, `sim`, `profile`): the rig runs a copy of the model whose inputs
    have the bound shapes, so its devices, servers, profile and tables all see them; same cuts."""
    import pytest

    from splitrt.errors import ModelError
    from splitrt.graph import model as graph
    from splitrt.graph import zoo
    from splitrt.graph.shapes import ShapeBinding

    parse = app.build_parser().parse_args
    with benchcli.bound_model(parse(["bench", "--model", "yolo_tiny", "--dim", "height=64", "--dim", "width=96"])) as m:
        cfg = benchcli.bench_config(parse(["bench", "--model", "yolo_tiny"]), m)
        assert cfg.model == m != "yolo_tiny"  # type: ignore[attr-defined]
        g = graph.load(m)  # no binding needed: the copy's inputs are static
        assert [t.shape for t in g.inputs] == [(1, 3, 64, 96)]
        original = graph.load(zoo.get("yolo_tiny"), ShapeBinding(dims={"height": 64, "width": 96}))
        assert [(c.id, c.bytes) for c in g.cuts()] == [(c.id, c.bytes) for c in original.cuts()]
    half = parse(["bench", "--model", "yolo_tiny", "--dim", "height=64"])
    with pytest.raises(ModelError, match=r"free dims without a value: images\[3\] 'width'"), benchcli.bound_model(half):
        pass
    with benchcli.bound_model(parse(["bench", "--model", "squeezenet"])) as m:
        assert m == "squeezenet"  # nothing bound: the model as named
