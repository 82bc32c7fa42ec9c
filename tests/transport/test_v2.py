"""The v2 transport: conversions both ways, and the calls against a small v2 servicer built on the
generated stubs (real gRPC on 127.0.0.1). The real third-party server is tests/cloud/test_v2_mlserver.py."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.errors import CloudError, CodecError
from splitrt.transport import codec, wire
from splitrt.transport import grpc_predict_v2_pb2 as v2pb
from splitrt.transport import grpc_predict_v2_pb2_grpc as v2grpc
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.grpc_transport import GrpcTransport
from splitrt.transport.v2 import (
    DATATYPES,
    V2Transport,
    from_v2_response,
    is_v2,
    model_name,
    target,
    to_v2_request,
)

SHA = "ab" * 32


def framed(tensors: dict[str, np.ndarray], spec: str = "fp32", cut: str = "c3") -> wire.Framed:
    header = pb.InferRequest(model_sha256=SHA, cut_id=cut, request_id="r1")
    return wire.Framed(header=header, tensors=[codec.encode(n, a, spec) for n, a in tensors.items()])


def test_names_and_addresses() -> None:
    assert model_name(SHA, "c12") == "abababababab-c12"
    assert is_v2("v2://10.0.0.1:8001") and not is_v2("10.0.0.1:8001") and not is_v2(None)
    assert target("v2://dns:///tails.svc:9000") == "dns:///tails.svc:9000"
    assert DATATYPES["float32"] == "FP32" and DATATYPES["int64"] == "INT64" and DATATYPES["bool"] == "BOOL"


def test_request_carries_raw_little_endian_contents_with_v2_datatypes() -> None:
    arrays = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i": np.array(7, dtype=np.int64),
        "b": np.array([True, False]),
        "h": np.ones((1, 2), np.float16),
    }
    req = to_v2_request(framed(arrays))
    assert req.model_name == "abababababab-c3" and req.id == "r1"
    assert [(t.name, t.datatype, list(t.shape)) for t in req.inputs] == [
        ("f", "FP32", [2, 3]),
        ("i", "INT64", []),
        ("b", "BOOL", [2]),
        ("h", "FP16", [1, 2]),
    ]
    assert [bytes(r) for r in req.raw_input_contents] == [
        a.astype(a.dtype.newbyteorder("<")).tobytes() for a in arrays.values()
    ]


def test_lossy_codec_is_refused_before_sending() -> None:
    with pytest.raises(CodecError, match=r"expected codec fp32.*got 'fp16'"):
        to_v2_request(framed({"f": np.ones((2, 2), np.float32)}, spec="fp16"))


def test_response_raw_or_typed_becomes_a_framed_reply() -> None:
    y = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    k = np.array([3, -4], dtype=np.int64)
    raw = v2pb.ModelInferResponse(id="r1")
    raw.outputs.add(name="y", datatype="FP32", shape=[2, 3])
    raw.outputs.add(name="k", datatype="INT64", shape=[2])
    raw.raw_output_contents.extend([y.tobytes(), k.tobytes()])
    typed = v2pb.ModelInferResponse(id="r1")
    typed.outputs.add(name="y", datatype="FP32", shape=[2, 3]).contents.fp32_contents.extend(y.ravel().tolist())
    typed.outputs.add(name="k", datatype="INT64", shape=[2]).contents.int64_contents.extend(k.tolist())
    for response in (raw, typed):
        reply = from_v2_response(response, "r1")
        assert reply.header.request_id == "r1"
        out = {t.name: codec.decode(t) for t in reply.tensors}
        np.testing.assert_array_equal(out["y"], y)
        np.testing.assert_array_equal(out["k"], k)


def test_a_short_raw_output_is_named() -> None:
    bad = v2pb.ModelInferResponse()
    bad.outputs.add(name="y", datatype="FP32", shape=[2, 3])
    bad.raw_output_contents.append(b"\0" * 20)
    with pytest.raises(CodecError, match=r"'y' FP32\[2, 3\]: expected 24 raw bytes, got 20"):
        from_v2_response(bad, "r")


class Servicer(v2grpc.GRPCInferenceServiceServicer):
    """A v2 server whose one model doubles its input; records what arrived."""

    def __init__(self) -> None:
        self.live_requests: list[v2pb.ServerLiveRequest] = []

    def ServerLive(self, request: v2pb.ServerLiveRequest, context: Any) -> v2pb.ServerLiveResponse:
        self.live_requests.append(request)
        return v2pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> v2pb.ServerReadyResponse:
        return v2pb.ServerReadyResponse(ready=True)

    def ServerMetadata(self, request: Any, context: Any) -> v2pb.ServerMetadataResponse:
        return v2pb.ServerMetadataResponse(name="fake", version="0")

    def ModelInfer(self, request: v2pb.ModelInferRequest, context: Any) -> v2pb.ModelInferResponse:
        if request.model_name != model_name(SHA, "c3"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model_name} not found")
        x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(list(request.inputs[0].shape))
        out = v2pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        out.outputs.add(name="y", datatype="FP32", shape=list(x.shape))
        out.raw_output_contents.append((2 * x).tobytes())
        return out


@pytest.fixture()
def fake() -> Iterator[tuple[Servicer, V2Transport]]:
    servicer = Servicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    v2grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    transport = V2Transport(f"v2://127.0.0.1:{port}", model_sha256=SHA)
    try:
        yield servicer, transport
    finally:
        transport.close()
        server.stop(None)


def test_calls_against_a_v2_servicer(fake: tuple[Servicer, V2Transport]) -> None:
    servicer, t = fake
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    reply = t.infer(framed({"x": x}), timeout_s=10)
    np.testing.assert_array_equal(codec.decode(reply.tensors[0]), 2 * x)
    st = t.status(timeout_s=10)
    assert st.version == "v2 fake 0" and [m.sha256 for m in st.models] == [SHA] and not st.allow_upload
    # The probe's payload rides in a field ServerLiveRequest does not have: parsed, kept as unknown.
    assert t.probe(pb.ProbeRequest(payload=bytes(5000)), timeout_s=10).received_bytes == 5000
    assert t.probe(pb.ProbeRequest(), timeout_s=10).received_bytes == 0
    assert servicer.live_requests[0].ByteSize() > 5000 and servicer.live_requests[1].ByteSize() == 0
    frames = list(t.infer_stream([framed({"x": x}), framed({"x": x}, cut="c9")], timeout_s=10))
    assert not frames[0].header.error.code and frames[1].header.error.code == "NOT_FOUND"


def test_errors_are_cloud_errors(fake: tuple[Servicer, V2Transport]) -> None:
    _, t = fake
    with pytest.raises(CloudError, match=r"v2 model abababababab-c9.*NOT_FOUND") as err:
        t.infer(framed({"x": np.ones((1, 2), np.float32)}, cut="c9"), timeout_s=10)
    assert err.value.code == "NOT_FOUND"
    with pytest.raises(CloudError, match="takes no uploads") as err:
        t.put_model(iter(()), timeout_s=1)
    assert err.value.code == "UNIMPLEMENTED"
    gone = V2Transport("v2://127.0.0.1:1")
    with pytest.raises(CloudError) as err:
        gone.status(timeout_s=2)
    assert err.value.code == "UNAVAILABLE" and err.value.retryable
    gone.close()


def test_dns_names_are_balanced_round_robin(fake: tuple[Servicer, V2Transport], tmp_path: Path) -> None:
    """``dns:///NAME:PORT`` (a headless Service) works for both transports; ``localhost`` resolves to
    127.0.0.1 and ::1 here, only one of which listens: round_robin uses the one that answers."""
    _, t = fake
    port = t.address.rsplit(":", 1)[1]
    by_name = V2Transport(f"v2://dns:///localhost:{port}")
    try:
        assert by_name.status(timeout_s=10).version == "v2 fake 0"
    finally:
        by_name.close()
    with CloudServer(ServerConfig(models_dir=tmp_path, port=0)) as server:
        grpc_t = GrpcTransport(f"dns:///localhost:{server.address.rsplit(':', 1)[1]}")
        try:
            assert grpc_t.status(timeout_s=10).version
        finally:
            grpc_t.close()
