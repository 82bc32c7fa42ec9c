"""``Transport`` over the Open Inference Protocol v2 (KServe/Triton ``inference.GRPCInferenceService``):
a device runs its tails on a standard serving engine (Triton, KServe, MLServer) instead of ``splitrt serve``.

Addresses name it by scheme: ``v2://host:port``. One v2 model per (model, cut), named
``model_name(sha256, cut)`` = ``<sha256[:12]>-<cut>`` (``splitrt export-repository`` writes them); its
inputs are the cut's crossing tensors, its outputs the graph outputs. Tensors travel as raw contents
(``raw_input_contents``: the arrays' little-endian buffers), so only lossless codecs apply (``fp32``,
and ``raw`` for non-float tensors); a lossy codec is refused on the device with ``CodecError`` before
anything is sent (the request then finishes locally and the cloud stays up).

What v2 has no word for: ``status`` reports the server's readiness (``ServerReady``) and, as present,
the model this transport was built for (a v2 server is provisioned by the operator: whether a cut is
deployed shows per request, ``NOT_FOUND``); ``probe`` times ``ServerLive`` and carries its upload bytes
in a field the server skips (protobuf ignores unknown fields), so the bandwidth estimate still gets
samples; ``put_model`` is ``UNIMPLEMENTED``; replies carry no tail time, queue time or load (zeros).

- ``proto/grpc_predict_v2.proto``: a wire-compatible subset of KServe's ``grpc_predict_v2.proto`` (names and
  field numbers theirs, attributed in its header); stubs ``grpc_predict_v2_pb2*`` by ``protogen`` like ours.
- ``V2Transport("v2://host:port", *, model_sha256, token, max_message_bytes, tls, tls_ca_path,
  tls_server_name)`` implements ``Transport``: ``infer`` = ``ModelInfer`` on ``model_name(sha256, cut)`` =
  ``<sha256[:12]>-<cut>``, inputs the crossing tensors as ``raw_input_contents`` with v2 datatypes
  (``DATATYPES``: ``float32`` -> ``FP32``, ``int64`` -> ``INT64``, ...; a lossy codec is ``CodecError`` before
  sending), replies raw or typed converted to a framed ``InferReply`` (tail/queue ms and load zero; a reply that
  does not convert is ``CloudError(DATA_LOSS)``); ``status`` = ``ServerReady`` + ``ServerMetadata``, listing
  ``model_sha256`` as present (which cuts are deployed shows per request: NOT_FOUND); ``probe`` = ``ServerLive``
  carrying the upload bytes in unknown field 15 (servers parse and drop it), nothing down; ``infer_stream`` =
  one ``ModelInfer`` per frame; ``put_model`` = ``CloudError(UNIMPLEMENTED)``; also ``model_metadata(name)``,
  ``model_ready(name)``. No keep-alive pings on idle channels (stock servers GOAWAY them). Errors map like
  ``GrpcTransport``'s.
- ``device.client``: an address starting ``v2://`` builds a ``V2Transport`` (``transport.v2.is_v2``), anything
  else a ``GrpcTransport``; everything above the transport (fallback, runtime, CLI) is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from splitrt.errors import CloudError, CodecError
from splitrt.transport import codec, wire
from splitrt.transport import grpc_predict_v2_pb2 as v2pb
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.base import describe_infer
from splitrt.transport.grpc_transport import ClientOptions, GrpcClient, mapped

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack

SCHEME = "v2://"
SERVICE = "inference.GRPCInferenceService"

# numpy dtype name -> v2 datatype string (the protocol's "Tensor Data Types").
DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
NUMPY_DTYPES: dict[str, str] = {v: k for k, v in DATATYPES.items()}

# The typed-list field of InferTensorContents that holds each datatype (servers that do not answer raw).
_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
_PROBE_FIELD_TAG = bytes([(15 << 3) | 2])  # field 15, length-delimited: unknown to ServerLiveRequest
_LOSSLESS = {"fp32", codec.RAW}


def is_v2(address: str | None) -> bool:
    return bool(address) and str(address).startswith(SCHEME)


def target(address: str) -> str:
    """The gRPC target of ``v2://host:port`` (``host:port``; ``dns:///name:port`` passes through)."""
    return address[len(SCHEME) :] if address.startswith(SCHEME) else address


def model_name(sha256: str, cut_id: str) -> str:
    """The v2 model that serves the tail of ``cut_id`` of the model with this sha256."""
    return f"{sha256[:12]}-{cut_id}"


def datatype(dtype: str) -> str:
    """The v2 datatype of a numpy dtype name (``CodecError`` for one v2 cannot carry)."""
    try:
        return DATATYPES[np.dtype(dtype).name]
    except (KeyError, TypeError) as exc:
        raise CodecError(f"v2 datatype: expected one of {sorted(DATATYPES)}, got dtype {dtype!r}") from exc


def to_v2_request(request: wire.Framed) -> v2pb.ModelInferRequest:
    """splitrt's ``InferRequest`` as a ``ModelInferRequest`` with raw contents."""
    header = request.header
    out = v2pb.ModelInferRequest(model_name=model_name(header.model_sha256, header.cut_id), id=header.request_id)
    for t in request.tensors:
        if t.codec not in _LOSSLESS:
            raise CodecError(f"tensor {t.name!r} for a v2 server: expected codec fp32 (raw contents), got {t.codec!r}")
        out.inputs.add(name=t.name, datatype=datatype(t.dtype), shape=list(t.shape))
        out.raw_input_contents.append(bytes(t.payload))
    return out


def _output_array(out: Any, raw: bytes | None) -> np.ndarray:
    dtype = NUMPY_DTYPES.get(out.datatype)
    if dtype is None:
        raise CodecError(f"v2 output {out.name!r}: expected a datatype in {sorted(NUMPY_DTYPES)}, got {out.datatype!r}")
    shape = tuple(int(d) for d in out.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if raw is not None:
        want = count * np.dtype(dtype).itemsize
        if len(raw) != want:
            raise CodecError(
                f"v2 output {out.name!r} {out.datatype}{list(shape)}: expected {want} raw bytes, got {len(raw)}"
            )
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
    field = _CONTENTS_FIELD.get(out.datatype)
    values = getattr(out.contents, field) if field else []
    if len(values) != count:
        raise CodecError(
            f"v2 output {out.name!r} {out.datatype}{list(shape)}: expected {count} values, got {len(values)}"
        )
    return np.asarray(values, dtype=dtype).reshape(shape)


def from_v2_response(response: v2pb.ModelInferResponse, request_id: str) -> wire.Framed:
    """A ``ModelInferResponse`` (raw or typed contents) as splitrt's framed ``InferReply``."""
    raws = list(response.raw_output_contents)
    if raws and len(raws) != len(response.outputs):
        raise CodecError(f"v2 response: expected one raw content per output ({len(response.outputs)}), got {len(raws)}")
    tensors = [
        codec.encode(out.name, _output_array(out, raws[i] if raws else None), "fp32", copy=False)
        for i, out in enumerate(response.outputs)
    ]
    return wire.Framed(header=pb.InferReply(request_id=response.id or request_id), tensors=tensors)


class V2Transport(GrpcClient):
    """The v2 service at ``address`` (``v2://host:port``); implements ``Transport`` as far as v2 goes.

    ``model_sha256``: the model this transport serves, reported by ``status`` (see the module doc).
    TLS and a bearer token as for ``GrpcTransport`` (e.g. behind a KServe ingress).
    """

    def __init__(
        self, address: str, *, model_sha256: str = "", keepalive_s: float = 300.0, **options: Unpack[ClientOptions]
    ) -> None:
        super().__init__(address, keepalive_s=keepalive_s, **options)
        self._model_sha256 = model_sha256
        self._channel: grpc.Channel | None = None
        self._calls: dict[str, Any] = {}

    def _open(self) -> grpc.Channel:
        # No pings on an idle channel: a stock gRPC server allows one every 5 min without calls and
        # closes a connection that pings more often (GOAWAY "too_many_pings").
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", self._max_message_bytes),
            ("grpc.max_receive_message_length", self._max_message_bytes),
            ("grpc.keepalive_time_ms", int(max(self._keepalive_s, 300.0) * 1000)),
            ("grpc.keepalive_permit_without_calls", 0),
        ]
        addr = target(self._address)
        if addr.startswith("dns:///"):  # many servers behind one name (headless Service): use them all
            options.append(("grpc.lb_policy_name", "round_robin"))
        return self._dial(addr, options)

    def _call(self, method: str, response: Any, *, raw: bool = False) -> Any:
        """The callable for ``method`` on the open channel; ``raw``: it takes the request's bytes."""
        with self._lock:
            if self._channel is None:
                self._channel = self._open()
                self._calls = {}
            key = f"{method}/{raw}"
            call = self._calls.get(key)
            if call is None:
                serializer: Callable[[Any], bytes] = bytes if raw else _serialize
                call = self._channel.unary_unary(
                    f"/{SERVICE}/{method}",
                    request_serializer=serializer,
                    response_deserializer=response.FromString,
                    _registered_method=True,
                )
                self._calls[key] = call
            return call

    def infer(self, request: wire.Framed, *, timeout_s: float) -> wire.Framed:
        v2req = to_v2_request(request)

        def what() -> str:
            return f"{describe_infer(request.header, self._address)} (v2 model {v2req.model_name})"

        with mapped(what):
            reply = self._call("ModelInfer", v2pb.ModelInferResponse)(v2req, timeout=timeout_s, metadata=self._metadata)
        try:
            return from_v2_response(reply, request.header.request_id)
        except CodecError as exc:
            raise CloudError(f"{what()}: reply does not convert: {exc}", code="DATA_LOSS") from exc

    def infer_stream(self, requests: Iterable[wire.Framed], *, timeout_s: float | None = None) -> Iterator[wire.Framed]:
        """v2 has no splitrt-style stream: one ``ModelInfer`` per frame, a failed one reported in its
        reply's ``error`` as InferStream does."""
        for request in requests:
            try:
                yield self.infer(request, timeout_s=timeout_s or 60.0)
            except CloudError as exc:
                header = pb.InferReply(
                    request_id=request.header.request_id, error=pb.Error(code=exc.code, message=str(exc))
                )
                yield wire.Framed(header=header, tensors=[])

    def probe(self, request: pb.ProbeRequest, *, timeout_s: float) -> pb.ProbeReply:
        """``ServerLive``, its request padded with ``request.payload`` in an unknown field (field 15) the
        server parses and drops; nothing comes back (``reply_bytes`` cannot be honoured)."""
        payload = bytes(request.payload)
        body = _PROBE_FIELD_TAG + _varint(len(payload)) + payload if payload else b""
        with mapped(lambda: f"probe (ServerLive) of {self._address}"):
            reply = self._call("ServerLive", v2pb.ServerLiveResponse, raw=True)(
                body, timeout=timeout_s, metadata=self._metadata
            )
        if not reply.live:
            raise CloudError(
                f"probe of {self._address}: expected live, got not live", code="UNAVAILABLE", retryable=True
            )
        return pb.ProbeReply(received_bytes=len(payload))

    def status(self, *, timeout_s: float) -> pb.StatusReply:
        t_end = time.monotonic() + timeout_s

        def left() -> float:
            return max(0.001, t_end - time.monotonic())

        with mapped(lambda: f"status (ServerReady) of {self._address}"):
            ready = self._call("ServerReady", v2pb.ServerReadyResponse)(
                v2pb.ServerReadyRequest(), timeout=left(), metadata=self._metadata
            )
            meta = self._call("ServerMetadata", v2pb.ServerMetadataResponse)(
                v2pb.ServerMetadataRequest(), timeout=left(), metadata=self._metadata
            )
        if not ready.ready:
            raise CloudError(
                f"status of {self._address}: expected a ready v2 server, got not ready",
                code="UNAVAILABLE",
                retryable=True,
            )
        models = (
            [pb.ModelInfo(sha256=self._model_sha256, name="v2 (cuts checked per request)")]
            if self._model_sha256
            else []
        )
        return pb.StatusReply(
            version=f"v2 {meta.name} {meta.version}".strip(),
            models=models,
            allow_upload=False,
            max_message_bytes=self._max_message_bytes,
        )

    def put_model(self, chunks: Iterable[pb.ModelChunk], *, timeout_s: float) -> pb.PutModelReply:
        raise CloudError(
            f"upload to {self._address}: a v2 server takes no uploads; expected the tails "
            "deployed with `splitrt export-repository`, got an upload request",
            code="UNIMPLEMENTED",
        )

    def model_metadata(self, name: str, *, timeout_s: float) -> v2pb.ModelMetadataResponse:
        """One v2 model's metadata (``NOT_FOUND`` as ``CloudError`` when the server lacks it)."""
        with mapped(lambda: f"metadata of {name} on {self._address}"):
            reply: v2pb.ModelMetadataResponse = self._call("ModelMetadata", v2pb.ModelMetadataResponse)(
                v2pb.ModelMetadataRequest(name=name), timeout=timeout_s, metadata=self._metadata
            )
        return reply

    def model_ready(self, name: str, *, timeout_s: float) -> bool:
        with mapped(lambda: f"readiness of {name} on {self._address}"):
            reply = self._call("ModelReady", v2pb.ModelReadyResponse)(
                v2pb.ModelReadyRequest(name=name), timeout=timeout_s, metadata=self._metadata
            )
        return bool(reply.ready)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._calls = self._channel, None, {}
        if channel is not None:
            channel.close()


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
