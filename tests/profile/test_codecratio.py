"""Per-cut codec ratios: measured on the real cut tensors, stored in profiles, priced by plans."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import ProfileError
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import solver
from splitrt.plan.costmodel import CODEC_RATIOS, Conditions, Link
from splitrt.profile import codecratio, profiler
from splitrt.transport import codec


@pytest.fixture(scope="module")
def squeeze() -> tuple[graph.ModelGraph, dict[str, list[float]]]:
    g = graph.load(zoo.get("squeezenet"))
    facts = codecratio.measure(g, zoo.random_inputs(g.path))
    assert set(facts.errors) == {k for k in codecratio.MEASURED if not k.startswith("fp32")}
    quants = {k: v for k, v in facts.errors.items() if codec.Codec.parse(k).image is None}
    assert all(0 <= e < codecratio.MAX_CODEC_ERROR for v in quants.values() for e in v)  # squeezenet: fine
    # a JPEG of random-normal noise at the input is far off (real photos: tests/profile/test_accuracy.py)
    assert facts.errors["jpeg50"][0] > codecratio.MAX_CODEC_ERROR
    return g, facts.ratios


def test_ratios_are_what_the_device_sends_at_each_cut(squeeze: tuple[graph.ModelGraph, dict[str, list[float]]]) -> None:
    """The device's own head (optimised session) on the same inputs: its encoded crossing tensors are the
    measured ratio of the float bytes (the unoptimised run differs in the last bits only)."""
    g, ratios = squeeze
    ids = [c.id for c in g.cuts()]
    assert set(ratios) == set(codecratio.MEASURED) and all(len(v) == len(ids) for v in ratios.values())
    with Device(g.path, config=DeviceConfig(intra_op_threads=1)) as dev:
        x = zoo.random_inputs(g.path)
        for cut in ("cloud", ids[len(ids) // 3], ids[2 * len(ids) // 3]):
            head = dev.run_head(x, cut)
            raw = sum(a.nbytes for a in head.crossing.values() if a.dtype.kind == "f")
            for spec in ("int8+zstd", "fp32+zstd", "int8c"):
                sent = sum(codec.encode(n, a, spec).nbytes for n, a in head.crossing.items() if a.dtype.kind == "f")
                assert ratios[spec][ids.index(cut)] == pytest.approx(sent / raw, abs=0.01), (cut, spec)
    k = ratios["int8+zstd"]
    # ReLU activations compress (about half zeros); the random-normal input does not, past int8's 0.25.
    assert min(k[1:-1]) < 0.15 < k[0] < 0.25
    assert ratios["fp32+zstd"][0] > 0.85


def test_profiles_keep_them_and_plans_choose_them(
    squeeze: tuple[graph.ModelGraph, dict[str, list[float]]], tmp_path: Path
) -> None:
    g, ratios = squeeze
    old = profiler.load_profile("x86_64-2core__squeezenet.json", sha256=g.sha256)
    before = dataclasses.replace(old, codec_ratios=None)
    assert profiler.cost_table(before, before).codecs == tuple(CODEC_RATIOS)  # a profile from before
    prof = dataclasses.replace(old, codec_ratios=ratios)
    profiler.save_profile(prof, tmp_path / "p.json")
    again = profiler.load_profile(tmp_path / "p.json")
    assert again.codec_ratios == ratios
    table = profiler.cost_table(again, again)
    assert set(table.per_cut_codecs()) == set(codecratio.MEASURED)
    # a slow board on a slow link: the per-cut compressed codec beats every fixed-ratio one, and plans take it
    cond = Conditions(link=Link(bandwidth_mbps=10.0, rtt_ms=20.0), device_load=30.0)  # a slow board
    quants = [c for c in table.codecs if codec.Codec.parse(c).image is None]
    best = solver.solve(table, cond, codecs=quants)
    assert best.codec.endswith("+zstd") and best.cut != "device"
    fixed = solver.solve(table, cond, codecs=list(CODEC_RATIOS))
    assert best.predicted_ms < fixed.predicted_ms
    bad = json.loads((tmp_path / "p.json").read_text())
    bad["codec_ratios"]["int8+zstd"] = bad["codec_ratios"]["int8+zstd"][:-1]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"codec_ratios\['int8\+zstd'\]: expected \d+ positive ratios"):
        profiler.load_profile(tmp_path / "bad.json")


@pytest.mark.slow
def test_with_codec_ratios_keeps_the_timings_and_refuses_another_model() -> None:
    g = graph.load(zoo.get("squeezenet"))
    old = profiler.load_profile("x86_64-2core__squeezenet.json", sha256=g.sha256)
    new = profiler.with_codec_ratios(dataclasses.replace(old, codec_ratios=None), g.path, progress=lambda s: None)
    assert new.cuts == old.cuts and new.codec_ratios is not None and new.codec_errors is not None
    # alike (the shipped profile measured them on a real photo, this one on noise: the input is 4x apart, the
    # early feature maps of a photo compress up to 1.4x better)
    inner = [i for i, c in enumerate(old.cut_ids) if c != "cloud"]
    got, was = new.codec_ratios["int8+zstd"], old.codec_ratios["int8+zstd"]  # type: ignore[index]
    assert np.allclose([got[i] for i in inner], [was[i] for i in inner], rtol=0.5)
    with pytest.raises(ProfileError, match="expected the same model"):
        profiler.with_codec_ratios(old, zoo.get("tiny_chain"), progress=lambda s: None)


def test_the_output_not_the_tensor_error_guards_a_codec() -> None:
    """densenet121's c2 (after the first BatchNorm): one channel's range dwarfs the others, per-tensor int8
    collapses them (relative RMS error 0.05) while int8c keeps them. The tensor error is recorded, but what
    guards a plan is the output's agreement on samples: int8 priced out where it changes the answer, int8c
    priced by its bytes where it does not."""
    from splitrt.plan.costmodel import MAX_CODEC_RATIO
    from splitrt.profile.costs import measured_codecs

    prof = profiler.load_profile("x86_64-2core__densenet121.json")
    assert prof.codec_errors is not None and prof.codec_ratios is not None
    i = prof.cut_ids.index("c2")
    assert prof.codec_errors["int8+zstd"][i] > codecratio.MAX_CODEC_ERROR > prof.codec_errors["int8c+zstd"][i]
    assert prof.codec_ratios["int8+zstd"][i] < 0.05  # what made it look cheap
    n = len(prof.cuts)
    shares: dict[str, list[float | None]] = {k: [None] * n for k in ("int8+zstd", "int8c+zstd")}
    shares["int8+zstd"][i], shares["int8c+zstd"][i] = 0.4, 1.0
    guarded = dataclasses.replace(prof, codec_agreement=shares, accuracy={"metric": "top1", "samples": 5})
    codecs = measured_codecs(guarded)
    assert codecs["int8+zstd"][i] == MAX_CODEC_RATIO  # type: ignore[index]
    assert codecs["int8c+zstd"][i] == prof.codec_ratios["int8c+zstd"][i]  # type: ignore[index]
    table = profiler.cost_table(guarded, guarded)
    cond = Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=20.0), device_load=30.0)
    assert solver.solve(table, cond, codecs=None, cuts=["c2"]).codec == "int8c+zstd"


def test_output_agreement_records_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    old = profiler.load_profile("x86_64-2core__squeezenet.json")
    n = len(old.cuts)
    shares: dict[str, list[float | None]] = {"jpeg75": [0.98] + [None] * (n - 1)}
    acc = {"metric": "top1", "samples": 50, "source": "zoo-default", "output": "y"}
    prof = dataclasses.replace(old, codec_agreement=shares, accuracy=acc)
    profiler.save_profile(prof, tmp_path / "p.json")
    again = profiler.load_profile(tmp_path / "p.json")
    assert again.codec_agreement == shares and again.accuracy == acc
    assert "codec_agreement" not in old.to_dict()  # a profile without samples has no record at all
    bad = json.loads((tmp_path / "p.json").read_text())
    bad["codec_agreement"]["jpeg75"][0] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"codec_agreement\['jpeg75'\]: expected \d+ shares in \[0, 1\]"):
        profiler.load_profile(tmp_path / "bad.json")


def test_a_tiny_tensors_ratio_over_the_cap_is_priced_at_the_cap() -> None:
    """openwakeword's alexa_v0.1 profile measured int8+zstd at 4.5 on its one-float output (issue 33):
    the table refused the profile ('ratio must be in (0, 4]'); it is priced at the cap instead."""
    from splitrt.plan.costmodel import MAX_CODEC_RATIO
    from splitrt.profile.costs import measured_codecs

    p = profiler.load_profile("x86_64-2core__squeezenet.json")
    n = len(p.cut_ids)
    odd = dataclasses.replace(p, codec_ratios={"int8+zstd": [4.5] * n, "fp32+zstd": [0.5] * (n - 1) + [4.2]})
    got = measured_codecs(odd, min_agreement=0)  # bytes alone: the cap is the only guard
    assert got["int8+zstd"] == [MAX_CODEC_RATIO] * n and got["fp32+zstd"][-1] == MAX_CODEC_RATIO
    profiler.cost_table(odd, odd)  # builds


def test_one_pass_over_several_inputs_is_the_mean_of_each_ones_ratios() -> None:
    """``profile`` measures the codecs once, on the samples: ratios are the mean of each input's (as the
    accuracy guard's re-measure was), errors and times the first input's."""
    g = graph.load(zoo.get("tiny_chain"))
    a, b = zoo.random_inputs(g.path), {k: np.abs(v) * 3 for k, v in zoo.random_inputs(g.path).items()}
    both = codecratio.measure_pass(g, [a, b], codecs=["fp32", "int8+zstd", "fp16", "jpeg75"])
    one, two = codecratio.measure(g, a, codecs=["int8+zstd", "fp16"]), codecratio.measure(g, b, codecs=["int8+zstd"])
    assert set(both.facts.ratios) == {"int8+zstd", "fp16", "jpeg75"}  # plain fp32 is 1 by definition
    pairs = zip(one.ratios["int8+zstd"], two.ratios["int8+zstd"], strict=True)
    mean = [round((x + y) / 2, codecratio.DIGITS) for x, y in pairs]
    assert both.facts.ratios["int8+zstd"] == mean != one.ratios["int8+zstd"]
    assert both.facts.errors["fp16"] == one.errors["fp16"]
    assert set(both.encode_ms) == {"fp32", "int8+zstd", "fp16", "jpeg75"}
    cloud = [c.id for c in g.cuts()].index("cloud")
    assert both.encode_ms["int8+zstd"][cloud] > 0 and both.decode_ms["int8+zstd"][cloud] > 0
    assert codecratio.measure_pass(g, [a], timed=False).encode_ms == {}
    with pytest.raises(ProfileError, match="at least one input"):
        codecratio.measure_pass(g, [])


def test_a_slow_encode_is_timed_twice_a_fast_one_up_to_three_times() -> None:
    calls: list[int] = []
    assert codecratio._fastest(lambda: calls.append(1), 1.0, 3) < 1e3  # 1 s spent: one more timing only
    assert len(calls) == 1
    calls.clear()
    codecratio._fastest(lambda: calls.append(1), 0.0, 3)  # 0 s and then > 0 s: no agreement, no budget spent
    assert len(calls) == 2
    calls.clear()
    codecratio._fastest(lambda: calls.append(1), 0.0, 1)
    assert not calls


def test_a_uint8_frame_is_priced_as_an_image_codec_sends_it(tmp_path: Path) -> None:
    """A camera's uint8 frame at the input: an image codec sends it as a JPEG, every other codec raw; the
    profile counts it in ``float_bytes`` with those measured ratios, so a plan prices what is sent."""
    import onnx
    from onnx import TensorProto, helper

    from splitrt.graph import photos

    x = helper.make_tensor_value_info("frame", TensorProto.UINT8, [1, 96, 128, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    nodes = [
        helper.make_node("Cast", ["frame"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    path = tmp_path / "frame.onnx"
    onnx.save(
        helper.make_model(helper.make_graph(nodes, "frame", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]),
        path,
    )
    g = graph.load(path)
    raw = 96 * 128 * 3
    assert g.cuts()[0].id == "cloud" and g.cuts()[0].codec_bytes == raw
    feeds = photos.photo_inputs(g.inputs)
    assert feeds is not None and feeds["frame"].dtype == np.uint8
    facts = codecratio.measure(g, feeds)
    jpeg = codec.encode("frame", feeds["frame"], "jpeg75").nbytes
    assert facts.ratios["jpeg75"][0] == pytest.approx(jpeg / raw, abs=1e-4) and facts.ratios["jpeg75"][0] < 0.3
    assert facts.ratios["fp16"][0] == facts.ratios["int8"][0] == 1.0  # not a float: sent raw
    prof = profiler.measure(path, runs=1, warmup=0)
    assert prof.cuts[0].float_bytes == raw
    table = profiler.cost_table(prof, prof, min_agreement=0.0)
    sent = table.sent_bytes[table.index("cloud")]
    assert sent[table.codec_index("jpeg75")] < 0.3 * raw and sent[table.codec_index("fp16")] == raw
    assert table.encode_ms[table.index("cloud"), table.codec_index("jpeg75")] > 0
