"""A top-level If whose condition the binding's sample fixes is specialised: its taken branch inlined, its
nodes become cuts, the steps recorded with the binding; the guard names a request that takes the other
branch. Checked on a small model with random weights (both branches compute) and on silero-vad (its
whole network sits in the branches of an If on the sample-rate scalar)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.errors import ModelError, ProfileError
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes
from tests.conftest import rel_err
from tests.realmodels import MODELS, bound, fetch

VAD = {m.name: m for m in MODELS}["silero_vad"]


def _branchy(tmp_path: Path) -> Path:
    """x [N, 8], sr (int64 scalar) -> If(sr == 16000): then 3 MatMul+Relu layers, else MatMul+Tanh -> y [N, 4]."""
    rng = np.random.default_rng(7)
    w = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"w{i}")
        for i, s in enumerate([(8, 16), (16, 16), (16, 4), (8, 4)])
    ]
    mk = helper.make_node
    then = helper.make_graph(
        [
            mk("MatMul", ["x", "w0"], ["t0"]),
            mk("Relu", ["t0"], ["t1"]),
            mk("MatMul", ["t1", "w1"], ["t2"]),
            mk("Relu", ["t2"], ["t3"]),
            mk("MatMul", ["t3", "w2"], ["t_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [mk("MatMul", ["x", "w3"], ["e0"]), mk("Tanh", ["e0"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(16000, np.int64))),
        helper.make_node("Equal", ["sr", "k"], ["is16k"]),
        helper.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other),
    ]
    g = helper.make_graph(
        nodes,
        "branchy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        w,
    )
    p = tmp_path / "branchy.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def _sample(sr: int, n: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(n).standard_normal((n, 8)).astype(np.float32), "sr": np.array(sr, np.int64)}


def _split_run(mg: graph.ModelGraph, cut: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = dict(feeds)
    for seg in partition.head_tail(mg, cut):
        if seg.outputs:
            sess = ort.InferenceSession(seg.model.SerializeToString(), providers=["CPUExecutionProvider"])
            env.update(zip(seg.outputs, sess.run(list(seg.outputs), {k: env[k] for k in seg.inputs}), strict=True))
    return env


def test_the_branch_the_sample_takes_is_inlined_and_its_nodes_are_cuts(tmp_path: Path) -> None:
    p = _branchy(tmp_path)
    assert len(graph.load(p).cuts()) == 3  # cloud, after the Equal, device: the If is one node
    for sr, key, inner in ((16000, "0t", 4), (8000, "0e", 1)):
        mg = graph.load(p, shapes.ShapeBinding(sample=_sample(sr), sample_path="s.npz"))
        spec = mg.specialisation
        assert spec is not None and spec.key == key and mg.sha256 == f"{graph.load(p).sha256}~{key}"
        assert len([c for c in mg.cuts() if c.id not in ("cloud", "device")]) >= inner
        assert mg.binding is not None and mg.binding.as_dict()["specialised"]["steps"][0]["values"] == {"sr": sr}
        full = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        feeds = _sample(sr, 3)
        ref = full.run(None, feeds)[0]
        for cut in mg.cuts():
            assert rel_err(ref, _split_run(mg, cut.id, feeds)["y"]) < 1e-6, cut.id
        assert spec.holds(feeds) is None
        other = dict(feeds, sr=np.array(24000 - sr, np.int64))
        why = spec.holds(other)
        taken = "else" if sr == 16000 else "then"
        assert why is not None and f"takes the {taken} branch" in why
        assert f"sr={24000 - sr}" in why and f"sr={sr}" in why
        # the guard is what keeps this from being wrong: the specialised split on the other branch's input differs
        assert rel_err(full.run(None, other)[0], _split_run(mg, mg.cuts()[1].id, other)["y"]) > 0.1


def test_no_sample_no_specialisation_and_made_up_steps_are_refused(tmp_path: Path) -> None:
    p = _branchy(tmp_path)
    mg = graph.load(p, shapes.binding_from(shapes=["x=2x8", "sr="]))
    assert mg.specialisation is None and mg.binding is not None and "specialised" not in mg.binding.as_dict()
    base = graph.load(p)
    derived = graph.derived(base, "0t")
    assert [c.id for c in derived.cuts()] == [
        c.id for c in graph.load(p, shapes.ShapeBinding(sample=_sample(16000))).cuts()
    ]  # a server derives the same cuts from the file alone
    for bad in ("1t", "0x", "", "0t0t"):
        with pytest.raises(ModelError):
            graph.derived(base, bad)


def test_silero_vad_offers_its_inner_cuts_and_splits_exactly() -> None:
    path = fetch(VAD)
    mg = bound("silero_vad")
    assert mg.specialisation is not None and mg.specialisation.key.startswith("0t")
    inner = [c for c in mg.cuts() if c.id not in ("cloud", "device")]
    assert len(inner) >= 40 and len(graph.load(path).cuts()) <= 6
    spec = mg.binding.as_dict()["specialised"] if mg.binding else {}
    assert spec["steps"][0]["values"] == {"sr": 16000}
    full = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in mg.model.graph.output]
    for which in ("a", "b"):  # batch 1 and batch 2, both 16 kHz
        feeds = VAD.sample_a if which == "a" else VAD.sample_b
        ref = full.run(names, feeds)
        for cut in inner[:: max(1, len(inner) // 8)]:
            out = _split_run(mg, cut.id, feeds)
            for n, r in zip(names, ref, strict=True):
                assert rel_err(np.asarray(r), out[n]) < 1e-4, (which, cut.id, n)
    at8k = dict(VAD.sample_a, sr=np.array(8000, np.int64), input=VAD.sample_a["input"][:, :256])
    why = mg.specialisation.holds(at8k)
    assert why is not None and "sr=8000" in why and "sr=16000" in why


def test_the_specialisation_is_recorded_in_plan_json(tmp_path: Path) -> None:
    mg = bound("silero_vad")
    plan = partition.write_segments(mg, ["c20"], tmp_path / "out")
    assert plan["sha256"] == mg.sha256 and "~" in str(plan["sha256"])
    rec = plan["binding"]["specialised"]  # type: ignore[index]
    assert rec["key"] == mg.specialisation.key and rec["base_sha256"] == mg.file_sha256


def test_a_profile_records_the_specialisation(tmp_path: Path) -> None:
    from splitrt.profile import profiler

    prof = profiler.measure(
        fetch(VAD),
        runs=1,
        warmup=0,
        segments=2,
        threads=1,
        progress=lambda _: None,
        binding=shapes.ShapeBinding(sample=VAD.sample_a, sample_path="vad16k.npz"),
    )
    mg = bound("silero_vad")
    assert prof.sha256 == mg.sha256 and prof.cut_ids == tuple(c.id for c in mg.cuts())
    assert prof.model["binding"]["specialised"]["steps"][0]["values"] == {"sr": 16000}
    # planning the model unspecialised (or specialised on other branches) with it is refused, saying why
    profiler.save_profile(prof, tmp_path / "vad.json")
    short = mg.file_sha256[:12]
    with pytest.raises(ProfileError, match=rf"{short}\.\.\.~0t1t, expected sha256 {short}\.\.\. .*same branches"):
        profiler.load_profile(tmp_path / "vad.json", sha256=graph.load(fetch(VAD)).sha256)


def test_an_if_on_a_boolean_input_itself(tmp_path: Path) -> None:
    mk = helper.make_node
    then = helper.make_graph(
        [mk("Relu", ["x"], ["a"]), mk("Neg", ["a"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [mk("Sigmoid", ["x"], ["e_out"])], "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)]
    )
    g = helper.make_graph(
        [mk("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
        "flagged",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    p = tmp_path / "flag.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), "flag": np.array(True)}
    mg = graph.load(p, shapes.ShapeBinding(sample=feeds))
    assert mg.specialisation is not None and mg.specialisation.key == "0t"
    assert len(mg.cuts()) == 4  # cloud, after Relu, after Neg (the Identity to y), device
    ref = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert rel_err(ref, _split_run(mg, "c1", feeds)["y"]) < 1e-6
    assert mg.specialisation.holds(feeds) is None
    assert "flag=False" in str(mg.specialisation.holds(dict(feeds, flag=np.array(False))))
