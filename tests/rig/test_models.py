"""rig.models: the rig plans with the accuracy guard (measured on the zoo's photographs, cached) and prices
the device's encodes at a factor of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.costmodel import MAX_CODEC_RATIO
from splitrt.profile import profiler
from splitrt.rig import models


def _ratio(table: object, cut: str, codec: str) -> float:
    t = table  # a CostTable
    return float(t.codec_ratio_matrix[t.index(cut), t.codec_index(codec)])  # type: ignore[attr-defined]


@pytest.mark.slow  # squeezenet's tails on two photos
def test_the_rig_plans_lossy_codecs_only_where_the_photos_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITRT_CACHE", str(tmp_path / "cache"))
    shipped = models.shipped_profile("squeezenet")
    assert shipped is not None
    sha = profiler.load_profile(shipped).sha256
    said: list[str] = []
    # without samples the profile allows no lossy codec: the rig plans as a deployment would
    bare = models.cost_table_for(shipped, sha, 10.0)
    assert _ratio(bare, "cloud", "jpeg50") == MAX_CODEC_RATIO
    guarded = models.guarded_profile(shipped, zoo.get("squeezenet"), said.append, max_samples=2, inner_cuts=1)
    assert guarded != shipped and guarded.parent == tmp_path / "cache" / "guard"
    prof = profiler.load_profile(guarded, sha256=sha)
    assert prof.accuracy is not None and prof.accuracy["samples"] == 2 and prof.accuracy["source"] == "zoo"
    assert prof.codec_ratios == profiler.load_profile(shipped).codec_ratios  # the guard only: ratios as they were
    ids = prof.cut_ids
    shares = (prof.codec_agreement or {})["jpeg50"]
    measured = [c for c, s in zip(ids, shares, strict=True) if s is not None and c != "device"]
    assert measured[0] == "cloud" and len(measured) == 2
    table = models.cost_table_for(guarded, sha, 10.0)
    for cut, share in zip(ids, shares, strict=True):
        if cut == "device":
            continue
        allowed = share is not None and share >= 0.99
        assert (_ratio(table, cut, "jpeg50") < MAX_CODEC_RATIO) == allowed, (cut, share)
    # cached: the second call measures nothing
    said.clear()
    stamp = guarded.stat().st_mtime_ns
    again = models.guarded_profile(shipped, zoo.get("squeezenet"), said.append, max_samples=2, inner_cuts=1)
    assert again == guarded and guarded.stat().st_mtime_ns == stamp and not said
    # a profile that has its guard already is taken as it is
    assert models.guarded_profile(guarded, zoo.get("squeezenet"), said.append) == guarded


def test_a_model_that_takes_no_photo_keeps_its_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITRT_CACHE", str(tmp_path / "cache"))
    path = zoo.get("tiny_chain")
    out = tmp_path / "tiny.json"
    profiler.save_profile(profiler.measure(path, runs=1, warmup=0), out)
    said: list[str] = []
    assert models.guarded_profile(out, path, said.append) == out
    assert said and "lossless codecs only" in said[0]


def test_the_device_encodes_at_a_factor_of_its_own() -> None:
    shipped = models.shipped_profile("squeezenet")
    assert shipped is not None
    sha = graph.load(zoo.get("squeezenet")).sha256
    same = models.cost_table_for(shipped, sha, 10.0, 2.0)
    own = models.cost_table_for(shipped, sha, 10.0, 2.0, codec_factor=1.5)
    assert np.array_equal(same.head_ms, own.head_ms) and np.array_equal(same.decode_ms, own.decode_ms)
    assert np.any(own.encode_ms > 0)
    assert np.allclose(own.encode_ms * 10.0, same.encode_ms * 1.5)
    assert own.call_ms * 10.0 == pytest.approx(same.call_ms * 1.5)
    head, tail = models.cost_tables(shipped, sha, [10.0, 2.0], codec_factor=1.5)
    assert np.allclose(head.encode_ms, own.encode_ms) and np.allclose(tail.encode_ms * 1.5, own.encode_ms * 2.0)
