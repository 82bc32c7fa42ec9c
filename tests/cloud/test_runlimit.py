"""Issue 36 item 2: no run holds a worker longer than the server's per-run limit, whatever the client's
deadline; the limit is the operator's ``--max-run-s`` or derived from the segment's measured time and the
model's size. A real server on 127.0.0.1 and real onnxruntime runs of an endless Loop."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest

from splitrt.cloud.capacity.runlimit import RUN_FACTOR, RUN_FLOOR_S, run_limit_s
from splitrt.cloud.guard.limits import Limits
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph.model import model_sha256
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from tests.cloud.test_hostile import request
from tests.hostilemodels import loop_model


def test_the_limit_is_the_flag_or_derived_from_measured_time_and_model_size() -> None:
    assert run_limit_s(flag_s=7.0, measured_ms=1e6, model_bytes=10**12) == 7.0
    assert run_limit_s(flag_s=None, measured_ms=0.0, model_bytes=300) == RUN_FLOOR_S
    assert run_limit_s(flag_s=None, measured_ms=500.0, model_bytes=300) == RUN_FACTOR * 0.5
    assert run_limit_s(flag_s=None, measured_ms=1.0, model_bytes=548_000_000) == pytest.approx(RUN_FACTOR * 5.48)


@pytest.mark.parametrize("flag_s", [None, 0.5])
def test_an_endless_run_is_terminated_at_the_run_limit_not_the_deadline(tmp_path: Path, flag_s: float | None) -> None:
    """A Loop with trip count 2^62 called with a 120 s deadline: terminated after the per-run limit (the
    derived default for a 300-byte model, or ``max_run_s``) with RESOURCE_EXHAUSTED naming the limit; the
    worker is free again (a second call is served the same way, not queued behind the first)."""
    onnx.save(loop_model(), tmp_path / "loop.onnx")
    sha = model_sha256(tmp_path / "loop.onnx")
    cfg = ServerConfig(models_dir=tmp_path, workers=1, max_queue=2, limits=Limits(max_run_s=flag_s))
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as info:
                stub.Infer(request(sha, "cloud", x=np.ones(1, np.float32)), timeout=120)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            limit = RUN_FLOOR_S if flag_s is None else flag_s
            assert f"expected at most {limit:g} s per run" in str(info.value.details())
        assert s.admission.running == 0 and s.canceller.terminated == 2


def test_after_a_run_hit_the_limit_its_segment_holds_one_worker_not_all(tmp_path: Path) -> None:
    """Two workers. Once an endless Loop has been terminated by the run limit, its later runs go to the
    heavy lane (one at a time): with two such calls in flight, a legitimate request still finds a worker
    and is answered while both are pending (before, both workers were the loop's until the limit)."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from splitrt.graph import zoo

    onnx.save(loop_model(), tmp_path / "loop.onnx")
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    sha = model_sha256(tmp_path / "loop.onnx")
    legit = model_sha256(tmp_path / "tiny_chain.onnx")
    cfg = ServerConfig(models_dir=tmp_path, workers=2, max_queue=4, limits=Limits(max_run_s=3.0))
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch, ThreadPoolExecutor(2) as pool:
        stub = pb_grpc.SplitInferenceStub(ch)
        loop_req = request(sha, "cloud", x=np.ones(1, np.float32))
        with pytest.raises(grpc.RpcError):  # the first run: terminated by the limit, the segment marked
            stub.Infer(loop_req, timeout=120)
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        stub.Infer(request(legit, "cloud", x=x), timeout=60)  # its tail built before the loops hold anything
        loops = [pool.submit(stub.Infer, loop_req, timeout=120) for _ in range(2)]
        for _ in range(600):  # until one of them runs
            if s.canceller.running() >= 1:
                break
            threading.Event().wait(0.01)
        reply = stub.Infer(request(legit, "cloud", x=x), timeout=60)
        pending = sum(not f.done() for f in loops)
        assert reply.outputs and pending == 2  # answered beside the loops, not after one of them
        for f in loops:
            with pytest.raises(grpc.RpcError) as info:
                f.result(timeout=120)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_runs_of_a_segment_the_limit_stopped_yield_the_cpu(tmp_path: Path) -> None:
    """The runs of a segment stopped by the run limit before run at a lower OS priority, even for a lone
    client (who is never over its share); a segment's first runs and those of one that finishes do not."""
    import os
    import shutil

    from splitrt.graph import zoo

    onnx.save(loop_model(), tmp_path / "loop.onnx")
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    cfg = ServerConfig(models_dir=tmp_path, workers=1, max_queue=2, limits=Limits(max_run_s=0.5))
    nice: list[int] = []
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        run = s.canceller.run

        def noting(*args: object, **kw: object) -> object:
            nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return run(*args, **kw)  # type: ignore[arg-type]

        s.canceller.run = noting  # type: ignore[method-assign]
        low = s.handler.niced.nice if s.handler.niced.enabled else 0
        stub = pb_grpc.SplitInferenceStub(ch)
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        for _ in range(2):
            stub.Infer(request(model_sha256(tmp_path / "tiny_chain.onnx"), "cloud", x=x), timeout=60)
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                stub.Infer(request(model_sha256(tmp_path / "loop.onnx"), "cloud", x=np.ones(1, np.float32)), timeout=60)
    if not low:
        pytest.skip("threads cannot lower their priority here")
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert nice == [base, base, base, min(19, base + low)], nice
