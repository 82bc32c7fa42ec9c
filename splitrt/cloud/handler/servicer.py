"""The ``SplitInference`` gRPC methods and how a failure becomes a status (an abort, or a stream frame's
error). Stateless: Infer and InferStream go to ``handler.infer.Handler``, the rest to the ``CloudServer``.
Callable without a gRPC server, given a context with ``time_remaining()`` and a raising ``abort``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from splitrt.cloud.capacity.cancel import CallToken
from splitrt.cloud.common import MAX_WAIT_S, RpcFailure, redact
from splitrt.cloud.guard.probes import PROBE_FREE_BYTES, PROBE_MAX_PAYLOAD_BYTES, PROBE_MAX_REPLY_BYTES
from splitrt.cloud.guard.watchdog import cancel_call
from splitrt.cloud.models.pace import Paced
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire

if TYPE_CHECKING:
    from splitrt.cloud.config import ServerConfig
    from splitrt.cloud.handler.infer import Handler
    from splitrt.cloud.handler.nexthop import NextHop


def remaining_s(context: Any, default_s: float) -> float:
    """The call's time left, always a bounded number: a call without a deadline (or an absurd one) gets
    the server's ``default_deadline_s`` (waits on a larger number raise in ``threading``)."""
    left = _own_deadline_s(context)
    return default_s if left is None else left


class Backend(Protocol):
    """What the servicer needs of the server (``CloudServer`` is one)."""

    config: ServerConfig
    next_hop: NextHop
    handler: Handler

    def load(self) -> pb.Load: ...

    def status(self) -> pb.StatusReply: ...

    def put_model(self, chunks: Iterator[pb.ModelChunk], time_remaining_s: float | None = None) -> pb.PutModelReply: ...

    def admitted(self, what: str, nbytes: int) -> AbstractContextManager[None]: ...


def call_token(context: grpc.ServicerContext) -> CallToken:
    """Fired when the call ends, a client's cancel included (a run still going is then terminated)."""
    token = CallToken()
    add = getattr(context, "add_callback", None)  # an in-process fake context may not have it
    if add is not None and not add(token.cancel):
        token.cancel()  # the call had already ended
    return token


class Servicer:
    """SplitInference (registered on a gRPC server by ``add_servicer``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._roots: list[str] | None = None

    def _said(self, message: str) -> str:
        """A failure's message without the server's paths (``common.redact``)."""
        if self._roots is None:
            import tempfile

            models, tmp = Path(self.backend.config.models_dir), tempfile.gettempdir()
            self._roots = [str(models), str(models.absolute()), str(models.resolve()), tmp, os.path.realpath(tmp)]
        return redact(message, self._roots)

    def _remaining(self, context: grpc.ServicerContext) -> float:
        left = _own_deadline_s(context)  # ``remaining_s``, one call fewer: per request
        return self.backend.config.default_deadline_s if left is None else left

    def Infer(self, request: wire.Framed | wire.Malformed, context: grpc.ServicerContext) -> wire.Framed:
        try:
            if isinstance(request, wire.Malformed):
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"Infer: {request.message}")
            return self.backend.handler.infer(request, self._remaining(context), call_token(context))
        except RpcFailure as exc:
            if exc.retry_after_ms is not None:  # queue full: when to come back
                context.set_trailing_metadata(((wire.RETRY_AFTER_KEY, f"{exc.retry_after_ms:g}"),))
            context.abort(exc.code, self._said(exc.message))
            raise AssertionError("unreachable") from exc

    def InferStream(
        self, request_iterator: Iterator[wire.Framed | wire.Malformed], context: grpc.ServicerContext
    ) -> Iterator[wire.Framed | pb.InferReply]:
        # A failed frame is answered in its reply frame: the stream and the requests after it go on.
        token = call_token(context)
        for request in request_iterator:
            if isinstance(request, wire.Malformed):  # the frame has no readable request_id
                yield pb.InferReply(
                    load=self.backend.load(),
                    error=pb.Error(
                        code=grpc.StatusCode.INVALID_ARGUMENT.name, message=f"InferStream: {request.message}"
                    ),
                )
                continue
            try:
                yield self.backend.handler.infer(request, self._remaining(context), token)
            except RpcFailure as exc:
                yield pb.InferReply(
                    request_id=request.header.request_id,
                    load=self.backend.load(),
                    error=pb.Error(
                        code=exc.code.name, message=self._said(exc.message), retry_after_ms=exc.retry_after_ms or 0.0
                    ),
                )

    def Probe(
        self, request: pb.ProbeRequest | wire.ProbeBody | wire.Malformed, context: grpc.ServicerContext
    ) -> pb.ProbeReply:
        if isinstance(request, wire.Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Probe: {request.message}")
            raise AssertionError("unreachable")
        # From gRPC, the payload is only measured (``wire.probe_deserializer``); in process, a message.
        header, received = (
            (request.header, request.payload_bytes)
            if isinstance(request, wire.ProbeBody)
            else (request, len(request.payload))
        )
        n = int(header.reply_bytes)
        # Room for the reply's other fields; and a measurement needs no reply of a full message (building,
        # serialising and sending one holds the interpreter for long: ``PROBE_MAX_REPLY_BYTES``).
        limit = min(self.backend.config.max_message_bytes - 1024, PROBE_MAX_REPLY_BYTES)
        if n > limit:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"probe reply_bytes: expected at most {limit}, got {n}")
        if received > PROBE_MAX_PAYLOAD_BYTES:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"probe payload: expected at most {PROBE_MAX_PAYLOAD_BYTES} bytes, got {received}",
            )
        nbytes = n + received
        # A bandwidth probe is admitted like a request, each side counted three times (gRPC's and protobuf's
        # copies), until the reply has gone; an RTT ping is not, so liveness answers under load.
        held = self.backend.admitted("probe", 3 * nbytes) if nbytes > PROBE_FREE_BYTES else nullcontext()
        try:
            held.__enter__()
            try:
                reply = pb.ProbeReply(payload=bytes(n), received_bytes=received, load=self.backend.load())
                self.backend.next_hop.probe(header, reply, self._remaining(context))  # the next hop, if asked
            except BaseException:
                held.__exit__(None, None, None)
                raise
        except RpcFailure as exc:
            context.abort(exc.code, self._said(exc.message))
            raise AssertionError("unreachable") from exc
        add = getattr(context, "add_callback", None)  # an in-process fake context may not have it
        if add is None or not add(lambda: held.__exit__(None, None, None)):
            held.__exit__(None, None, None)
        return reply

    def Status(self, request: pb.StatusRequest | wire.Malformed, context: grpc.ServicerContext) -> pb.StatusReply:
        if isinstance(request, wire.Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Status: {request.message}")
        return self.backend.status()

    def PutModel(
        self, request_iterator: Iterator[pb.ModelChunk | wire.Malformed], context: grpc.ServicerContext
    ) -> pb.PutModelReply:
        # Cut below the minimum rate or past the deadline, even while waiting for a chunk (``pace``).
        paced = Paced(
            _well_formed(request_iterator, "PutModel"),
            self.backend.config.upload_pace,
            lambda code, message: cancel_call(context, code, message),
            deadline_s=_own_deadline_s(context),
        )
        try:
            return self.backend.put_model(iter(paced), self._remaining(context))
        except RpcFailure as exc:
            context.abort(exc.code, self._said(exc.message))
            raise AssertionError("unreachable") from exc
        finally:
            paced.close()


def _own_deadline_s(context: Any) -> float | None:
    """The call's own time left, None when it set no deadline (or an absurd one; NaN too), or an in-process
    context has none."""
    try:
        left = context.time_remaining()
    except Exception:  # an in-process context without deadlines
        return None
    return None if left is None or not left < MAX_WAIT_S else max(0.0, float(left))


def _well_formed(chunks: Iterator[pb.ModelChunk | wire.Malformed], method: str) -> Iterator[pb.ModelChunk]:
    for chunk in chunks:
        if isinstance(chunk, wire.Malformed):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {chunk.message}")
        yield chunk


def lenient(message_type: Any) -> Callable[[bytes], Any]:
    """``message_type.FromString`` that returns ``wire.Malformed`` instead of raising on bytes that do not
    parse: the method then answers INVALID_ARGUMENT (gRPC itself would answer INTERNAL)."""
    return wire.lenient_deserializer(message_type, message_type.FromString)


def add_servicer(servicer: Servicer, server: grpc.Server) -> None:
    """The generated ``add_SplitInferenceServicer_to_server``, but Infer and InferStream use the hand
    framing of ``splitrt.transport.wire`` (same bytes on the wire, payloads never copied by protobuf)."""
    framed: dict[str, Any] = {
        "request_deserializer": wire.lenient_deserializer(pb.InferRequest),
        "response_serializer": wire.serialize,
    }

    def stock(request: Any, reply: Any) -> dict[str, Any]:
        return {"request_deserializer": lenient(request), "response_serializer": reply.SerializeToString}

    handlers = {
        "Infer": grpc.unary_unary_rpc_method_handler(servicer.Infer, **framed),
        "InferStream": grpc.stream_stream_rpc_method_handler(servicer.InferStream, **framed),
        "Probe": grpc.unary_unary_rpc_method_handler(
            servicer.Probe,
            request_deserializer=wire.probe_deserializer,
            response_serializer=pb.ProbeReply.SerializeToString,
        ),
        "Status": grpc.unary_unary_rpc_method_handler(servicer.Status, **stock(pb.StatusRequest, pb.StatusReply)),
        "PutModel": grpc.stream_unary_rpc_method_handler(servicer.PutModel, **stock(pb.ModelChunk, pb.PutModelReply)),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(wire.SERVICE_NAME, handlers)


def add_health(health: Any, server: grpc.Server) -> None:
    """``health_pb2_grpc.add_HealthServicer_to_server``, but bytes that do not parse are INVALID_ARGUMENT
    (the generated handlers answer INTERNAL: "Exception deserializing request!")."""
    from grpc_health.v1 import health_pb2

    def check(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, wire.Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Check: {request.message}")
        return health.Check(request, context)

    def watch(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if isinstance(request, wire.Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Watch: {request.message}")
        yield from health.Watch(request, context)

    stock: dict[str, Any] = {
        "request_deserializer": lenient(health_pb2.HealthCheckRequest),
        "response_serializer": health_pb2.HealthCheckResponse.SerializeToString,
    }
    handlers = {
        "Check": grpc.unary_unary_rpc_method_handler(check, **stock),
        "Watch": grpc.unary_stream_rpc_method_handler(watch, **stock),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("grpc.health.v1.Health", handlers),))
    server.add_registered_method_handlers("grpc.health.v1.Health", handlers)
