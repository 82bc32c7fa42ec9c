"""The edge tier: a server started with a next tier (``splitrt serve --next HOST:PORT``) runs the middle
of a three-tier chain and forwards the rest.

A request naming ``next_cut_id`` B (besides its ``cut_id`` A) is run from A up to B here (the middle
segment, ``partition.split(graph, [A, B])[1]``, cached in the ``TailCache`` as ``"A>B"``); the tensors
crossing B go to the next tier in an ordinary request for cut B, and the next tier's outputs come back
to the device as they arrived (not decoded here). B = ``device``: the middle is the whole rest, nothing
is forwarded. The reply says where the time went per hop (``edge_ms``, ``next_ms``, ``next_tail_ms``, ...).

The next tier failing (down, slow, refusing) loses nothing: the edge has the model, so it runs B's tail
itself and says so in ``next_error``; after a failure it skips the next tier for a backoff (doubling,
capped) and finishes requests itself, while a ``Probe`` with ``next_probe`` always tries it (the device's
prober revives the path). A server without a next tier answers such requests the same way.

A worker slot is held while a segment runs, never while the forward is on the wire.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import numpy as np

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.cloud.inputs import check_inputs, decode_inputs
from splitrt.cloud.tails import Tail, TailCache
from splitrt.errors import CloudError, CodecError, CutError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

if TYPE_CHECKING:
    from splitrt.cloud.admission import Admission
    from splitrt.cloud.cancel import CallToken, Canceller
    from splitrt.cloud.store import ModelStore
    from splitrt.transport.base import Transport

DEVICE_CUT = "device"


@dataclass(frozen=True, kw_only=True)
class NextTier:
    """Where an edge forwards to, and how it treats a next tier that does not answer."""

    address: str
    token: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_ca_path: Path | None = None
    # The forward's timeout is the request's time left minus this reserve (for finishing here), capped.
    reserve_s: float = 0.25
    timeout_s: float = 30.0
    # After a failure, finish requests here without trying the next tier for this long (doubling).
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 5.0


class RelayBackend(Protocol):
    """What the relay needs of the server (``CloudServer`` is one)."""

    store: ModelStore
    tails: TailCache
    admission: Admission
    canceller: Canceller
    max_decoded_bytes: int

    def load(self) -> pb.Load: ...


def check_cuts(graph: Any, cut_id: str, next_cut_id: str) -> None:
    """``RpcFailure``: NOT_FOUND for an unknown cut, INVALID_ARGUMENT when B is not A or a later cut."""
    try:
        a, b = graph.cut(cut_id), graph.cut(next_cut_id)
    except CutError as exc:
        raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"cut of model {graph.sha256[:12]}: {exc}") from exc
    if a.head_mask & ~b.head_mask:
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"next_cut_id {next_cut_id!r} is before cut_id {cut_id!r}: expected a cut whose head "
            f"contains the head of {cut_id!r} (at or after it, device -> cloud), got {next_cut_id!r}",
        )


def _monotonic(deadline: float) -> float:
    """A ``time.perf_counter()`` deadline on ``time.monotonic()``'s clock (the canceller's)."""
    return time.monotonic() + (deadline - time.perf_counter())


class Relay:
    """The edge's request path and probe forwarding (``CloudServer.relay``)."""

    def __init__(self, backend: RelayBackend, next_tier: NextTier | None, max_message_bytes: int) -> None:
        self.backend = backend
        self.next = next_tier
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._transport: Transport | None = None
        self._down_until = 0.0
        self._backoff_s = next_tier.backoff_initial_s if next_tier else 0.0
        self._timeouts = 0  # forwards timed out in a row
        self.forwarded = 0
        self.finished_here = 0

    @property
    def address(self) -> str:
        return self.next.address if self.next else ""

    def _link(self) -> Transport:
        assert self.next is not None
        with self._lock:
            if self._transport is None:
                from splitrt.transport.grpc_transport import GrpcTransport

                n = self.next
                self._transport = GrpcTransport(
                    n.address,
                    token=n.token,
                    max_message_bytes=self.max_message_bytes,
                    tls=n.tls,
                    tls_ca_path=n.tls_ca_path,
                )
            return self._transport

    def _failed(self, now: float) -> None:
        with self._lock:
            self._down_until = now + self._backoff_s
            self._backoff_s = min(2 * self._backoff_s, self.next.backoff_max_s if self.next else 0.0)

    def _answered(self) -> None:
        with self._lock:
            self._timeouts = 0
            self._down_until = 0.0
            self._backoff_s = self.next.backoff_initial_s if self.next else 0.0

    def _skip(self, now: float) -> str:
        """Why not to forward now ("" to forward)."""
        if self.next is None:
            return "this server has no next tier (start it with --next HOST:PORT)"
        with self._lock:
            if now < self._down_until:
                return f"next tier {self.next.address} failed {self._backoff_s:.2f} s backoff ago; not retried yet"
        return ""

    # -- requests ----------------------------------------------------------------------------------
    def _run(
        self, tail: Tail, feeds: dict[str, np.ndarray], deadline: float, what: str, token: CallToken | None = None
    ) -> list[Any]:
        a = self.backend.admission
        if not a.acquire(deadline - time.perf_counter()):
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{what}: expected a worker within the deadline, got none free in time",
            )
        try:
            return self.backend.canceller.run(
                tail.session, tail.outputs, feeds, what=what, deadline=_monotonic(deadline), token=token
            )
        finally:
            a.release_slot()

    def infer(self, request: wire.Framed, deadline_s: float, t0: float, token: CallToken | None = None) -> wire.Framed:
        """Run ``cut_id`` -> ``next_cut_id`` here and forward the rest (admitted by the caller)."""
        h = request.header
        b = self.backend
        graph = b.store.graph(h.model_sha256)
        check_cuts(graph, h.cut_id, h.next_cut_id)
        deadline = t0 + deadline_s
        t_build = time.perf_counter()
        middle = b.tails.get(h.model_sha256, f"{h.cut_id}>{h.next_cut_id}")
        build_ms = (time.perf_counter() - t_build) * 1e3  # a first request's session build: not a queue
        check_inputs(request, middle, b.max_decoded_bytes)
        try:
            out_codec = codec.Codec.parse(h.output_codec or "fp32")
            next_codec = codec.Codec.parse(h.next_codec or "fp32")
        except CodecError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        a = b.admission
        if not a.acquire(deadline - time.perf_counter()):
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"waited {(time.perf_counter() - t0) * 1e3:.1f} ms for a worker: expected one within "
                f"the deadline of {deadline_s * 1e3:.1f} ms",
            )
        t_run = time.perf_counter()
        try:
            feeds = decode_inputs(request, b.max_decoded_bytes)
            t_run = time.perf_counter()
            values = b.canceller.run(
                middle.session,
                middle.outputs,
                feeds,
                what=f"segment {h.cut_id}>{h.next_cut_id}",
                deadline=_monotonic(deadline),
                token=token,
            )
        finally:
            a.release_slot()
        compute_ms = (time.perf_counter() - t_run) * 1e3
        env = dict(zip(middle.outputs, values, strict=True))
        reply = pb.InferReply(
            request_id=h.request_id, queue_ms=max((t_run - t0) * 1e3 - build_ms, 0.0), build_ms=build_ms
        )
        # The middle's outputs: what the next tier needs, and graph outputs made here (back to the device).
        sent = graph.cut(h.next_cut_id).tensor_names
        made = set(graph.cut(h.next_cut_id).kept) - set(graph.cut(h.cut_id).kept)
        outputs = {n: v for n, v in env.items() if n in made}
        if h.next_cut_id != DEVICE_CUT:
            forwarded = self._forward(request, {n: env[n] for n in sent}, next_codec, deadline, reply)
            if forwarded is not None:
                try:
                    own = [codec.encode(n, np.asarray(v), out_codec, copy=False) for n, v in outputs.items()]
                except CodecError as exc:
                    raise RpcFailure(grpc.StatusCode.INTERNAL, f"cannot encode outputs: {exc}") from exc
                return self._reply(reply, own + forwarded, compute_ms, t0)
            tail = b.tails.get(h.model_sha256, h.next_cut_id)
            t1 = time.perf_counter()
            values = self._run(
                tail,
                {n: np.asarray(env[n]) for n, _, _ in tail.inputs},
                deadline,
                f"tail of cut {h.next_cut_id!r} (next tier failed)",
                token,
            )
            compute_ms += (time.perf_counter() - t1) * 1e3
            outputs.update(zip(tail.outputs, values, strict=True))
        try:
            encoded = [codec.encode(n, np.asarray(v), out_codec, copy=False) for n, v in outputs.items()]
        except CodecError as exc:
            raise RpcFailure(grpc.StatusCode.INTERNAL, f"cannot encode outputs: {exc}") from exc
        with self._lock:
            self.finished_here += 1
        return self._reply(reply, encoded, compute_ms, t0)

    def _reply(self, reply: pb.InferReply, tensors: list[codec.Encoded], compute_ms: float, t0: float) -> wire.Framed:
        reply.tail_ms = compute_ms
        reply.load.CopyFrom(self.backend.load())
        reply.edge_ms = (time.perf_counter() - t0) * 1e3
        return wire.Framed(header=reply, tensors=tensors)

    def _forward(
        self, request: wire.Framed, env: dict[str, Any], spec: codec.Codec, deadline: float, reply: pb.InferReply
    ) -> list[codec.Encoded] | None:
        """The next tier's encoded outputs, or None (``reply.next_error`` says why) to finish here."""
        h = request.header
        now = time.perf_counter()
        reply.next_address = self.address
        skip = self._skip(time.monotonic())
        if skip:
            reply.next_error.CopyFrom(pb.Error(code=grpc.StatusCode.UNAVAILABLE.name, message=skip))
            return None
        assert self.next is not None
        try:
            tensors = [codec.encode(n, np.asarray(v), spec, copy=False) for n, v in env.items()]
        except CodecError as exc:  # e.g. a lossy codec refusing inf/NaN: finish here
            reply.next_error.CopyFrom(pb.Error(code=grpc.StatusCode.INVALID_ARGUMENT.name, message=str(exc)))
            return None
        header = pb.InferRequest(
            model_sha256=h.model_sha256,
            cut_id=h.next_cut_id,
            codec=str(spec),
            request_id=h.request_id,
            output_codec=h.output_codec,
        )
        timeout_s = min(self.next.timeout_s, max(0.001, deadline - now - self.next.reserve_s))
        t1 = time.perf_counter()
        try:
            answer = self._link().infer(wire.Framed(header=header, tensors=tensors), timeout_s=timeout_s)
        except CloudError as exc:
            # A timeout may be the request's short deadline, not the next tier: backoff only at the second
            # in a row (as the device runtime treats a cloud's timeouts).
            self._timeouts = self._timeouts + 1 if exc.code == "DEADLINE_EXCEEDED" else 0
            if exc.code != "DEADLINE_EXCEEDED" or self._timeouts >= 2:
                self._failed(time.monotonic())
            reply.next_ms = (time.perf_counter() - t1) * 1e3
            reply.next_error.CopyFrom(pb.Error(code=exc.code or "UNKNOWN", message=str(exc)))
            log_event(
                "next_failed", request_id=h.request_id, next=self.next.address, code=exc.code, error=str(exc)[:300]
            )
            return None
        self._answered()
        nh = answer.header
        reply.next_ms = (time.perf_counter() - t1) * 1e3
        reply.next_tail_ms, reply.next_queue_ms = nh.tail_ms, nh.queue_ms
        reply.next_bytes_up = sum(t.nbytes for t in tensors)
        reply.next_bytes_down = sum(t.nbytes for t in answer.tensors)
        reply.next_load.CopyFrom(nh.load)
        with self._lock:
            self.forwarded += 1
        return list(answer.tensors)

    # -- probes ------------------------------------------------------------------------------------
    def probe(self, request: pb.ProbeRequest, reply: pb.ProbeReply, timeout_s: float | None) -> None:
        """With ``next_probe``: probe the next tier with the requested sizes, into ``reply.next_*``."""
        if not request.next_probe:
            return
        if self.next is None:
            reply.next_error.CopyFrom(
                pb.Error(
                    code=grpc.StatusCode.FAILED_PRECONDITION.name,
                    message="this server has no next tier (start it with --next)",
                )
            )
            return
        reply.next_address = self.next.address
        limit = self.max_message_bytes - 1024  # as the servicer's own limit on reply_bytes
        sizes = (int(request.next_payload_bytes), int(request.next_reply_bytes))
        if max(sizes) > limit:
            msg = f"next probe sizes: expected at most {limit} bytes each, got {sizes}"
            reply.next_error.CopyFrom(pb.Error(code=grpc.StatusCode.INVALID_ARGUMENT.name, message=msg))
            return
        req = pb.ProbeRequest(payload=bytes(int(request.next_payload_bytes)), reply_bytes=int(request.next_reply_bytes))
        timeout = min(self.next.timeout_s, max(0.001, (timeout_s or self.next.timeout_s) - self.next.reserve_s))
        t0 = time.perf_counter()
        try:
            answer = self._link().probe(req, timeout_s=timeout)
        except CloudError as exc:
            self._failed(time.monotonic())
            reply.next_error.CopyFrom(pb.Error(code=exc.code or "UNKNOWN", message=str(exc)))
            return
        reply.next_ms = (time.perf_counter() - t0) * 1e3
        reply.next_load.CopyFrom(answer.load)
        self._answered()

    def close(self) -> None:
        with self._lock:
            link, self._transport = self._transport, None
        if link is not None:
            link.close()
