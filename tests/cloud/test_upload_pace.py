"""Uploads are charged on what arrives and cut when they trickle: a client sending 1 KiB and then
nothing (declaring the whole store's quota) is cut by the minimum rate while it waits, its quota freed
at once, and meanwhile a legitimate upload is stored. A real gRPC server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from splitrt.cloud.models.pace import UploadPace, verdict
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

TOKEN = "pace-t0ken-xyz"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def test_verdict_cuts_below_the_rate_after_the_grace_and_past_the_deadline() -> None:
    pace = UploadPace(min_rate_bytes_per_s=1024, grace_s=10, timeout_s=100)
    assert verdict(pace, elapsed_s=5, received_bytes=0, deadline_s=100) is None  # in its grace
    assert verdict(pace, elapsed_s=20, received_bytes=20 * 1024, deadline_s=100) is None
    slow = verdict(pace, elapsed_s=20, received_bytes=1024, deadline_s=100)
    assert slow is not None and "expected at least 1 KiB/s after 10 s, got 1024 bytes in 20.0 s" in slow
    late = verdict(pace, elapsed_s=50, received_bytes=1 << 30, deadline_s=50)
    assert late is not None and "expected the whole model within 50 s" in late


def test_trickling_upload_is_cut_and_frees_its_quota(tmp_path: Path) -> None:
    data = zoo.get("tiny_chain").read_bytes()
    quota = 2 * len(data) + 4096
    cfg = ServerConfig(
        models_dir=tmp_path,
        allow_upload=True,
        tokens=(TOKEN,),
        max_store_bytes=quota,
        upload_pace=UploadPace(min_rate_bytes_per_s=32 * 1024, grace_s=1.0, timeout_s=600),
    )
    stop = threading.Event()

    def trickle() -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(sha256="ab" * 32, name="squat.onnx", total_bytes=quota, data=b"\0" * 1024)
        stop.wait(60)  # then nothing: the next KiB would come in 20 s

    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        squat = stub.PutModel.future(trickle(), timeout=60, metadata=AUTH)
        end = time.monotonic() + 30
        while s.store._pending_models != 1:  # the squatter's first chunk is in
            assert time.monotonic() < end, "the squatter's upload never started"
            time.sleep(0.01)
        # Its declared size does not hold the quota: a legitimate upload fits beside it.
        sha = hashlib.sha256(data).hexdigest()
        chunk = pb.ModelChunk(sha256=sha, name="m.onnx", total_bytes=len(data), data=data)
        assert stub.PutModel(iter([chunk]), timeout=30, metadata=AUTH).sha256 == sha
        with pytest.raises(grpc.RpcError) as info:
            squat.result()
        stop.set()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "upload cut: expected at least 32 KiB/s after 1 s, got 1024 bytes in" in (info.value.details() or "")
        end = time.monotonic() + 30  # the handler's finally runs just after the client hears the status
        while (s.store._pending_bytes, s.store._pending_models) != (0, 0):
            assert time.monotonic() < end, "the squatter's quota was never freed"
            time.sleep(0.01)
    assert not list(tmp_path.glob(".upload-*.part"))


def test_serve_flags_set_the_pace(tmp_path: Path) -> None:
    from splitrt.cli import app as cli
    from splitrt.cli.serve import server_config
    from splitrt.errors import ConfigError

    argv = ["serve", "--models", str(tmp_path), "--upload-min-kbps", "8", "--upload-timeout-s", "60"]
    pace = server_config(cli.build_parser().parse_args(argv)).upload_pace
    assert (pace.min_rate_bytes_per_s, pace.timeout_s) == (8 * 1024, 60)
    with pytest.raises(ConfigError, match=r"upload_pace.timeout_s: expected > 0, got 0"):
        server_config(cli.build_parser().parse_args([*argv[:3], "--upload-timeout-s", "0"]))
