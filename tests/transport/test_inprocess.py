"""InProcessTransport: a real CloudServer's servicer, called in the test's thread by a real Device, gives
the local run's outputs and fails with the same CloudError as the same request over gRPC."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig, HeadResult
from splitrt.errors import CloudError
from splitrt.graph import zoo
from splitrt.transport.inprocess import FakeContext, InProcessTransport

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

CONFIG = DeviceConfig(intra_op_threads=1, timeout_s=10)


def servicer_of(server: CloudServer) -> Any:
    """The server's SplitInference servicer, unstarted (no port bound)."""
    return server.servicer


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


@pytest.fixture(scope="module")
def server(models_dir: Path) -> CloudServer:
    return CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))


@pytest.fixture()
def dev(server: CloudServer) -> Iterator[Device]:
    with Device(zoo.get("tiny_chain"), config=CONFIG, transport=InProcessTransport(servicer_of(server))) as d:
        yield d


def test_split_runs_in_process_equal_the_local_run(dev: Device) -> None:
    x = dev.random_inputs(seed=2)
    ref = dev.run_local(x)
    for cut in [c.id for c in dev.graph.cuts()]:
        res = dev.run_detailed(x, cut=cut)
        assert res.where == ("local" if cut == "device" else "cloud")
        np.testing.assert_allclose(res.outputs["y"], ref["y"], rtol=1e-5, atol=1e-6)
    for res in dev.stream([x, x], cut="c2"):
        assert res.error is None
        np.testing.assert_allclose(res.outputs["y"], ref["y"], rtol=1e-5, atol=1e-6)
    assert any(m.sha256 == dev.sha256 for m in dev.status().models)
    p = dev.probe(1000, 200)
    assert p.down_bytes == 200 and p.load.workers == 1
    assert dev.cloud == "in-process"


def test_missing_model_is_uploaded_in_process(tmp_path: Path) -> None:
    # Uploads need a token (secure by default); the in-process transport passes no metadata and no
    # interceptor runs: the servicer is called directly.
    s = CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=("t0ken-t0ken",), intra_op_threads=1))
    try:
        with Device(zoo.get("tiny_chain"), config=CONFIG, transport=InProcessTransport(servicer_of(s))) as dev:
            x = dev.random_inputs()
            res = dev.run_detailed(x, cut="c1")  # blocking API: uploads inline, then infers
            assert res.where == "cloud"
            np.testing.assert_allclose(res.outputs["y"], dev.run_local(x)["y"], rtol=1e-5, atol=1e-6)
    finally:
        s.stop()  # never started: stop releases what the upload's session opened (its niced thread)
    assert (tmp_path / f"{dev.sha256}.onnx").read_bytes() == zoo.get("tiny_chain").read_bytes()


def _failure(dev: Device, call: str) -> CloudError:
    with pytest.raises(CloudError) as info:
        if call == "infer":
            head = dev.run_head(dev.random_inputs(), "c2")
            wrong = HeadResult(
                cut_id=head.cut_id, crossing={f"{n}_wrong": a for n, a in head.crossing.items()}, head_ms=head.head_ms
            )
            dev.send(wrong, timeout_s=10)
        else:
            # More than the server will echo (by the servicer's cap: a probe declaring more than the caps
            # together is refused by the front door, before its body is read).
            dev.probe(16, 17 << 20)
    return info.value


@pytest.mark.parametrize("call", ["infer", "probe"])
def test_a_bad_request_fails_as_over_grpc(server: CloudServer, dev: Device, call: str) -> None:
    fake = _failure(dev, call)
    with CloudServer(server.config) as live, Device(zoo.get("tiny_chain"), live.address, config=CONFIG) as remote:
        real = _failure(remote, call)
    assert fake.code == real.code == "INVALID_ARGUMENT" and fake.retryable is real.retryable is False
    # Same server message after "<what> on <address>:"
    assert str(fake).split(": ", 1)[1] == str(real).split(": ", 1)[1]
    assert "in-process" in str(fake) and live.address in str(real)


def test_fake_context_records_the_abort() -> None:
    ctx = FakeContext(timeout_s=None)
    assert ctx.time_remaining() is None
    with pytest.raises(grpc.RpcError):
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such model")
    assert ctx.aborted == (grpc.StatusCode.NOT_FOUND, "no such model")
