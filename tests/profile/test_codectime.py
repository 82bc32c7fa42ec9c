"""What sending costs beyond the wire: encode and decode times per (cut, codec) measured on the cut
tensors, one call's fixed cost, kept in profiles and priced by plans as their own terms."""

from __future__ import annotations

import dataclasses

import pytest

from splitrt.errors import ProfileError
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.costmodel import Conditions, Link
from splitrt.profile import codectime, profiler


@pytest.fixture(scope="module")
def timed() -> tuple[graph.ModelGraph, codectime.CodecTimes]:
    g = graph.load(zoo.get("tiny_chain"))
    return g, codectime.measure(g, zoo.random_inputs(g.path), codecs=["fp32", "int8+zstd", "fp16"], repeats=2)


def test_every_codec_is_timed_at_every_cut(timed: tuple[graph.ModelGraph, codectime.CodecTimes]) -> None:
    g, t = timed
    ids = [c.id for c in g.cuts()]
    assert set(t.encode_ms) == set(t.decode_ms) == {"fp32", "int8+zstd", "fp16"}
    for times in (*t.encode_ms.values(), *t.decode_ms.values()):
        assert len(times) == len(ids) and all(x >= 0 for x in times)
    # the device sends nothing at its own cut; a cut that sends floats costs something to compress
    assert t.encode_ms["int8+zstd"][ids.index("device")] == 0.0
    assert t.encode_ms["int8+zstd"][ids.index("cloud")] > 0.0
    assert 0.0 < t.call_ms < 50.0


def test_profiles_keep_them_and_plans_price_them_scaled_by_each_side(tmp_path: object) -> None:
    old = profiler.load_profile("x86_64-2core__squeezenet.json")
    assert old.codec_encode_ms is not None and old.call_ms is not None  # the shipped profile has them
    path = f"{tmp_path}/p.json"
    profiler.save_profile(old, path)
    again = profiler.load_profile(path)
    assert again.codec_encode_ms == old.codec_encode_ms and again.call_ms == old.call_ms
    table = profiler.cost_table(old, old, device_speed_factor=10.0, cloud_speed_factor=2.0)
    i, k = table.index("cloud"), table.codec_index("int8+zstd")
    assert table.encode_ms[i, k] == pytest.approx(10.0 * old.codec_encode_ms["int8+zstd"][i])
    assert table.decode_ms[i, k] == pytest.approx(2.0 * old.codec_decode_ms["int8+zstd"][i])  # type: ignore[index]
    assert table.call_ms == pytest.approx(10.0 * old.call_ms)
    e = table.estimate("cloud", "int8+zstd", Conditions(link=Link(bandwidth_mbps=10.0, rtt_ms=20.0), device_load=2.0))
    assert e.encode_ms == pytest.approx(2.0 * table.encode_ms[i, k]) and e.call_ms == pytest.approx(2 * table.call_ms)
    # a profile without them prices 0
    bare = profiler.cost_table(
        *(dataclasses.replace(old, codec_encode_ms=None, codec_decode_ms=None, call_ms=None),) * 2
    )
    assert not bare.encode_ms.any() and not bare.decode_ms.any() and bare.call_ms == 0.0


def test_a_malformed_list_is_refused(tmp_path: object) -> None:
    import json

    old = profiler.load_profile("x86_64-2core__squeezenet.json")
    d = old.to_dict()
    d["codec_encode_ms"] = {"fp32": [1.0]}
    path = f"{tmp_path}/bad.json"
    with open(path, "w") as f:
        json.dump(d, f)
    with pytest.raises(ProfileError, match="codec_encode_ms"):
        profiler.load_profile(path)
