"""The hand framing of Infer/InferStream (``wire.serialize`` / ``wire.deserializer``) against stock protobuf:
same messages both ways, payloads as views, and a stock client/server on either end of a real channel."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, HeadResult, SplitResult
from splitrt.graph import zoo
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport.codec import Encoded

BIG = 64 * 1024 * 1024


def _tensors() -> list[Encoded]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    return [
        codec.encode("x", x, copy=False),
        codec.encode("idx", np.arange(7, dtype=np.int64), copy=False),
        codec.encode("h", x, "fp16"),
        codec.encode("q", x, "int8c+zlib"),
        codec.encode("scalar", np.array(2.5, np.float64), copy=False),
        codec.encode("empty", np.zeros((0, 4), np.float32), copy=False),
    ]


def _request() -> wire.Framed:
    header = pb.InferRequest(model_sha256="ab" * 32, cut_id="c3", codec="fp32", request_id="r1", output_codec="fp16")
    return wire.Framed(header=header, tensors=_tensors())


def _same(a: list[Encoded], b: list[Encoded]) -> None:
    assert [(e.name, e.dtype, e.shape, e.codec, bytes(e.payload)) for e in a] == [
        (e.name, e.dtype, e.shape, e.codec, bytes(e.payload)) for e in b
    ]


def test_framed_bytes_parse_as_the_stock_message() -> None:
    framed = _request()
    stock = pb.InferRequest.FromString(wire.serialize(framed))
    for t in stock.tensors:  # the framer's alignment padding: zeros, not part of the tensor
        assert set(t.pad) <= {0}
        t.ClearField("pad")
    assert stock == framed.to_message()
    assert [t.name for t in stock.tensors] == ["x", "idx", "h", "q", "scalar", "empty"]
    reply = wire.Framed(
        header=pb.InferReply(request_id="r1", tail_ms=1.5, load=pb.Load(workers=2)), tensors=_tensors()[:2]
    )
    stock_reply = pb.InferReply.FromString(wire.serialize(reply))
    for t in stock_reply.outputs:
        t.ClearField("pad")
    assert stock_reply == reply.to_message()
    assert wire.serialize(pb.InferReply(request_id="r")) == pb.InferReply(request_id="r").SerializeToString()


def test_stock_bytes_deserialize_with_payload_views() -> None:
    framed = _request()
    data = framed.to_message().SerializeToString()
    got = wire.deserializer(pb.InferRequest)(data)
    assert got.header == framed.header
    _same(got.tensors, framed.tensors)
    for e in got.tensors:
        assert isinstance(e.payload, memoryview) and e.payload.readonly and e.payload.obj is data
    decoded = {e.name: codec.decode(e) for e in got.tensors}
    for e in framed.tensors:
        np.testing.assert_array_equal(decoded[e.name], codec.decode(e))


def test_any_field_order_repeats_and_unknown_fields() -> None:
    # Fields in reverse order, a payload given twice (the last one wins) and unknown fields (kept).
    def field(number: int, body: bytes) -> bytes:
        return bytes([number << 3 | 2, len(body)]) + body

    tensor = (
        field(5, b"\x00" * 8)
        + field(4, b"fp32")
        + bytes([3 << 3 | 2, 1, 2])
        + field(2, b"float32")
        + field(1, b"t")
        + field(5, np.array([1.0, 2.0], np.float32).tobytes())
        + field(15, b"??")
    )
    data = field(5, tensor) + field(2, b"c1") + field(1, b"s" * 10) + field(14, b"!")
    got = wire.deserializer(pb.InferRequest)(data)
    stock = pb.InferRequest.FromString(data)
    assert got.header.cut_id == stock.cut_id == "c1" and got.header.model_sha256 == stock.model_sha256
    assert got.header.SerializeToString().endswith(field(14, b"!"))  # unknown field preserved
    (t,) = got.tensors
    assert (t.name, t.dtype, t.shape, t.codec) == ("t", "float32", (2,), "fp32")
    assert bytes(t.payload) == stock.tensors[0].payload
    np.testing.assert_array_equal(codec.decode(t), [1.0, 2.0])


@pytest.mark.parametrize("name_len", [1, 7, 100, 200])
def test_framed_payloads_are_aligned_views(name_len: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 1000)).astype(np.float32)
    tensors = [
        codec.encode("n" * name_len, x, copy=False),
        codec.encode("i" * (name_len + 3), x.astype(np.float64)),
        codec.encode("z", np.arange(5, dtype=np.int64)),
        codec.encode("b" * name_len, x[:, :33], "fp16"),
        codec.encode("empty", np.zeros((0,), np.float32)),
        *_tensors(),
    ]
    for header in (
        pb.InferRequest(model_sha256="ab" * 32, cut_id="c" * name_len),
        pb.InferReply(request_id="r" * name_len, tail_ms=1.0),
    ):
        data = wire.serialize(wire.Framed(header=header, tensors=tensors))
        got = wire.deserializer(type(header))(data)
        base = np.frombuffer(data, np.uint8).ctypes.data
        _same(got.tensors, tensors)
        for e in got.tensors:
            if e.nbytes:
                assert (np.frombuffer(e.payload, np.uint8).ctypes.data - base) % wire.ALIGN_BYTES == 0, e.name
        assert all(codec.decode(e).flags.aligned for e in got.tensors)
        # stock protobuf reads the same tensors (the pad is a declared field of zeros)
        stock = type(header).FromString(data)
        field = stock.tensors if isinstance(stock, pb.InferRequest) else stock.outputs
        assert [bytes(t.payload) for t in field] == [bytes(e.payload) for e in tensors]
        assert all(set(t.pad) <= {0} for t in field)


@pytest.mark.parametrize("cut", [3, 10, 40])
def test_truncated_bytes_are_refused(cut: int) -> None:
    data = wire.serialize(_request())
    with pytest.raises((ValueError, DecodeError)):
        wire.deserializer(pb.InferRequest)(data[:cut])
    with pytest.raises((ValueError, DecodeError)):
        wire.deserializer(pb.InferRequest)(data[:-3])


def test_a_probe_request_is_measured_not_copied() -> None:
    # Stock bytes (payload first or last, given twice: the last wins, as in protobuf) give the same
    # header fields and payload length; the payload is never parsed into a message.
    stock = pb.ProbeRequest(payload=bytes(range(256)) * 4, reply_bytes=4096, next_probe=True, next_reply_bytes=7)
    data = stock.SerializeToString()
    got = wire.probe_deserializer(data)
    assert isinstance(got, wire.ProbeBody) and got.payload_bytes == 1024
    assert got.header.reply_bytes == 4096 and got.header.next_probe and got.header.next_reply_bytes == 7
    assert got.header.payload == b""
    twice = data + pb.ProbeRequest(payload=b"xyz").SerializeToString()
    assert pb.ProbeRequest.FromString(twice).payload == b"xyz"
    body = wire.probe_deserializer(twice)
    assert isinstance(body, wire.ProbeBody) and body.payload_bytes == 3 and body.header.reply_bytes == 4096
    empty = wire.probe_deserializer(b"")
    assert isinstance(empty, wire.ProbeBody) and empty.payload_bytes == 0 and empty.header.reply_bytes == 0
    bad = wire.probe_deserializer(data[:-2])  # truncated inside a field
    assert isinstance(bad, wire.Malformed) and "splitrt.v1.ProbeRequest" in bad.message


def test_encode_without_copy_is_a_read_only_view() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    e = codec.encode("x", x, copy=False)
    assert isinstance(e.payload, memoryview) and e.payload.readonly and len(e.payload) == x.nbytes
    assert np.shares_memory(np.frombuffer(e.payload, np.float32), x)
    assert bytes(e.payload) == codec.encode("x", x).payload
    # a non-contiguous or big-endian array is made plain first (one copy, as before)
    np.testing.assert_array_equal(codec.decode(codec.encode("t", x.T, copy=False)), x.T)
    np.testing.assert_array_equal(codec.decode(codec.encode("b", x.astype(">f4"), copy=False)), x)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("multi_io"), d / "multi_io.onnx")
    return d


def test_stock_client_and_framed_device_agree(models_dir: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1)) as s,
        Device(models_dir / "multi_io.onnx", s.address) as dev,
    ):
        x = dev.random_inputs()
        ref = dev.run_local(x)
        framed = dev.run(x, cut="c3")
        streamed = [r.outputs for r in dev.stream([x, x], cut="c1")]
        head = dev.run_head(x, "c3")
        request = dev._request(head, codec.Codec())[0].to_message()
        stub = pb_grpc.SplitInferenceStub(grpc.insecure_channel(s.address, wire.channel_options(BIG, 30)))
        reply = stub.Infer(request, timeout=10)
        stock = {t.name: codec.decode(wire.from_proto(t)) for t in reply.outputs}
    # The stock reply carries only what the tail made; the device assembles it with what its head kept.
    assert set(stock) == set(ref) - set(head.kept)
    stock |= head.kept
    for outputs in [framed, stock, *streamed]:
        assert set(outputs) == set(ref)
        for name in ref:
            np.testing.assert_allclose(outputs[name], ref[name], rtol=1e-5, atol=1e-6)


class _StockServicer(pb_grpc.SplitInferenceServicer):
    """A server built from the generated code only: echoes the first tensor back as every output it is
    told the tail makes."""

    def __init__(self, outputs: list[str]) -> None:
        self.outputs = outputs

    def Infer(self, request: pb.InferRequest, context: grpc.ServicerContext) -> pb.InferReply:
        t = request.tensors[0]
        return pb.InferReply(
            request_id=request.request_id,
            tail_ms=0.25,
            load=pb.Load(workers=1),
            outputs=[
                pb.Tensor(name=n, dtype=t.dtype, shape=t.shape, codec=t.codec, payload=t.payload) for n in self.outputs
            ],
        )


def _send_to_stock_server(
    models_dir: Path, outputs: Callable[[Device], list[str]]
) -> tuple[Device, HeadResult, SplitResult]:
    """Cut c4 of multi_io sent by a framed Device to a stock servicer answering ``outputs(dev)``."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    with Device(models_dir / "multi_io.onnx") as dev:
        pb_grpc.add_SplitInferenceServicer_to_server(_StockServicer(outputs(dev)), server)  # type: ignore[abstract]
        dev.cloud = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        try:
            dev._model_checked = True  # the stock servicer has no Status
            head = dev.run_head(dev.random_inputs(), "c4")
            result = dev.send(head)
        finally:
            server.stop(None)
    return dev, head, result


def _made_at_c4(dev: Device) -> list[str]:
    return [n for n in dev.output_names if n not in dev.graph.cut("c4").kept]


def test_framed_device_against_a_stock_server(models_dir: Path) -> None:
    dev, head, result = _send_to_stock_server(models_dir, _made_at_c4)
    made = _made_at_c4(dev)
    first = next(iter(head.crossing.values()))
    assert result.tail_ms == 0.25 and result.load is not None and result.load.workers == 1
    assert set(result.outputs) == set(dev.output_names)
    for name in made:
        np.testing.assert_array_equal(result.outputs[name], first)
    for name, kept in head.kept.items():
        np.testing.assert_array_equal(result.outputs[name], kept)


def test_a_reply_with_every_output_from_an_older_server_is_accepted(models_dir: Path) -> None:
    """A server from before replies carried only the tail's outputs sends every output: the device takes
    the ones its tail made from the reply and keeps its own for the rest."""
    dev, head, result = _send_to_stock_server(models_dir, lambda d: list(d.output_names))
    first = next(iter(head.crossing.values()))
    assert head.kept and set(result.outputs) == set(dev.output_names)
    for name in dev.output_names:
        np.testing.assert_array_equal(result.outputs[name], head.kept.get(name, first))
