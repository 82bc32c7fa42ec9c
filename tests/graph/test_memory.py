"""graph.memory: a head's weights + peak activations, and whether a cut sends the raw input."""

from __future__ import annotations

from splitrt.graph import memory, zoo
from splitrt.graph import model as graph


def test_tiny_chain_by_hand() -> None:
    mg = graph.load(zoo.get("tiny_chain"))  # x 1x3x32x32 -> conv 8 -> relu -> conv 16 s2 -> relu -> gap -> fc
    cuts = mg.cuts()
    mem = memory.head_memory_bytes(mg)
    by = dict(zip([c.id for c in cuts], mem, strict=True))
    x, a1, a2 = 3 * 32 * 32 * 4, 8 * 32 * 32 * 4, 16 * 16 * 16 * 4
    w1, w2, fc = 8 * 3 * 9 * 4, 16 * 8 * 9 * 4, 10 * 16 * 4
    assert by["cloud"] == 0
    # the first conv: its input and output live together (the input is not needed after)
    assert by["c1"] == w1 + x + a1
    # the whole model: every weight; the peak is the first conv (input + a1) or relu (a1 + r1)
    assert by["device"] == w1 + w2 + fc + max(x + a1, 2 * a1, a1 + a2)
    assert mem == sorted(mem) or max(mem) == by["device"]
    assert memory.sends_input(mg) == [c.id == "cloud" for c in cuts]


def test_multi_io_sends_its_late_input_past_the_first_cuts() -> None:
    mg = graph.load(zoo.get("multi_io"))  # input b is only needed late: early cuts send it
    flags = dict(zip([c.id for c in mg.cuts()], memory.sends_input(mg), strict=True))
    assert flags["cloud"] and flags["c1"] and not flags["device"]
