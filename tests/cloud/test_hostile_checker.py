"""An upload's check runs in a child process at a lower CPU priority (``cloud.models.upload.CHECKER``, a
``cloud.models.children`` pool): its verdict and
its refusals come back as from an in-process check, it never runs in the server's own process, and a
real server stores a good upload and refuses a bad one through it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import grpc
import psutil
import pytest

from splitrt.cloud.capacity.memory import CHECKER_RESIDENT_BYTES
from splitrt.cloud.common import RpcFailure
from splitrt.cloud.models.children import NICE
from splitrt.cloud.models.upload import CHECKER, _check_model
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")


def where_and_how_nice() -> None:
    """Run in the child: says its pid and niceness (as a refusal, the way verdicts come back)."""
    raise RpcFailure(grpc.StatusCode.ABORTED, f"{os.getpid()} {os.nice(0)}")


def test_the_check_runs_in_a_child_at_a_lower_priority() -> None:
    with pytest.raises(RpcFailure) as info:
        CHECKER.run(where_and_how_nice)
    assert info.value.code is grpc.StatusCode.ABORTED
    pid, nice = (int(x) for x in info.value.message.split())
    assert pid != os.getpid()
    assert nice == min(19, os.nice(0) + NICE)  # pytest may itself run under nice


def test_verdicts_come_back_from_the_child(tmp_path: Path) -> None:
    good = tmp_path / "good.onnx"
    shutil.copyfile(zoo.get("tiny_chain"), good)
    CHECKER.run(_check_model, good, tmp_path, None)  # a model that loads: no refusal
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07not a model")
    with pytest.raises(RpcFailure) as info:
        CHECKER.run(_check_model, bad, tmp_path, None)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "nothing stored" in info.value.message
    with pytest.raises(RpcFailure) as info:
        CHECKER.run(_check_model, good, tmp_path, 1)  # over --max-nodes
    assert "expected at most 1 nodes (--max-nodes)" in info.value.message


def test_a_real_server_checks_uploads_in_the_child(tmp_path: Path) -> None:
    data = Path(zoo.get("tiny_chain")).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    cfg = ServerConfig(models_dir=tmp_path, workers=1, tokens=("t0k-t0k-t0k",), allow_upload=True)
    auth = (("authorization", "Bearer t0k-t0k-t0k"),)
    # A fresh child, as this server's start makes one: the session's shared child has checked every other
    # test's uploads (95 MB after those of four test modules, over the 84 MB baseline of a fresh one).
    CHECKER.stop()
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        put = pb_grpc.SplitInferenceStub(ch).PutModel
        reply = put(iter([pb.ModelChunk(sha256=sha, name="m.onnx", total_bytes=len(data), data=data)]), metadata=auth)
        assert reply.sha256 == sha and (tmp_path / f"{sha}.onnx").exists()
        junk = b"\x08\x07not a model"
        junk_sha = hashlib.sha256(junk).hexdigest()
        with pytest.raises(grpc.RpcError) as err:
            put(iter([pb.ModelChunk(sha256=junk_sha, name="j.onnx", data=junk)]), metadata=auth)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert not (tmp_path / f"{junk_sha}.onnx").exists() and s.admission.running == 0
        # What the ledger counts for the child at rest (its baseline) covers it once it has checked.
        pool = CHECKER._pool
        assert pool is not None
        resident = sum(psutil.Process(p.pid).memory_info().rss for p in pool._processes.values())
        assert 0 < resident <= CHECKER_RESIDENT_BYTES, resident
