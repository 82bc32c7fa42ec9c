"""``Transport`` over gRPC: one channel per cloud (reused, keep-alive pings), Infer and InferStream
framed by hand (``wire.serialize`` / ``wire.deserializer``), the bearer token as metadata.

The channel is opened on the first call (a TLS CA file is read then, not when the transport is built)
and ``close()`` drops it: a later call opens a fresh one. gRPC errors become ``CloudError`` here and
nowhere else (``mapped``).

- ``GrpcTransport(address, *, token, max_message_bytes, keepalive_s, tls, tls_ca_path, tls_server_name)``.
- A ``dns:///NAME:PORT`` address (a Kubernetes headless Service) gets gRPC's ``round_robin`` over every address
  the name resolves to, in ``GrpcTransport`` and ``V2Transport`` alike; in ``GrpcTransport`` an address list
  ``ipv4:10.0.0.1:50051,10.0.0.2:50051`` (or ``ipv6:``) too (``ROUND_ROBIN_SCHEMES``). Such an address is one
  cloud to the runtime: gRPC spreads and skips dead addresses, the runtime's balancing and failover see the list
  as a whole. Tested with a name resolving to 127.0.0.1 and 127.0.0.2 in a namespace's own hosts file
  (``tests/device/test_balance_dns.py``, root; c-ares and native resolvers). ``splitrt run --cloud A --cloud B
  --count N`` balances a stream over several clouds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import grpc

from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport import wire
from splitrt.transport.base import describe_infer, describe_upload

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack

# gRPC targets that may name several servers: one channel balances over them (``round_robin``).
ROUND_ROBIN_SCHEMES = ("dns:", "ipv4:", "ipv6:")


@dataclass(frozen=True)
class _Calls:
    """An open channel and the callables on it."""

    channel: grpc.Channel
    stub: pb_grpc.SplitInferenceStub
    infer: Any
    infer_stream: Any


@contextmanager
def mapped(what: Callable[[], str]) -> Iterator[None]:
    """The boundary: a gRPC error becomes ``CloudError(code=<status name>, retryable=...)``; ``what`` is
    called only on failure (a stream learns what it carries as it goes)."""
    try:
        yield
    except grpc.RpcError as exc:
        raise wire.cloud_error(exc, what()) from exc


class ClientOptions(TypedDict, total=False):
    """How a client reaches its server besides the address and keep-alive (``GrpcClient``)."""

    token: str | None
    max_message_bytes: int
    tls: bool
    tls_ca_path: Path | None
    tls_server_name: str | None


class GrpcClient:
    """A client of one gRPC server at ``address``: ``token`` sent as a bearer token with every call, the
    message limit, keep-alive pings every ``keepalive_s``. TLS is on when ``tls`` or ``tls_ca_path`` is given
    (``tls_server_name`` overrides the name checked); the CA file is read when a channel opens."""

    def __init__(self, address: str, *, keepalive_s: float, **options: Unpack[ClientOptions]) -> None:
        token = options.get("token")
        self._address = address
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._max_message_bytes = options.get("max_message_bytes", wire.DEFAULT_MAX_MESSAGE_BYTES)
        self._keepalive_s = keepalive_s
        self._tls_ca_path = options.get("tls_ca_path")
        self._tls = options.get("tls", False) or self._tls_ca_path is not None
        self._tls_server_name = options.get("tls_server_name")
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self._address

    def _dial(self, target: str, options: list[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``target`` with ``options``, secure when TLS is on."""
        if not self._tls:
            return grpc.insecure_channel(target, options)
        root = Path(self._tls_ca_path).read_bytes() if self._tls_ca_path is not None else None
        if self._tls_server_name:
            options.append(("grpc.ssl_target_name_override", self._tls_server_name))
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root), options)


class GrpcTransport(GrpcClient):
    """The ``SplitInference`` service at ``address`` ("host:port"); implements ``Transport``."""

    def __init__(self, address: str, *, keepalive_s: float = 30.0, **options: Unpack[ClientOptions]) -> None:
        super().__init__(address, keepalive_s=keepalive_s, **options)
        self._live: _Calls | None = None

    def _open(self) -> grpc.Channel:
        options = wire.channel_options(self._max_message_bytes, self._keepalive_s)
        if self._address.startswith(ROUND_ROBIN_SCHEMES):
            # A name resolving to many servers (a Kubernetes headless Service), or a list of addresses
            # (``ipv4:10.0.0.1:50051,10.0.0.2:50051``): spread the requests over all of them, not just
            # the first address (gRPC's default, pick_first); a dead one is skipped while it reconnects.
            options.append(("grpc.lb_policy_name", "round_robin"))
        return self._dial(self._address, options)

    def _calls(self) -> _Calls:
        live = self._live
        if live is not None:
            return live
        # Built outside the lock (reading a CA file may block); a racing caller's channel is dropped.
        channel = self._open()
        with self._lock:
            if self._live is None:
                framed: dict[str, Any] = {
                    "request_serializer": wire.serialize,
                    "response_deserializer": wire.deserializer(pb.InferReply),
                    "_registered_method": True,
                }
                self._live = _Calls(
                    channel=channel,
                    stub=pb_grpc.SplitInferenceStub(channel),
                    infer=channel.unary_unary(f"/{wire.SERVICE_NAME}/Infer", **framed),
                    infer_stream=channel.stream_stream(f"/{wire.SERVICE_NAME}/InferStream", **framed),
                )
            else:
                channel.close()
            return self._live

    def stub(self) -> pb_grpc.SplitInferenceStub:
        """The generated stub on the open channel (stock protobuf framing; for tools and tests)."""
        return self._calls().stub

    def infer(self, request: wire.Framed, *, timeout_s: float) -> wire.Framed:
        # ``mapped`` inlined: no context manager and closure per request on the hot path.
        try:
            reply: wire.Framed = self._calls().infer(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.cloud_error(exc, describe_infer(request.header, self._address)) from exc
        return reply

    def infer_stream(self, requests: Iterable[wire.Framed], *, timeout_s: float | None = None) -> Iterator[wire.Framed]:
        sent: list[Any] = [None]  # the last request's header, for the error message

        def tap() -> Iterator[wire.Framed]:
            for request in requests:
                sent[0] = request.header
                yield request

        with mapped(lambda: describe_infer(sent[0], self._address, stream=True)):
            yield from self._calls().infer_stream(tap(), timeout=timeout_s, metadata=self._metadata)

    def probe(self, request: pb.ProbeRequest, *, timeout_s: float) -> pb.ProbeReply:
        with mapped(lambda: f"probe of {self._address}"):
            declared = ((wire.PROBE_BYTES_KEY, str(len(request.payload) + int(request.reply_bytes))),)
            reply: pb.ProbeReply = self._calls().stub.Probe(
                request, timeout=timeout_s, metadata=self._metadata + declared
            )
        return reply

    def status(self, *, timeout_s: float) -> pb.StatusReply:
        with mapped(lambda: f"status of {self._address}"):
            reply: pb.StatusReply = self._calls().stub.Status(
                pb.StatusRequest(), timeout=timeout_s, metadata=self._metadata
            )
        return reply

    def put_model(self, chunks: Iterable[pb.ModelChunk], *, timeout_s: float) -> pb.PutModelReply:
        first: list[pb.ModelChunk | None] = [None]  # names the model in the error message

        def tap() -> Iterator[pb.ModelChunk]:
            for chunk in chunks:
                if first[0] is None:
                    first[0] = chunk
                yield chunk

        with mapped(lambda: describe_upload(first[0], self._address)):
            reply: pb.PutModelReply = self._calls().stub.PutModel(tap(), timeout=timeout_s, metadata=self._metadata)
        return reply

    def close(self) -> None:
        with self._lock:
            live, self._live = self._live, None
        if live is not None:
            live.channel.close()
