"""Admission with a retry hint, and load in every reply: a real server on 127.0.0.1 with one worker and
a tiny queue. A full queue answers RESOURCE_EXHAUSTED at once with ``retry-after-ms`` (trailing
metadata, the message, a stream frame's ``Error``); an adaptive device flooded by threads loses no
request, and every result equals the full model run locally."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import CloudError, ConfigError
from splitrt.graph import model as graph_model
from splitrt.graph import zoo
from splitrt.profile.priors import flops_table
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport.inprocess import InProcessTransport


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


class _Gate:
    """A before_tail hook holding every request in the worker until ``open_when()`` (or release)."""

    def __init__(self, open_when: Callable[[], bool] = lambda: False) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.open_when = open_when

    def __call__(self, header: pb.InferRequest) -> None:
        self.entered.release()
        while not (self.release.is_set() or self.open_when()):
            self.release.wait(0.002)


@pytest.fixture()
def busy(models_dir: Path) -> Iterator[tuple[CloudServer, Device, _Gate]]:
    """One worker held by a gated request, one request queued: the queue is full."""
    gate = _Gate()
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=1)) as s,
        Device(zoo.get("tiny_chain"), s.address) as dev,
        ThreadPoolExecutor(2) as pool,
    ):
        x = dev.random_inputs()
        for _ in range(3):  # a few served requests: a service time to hint with
            dev.run(x, cut="c2")
        s.handler.before_tail = gate
        held = [pool.submit(dev.run, x, cut="c2", timeout_s=30)]
        assert gate.entered.acquire(timeout=30)
        held.append(pool.submit(dev.run, x, cut="c2", timeout_s=30))
        while s.admission.admitted < 2:  # the second one is admitted and waits for the worker
            gate.release.wait(0.002)
        yield s, dev, gate
        gate.release.set()
        for f in held:
            f.result(timeout=30)


def test_a_full_queue_is_refused_at_once_with_a_retry_hint(busy: tuple[CloudServer, Device, _Gate]) -> None:
    s, dev, _ = busy
    head = dev.run_head(dev.random_inputs(), "c2")
    request = dev._request(head, codec.Codec.parse("fp32"))[0].to_message()
    stub = pb_grpc.SplitInferenceStub(grpc.insecure_channel(s.address))
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(request, timeout=10)
    err = info.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    hint = wire.retry_after_ms(err.trailing_metadata())
    assert hint is not None and hint > 0
    assert "queue depth 2, expected at most 2" in err.details() and f"retry after {hint:g} ms" in err.details()
    # The device's CloudError carries the hint.
    with pytest.raises(CloudError) as cinfo:
        dev.send(head, timeout_s=10)
    assert cinfo.value.code == "RESOURCE_EXHAUSTED" and cinfo.value.retryable
    assert cinfo.value.retry_after_ms is not None and cinfo.value.retry_after_ms > 0
    # A stream frame carries it in its Error; the load says why.
    replies = list(stub.InferStream(iter([request]), timeout=10))
    assert replies[0].error.code == "RESOURCE_EXHAUSTED" and replies[0].error.retry_after_ms > 0
    assert replies[0].load.queue_depth == 2 and replies[0].load.workers == 1 and replies[0].load.max_queue == 1
    assert s.stats.refused == 3 and s.status().errors_by_code["RESOURCE_EXHAUSTED"] == 3


def test_the_in_process_transport_carries_the_hint_too(busy: tuple[CloudServer, Device, _Gate]) -> None:
    s, _, _ = busy
    with Device(zoo.get("tiny_chain"), transport=InProcessTransport(s.servicer)) as local:
        head = local.run_head(local.random_inputs(), "c2")
        with pytest.raises(CloudError) as info:
            local.send(head, timeout_s=10)
    assert info.value.code == "RESOURCE_EXHAUSTED" and (info.value.retry_after_ms or 0) > 0


def test_replies_and_status_report_service_time(models_dir: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=3)) as s,
        Device(zoo.get("tiny_chain"), s.address) as dev,
    ):
        x = dev.random_inputs()
        results = [dev.run_detailed(x, cut=cut) for cut in ("c2", "c2", "c3")]
        load = results[-1].load
        assert load is not None and load.service_ms > 0 and load.workers == 1 and load.max_queue == 3
        assert load.queue_depth == 1  # the replying request itself: devices subtract it
        st = dev.status()
        assert st.load.queue_depth == 0 and st.load.service_ms > 0 and st.errors == 0
        assert {(g.cut_id, g.hits) for g in st.segments} == {("c2", 2), ("c3", 1)}
        assert all(g.service_ms > 0 for g in st.segments)


def test_a_flooded_server_loses_no_request(models_dir: Path) -> None:
    """workers=1, max_queue=1, six threads: refused requests finish on the device (the head's output is
    kept), the refusing cloud waits out its hint, and every output equals the whole model's."""
    graph = graph_model.load(zoo.get("tiny_chain"))
    # A device far slower than the cloud: the plan sends whenever the cloud admits.
    table = flops_table(graph, device_gflops=0.0005, cloud_gflops=100.0)
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=1)) as s,
        AdaptiveDevice(graph, table, [s.address], config=RuntimeConfig(deadline_ms=30_000), start_prober=False) as dev,
    ):
        # The first request holds the worker until the server has refused one: refusals happen.
        s.handler.before_tail = _Gate(open_when=lambda: s.stats.refused >= 1)
        outcomes, lock = [], threading.Lock()

        def work(k: int) -> None:
            for i in range(5):
                x = dev.local.random_inputs(seed=10 * k + i)
                out = dev.infer(x)
                with lock:
                    outcomes.append((out, dev.local.run_local(x)))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(outcomes) == 30 and dev.stats["completed"] == 30 and dev.stats["failed"] == 0
    for out, ref in outcomes:
        assert set(out.outputs) == set(ref)
        for name, want in ref.items():
            np.testing.assert_allclose(out.outputs[name], want, rtol=1e-5, atol=1e-6)
    assert s.stats.refused >= 1 and dev.stats["refused"] >= 1
    assert any(o.fallback for o, _ in outcomes)  # a refused request finished here
    assert any(o.server == s.address for o, _ in outcomes)  # and the cloud served the others
    assert s.served + dev.stats["fallbacks"] + sum(o.plan == "device" for o, _ in outcomes) == 30


@pytest.mark.parametrize("workers", [1, 2, 3, 64])
def test_tail_sessions_share_the_cpus_among_the_workers(tmp_path: Path, workers: int) -> None:
    """Workers x tail threads stays within the CPUs this process may use (at least one thread each): with
    onnxruntime's default of every core per session, concurrent tails oversubscribe the host."""
    import os

    from splitrt.cloud.server import tail_threads

    cpus = len(os.sched_getaffinity(0))
    server = CloudServer(ServerConfig(models_dir=tmp_path, workers=workers))
    assert server.tails.intra_op_threads == tail_threads(server.config) == max(1, cpus // workers)
    assert workers * server.tails.intra_op_threads <= max(cpus, workers)
    explicit = CloudServer(ServerConfig(models_dir=tmp_path, workers=workers, intra_op_threads=3))
    assert explicit.tails.intra_op_threads == 3
    with pytest.raises(ConfigError, match="intra_op_threads: expected >= 0"):
        CloudServer(ServerConfig(models_dir=tmp_path, workers=workers, intra_op_threads=-1))
