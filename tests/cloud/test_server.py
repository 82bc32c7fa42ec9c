"""The cloud server against bad input and faults: a real gRPC server on 127.0.0.1 (ephemeral port).

After every refused request the server must still serve a correct one (``_serves``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrt import __version__
from splitrt.cloud.server import CloudServer, ServerConfig, tokens_from_file
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import CloudError, ConfigError
from splitrt.graph import zoo
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

BIG = 64 * 1024 * 1024
TOKEN = "upl0ad-t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
# Uploads need a token (secure by default): the upload tests state it.
UPLOADS = {"allow_upload": True, "tokens": (TOKEN,)}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    shutil.copyfile(zoo.get("multi_io"), d / "multi_io.onnx")
    return d


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[CloudServer]:
    s = CloudServer(
        ServerConfig(models_dir=models_dir, workers=2, max_queue=4, max_message_bytes=256 * 1024, segment_cache_size=4)
    )
    s.start()
    yield s
    s.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def device(server: CloudServer) -> Iterator[Device]:
    with Device(zoo.get("tiny_chain"), server.address) as d:
        yield d


def _stub(address: str) -> pb_grpc.SplitInferenceStub:
    return pb_grpc.SplitInferenceStub(grpc.insecure_channel(address, wire.channel_options(BIG, 30.0)))


def _request(device: Device, cut: str = "c2", spec: str = "fp32") -> pb.InferRequest:
    """A stock protobuf request (sent with the generated stub: the server must parse it too)."""
    head = device.run_head(device.random_inputs(), cut)
    return device._request(head, codec.Codec.parse(spec))[0].to_message()


def _code(address: str, request: pb.InferRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        _stub(address).Infer(request, timeout=10)
    err = info.value
    return err.code(), err.details()


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b))) / (float(np.max(np.abs(a))) or 1.0)


def _serves(device: Device) -> None:
    x = device.random_inputs(seed=7)
    got = device.run(x, cut="c3")
    assert _rel(device.run_local(x)["y"], got["y"]) <= 1e-5


def test_health_and_status(server: CloudServer, models_dir: Path) -> None:
    channel = grpc.insecure_channel(server.address)
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=wire.SERVICE_NAME), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    st = _stub(server.address).Status(pb.StatusRequest(), timeout=5)
    assert st.version == __version__
    want = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in models_dir.glob("*.onnx")}
    assert {m.sha256: m.name for m in st.models} == want
    assert st.load.workers == 2 and st.max_queue == 4 and 0.0 <= st.load.cpu_percent <= 100.0


def test_probe_echoes_sizes(server: CloudServer) -> None:
    reply = _stub(server.address).Probe(pb.ProbeRequest(payload=bytes(1000), reply_bytes=5000), timeout=5)
    assert reply.received_bytes == 1000 and len(reply.payload) == 5000
    with pytest.raises(grpc.RpcError) as info:
        _stub(server.address).Probe(pb.ProbeRequest(reply_bytes=10**9), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_model_and_cut_are_not_found(server: CloudServer, device: Device) -> None:
    req = _request(device)
    req.model_sha256 = "0" * 64
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.NOT_FOUND and "0000000000" in details
    _serves(device)
    req = _request(device)
    req.cut_id = "c999"
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.NOT_FOUND and "c999" in details
    _serves(device)


def test_wrong_tensor_name_dtype_shape_are_invalid_argument(server: CloudServer, device: Device) -> None:
    req = _request(device, "c2")
    real = req.tensors[0].name
    req.tensors[0].name = "nope"
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"expected tensors ['{real}']" in details and "got ['nope']" in details
    _serves(device)

    req = _request(device, "c2")
    arr = codec.decode(wire.from_proto(req.tensors[0])).astype(np.float64)
    req.tensors[0].CopyFrom(wire.to_proto(codec.encode(real, arr, "fp32")))
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected dtype float32, got float64" in details
    _serves(device)

    req = _request(device, "c2")
    shape = list(req.tensors[0].shape)
    arr = np.zeros([shape[0], shape[1] + 1, *shape[2:]], np.float32)
    req.tensors[0].CopyFrom(wire.to_proto(codec.encode(real, arr, "fp32")))
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"got {[shape[0], shape[1] + 1, *shape[2:]]}" in details and "expected shape [N, " in details
    _serves(device)


@pytest.mark.parametrize("spec", ["fp32", "int8c", "fp16+zlib", "int8+zstd"])
def test_truncated_or_garbage_payloads_are_invalid_argument(server: CloudServer, device: Device, spec: str) -> None:
    req = _request(device, "c2", spec)
    good = req.tensors[0].payload
    req.tensors[0].payload = good[: len(good) // 2]
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected" in details and ("got" in details or "truncated" in details)
    _serves(device)
    req.tensors[0].payload = b"\x78\x9c garbage" * 3
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    _serves(device)
    req.tensors[0].codec = "int3"
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "int3" in details
    _serves(device)


def test_oversize_request_is_resource_exhausted(server: CloudServer, device: Device) -> None:
    req = _request(device, "c2")
    req.tensors[0].payload = bytes(512 * 1024)  # server limit is 256 KiB
    code, _ = _code(server.address, req)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    _serves(device)


def test_lru_bounds_cached_segments(server: CloudServer, device: Device) -> None:
    x = device.random_inputs()
    for cut in ("c1", "c2", "c3", "c4", "c5", "c6"):
        device.run(x, cut=cut)
    st = device.status()
    assert len(st.segments) == 4
    assert {s.cut_id for s in st.segments} == {"c3", "c4", "c5", "c6"}


def test_stream_reports_a_bad_frame_and_goes_on(server: CloudServer, device: Device) -> None:
    reqs = [_request(device, "c3") for _ in range(3)]
    reqs[1].tensors[0].payload = b"short"
    replies = list(_stub(server.address).InferStream(iter(reqs), timeout=10))
    assert [r.request_id for r in replies] == [r.request_id for r in reqs]
    assert replies[0].error.code == "" and replies[2].error.code == ""
    assert replies[1].error.code == "INVALID_ARGUMENT" and "expected" in replies[1].error.message
    frames = [device.random_inputs(seed=i) for i in range(4)]
    results = list(device.stream(frames, cut="c4"))
    assert len(results) == 4
    for frame, res in zip(frames, results, strict=True):
        assert res.error is None
        assert _rel(device.run_local(frame)["y"], res.outputs["y"]) <= 1e-5


def test_multi_input_model_at_every_cut(server: CloudServer) -> None:
    with Device(zoo.get("multi_io"), server.address) as dev:
        x = dev.random_inputs()
        ref = dev.run_local(x)
        for cut in dev.graph.cuts():
            got = dev.run(x, cut=cut.id)
            assert set(got) == set(ref)
            for name in ref:
                assert _rel(ref[name], got[name]) <= 1e-5


class _Gate:
    """A before_tail hook that holds requests until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def __call__(self, request: pb.InferRequest) -> None:
        self.entered.release()
        assert self.release.wait(30)


def _wait_for(pred: object, what: str) -> None:
    for _ in range(500):
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_back_pressure_and_deadline(models_dir: Path) -> None:
    gate = _Gate()
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=2)) as s,
        Device(zoo.get("tiny_chain"), s.address) as dev,
        ThreadPoolExecutor(4) as pool,
    ):
        dev.ensure_model()
        dev.run(dev.random_inputs(), cut="c2")  # warm the tail
        s.handler.before_tail = gate
        x = dev.random_inputs()
        held = [pool.submit(dev.run, x, cut="c2", timeout_s=30) for _ in range(3)]
        assert gate.entered.acquire(timeout=10)
        _wait_for(lambda: s.admission.admitted == 3, "3 admitted requests")
        with pytest.raises(CloudError) as info:
            dev.run(x, cut="c2")
        assert info.value.code == "RESOURCE_EXHAUSTED" and info.value.retryable
        assert "queue depth 3" in str(info.value)
        gate.release.set()
        ref = dev.run_local(x)["y"]
        for f in held:
            assert _rel(ref, f.result(timeout=30)["y"]) <= 1e-5
        # a request whose deadline passes while it waits for a worker
        gate.release.clear()
        first = pool.submit(dev.run, x, cut="c2", timeout_s=30)
        assert gate.entered.acquire(timeout=10)
        with pytest.raises(CloudError) as info:
            dev.run(x, cut="c2", timeout_s=0.3)
        assert info.value.code == "DEADLINE_EXCEEDED" and info.value.retryable
        gate.release.set()
        first.result(timeout=30)
        s.handler.before_tail = None
        _serves(dev)


def test_graceful_stop_drains_in_flight_calls(models_dir: Path) -> None:
    gate = _Gate()
    s = CloudServer(ServerConfig(models_dir=models_dir, workers=2))
    s.start()
    with Device(zoo.get("tiny_chain"), s.address) as dev, ThreadPoolExecutor(2) as pool:
        x = dev.random_inputs()
        dev.run(x, cut="c1")
        s.handler.before_tail = gate
        pending = pool.submit(dev.run, x, cut="c1", timeout_s=30)
        assert gate.entered.acquire(timeout=10)
        stopping = pool.submit(s.stop, 10.0)
        time.sleep(0.2)
        assert not stopping.done()  # still draining
        gate.release.set()
        assert _rel(dev.run_local(x)["y"], pending.result(timeout=30)["y"]) <= 1e-5
        stopping.result(timeout=30)
        with pytest.raises(CloudError) as info:
            dev.run(x, cut="c1", timeout_s=2)
        assert info.value.code == "UNAVAILABLE" and info.value.retryable


def _model_bytes(name: str) -> tuple[bytes, str]:
    data = zoo.get(name).read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def test_upload_once_then_serve(tmp_path: Path) -> None:
    with CloudServer(ServerConfig(models_dir=tmp_path, **UPLOADS)) as s:
        with Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=TOKEN)) as dev:
            x = dev.random_inputs()
            assert _rel(dev.run_local(x)["y"], dev.run(x, cut="c2")["y"]) <= 1e-5
            assert (tmp_path / f"{dev.sha256}.onnx").read_bytes() == zoo.get("tiny_chain").read_bytes()
            assert dev.upload_model().already_present
        assert [p.name for p in tmp_path.iterdir()] == [f"{dev.sha256}.onnx"]


def test_status_lists_models_copied_in_after_start(tmp_path: Path) -> None:
    with CloudServer(ServerConfig(models_dir=tmp_path)) as s:
        stub = _stub(s.address)
        assert len(stub.Status(pb.StatusRequest(), timeout=5).models) == 0
        data, sha = _model_bytes("tiny_chain")
        (tmp_path / "late.onnx").write_bytes(data)  # an operator drops a model in
        assert [(m.sha256, m.name) for m in stub.Status(pb.StatusRequest(), timeout=5).models] == [(sha, "late.onnx")]
        (tmp_path / "late.onnx").unlink()
        assert len(stub.Status(pb.StatusRequest(), timeout=5).models) == 0


def test_upload_with_wrong_hash_or_garbage_stores_nothing(tmp_path: Path) -> None:
    data, sha = _model_bytes("tiny_chain")
    with CloudServer(ServerConfig(models_dir=tmp_path, **UPLOADS)) as s:
        stub = _stub(s.address)
        wrong = "ab" * 32
        with pytest.raises(grpc.RpcError) as info:
            stub.PutModel(
                iter(
                    [
                        pb.ModelChunk(sha256=wrong, total_bytes=len(data), data=data[:1000]),
                        pb.ModelChunk(data=data[1000:]),
                    ]
                ),
                timeout=10,
                metadata=AUTH,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"expected {wrong}, got {sha}" in info.value.details()
        garbage = b"not an onnx model" * 100
        with pytest.raises(grpc.RpcError) as info:
            stub.PutModel(
                iter([pb.ModelChunk(sha256=hashlib.sha256(garbage).hexdigest(), data=garbage)]),
                timeout=10,
                metadata=AUTH,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "nothing stored" in info.value.details()
        assert list(tmp_path.iterdir()) == []
        assert len(stub.Status(pb.StatusRequest(), timeout=5, metadata=AUTH).models) == 0
        reply = stub.PutModel(iter([pb.ModelChunk(sha256=sha, data=data)]), timeout=10, metadata=AUTH)
        assert reply.sha256 == sha and not reply.already_present


def test_upload_refused_when_not_allowed(tmp_path: Path) -> None:
    with CloudServer(ServerConfig(models_dir=tmp_path)) as s:
        data, sha = _model_bytes("tiny_chain")
        with pytest.raises(grpc.RpcError) as info:
            _stub(s.address).PutModel(iter([pb.ModelChunk(sha256=sha, data=data)]), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with Device(zoo.get("tiny_chain"), s.address) as dev, pytest.raises(CloudError) as err:
            dev.run(dev.random_inputs(), cut="c2")
        assert err.value.code == "NOT_FOUND" and not err.value.retryable
        assert list(tmp_path.iterdir()) == []


def test_bearer_token_auth(models_dir: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# operators\ns3cret-token\n\nother-token\n")
    token_file.chmod(0o600)
    assert tokens_from_file(token_file) == ("s3cret-token", "other-token")
    with CloudServer(ServerConfig(models_dir=models_dir, tokens=tokens_from_file(token_file))) as s:
        for token in (None, "wrong"):
            with (
                Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=token)) as dev,
                pytest.raises(CloudError) as info,
            ):
                dev.run(dev.random_inputs(), cut="c2")
            assert info.value.code == "UNAUTHENTICATED" and not info.value.retryable
        with pytest.raises(grpc.RpcError) as rpc_info:
            list(_stub(s.address).InferStream(iter([]), timeout=5))
        assert rpc_info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(s.address))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        with Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token="s3cret-token")) as dev:
            _serves(dev)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test cert")
def test_tls(models_dir: Path, tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    cfg = ServerConfig(models_dir=models_dir, tls_cert_path=cert, tls_key_path=key, tokens=("t0ken-t0ken",))
    with CloudServer(cfg) as s:
        with Device(
            zoo.get("tiny_chain"), f"localhost:{s.port}", config=DeviceConfig(tls_ca_path=cert, token="t0ken-t0ken")
        ) as dev:
            _serves(dev)
        with (
            Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(timeout_s=2)) as plain,
            pytest.raises(CloudError) as info,
        ):
            plain.run(plain.random_inputs(), cut="c2")
        assert info.value.code == "UNAVAILABLE"


def test_bad_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a directory"):
        CloudServer(ServerConfig(models_dir=tmp_path / "missing"))
    with pytest.raises(ConfigError, match="both a certificate and a key"):
        CloudServer(ServerConfig(models_dir=tmp_path, tls_cert_path=tmp_path / "c"))
    with pytest.raises(ConfigError, match="at least one token"):
        (tmp_path / "empty").write_text("\n# none\n")
        (tmp_path / "empty").chmod(0o600)
        tokens_from_file(tmp_path / "empty")


def test_zlib_bomb_through_a_symbolic_dimension_is_refused_unread(server: CloudServer, device: Device) -> None:
    # tiny_chain's input is [N, 3, 32, 32]: N = 1024 claims 12.6 MB, a 12 KB zlib stream of zeros. The
    # server's cap (4 x its 256 KiB message limit) refuses it from the claimed shape alone.
    req = _request(device, "cloud")
    big = np.zeros((1024, 3, 32, 32), np.float32)
    req.tensors[0].CopyFrom(wire.to_proto(codec.encode("x", big, "fp32+zlib")))
    assert req.ByteSize() < 64 * 1024
    code, details = _code(server.address, req)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"decodes to {big.nbytes} bytes, expected at most {4 * 256 * 1024}" in details
    _serves(device)


def test_decoded_total_of_a_request_is_capped(models_dir: Path) -> None:
    # multi_io at cut "cloud": two 256-byte tensors; each fits a 300-byte cap, together they do not.
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_decoded_bytes=300)) as s,
        Device(zoo.get("multi_io"), s.address) as dev,
    ):
        head = dev.run_head(dev.random_inputs(), "cloud")
        request = dev._request(head, codec.Codec())[0].to_message()
        code, details = _code(s.address, request)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "decode to 512 bytes in total, expected at most 300" in details


def test_a_queued_request_is_decoded_only_in_a_worker_slot(models_dir: Path) -> None:
    gate = _Gate()
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=2)) as s,
        Device(zoo.get("tiny_chain"), s.address) as dev,
        ThreadPoolExecutor(1) as pool,
    ):
        x = dev.random_inputs()
        dev.run(x, cut="c2")  # warm the tail
        s.handler.before_tail = gate
        held = pool.submit(dev.run, x, cut="c2", timeout_s=30)
        assert gate.entered.acquire(timeout=10)
        # A corrupt zlib stream with a plausible shape: found out only by inflating it, which must
        # wait for the worker slot (so it times out there instead of failing at once).
        req = _request(dev, "c2", "fp32+zlib")
        req.tensors[0].payload = b"\x78\x9c garbage" * 3
        with pytest.raises(grpc.RpcError) as info:
            _stub(s.address).Infer(req, timeout=0.5)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        gate.release.set()
        held.result(timeout=30)
        s.handler.before_tail = None
        code, details = _code(s.address, req)  # with a free slot: decoded, and refused
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "corrupt" in details
        _serves(dev)


def test_garbage_infer_bytes_are_invalid_argument(server: CloudServer, device: Device) -> None:
    channel = grpc.insecure_channel(server.address)
    infer = channel.unary_unary(f"/{wire.SERVICE_NAME}/Infer")
    garbage = [
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x2a\x05\x0a\x09abc",
        b"\x2a\x03\x0b\x01\x02",
        b"not a protobuf message at all",
    ]
    for data in garbage:
        with pytest.raises(grpc.RpcError) as info:
            infer(data, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, data
        assert "Infer: expected a protobuf-encoded splitrt.v1.InferRequest" in info.value.details()
    _serves(device)
    stream = channel.stream_stream(f"/{wire.SERVICE_NAME}/InferStream", response_deserializer=pb.InferReply.FromString)
    good = _request(device, "c3")
    replies = list(stream(iter([garbage[0], good.SerializeToString()]), timeout=10))
    assert replies[0].error.code == "INVALID_ARGUMENT" and "splitrt.v1.InferRequest" in replies[0].error.message
    assert replies[1].error.code == "" and replies[1].request_id == good.request_id
    channel.close()


@pytest.mark.parametrize(("method", "streaming"), [("Probe", False), ("Status", False), ("PutModel", True)])
def test_garbage_bytes_to_any_method_are_invalid_argument(
    server: CloudServer, device: Device, method: str, streaming: bool
) -> None:
    # gRPC alone answers INTERNAL ("Exception deserializing request") to bytes that do not parse.
    channel = grpc.insecure_channel(server.address)
    call = (channel.stream_unary if streaming else channel.unary_unary)(f"/{wire.SERVICE_NAME}/{method}")
    for data in (b"\xff" * 11, b"\x0a\x05ab", b"\x0a\x80\x80\x80\x80\x10"):
        with pytest.raises(grpc.RpcError) as info:
            call(iter([data]) if streaming else data, timeout=10)
        assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED), data
        if info.value.code() == grpc.StatusCode.INVALID_ARGUMENT:
            assert f"{method}: expected a protobuf-encoded splitrt.v1." in info.value.details()
    channel.close()
    _serves(device)


def test_unknown_cuts_leave_nothing_behind(server: CloudServer, device: Device) -> None:
    # every refused (model, cut) used to keep a build lock forever: memory an attacker could grow at will
    for i in range(50):
        req = _request(device)
        req.cut_id = f"c{1000 + i}"
        assert _code(server.address, req)[0] == grpc.StatusCode.NOT_FOUND
    assert server.tails._building == {}
    _serves(device)


def test_a_stored_model_onnxruntime_cannot_run_is_failed_precondition(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 999)])  # loads; onnxruntime refuses
    onnx.save(model, str(tmp_path / "future.onnx"))
    sha = hashlib.sha256((tmp_path / "future.onnx").read_bytes()).hexdigest()
    with CloudServer(ServerConfig(models_dir=tmp_path)) as s:
        code, details = _code(s.address, pb.InferRequest(model_sha256=sha, cut_id="cloud"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "does not load in onnxruntime" in details
