"""graph: loading/normalising any ONNX model, clear errors for bad ones, cut enumeration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.errors import CutError, ModelError, SplitrtError
from splitrt.graph import model as graph
from splitrt.graph import shapes, zoo


def _save(m: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(m, str(path))
    return path


def _chain_model(opset: int = 13, shape: list[object] | None = None) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape or [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


# --- bad models: each a ModelError naming the file and the cause --------------------------------------


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"nope\.onnx: no such file"):
        graph.load(tmp_path / "nope.onnx")


def test_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a regular file"):
        graph.load(tmp_path)


def test_random_bytes_are_not_onnx(tmp_path: Path) -> None:
    p = tmp_path / "garbage.onnx"
    p.write_bytes(np.random.default_rng(1).bytes(5000))
    with pytest.raises(ModelError, match=r"garbage\.onnx: not (a valid ONNX model|an ONNX model)"):
        graph.load(p)


def test_text_file_is_not_onnx(tmp_path: Path) -> None:
    p = tmp_path / "readme.onnx"
    p.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelError, match=r"readme\.onnx"):
        graph.load(p)


def test_truncated_model(tmp_path: Path, zoo_path) -> None:  # type: ignore[no-untyped-def]
    data = zoo_path("squeezenet").read_bytes()
    p = tmp_path / "cut_short.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"cut_short\.onnx: not (a valid ONNX model|an ONNX model)"):
        graph.load(p)


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelError, match="empty file"):
        graph.load(p)


def test_checker_failure_names_the_cause(tmp_path: Path) -> None:
    m = _chain_model()
    m.graph.node[1].input[0] = "undefined_tensor"
    with pytest.raises(ModelError, match=r"bad\.onnx: fails the ONNX checker.*undefined_tensor"):
        graph.load(_save(m, tmp_path / "bad.onnx"))


def test_old_opset_refused(tmp_path: Path) -> None:
    m = _chain_model(opset=7)
    with pytest.raises(ModelError, match=r"opset 7 is not supported \(expected opset >= 9\)"):
        graph.load(_save(m, tmp_path / "old.onnx"))


def test_data_dependent_size_is_measured_once_shapes_are_bound(tmp_path: Path) -> None:
    # Reshape to a runtime-provided shape: the crossing tensor's size is unknowable statically.
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    path = _save(m, tmp_path / "dyn.onnx")
    unbound = graph.load(path)
    # Every structural cut is kept (ids must not depend on sizing); unbound, the size of `s` is unknown.
    cut_s = next(c for c in unbound.cuts() if c.tensor_names == ("s",))
    assert cut_s.tensors[0].bytes == -1 and not unbound.sized
    # Bound by a sample (the shape input's VALUE decides `s`): measured, and right.
    sample = {"x": np.ones((2, 4), np.float32), "shape": np.array([4, 2], np.int64)}
    bound = graph.load(path, shapes.ShapeBinding(sample=sample))
    s_info = bound.tensor("s")
    assert (s_info.shape, s_info.bytes, s_info.source) == ((4, 2), 32, "measured")
    assert bound.sized and [c.id for c in bound.cuts()] == [c.id for c in unbound.cuts()]


def test_graph_input_of_unknown_rank_is_a_clear_error(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    x = g.input[0]
    x.type.tensor_type.ClearField("shape")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    p = tmp_path / "norank.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match=r"norank\.onnx: (free dims without a value: x \(unknown rank\)|fails)"):
        graph.load(p, shapes.ShapeBinding())


def test_initializer_output_and_dead_nodes(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(2, 2), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("Neg", ["h"], ["dead"]),  # feeds no output
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 2]),
        ],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    mg = graph.load(_save(m, tmp_path / "io.onnx"))
    assert not any(n.op_type == "Neg" for n in mg.nodes)
    heads = [(c.tensor_names, c.kept) for c in mg.cuts()]
    assert len(heads) == len(set(heads))  # no two cuts with the same crossing and kept sets
    from splitrt.graph import partition
    from tests.conftest import run_segments, session

    feeds = {"x": np.array([[1.0, -2.0], [3.0, 4.0]], np.float32)}
    ref = session(mg.path).run(["y", "W"], feeds)
    for c in mg.cuts():
        env = run_segments(partition.split(mg, [c.id]), feeds)
        assert np.allclose(env["y"], ref[0]) and np.array_equal(env["W"], ref[1]), c.id


def test_external_data_is_part_of_the_model_identity(tmp_path: Path) -> None:
    m = onnx.load(str(zoo.get("tiny_chain")))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    onnx.save_model(m, str(a / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    m = onnx.load(str(zoo.get("tiny_chain")))  # save_model moved the weights out of `m`: start again
    w = next(t for t in m.graph.initializer if t.name == "w1")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 2, "w1"))
    onnx.save_model(m, str(b / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    assert (a / "m.onnx").read_bytes() == (b / "m.onnx").read_bytes()  # same graph file...
    assert graph.load(a / "m.onnx").sha256 != graph.load(b / "m.onnx").sha256  # ...other weights


def test_every_error_is_a_splitrt_error() -> None:
    assert issubclass(ModelError, SplitrtError) and issubclass(CutError, SplitrtError)


# --- normalisation --------------------------------------------------------------------------------------


def test_ir3_initializer_inputs_are_dropped(tmp_path: Path) -> None:
    m = _chain_model(opset=9)
    m.ir_version = 3
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4]))
    mg = graph.load(_save(m, tmp_path / "ir3.onnx"))
    assert [t.name for t in mg.inputs] == ["x"]
    assert mg.model.ir_version >= 4


def test_constant_nodes_become_initializers_and_never_cross(tmp_path: Path) -> None:
    mg = graph.load(zoo.get("branchy"))
    assert not any(n.op_type == "Constant" for n in mg.nodes)
    assert "k" in mg.initializer_names
    for c in mg.cuts():
        assert "k" not in c.tensor_names


def test_symbolic_batch_dim_counts_as_one(tmp_path: Path) -> None:
    mg = graph.load(_save(_chain_model(shape=["batch", 4]), tmp_path / "sym.onnx"))
    assert mg.inputs[0].shape == ("batch", 4)
    assert mg.cut("cloud").bytes == 4 * 4


def test_external_data_model(tmp_path: Path) -> None:
    m = onnx.load(str(zoo.get("tiny_chain")))
    p = tmp_path / "ext.onnx"
    onnx.save_model(
        m, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data", size_threshold=0
    )
    mg = graph.load(p)
    assert len(mg.cuts()) == len(graph.load(zoo.get("tiny_chain")).cuts())
    (tmp_path / "ext.data").unlink()
    with pytest.raises(ModelError, match="ext"):
        graph.load(p)


def test_flops_of_a_conv_are_counted() -> None:
    mg = graph.load(zoo.get("tiny_chain"))
    # Conv1: out 1x8x32x32, each output 3*3*3 MACs; Conv2: out 1x16x16x16, 8*3*3 MACs; Gemm 16x10; one FLOP
    # per element for each Relu (8x32x32, 16x16x16) and for the pool's input (16x16x16).
    expected = 2 * (8 * 32 * 32 * 27 + 16 * 16 * 16 * 72 + 10 * 16) + 8 * 32 * 32 + 2 * 16 * 16 * 16
    assert mg.flops == pytest.approx(expected)


# --- cuts -------------------------------------------------------------------------------------------------


def _closed_under_predecessors(mg: graph.ModelGraph, head: frozenset[int]) -> bool:
    for k in head:
        for t in mg.node_inputs[k]:
            p = mg.producer.get(t)
            if p is not None and p not in head:
                return False
    return True


def _crossing_bruteforce(mg: graph.ModelGraph, head: frozenset[int]) -> set[str]:
    crossing = set()
    available = {t.name for t in mg.inputs} | {o for k in head for o in mg.nodes[k].output}
    for t in available:
        if any(c not in head for c in mg.consumers.get(t, [])):  # the tail needs it
            crossing.add(t)
    return crossing


@pytest.mark.parametrize("name", ["tiny_chain", "multi_io", "branchy", "squeezenet", "inception_v1", "resnet50"])
def test_every_cut_is_valid_and_its_crossing_set_exact(name: str) -> None:
    mg = graph.load(zoo.get(name))
    cuts = mg.cuts()
    assert cuts[0].id == "cloud" and cuts[-1].id == "device"
    assert len({c.id for c in cuts}) == len(cuts) == len({c.head_mask for c in cuts})
    sizes = [c.head_nodes for c in cuts]
    assert sizes == sorted(sizes)  # topological order
    for c in cuts:
        head = c.head
        assert _closed_under_predecessors(mg, head), c.id
        assert set(c.tensor_names) == _crossing_bruteforce(mg, head), c.id
        available = {t.name for t in mg.inputs} | {o for k in head for o in mg.nodes[k].output}
        assert set(c.kept) == {o.name for o in mg.outputs} & available, c.id
        assert c.bytes == sum(t.bytes for t in c.tensors) and (c.bytes > 0) == (c.id != "device")
        assert 0.0 <= c.head_flops_fraction <= 1.0
    assert cuts[-1].head_flops_fraction == pytest.approx(1.0)


def test_single_tensor_cuts_found_across_branches() -> None:
    """Inception: between modules only the concat output crosses; all such cuts are listed."""
    mg = graph.load(zoo.get("inception_v1"))
    concat_outs = [n.output[0] for n in mg.nodes if n.op_type == "Concat"]
    single = {c.tensors[0].name for c in mg.cuts() if len(c.tensors) == 1}
    assert set(concat_outs) <= single


def test_residual_block_interior_cut_crosses_skip_tensor() -> None:
    mg = graph.load(zoo.get("resnet50"))
    multi = [c for c in mg.cuts() if len(c.tensors) == 2]
    assert multi, "resnet50 must have frontier cuts inside residual blocks"


def test_graph_input_needed_late_crosses(tmp_path: Path) -> None:
    mg = graph.load(zoo.get("multi_io"))
    late_cut = [c for c in mg.cuts() if "b" in c.tensor_names and c.head_nodes > 0]
    assert late_cut, "graph input b is needed only late: it crosses with the head's tensors"
    # An output the head made stays on the device: never sent, never replied (the device assembles).
    kept = [c for c in mg.cuts() if "early" in c.kept]
    assert kept and all("early" not in c.tensor_names for c in kept if c.id != "c2")
    assert "early" in mg.cut("c2").tensor_names  # ... unless the tail reads it: then it is sent, not replied
    assert all(c.reply_bytes == sum(o.bytes for o in mg.outputs if o.name not in c.kept) for c in mg.cuts())
    assert mg.cut("device").tensors == () and mg.cut("device").reply_bytes == 0
    assert set(mg.cut("device").kept) == {o.name for o in mg.outputs}


def test_if_node_is_never_split_and_its_captures_cross() -> None:
    mg = graph.load(zoo.get("branchy"))
    if_idx = next(i for i, n in enumerate(mg.nodes) if n.op_type == "If")
    assert "s2" in mg.node_inputs[if_idx]  # captured by both branches
    for c in mg.cuts():
        if if_idx not in c.head and mg.producer["s2"] in c.head:
            assert "s2" in c.tensor_names


def test_unknown_cut_id_lists_the_valid_ones() -> None:
    mg = graph.load(zoo.get("tiny_chain"))
    with pytest.raises(CutError, match=r"no cut 'c99'; expected one of \d+ cut ids"):
        mg.cut("c99")


def test_cut_ids_are_deterministic_across_loads() -> None:
    a = graph.load(zoo.get("inception_v1")).cuts()
    b = graph.load(zoo.get("inception_v1")).cuts()
    assert [(c.id, c.tensor_names) for c in a] == [(c.id, c.tensor_names) for c in b]
