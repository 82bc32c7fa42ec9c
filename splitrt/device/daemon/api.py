"""The daemon's local API for apps: ``LocalInference`` in ``proto/splitrt.proto`` (``Infer``, ``GetPlan``)
on a unix socket and/or a loopback TCP address. :class:`LocalServicer` serves it from a running
:class:`~splitrt.device.daemon.process.Daemon`; :class:`LocalClient` is the Python client.

- ``LocalClient(address | socket path).infer(inputs, model=, deadline_ms=) -> LocalResult``; ``.plan()``;
  INVALID_ARGUMENT -> ``InputError``, other statuses -> ``CloudError(code=...)``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import grpc
import numpy as np

from splitrt.device.daemon.runtimes import ServedModel
from splitrt.errors import CloudError, CodecError, InputError, SplitrtError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack

log = logging.getLogger("splitrt.device.daemon")


class InferOptions(TypedDict, total=False):
    """``Daemon.infer``'s keywords: the request's deadline and its id."""

    deadline_ms: float | None
    request: str | None


class Models(Protocol):
    """What the local API serves with: the ``process.Daemon`` that starts it."""

    def model(self, name: str) -> ServedModel: ...
    def count_failed(self, model: ServedModel) -> None: ...
    def plan(self, model: ServedModel) -> dict[str, Any]: ...
    def infer(self, model: ServedModel, inputs: Mapping[str, np.ndarray], **options: Unpack[InferOptions]) -> Any: ...


class LocalServicer(pb_grpc.LocalInferenceServicer):
    def __init__(self, daemon: Models) -> None:
        self.d = daemon

    def _model(self, name: str, context: grpc.ServicerContext) -> ServedModel:
        try:
            return self.d.model(name)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        raise AssertionError("unreachable")

    def Infer(self, request: pb.LocalInferRequest, context: grpc.ServicerContext) -> pb.LocalInferReply:
        m = self._model(request.model, context)
        rid = request.request_id or uuid.uuid4().hex[:12]
        inputs: dict[str, np.ndarray] = {}
        try:
            for t in request.tensors:
                if t.name in inputs:
                    raise InputError(f"tensor {t.name!r}: expected each input once, got it twice")
                inputs[t.name] = codec.decode(wire.from_proto(t))
        except (CodecError, InputError) as exc:
            self.d.count_failed(m)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            out = self.d.infer(m, inputs, deadline_ms=request.deadline_ms or None, request=rid)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SplitrtError as exc:
            log.warning("request %s failed: %s", rid, exc)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        reply = pb.LocalInferReply(
            request_id=rid, plan=out.plan, latency_ms=out.latency_ms, fallback=out.fallback, server=out.server or ""
        )
        raw = codec.Codec.parse("fp32")
        for name, value in out.outputs.items():
            wire.add_tensor(reply.outputs, codec.encode(name, np.asarray(value), raw))
        return reply

    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext) -> pb.GetPlanReply:
        m = self._model(request.model, context)
        p = self.d.plan(m)
        clouds = [
            pb.CloudState(
                address=str(c["address"]),
                up=bool(c["up"]),
                rtt_ms=float(c["rtt_ms"]) if c["rtt_ms"] is not None else -1.0,
                last_error=str(c["last_error"]),
            )
            for c in p["clouds"]
        ]
        return pb.GetPlanReply(
            model=m.config.name,
            sha256=p["sha256"],
            plan=p["plan"] or "",
            policy=p["policy"],
            objective=p["objective"],
            bandwidth_mbps=p["bandwidth_mbps"],
            rtt_ms=p["rtt_ms"],
            confidence=p["confidence"],
            device_load=p["device_load"],
            cloud_load=p["cloud_load"],
            clouds=clouds,
            completed=p["completed"],
            failed=p["failed"],
            fallbacks=p["fallbacks"],
            switches=p["switches"],
            cost_table=p["cost_table"],
        )


def add_local_servicer(servicer: LocalServicer, server: grpc.Server) -> None:
    """The generated ``add_LocalInferenceServicer_to_server``, but bytes that do not parse are
    INVALID_ARGUMENT naming the expected message (the generated handlers answer INTERNAL)."""

    def method(call: Any, request_type: Any, reply_type: Any) -> grpc.RpcMethodHandler:
        full_name = request_type.DESCRIPTOR.full_name

        def deserialize(data: bytes) -> Any:
            try:
                return request_type.FromString(data)
            except Exception as exc:  # protobuf's DecodeError, bad UTF-8 in a string field, ...
                return wire.Malformed(
                    f"expected a protobuf-encoded {full_name}, got {len(data)} bytes that "
                    f"do not parse ({type(exc).__name__}: {str(exc)[:200]})"
                )

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, wire.Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return call(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=deserialize, response_serializer=reply_type.SerializeToString
        )

    name = pb.DESCRIPTOR.services_by_name["LocalInference"].full_name
    handlers = {
        "Infer": method(servicer.Infer, pb.LocalInferRequest, pb.LocalInferReply),
        "GetPlan": method(servicer.GetPlan, pb.GetPlanRequest, pb.GetPlanReply),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


@dataclass(frozen=True, kw_only=True)
class LocalResult:
    request_id: str
    outputs: dict[str, np.ndarray]
    plan: str
    latency_ms: float
    fallback: bool
    server: str | None


class LocalClient:
    """Apps' client of the daemon: ``LocalClient("unix:/run/splitrt/daemon.sock")`` or
    ``LocalClient("127.0.0.1:50100")``. ``infer`` raises ``InputError`` for inputs the model rejects
    (INVALID_ARGUMENT) and ``CloudError`` (with the gRPC ``code``) for anything else."""

    def __init__(self, address: str, *, timeout_s: float = 60.0) -> None:
        if address.startswith("/"):
            address = f"unix:{address}"
        self.address = address
        self.timeout_s = timeout_s
        mb = wire.DEFAULT_MAX_MESSAGE_BYTES
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_send_message_length", mb), ("grpc.max_receive_message_length", mb)]
        )
        self._stub = pb_grpc.LocalInferenceStub(self._channel)

    def _error(self, exc: grpc.RpcError, what: str) -> SplitrtError:
        code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == "INVALID_ARGUMENT":
            return InputError(details)
        return CloudError(
            f"daemon {self.address}: {what}: {code}: {details}", code=code, retryable=code in wire.RETRYABLE_CODES
        )

    def infer(
        self, inputs: Mapping[str, Any], *, model: str = "", deadline_ms: float = 0.0, request_id: str = ""
    ) -> LocalResult:
        req = pb.LocalInferRequest(model=model, deadline_ms=deadline_ms, request_id=request_id)
        raw = codec.Codec.parse("fp32")
        for name, value in inputs.items():
            wire.add_tensor(req.tensors, codec.encode(name, np.ascontiguousarray(value), raw))
        try:
            reply = self._stub.Infer(req, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc, "Infer") from exc
        outputs = {t.name: codec.decode(wire.from_proto(t)) for t in reply.outputs}
        return LocalResult(
            request_id=reply.request_id,
            outputs=outputs,
            plan=reply.plan,
            latency_ms=reply.latency_ms,
            fallback=reply.fallback,
            server=reply.server or None,
        )

    def plan(self, model: str = "") -> pb.GetPlanReply:
        try:
            return self._stub.GetPlan(pb.GetPlanRequest(model=model), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc, "GetPlan") from exc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
