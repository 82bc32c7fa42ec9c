"""A server's next hop (``--next``; operators: docs/operator/tiers.md): a request for ``cut_id`` A and
``next_cut_id`` B runs A -> B here and ``NextHop.forward`` sends B's tensors on. A failing next hop loses
nothing: this server runs B's tail itself, says so in ``next_error`` and skips the hop for a doubling,
capped backoff (a ``Probe`` with ``next_probe`` always tries it).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.cloud.config import NextTier
from splitrt.errors import CloudError, CodecError, CutError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

if TYPE_CHECKING:
    from splitrt.transport.base import Transport

DEVICE_CUT = "device"


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


class NextHop:
    """The link to the next hop (``CloudServer.next_hop``): forwards, probes, backs off after failures.
    ``forwarded`` / ``finished_here`` count the requests with a ``next_cut_id`` that went on / ended here."""

    def __init__(self, next_tier: NextTier | None, max_message_bytes: int) -> None:
        self.next = next_tier
        self.max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._transport: Transport | None = None
        self._down_until = 0.0
        self._backoff_s = next_tier.backoff_initial_s if next_tier else 0.0
        self._timeouts = 0  # forwards timed out in a row
        self.forwarded = 0
        self.finished_here = 0

    def finished(self) -> None:
        with self._lock:
            self.finished_here += 1

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

    def forward(
        self, h: pb.InferRequest, env: dict[str, Any], spec: codec.Codec, deadline: float, reply: pb.InferReply
    ) -> list[codec.Encoded] | None:
        """The next hop's encoded outputs for the tensors crossing ``h.next_cut_id`` (``env``), or None
        (``reply.next_error`` says why) to finish here. ``deadline``: ``time.monotonic()``'s clock."""
        now = time.monotonic()
        reply.next_address = self.address
        skip = self._skip(now)
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
