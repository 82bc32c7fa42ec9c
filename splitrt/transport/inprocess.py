"""``Transport`` that calls a servicer's methods directly, in the calling thread: a FAKE cloud for pure,
fast tests (no ports, no gRPC threads). Not for production, and not a substitute for the gRPC tests.

What it keeps of gRPC: every message crosses as bytes through the same (de)serializers as over a channel
(``wire.serialize``, ``wire.lenient_deserializer`` / ``wire.deserializer``, protobuf for the rest), so the
servicer sees what it would see from a socket (read-only payload views, ``wire.Malformed`` for garbage);
the client's message limit (``RESOURCE_EXHAUSTED``); and the failures, mapped by ``wire.cloud_error`` as
the gRPC transport maps them: ``context.abort(code, details)`` -> that code, an exception in the
servicer or in the request iterator -> ``UNKNOWN``, a call that outlived its timeout ->
``DEADLINE_EXCEEDED``.

What it does not: server interceptors (no auth), TLS, the server's own message limit and thread pool,
cancelling a call at its deadline (the deadline is checked when the servicer returns or yields), and
concurrency between a stream's requests and replies (they alternate, in lockstep).

- ``InProcessTransport(CloudServer(...).servicer)``: calls the servicer in the caller's thread through the same
  serializers, with a fake context; for fast tests only (no auth, TLS or server-side limits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol

import grpc

from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire
from splitrt.transport.base import describe_infer, describe_upload


class Servicer(Protocol):
    """The methods of ``splitrt_pb2_grpc.SplitInferenceServicer`` (the cloud's servicer has them)."""

    def Infer(self, request: Any, context: Any) -> Any: ...

    def InferStream(self, request_iterator: Any, context: Any) -> Any: ...

    def Probe(self, request: Any, context: Any) -> Any: ...

    def Status(self, request: Any, context: Any) -> Any: ...

    def PutModel(self, request_iterator: Any, context: Any) -> Any: ...


class _Status(grpc.RpcError):
    """A call's failure as a gRPC client would see it (``code()``, ``details()``: what ``wire.cloud_error``
    reads), so both transports map failures through the same function."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


class FakeContext:
    """The parts of ``grpc.ServicerContext`` a servicer uses. ``abort`` records ``(code, details)`` in
    ``aborted`` and unwinds the servicer; the transport turns it into the caller's ``CloudError``."""

    def __init__(self, timeout_s: float | None) -> None:
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.aborted: tuple[grpc.StatusCode, str] | None = None
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: tuple[tuple[str, str], ...] = ()

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self.aborted = (code, details)
        raise _Status(code, details, self.trailing)

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = tuple(metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def is_active(self) -> bool:
        return not self.expired()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def peer(self) -> str:
        return "in-process"


class InProcessTransport:
    """``servicer``'s methods as a ``Transport`` (see the module docstring for what is faked)."""

    def __init__(
        self,
        servicer: Servicer,
        *,
        address: str = "in-process",
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.servicer = servicer
        self._address = address
        self._max_message_bytes = max_message_bytes
        self._parse_request = wire.lenient_deserializer(pb.InferRequest)
        self._parse_reply = wire.deserializer(pb.InferReply)

    @property
    def address(self) -> str:
        return self._address

    def _cross(self, message: Any, parse: Callable[[bytes], Any], direction: str) -> Any:
        """``message`` after a trip through its wire bytes, under the client's message limit."""
        data = wire.serialize(message)
        if len(data) > self._max_message_bytes:
            raise _Status(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{direction} message larger than max ({len(data)} vs. {self._max_message_bytes})",
            )
        return parse(data)

    @contextmanager
    def _boundary(
        self, context: FakeContext, what: Callable[[], str], requests_failed: list[bool] | None = None
    ) -> Iterator[None]:
        """Whatever the servicer did, the caller gets a reply or ``CloudError``, as over gRPC."""
        try:
            yield
            if context.code is not None and context.code != grpc.StatusCode.OK:  # set_code, no abort
                raise _Status(context.code, context.details)
            if context.expired():
                raise _Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except Exception as exc:
            if context.expired():  # the client's deadline fires before whatever the server says
                status = _Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif isinstance(exc, _Status):
                status = exc
            elif requests_failed:
                status = _Status(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
            else:
                status = _Status(grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}")
            raise wire.cloud_error(status, what()) from exc

    def infer(self, request: wire.Framed, *, timeout_s: float) -> wire.Framed:
        context = FakeContext(timeout_s)
        with self._boundary(context, lambda: describe_infer(request.header, self._address)):
            sent = self._cross(request, self._parse_request, "Sent")
            reply: wire.Framed = self._cross(self.servicer.Infer(sent, context), self._parse_reply, "Received")
        return reply

    def infer_stream(self, requests: Iterable[wire.Framed], *, timeout_s: float | None = None) -> Iterator[wire.Framed]:
        context = FakeContext(timeout_s)
        sent: list[Any] = [None]  # the last request's header, for the error message
        failed = [False]

        def crossed() -> Iterator[Any]:
            try:
                for request in requests:
                    sent[0] = request.header
                    yield self._cross(request, self._parse_request, "Sent")
            except Exception:
                failed[0] = True
                raise

        with self._boundary(context, lambda: describe_infer(sent[0], self._address, stream=True), failed):
            for reply in self.servicer.InferStream(crossed(), context):
                if context.expired():
                    raise _Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                yield self._cross(reply, self._parse_reply, "Received")

    def probe(self, request: pb.ProbeRequest, *, timeout_s: float) -> pb.ProbeReply:
        context = FakeContext(timeout_s)
        with self._boundary(context, lambda: f"probe of {self._address}"):
            sent = self._cross(request, pb.ProbeRequest.FromString, "Sent")
            reply: pb.ProbeReply = self._cross(self.servicer.Probe(sent, context), pb.ProbeReply.FromString, "Received")
        return reply

    def status(self, *, timeout_s: float) -> pb.StatusReply:
        context = FakeContext(timeout_s)
        with self._boundary(context, lambda: f"status of {self._address}"):
            reply: pb.StatusReply = self._cross(
                self.servicer.Status(pb.StatusRequest(), context), pb.StatusReply.FromString, "Received"
            )
        return reply

    def put_model(self, chunks: Iterable[pb.ModelChunk], *, timeout_s: float) -> pb.PutModelReply:
        context = FakeContext(timeout_s)
        first: list[pb.ModelChunk | None] = [None]  # names the model in the error message
        failed = [False]

        def crossed() -> Iterator[pb.ModelChunk]:
            try:
                for chunk in chunks:
                    if first[0] is None:
                        first[0] = chunk
                    yield self._cross(chunk, pb.ModelChunk.FromString, "Sent")
            except Exception:
                failed[0] = True
                raise

        with self._boundary(context, lambda: describe_upload(first[0], self._address), failed):
            reply: pb.PutModelReply = self._cross(
                self.servicer.PutModel(crossed(), context), pb.PutModelReply.FromString, "Received"
            )
        return reply

    def close(self) -> None:
        """Nothing to release: the servicer belongs to the caller."""
