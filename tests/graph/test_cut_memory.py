"""Cut enumeration takes memory linear in the model's size: a long chain (every prefix a cut) once held
O(n^2) bits of head masks (1.44 GB at 60 000 nodes, for good); masks are now made on demand."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from splitrt.graph import model as graph_mod


def chain(n: int, path: Path) -> Path:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def cut_peak_bytes(path: Path) -> tuple[int, list[graph_mod.Cut]]:
    g = graph_mod.load(path)
    tracemalloc.start()
    try:
        cuts = g.cuts()
        return tracemalloc.get_traced_memory()[1], cuts
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_cut_memory_grows_linearly_with_a_chain(tmp_path: Path) -> None:
    small, cuts_small = cut_peak_bytes(chain(2500, tmp_path / "a.onnx"))
    large, cuts_large = cut_peak_bytes(chain(5000, tmp_path / "b.onnx"))
    assert len(cuts_small) == 2501 and len(cuts_large) == 5001  # every prefix is a cut
    # Twice the nodes: about twice the memory (quadratic masks made it four times).
    assert large < 2.8 * small, (small, large)
    # The masks are still there, made when asked for.
    assert cuts_large[1234].head_mask == (1 << 1234) - 1 and cuts_large[-1].id == "device"


def star(n: int, path: Path) -> Path:
    """n Identity nodes of one input, each a graph output (``attacks``' ``many_outputs``)."""
    v = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4]) for i in range(n)]
    nodes = [helper.make_node("Identity", ["x"], [f"y{i}"]) for i in range(n)]
    g = helper.make_graph(nodes, "star", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])], v)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.slow
def test_cut_memory_grows_linearly_with_the_outputs(tmp_path: Path) -> None:
    """Each cut once held the outputs its head made and the live ones it crossed: O(cuts x outputs), 16 M
    entries at 4000 outputs (and as many steps: seconds). The kept outputs are now made when asked for."""
    small, cuts_small = cut_peak_bytes(star(1000, tmp_path / "a.onnx"))
    large, cuts_large = cut_peak_bytes(star(2000, tmp_path / "b.onnx"))
    assert len(cuts_small) == 1001 and len(cuts_large) == 2001
    assert large < 2.8 * small, (small, large)  # quadratic: about 4x
    c = cuts_large[1000]  # the first 1000 Identities ran on the device: their outputs stay there
    assert c.kept == tuple(f"y{i}" for i in range(1000)) and c.tensor_names == ("x",)
    assert c.reply_bytes == 1000 * 16 and cuts_large[-1].kept == tuple(f"y{i}" for i in range(2000))
