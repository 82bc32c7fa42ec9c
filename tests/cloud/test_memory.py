"""The server's memory budget: the ledger refuses what does not fit after evicting unused cache
entries; the tail cache is bounded in bytes, not entries; a build waits for a worker slot like a request.
Real gRPC server on 127.0.0.1, real onnxruntime sessions (squeezenet, random weights)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from splitrt.cloud.capacity.admission import serving
from splitrt.cloud.capacity.memory import (
    CHECKER_RESIDENT_BYTES,
    MB,
    STARTUP_BYTES,
    TRACKER_RESIDENT_BYTES,
    MemoryBudget,
    limit_for,
    rss_bytes,
    watch_limit,
)
from splitrt.cloud.common import RpcFailure
from splitrt.cloud.models.store import ModelStore
from splitrt.cloud.models.tails import HOT_S, Tail, TailCache
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")


def test_budget_evicts_then_refuses_naming_need_and_free() -> None:
    b = MemoryBudget(1000 * MB, 200 * MB)  # 800 MB available
    held = {"a": 300 * MB, "b": 300 * MB}

    def evict(n: int, build_for: str | None) -> int:  # a cache of two entries, least recent first
        freed = 0
        for k in list(held):
            if freed >= n:
                break
            freed += held.pop(k)
        b.release(freed)
        return freed

    b.add_evictor(evict)
    b.reserve(600 * MB, "caches")  # what the two entries hold
    assert b.reserve(400 * MB, "request") == 400 * MB  # needs 200 MB more: evicts "a" only
    assert held == {"b": 300 * MB} and b.used_bytes == 700 * MB
    with pytest.raises(RpcFailure) as info:
        b.reserve(900 * MB, "a big request")  # more than the whole budget: nothing can make room
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "a big request: needs ~900 MB" in info.value.message and "--max-memory-mb 1000" in info.value.message
    assert b.refused == 1 and held == {}  # it tried: everything evictable went first
    with pytest.raises(ConfigError, match="expected more than the 200 MB the process holds at start and 0 MB"):
        MemoryBudget(100 * MB, 200 * MB)
    # The headroom (the estimates' margin, below the RSS watch's line) is never reserved.
    h = MemoryBudget(1000 * MB, 200 * MB, headroom_bytes=64 * MB)
    assert h.available_bytes == 736 * MB and h.try_reserve(736 * MB) and not h.try_reserve(1)
    with pytest.raises(ConfigError, match="200 MB the process holds at start and 64 MB of headroom, got 250 MB"):
        MemoryBudget(250 * MB, 200 * MB, headroom_bytes=64 * MB)


@pytest.mark.parametrize("baseline_mb", [0, 30, 150, 560, 900, 961, 1500, 6000])
@pytest.mark.parametrize("available_mb", [1, 40, 80, 500])
def test_limit_for_leaves_what_was_asked_above_the_headroom(baseline_mb: int, available_mb: int) -> None:
    # The headroom grows with the budget: a budget sized "baseline + X" leaves less than X once the
    # process is large (a whole test run: 560 MB left 27 of 100 MB), limit_for never does.
    limit = limit_for(available_mb * MB, baseline_mb * MB)
    free = MemoryBudget(limit, baseline_mb * MB, headroom_bytes=limit - (watch_limit(limit) or limit)).available_bytes
    assert available_mb * MB <= free <= available_mb * MB + 2  # the smallest such budget, to rounding


@pytest.mark.parametrize("build_in_child", [False, True])
def test_a_server_that_accepts_uploads_counts_its_checker_child(tmp_path: Path, build_in_child: bool) -> None:
    # The checker's child (started with a server that accepts uploads) is the same pod's memory: such a
    # server plans with that much less; the resource tracker is counted once, with the builder's child
    # if there is one. Baselines are measured RSS: pairs made back to back, the spread is what this
    # process grew by between the two (the first server made beforehand: its imports are not a pair's).
    def available(allow_upload: bool) -> float:
        cfg = ServerConfig(
            models_dir=tmp_path,
            workers=1,
            tokens=("t0k-t0k-t0k",),
            allow_upload=allow_upload,
            build_in_child=build_in_child,
            max_memory_bytes=1792 * MB,
        )
        return CloudServer(cfg).budget.available_bytes

    available(True)
    expected = CHECKER_RESIDENT_BYTES + (0 if build_in_child else TRACKER_RESIDENT_BYTES)
    for _ in range(3):
        less = available(False) - available(True)
        assert expected - 8 * MB <= less <= expected + 8 * MB, (less / MB, expected / MB)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("squeezenet"), d / "squeezenet.onnx")
    return d


@pytest.fixture()
def device(models_dir: Path) -> Iterator[Device]:
    with Device(models_dir / "squeezenet.onnx", "127.0.0.1:1") as d:
        yield d


def _request(device: Device, cut: str) -> wire.Framed:
    head = device.run_head(device.random_inputs(), cut)
    return device._request(head, codec.Codec.parse("fp32"))[0]


def _send(server: CloudServer, device: Device, cut: str | wire.Framed) -> pb.InferReply:
    from splitrt.transport.grpc_transport import GrpcTransport

    t = GrpcTransport(server.address)
    try:
        reply = t.infer(_request(device, cut) if isinstance(cut, str) else cut, timeout_s=60).header
    finally:
        t.close()
    assert isinstance(reply, pb.InferReply)
    return reply


def test_tail_cache_is_bounded_in_bytes(models_dir: Path, device: Device) -> None:
    cuts = [c.id for c in device.graph.cuts()[1:-1]][::6][:8]
    requests = [_request(device, cut) for cut in cuts]  # the device's sessions before the baseline
    # 80 MB free above what this process holds now (the watch's headroom and start-up set aside, however
    # large this process has grown): a few squeezenet tails (17-29 MB each, estimated), not the 16 the entry
    # cap allows.
    config = ServerConfig(
        models_dir=models_dir,
        workers=1,
        max_memory_bytes=limit_for(80 * MB, rss_bytes() + STARTUP_BYTES),
        segment_cache_size=16,
        intra_op_threads=1,
    )
    with CloudServer(config) as server:
        available = server.budget.available_bytes
        for req in requests:
            reply = _send(server, device, req)
            assert not reply.HasField("error") and reply.request_id
            assert server.tails.held_bytes() <= available
        assert server.budget.peak_bytes <= available
        assert server.tails.evicted > 0 and len(server.tails.snapshot()) < len(cuts)
        assert server.budget.refused == 0  # evicting made room every time


def test_a_tail_build_waits_for_a_worker_slot(models_dir: Path, device: Device) -> None:
    config = ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1)
    cuts = [c.id for c in device.graph.cuts()[1:-1]]
    first, second = cuts[3], cuts[20]
    with CloudServer(config) as server:
        _send(server, device, first)  # built and cached
        in_tail, release = threading.Event(), threading.Event()

        def hold(header: pb.InferRequest) -> None:  # the request of `first` holds the only worker
            if header.cut_id == first:
                in_tail.set()
                release.wait(60)

        server.handler.before_tail = hold
        waiting = threading.Event()
        in_slot = server.tails._in_slot
        assert in_slot is not None

        def slot(fn: Callable[[bool], Tail], timeout_s: float, *, what: str) -> Tail:  # the build asks for a slot
            waiting.set()
            return in_slot(fn, timeout_s, what=what)

        server.tails._in_slot = slot
        results: list[object] = []
        t1 = threading.Thread(target=lambda: results.append(_send(server, device, first)))
        t1.start()
        assert in_tail.wait(60)
        t2 = threading.Thread(target=lambda: results.append(_send(server, device, second)))
        t2.start()
        assert waiting.wait(60)  # the build of `second` waits for the held worker: nothing built yet
        assert server.admission.running == 1 and second not in {c for _, c, _ in server.tails.snapshot()}
        release.set()
        t1.join(60)
        t2.join(60)
        assert len(results) == 2 and second in {c for _, c, _ in server.tails.snapshot()}
        assert np.isfinite(server.stats.service_ms())


def test_graph_cache_evicts_the_least_recent_graph(tmp_path: Path) -> None:
    from splitrt.cloud.capacity.memory import LOAD_PEAK_FACTOR
    from splitrt.cloud.models.store import ModelStore

    for name in ("tiny_chain", "multi_io", "branchy"):
        shutil.copyfile(zoo.get(name), tmp_path / f"{name}.onnx")
    free = ModelStore(tmp_path)  # what each costs, learnt without a budget
    costs = []
    for m in free.models():
        free.graph(m.sha256)
        costs.append((m.bytes * LOAD_PEAK_FACTOR, m.graph_bytes))
    # Room for any load's transient peak beside one graph kept, not two.
    budget = MemoryBudget(int(max(p for p, _ in costs) + max(g for _, g in costs)) + 1)
    store = ModelStore(tmp_path, budget=budget)
    shas = [m.sha256 for m in store.models()]
    for sha in shas:
        g = store.graph(sha)
        assert g.sha256 == sha and budget.used_bytes <= budget.available_bytes
    loaded = [m.sha256 for m in store.models() if m.graph is not None]
    assert shas[-1] in loaded and shas[0] not in loaded  # the least recent went first
    assert budget.used_bytes == sum(m.graph_bytes for m in store.models())
    assert store.graph(shas[0]).sha256 == shas[0]  # loaded again on demand


def test_concurrent_uploads_cannot_overshoot_the_store_quota(tmp_path: Path) -> None:
    import hashlib

    import onnx

    from splitrt.cloud.models.store import ModelStore
    from splitrt.cloud.models.upload import Quota, receive_model

    store = ModelStore(tmp_path)
    models = []
    for name in ("tiny_chain", "multi_io"):
        data = Path(zoo.get(name)).read_bytes()
        onnx.load_from_string(data)  # a real model each
        models.append((hashlib.sha256(data).hexdigest(), data))
    quota = Quota(max_store_bytes=sum(len(d) for _, d in models) - 1)  # room for either of them, not both
    first_in, go_on = threading.Event(), threading.Event()

    def slow_chunks(sha: str, data: bytes) -> Iterator[pb.ModelChunk]:
        half = len(data) // 2
        yield pb.ModelChunk(sha256=sha, name="a.onnx", total_bytes=len(data), data=data[:half])
        first_in.set()
        go_on.wait(60)
        yield pb.ModelChunk(sha256=sha, data=data[half:])

    results: list[object] = []

    def first() -> None:
        try:
            results.append(
                receive_model(store, slow_chunks(*models[0]), allow_upload=True, max_model_bytes=1 << 30, quota=quota)
            )
        except RpcFailure as exc:
            results.append(exc)

    a = threading.Thread(target=first)
    a.start()
    assert first_in.wait(60)  # the first upload is half written: its bytes count, its declared size does not
    sha, data = models[1]
    receive_model(  # fits beside the half that arrived: stored (a trickle cannot squat the quota)
        store,
        iter([pb.ModelChunk(sha256=sha, name="b.onnx", total_bytes=len(data), data=data)]),
        allow_upload=True,
        max_model_bytes=1 << 30,
        quota=quota,
    )
    go_on.set()
    a.join(60)
    # The first one's second half no longer fits: refused then, and the store never passed its quota.
    assert len(results) == 1 and isinstance(results[0], RpcFailure), results
    assert results[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED and "(--max-store-mb)" in results[0].message
    assert [m.sha256 for m in store.models()] == [sha]
    assert sum(m.bytes for m in store.models()) <= quota.max_store_bytes


def test_a_tail_session_computes_no_large_constant_while_it_is_built(tmp_path: Path) -> None:
    """onnxruntime folds every all-constant node while it builds a session and keeps the result as a
    weight (1.23, the newest for Python 3.10: unbounded; >= 1.27: up to 1 GiB by default). A model asking
    ConstantOfShape for 160 MiB must cost its tail session no such weight, and still compute right."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from splitrt.cloud.models.store import ModelStore
    from splitrt.cloud.models.tails import TailCache

    rows = 160 * 2**20 // (4 * 1024)
    shape = numpy_helper.from_array(np.array([rows, 1024], np.int64), "shape")
    g = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"]),
            helper.make_node("Add", ["x", "big"], ["wide"]),
            helper.make_node("ReduceMax", ["wide"], ["y"], axes=[0], keepdims=0),
        ],
        "cos",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
        [shape],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "cos.onnx")
    store = ModelStore(tmp_path)
    (sha,) = [m.sha256 for m in store.models()]
    cache = TailCache(store, capacity=2, intra_op_threads=1)
    store.graph(sha)  # loaded (and normalised: 160 MiB is beyond what it folds) before measuring
    before = rss_bytes()
    tail = cache.get(sha, "cloud")
    grown = rss_bytes() - before
    assert grown < 64 * MB, f"building the tail grew RSS by {grown / MB:.0f} MB: the constant was computed"
    x = np.random.default_rng(3).standard_normal(1024).astype(np.float32)
    (y,) = tail.session.run(tail.outputs, {"x": x})
    np.testing.assert_array_equal(y, x)  # max over identical rows x + 0


def test_a_build_keeps_the_graph_it_splits_in_the_ledger(models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under memory pressure, a tail build's own reservation evicted the graph it was splitting (the store's
    evictor runs first): the ledger freed bytes the build still held (room for the RSS to pass the budget)
    and the next build parsed the model again. A graph being split is pinned; the unused tail goes instead."""
    from splitrt.cloud.capacity.memory import build_peak_bytes
    from splitrt.cloud.models.store import ModelStore
    from splitrt.cloud.models.tails import TailCache
    from splitrt.graph.memory import tensor_bytes

    budget = MemoryBudget(4096 * MB)
    store = ModelStore(models_dir, budget=budget)
    cache = TailCache(store, capacity=8, intra_op_threads=1, budget=budget)
    (sha,) = [m.sha256 for m in store.models()]
    graph = store.graph(sha)
    build = build_peak_bytes(sum(tensor_bytes(t) for t in graph.model.graph.initializer))
    # Room for the graph and one build's peak: the second build must evict something.
    budget.limit_bytes = budget.used_bytes + build + MB
    cuts = [c.id for c in graph.cuts()[1:-1]]
    del graph
    with caplog.at_level("INFO", logger="splitrt.cloud"):
        for cut in (cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]):
            cache.get(sha, cut)
            assert budget.used_bytes <= budget.available_bytes
    assert not [r for r in caplog.records if "graph_evicted" in r.getMessage()]
    assert sha in store._loaded and store._pins == {}  # still loaded, no pin left behind
    assert cache.evicted == 1 and len(cache.snapshot()) == 1  # the first tail made room for the second


def test_a_new_tail_does_not_evict_one_another_client_uses_now(models_dir: Path, device: Device) -> None:
    # An attacker naming cut after cut must push out its own tails and cold ones, never the one a device
    # is streaming through (rebuilt for seconds, under the next build's reservation, again and again).
    now = [1000.0]
    budget = MemoryBudget(None)
    store = ModelStore(models_dir, budget=budget)
    tails = TailCache(store, 16, 1, budget=budget, clock=lambda: now[0])
    sha = store.models()[0].sha256
    cuts = [c.id for c in device.graph.cuts()[1:-1]][5:20:5]
    for client, cut in zip(("a", "b", "a"), cuts, strict=True):
        serving(client)
        tails.get(sha, cut)
    serving("")
    a1, b1, a2 = cuts
    assert tails.evict(1 << 40, "a") > 0  # a's own two go; b's, got just now, stays
    assert [k[1] for k in tails.snapshot()] == [b1] and a1 != a2
    assert tails.evict(1 << 40, "c") == 0 and len(tails.snapshot()) == 1  # nor for a third client
    now[0] += HOT_S + 0.1
    assert tails.evict(1 << 40, "c") > 0 and not tails.snapshot()  # b went quiet: now it may go
    serving("b")
    tails.get(sha, b1)
    serving("")
    assert tails.evict(1 << 40, None) > 0 and not tails.snapshot()  # a request's own memory: any unused tail


def test_a_build_refused_for_want_of_memory_says_what_it_spared() -> None:
    b = MemoryBudget(1000 * MB, 200 * MB)
    asked: list[str | None] = []

    def evict(n: int, build_for: str | None) -> int:
        asked.append(build_for)
        return 0  # everything held is in use by others

    b.add_evictor(evict)
    b.reserve(700 * MB, "sessions")
    with pytest.raises(RpcFailure) as info:
        b.reserve(200 * MB, "tail session of model x at cut 'c3'", build_for="127.0.0.2")
    assert asked == ["127.0.0.2"] and "tails other clients use now are not evicted" in info.value.message
    with pytest.raises(RpcFailure) as info:
        b.reserve(200 * MB, "request at cut 'c3'")
    assert asked[-1] is None and "other clients" not in info.value.message
