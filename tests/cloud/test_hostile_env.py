"""The server's own state, said without its paths: SIGHUP drains `splitrt serve` as SIGTERM does (and its
segments' directory goes with it), a full temporary directory is RESOURCE_EXHAUSTED saying so, NOT_FOUND
names no directory, and a bearer token shorter than the minimum is refused at start. Real `splitrt serve`
processes and real gRPC on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from splitrt.cloud.guard.security import MIN_TOKEN_CHARS
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.graph.model import model_sha256
from splitrt.rig.cloudserver import ServerProcess
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from tests.cli.test_serve import serve_checkout


def _request(sha: str, x: np.ndarray) -> pb.InferRequest:
    t = pb.Tensor(name="data_0", dtype="float32", shape=list(x.shape), codec="fp32", payload=x.tobytes())
    return pb.InferRequest(model_sha256=sha, cut_id="cloud", codec="fp32", request_id="t", tensors=[t])


@pytest.fixture()
def models(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    shutil.copyfile(zoo.get("squeezenet"), d / "squeezenet.onnx")
    return d


def _serve_in(tmp: Path, models: Path, monkeypatch: pytest.MonkeyPatch) -> ServerProcess:
    monkeypatch.setenv("TMPDIR", str(tmp))  # the child's temporary directory: its segments go there
    s = serve_checkout(str(models), "--workers", "1", "--intra-op-threads", "1", "--no-warm")
    monkeypatch.delenv("TMPDIR")
    return s


def test_sighup_drains_and_removes_the_segments(tmp_path: Path, models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    s = _serve_in(tmp, models, monkeypatch)
    try:
        port = s.event("listening")["port"]
        x = np.zeros((1, 3, 224, 224), np.float32)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            reply = pb_grpc.SplitInferenceStub(ch).Infer(
                _request(model_sha256(models / "squeezenet.onnx"), x), timeout=120
            )
        assert reply.outputs
        assert list(tmp.glob("splitrt-segments-*")), "the tail was built in the builder's directory"
        s.proc.send_signal(signal.SIGHUP)
        assert s.proc.wait(timeout=60) == 0
        assert s.event("stopped")
    finally:
        s.stop()
    assert not list(tmp.glob("splitrt-segments-*"))


@pytest.fixture()
def full_tmp(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 KiB tmpfs needs root")
    tmp = tmp_path / "full"
    tmp.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp)], check=True)
    try:
        yield tmp
    finally:
        subprocess.run(["umount", "-l", str(tmp)], check=False)


@pytest.mark.root
def test_full_temporary_directory_is_resource_exhausted_naming_no_path(
    full_tmp: Path, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _serve_in(full_tmp, models, monkeypatch)
    try:
        port = s.event("listening")["port"]
        x = np.zeros((1, 3, 224, 224), np.float32)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError) as info:
            pb_grpc.SplitInferenceStub(ch).Infer(_request(model_sha256(models / "squeezenet.onnx"), x), timeout=120)
    finally:
        assert s.stop() == 0
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    said = info.value.details() or ""
    assert "the server's disk is full" in said and str(full_tmp) not in said and "Errno" not in said, said


def test_not_found_names_no_server_path(models: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=models, workers=1)) as s,
        grpc.insecure_channel(s.address) as ch,
        pytest.raises(grpc.RpcError) as info,
    ):
        pb_grpc.SplitInferenceStub(ch).Infer(_request("ab" * 32, np.zeros(1, np.float32)), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    said = info.value.details() or ""
    assert "expected one of the 1 models the server holds" in said
    assert str(models) not in said and str(models.resolve()) not in said, said


@pytest.mark.parametrize("token", ["x", "a" * (MIN_TOKEN_CHARS - 1)])
def test_short_token_is_refused_naming_the_minimum(models: Path, token: str) -> None:
    with pytest.raises(ConfigError, match=f"expected at least {MIN_TOKEN_CHARS} characters each, got 1 shorter"):
        CloudServer(ServerConfig(models_dir=models, tokens=("a-long-enough-token", token)))
    with CloudServer(ServerConfig(models_dir=models, tokens=("a" * MIN_TOKEN_CHARS,))):
        pass  # the minimum itself is accepted
