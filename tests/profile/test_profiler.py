"""Profiler: real onnxruntime sessions on small zoo models; profile files; planner inputs from profiles."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from splitrt.errors import ProfileError
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import mincut, solver
from splitrt.plan.costmodel import Conditions, Link
from splitrt.profile import profiler


@pytest.fixture(scope="module")
def squeeze() -> tuple[graph.ModelGraph, profiler.Profile]:
    path = zoo.get("squeezenet")
    return graph.load(path), profiler.measure(path, runs=3, warmup=1, segments=6, progress=lambda m: None)


def test_profile_covers_every_cut(squeeze: tuple[graph.ModelGraph, profiler.Profile]) -> None:
    g, prof = squeeze
    assert prof.cut_ids == tuple(c.id for c in g.cuts())
    assert prof.sha256 == g.sha256 and prof.schema == profiler.SCHEMA
    assert prof.host["cores_logical"] >= 1 and prof.host["memory_mb"] > 0 and prof.host["cpu_model"]
    assert prof.runtime["provider"] == "CPUExecutionProvider" and prof.runtime["onnxruntime"]
    assert 1 < prof.runtime["segments"] <= 6
    assert len(prof.nodes) == len(g.nodes) and sum(n.kernel_ms for n in prof.nodes) > 0
    first, last = prof.cut("cloud"), prof.cut("device")
    assert first.head_ms == 0 and first.tail_ms == pytest.approx(prof.total_ms)
    assert last.tail_ms == 0 and last.head_ms == pytest.approx(prof.total_ms) and last.bytes == 0
    # the compute in a head never shrinks as it grows (its head_ms may: a later cut can cross fewer bytes)
    ms = np.array([n.ms for n in prof.nodes])
    heads = [sum(ms[i] for i in range(len(ms)) if int(c.head_mask or "0", 16) >> i & 1) for c in prof.cuts]
    assert np.all(np.diff(heads) >= -1e-9), "prefix heads must take no less compute as they grow"
    # anchors: measured directly and reproduced; prefix cuts between two anchors interpolate between them
    anchors = prof.runtime["anchors"]
    assert anchors and set(prof.runtime["anchor_ms"]) == set(anchors)
    for a, (head, tail) in prof.runtime["anchor_ms"].items():
        assert prof.cut(a).head_ms == pytest.approx(head, abs=1e-4)
        assert prof.cut(a).tail_ms == pytest.approx(tail, abs=1e-4)
    ids = list(prof.cut_ids)
    stops = ["cloud", *anchors, "device"]
    for lo, hi in itertools.pairwise(stops):
        a, b = prof.cut(lo), prof.cut(hi)
        for cid in ids[ids.index(lo) + 1 : ids.index(hi)]:
            c = prof.cut(cid)
            m = int(c.head_mask, 16)
            if m & (m + 1) == 0:  # a prefix cut: inside the span
                assert min(a.head_ms, b.head_ms) - 1e-6 <= c.head_ms <= max(a.head_ms, b.head_ms) + 1e-6
    for c in prof.cuts[1:-1]:
        assert c.split_ms >= 0
        assert c.head_ms > 0 and c.tail_ms > 0
        assert c.bytes == g.cut(c.cut).bytes and 0 <= c.float_bytes <= c.bytes
        assert c.head_p90_ms >= c.head_ms - 1e-6
    assert prof.reply_bytes == 4000  # 1000 float32 class scores
    assert prof.peak_rss_mb >= 0


def test_anchors_avoid_fused_pairs(squeeze: tuple[graph.ModelGraph, profiler.Profile]) -> None:
    g, prof = squeeze
    fused = profiler.fused_tensors(g, threads=1, providers=["CPUExecutionProvider"])
    # onnxruntime fuses every Conv of squeezenet with the Relu after it: the Conv outputs never exist
    convs = {n.output[0] for n in g.nodes if n.op_type == "Conv"}
    assert convs <= fused
    assert not any(g.nodes[g.producer[t]].op_type == "Dropout" for t in fused), "removed, not fused"
    for s in prof.segments[:-1]:
        assert not any(t.name in fused for t in g.cut(s.end).tensors)
    # a cut between a Conv and its Relu pays the Relu unfused in the tail (and is still a candidate)
    c1 = prof.cut("c1")
    assert {t.name for t in g.cut("c1").tensors} <= fused and c1.split_ms > 0
    assert profiler._unfused_tail_nodes(g, g.cut("c1"), fused) == [1]
    rt = prof.runtime
    assert rt["run_overhead_ms"] > 0 and rt["method"] == "anchored" and rt["fused_tensors"] == len(fused)


def test_direct_measurement_runs(squeeze: tuple[graph.ModelGraph, profiler.Profile]) -> None:
    g, _ = squeeze
    feeds = zoo.random_inputs(zoo.get("squeezenet"))
    head, tail = profiler.measure_direct(g, "c20", feeds, runs=2, warmup=1)
    assert head > 0 and tail > 0
    assert profiler.measure_direct(g, "cloud", feeds, runs=1, warmup=0)[0] == 0.0


def test_roundtrip_and_refusals(squeeze: tuple[graph.ModelGraph, profiler.Profile], tmp_path: Path) -> None:
    g, prof = squeeze
    path = tmp_path / "p.json"
    profiler.save_profile(prof, path)
    again = profiler.load_profile(path, sha256=g.sha256)
    assert again.cuts == prof.cuts and again.nodes == prof.nodes and again.total_ms == prof.total_ms

    with pytest.raises(ProfileError, match="expected sha256 000000000000"):
        profiler.load_profile(path, sha256="0" * 64)
    data = json.loads(path.read_text())
    data["schema"] = "splitrt.profile/0"
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"expected schema 'splitrt.profile/1', got 'splitrt.profile/0'"):
        profiler.load_profile(tmp_path / "old.json")
    (tmp_path / "trunc.json").write_text(path.read_text()[:500])
    with pytest.raises(ProfileError, match="not a JSON profile"):
        profiler.load_profile(tmp_path / "trunc.json")
    data = json.loads(path.read_text())
    del data["cuts"][3]["head_ms"]
    (tmp_path / "corrupt.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="corrupt profile"):
        profiler.load_profile(tmp_path / "corrupt.json")
    data = json.loads(path.read_text())
    data["cuts"][3]["tail_ms"] = -1
    (tmp_path / "neg.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="negative or non-finite"):
        profiler.load_profile(tmp_path / "neg.json")
    with pytest.raises(ProfileError, match="no such profile"):
        profiler.load_profile(tmp_path / "missing.json")


def test_planner_inputs(squeeze: tuple[graph.ModelGraph, profiler.Profile]) -> None:
    g, prof = squeeze
    table = profiler.cost_table(prof, prof, device_speed_factor=4.0)
    assert table.ids == prof.cut_ids
    assert table.head_ms[-1] == pytest.approx(4.0 * prof.total_ms)
    cond = Conditions(link=Link(bandwidth_mbps=50.0, rtt_ms=5.0))
    plan = solver.solve(table, cond)
    assert plan.cut in prof.cut_ids
    # the DADS min-cut on the node DAG is never worse than the best fp32 candidate under its model
    d = profiler.dag(g, prof, prof, device_speed_factor=4.0)
    best = mincut.best_head(d, cond)
    assert best.latency_ms <= mincut.best_prefix(d, cond).latency_ms + 1e-9
    nested = profiler.nested_matrix(prof)
    assert nested.shape == (len(prof.cuts),) * 2 and np.all(np.diag(nested))
    assert nested[0].all() and nested[:, -1].all()  # cloud head inside all; all inside device


def test_mismatched_profiles_are_refused(squeeze: tuple[graph.ModelGraph, profiler.Profile]) -> None:
    _, prof = squeeze
    other = profiler.Profile(
        **{
            **prof.to_dict(),
            "model": {**prof.model, "sha256": "f" * 64},
            "cuts": prof.cuts,
            "nodes": prof.nodes,
            "segments": prof.segments,
        }
    )
    with pytest.raises(ProfileError, match="expected the same model"):
        profiler.cost_table(prof, other)


@pytest.mark.slow
def test_shipped_profiles_match_the_zoo() -> None:
    shipped = sorted(Path(__file__).resolve().parents[2].glob("profiles/*.json"))
    assert len(shipped) >= 3
    for path in shipped:
        model = path.stem.split("__", 1)[1]
        # The model's identity, not a load (bvlc_alexnet: built in 4.8 s of CPU, loaded in 1.9 s, hashed in 0.5 s).
        prof = profiler.load_profile(path, sha256=graph.model_sha256(zoo.get(model)))
        assert prof.host["class"] == path.stem.split("__", 1)[0]
        assert prof.cut("device").head_ms > 0
