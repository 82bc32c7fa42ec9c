"""What a device sends and gets back: the head's result, the ``InferRequest`` made from it, the reply's
outputs decoded (and checked: ``DATA_LOSS`` when they do not decode or are not the ones expected), stream
frames' results, and the result types (``SplitResult``, ``ProbeResult``, an edge's ``Hops``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from splitrt.errors import CloudError, CodecError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb


@dataclass(frozen=True, kw_only=True)
class HeadResult:
    """The head's work for one request: what the tail needs (``crossing``, sent) and the graph outputs
    already on the device (``kept``: never sent, never replied; the outputs are assembled from both)."""

    cut_id: str
    crossing: dict[str, np.ndarray]
    head_ms: float
    kept: dict[str, np.ndarray] = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: os.urandom(8).hex())  # 16 hex digits, as uuid4().hex[:16]


@dataclass(frozen=True, kw_only=True)
class Hops:
    """Three tiers: an edge's account of a request (``InferReply.edge_ms``, ``next_*``)."""

    edge_ms: float  # arrival to reply at the edge: the device's hop is its round trip minus this
    next_ms: float  # the edge's round trip to its next tier (0: not forwarded)
    next_tail_ms: float
    next_queue_ms: float
    next_bytes_up: int
    next_bytes_down: int
    next_address: str
    forwarded: bool  # False: the edge finished the request itself
    next_error_code: str = ""  # the next tier failed (the edge then finished)
    next_error: str = ""
    next_load: wire.LoadInfo | None = None

    @classmethod
    def from_reply(cls, r: pb.InferReply) -> Hops:
        forwarded = r.HasField("next_load") and not r.next_error.code
        return cls(
            edge_ms=r.edge_ms,
            next_ms=r.next_ms,
            next_tail_ms=r.next_tail_ms,
            next_queue_ms=r.next_queue_ms,
            next_bytes_up=r.next_bytes_up,
            next_bytes_down=r.next_bytes_down,
            next_address=r.next_address,
            forwarded=forwarded,
            next_error_code=r.next_error.code,
            next_error=r.next_error.message,
            next_load=wire.LoadInfo.from_proto(r.next_load) if forwarded else None,
        )


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Where a split request's time went, by stage: the device's head and encoding, the call, the server's
    decoding, tail and queue."""

    head_ms: float = 0.0
    encode_ms: float = 0.0
    rpc_ms: float = 0.0
    decode_ms: float = 0.0
    tail_ms: float = 0.0
    queue_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SplitResult(StageTimes):
    """Outputs and where the time went (milliseconds)."""

    outputs: dict[str, np.ndarray]
    cut_id: str
    codec: str
    where: str  # "cloud" or "local"
    request_id: str
    build_ms: float = 0.0  # the cloud built the tail session for this request (its first on the cut)
    check_ms: float = 0.0  # the model check before the call (once per cloud: a one-off, not in total_ms)
    total_ms: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    load: wire.LoadInfo | None = None
    # Only for stream frames that failed (outputs then empty).
    error: CloudError | None = None
    # Three tiers (``send(..., next_cut=)``): the edge's per-hop account.
    hops: Hops | None = None
    # Of ``network_ms``: the wait behind the device's own bandwidth probe on the wire (``device.runtime``).
    probe_wait_ms: float = 0.0

    @property
    def network_ms(self) -> float:
        """Round trip minus the cloud's queue, session build and tail time: wire + gRPC + (de)serialisation."""
        return self.rpc_ms - self.tail_ms - self.queue_ms - self.build_ms

    @property
    def overhead_ms(self) -> float:
        """End to end minus head and tail compute."""
        return self.total_ms - self.head_ms - self.tail_ms

    def timings(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "cut_id",
                "codec",
                "where",
                "request_id",
                "head_ms",
                "encode_ms",
                "rpc_ms",
                "decode_ms",
                "tail_ms",
                "queue_ms",
                "build_ms",
                "total_ms",
                "bytes_up",
                "bytes_down",
            )
        } | {"network_ms": self.network_ms, "overhead_ms": self.overhead_ms}


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    up_bytes: int
    down_bytes: int
    seconds: float
    load: wire.LoadInfo
    # ``probe(..., next_bytes=)`` through an edge: its round trip to its next tier (None: failed, see
    # ``next_error``), and that tier's load.
    next_ms: float | None = None
    next_error: str = ""
    next_load: wire.LoadInfo | None = None


def encode_request(
    head: HeadResult, spec: codec.Codec, *, sha256: str, output_codec: str, next_cut_id: str = "", next_codec: str = ""
) -> tuple[wire.Framed, int]:
    """The ``InferRequest`` for ``head`` and its payload bytes (raw/fp32 payloads are views of the
    head's arrays: the serializer copies them once). ``next_cut_id``: an edge runs up to it and forwards."""
    header = pb.InferRequest(
        model_sha256=sha256,
        cut_id=head.cut_id,
        codec=str(spec),
        request_id=head.request_id,
        output_codec=output_codec,
        next_cut_id=next_cut_id,
        next_codec=next_codec,
    )
    tensors = [codec.encode(n, a, spec, copy=False) for n, a in head.crossing.items()]
    return wire.Framed(header=header, tensors=tensors), sum(e.nbytes for e in tensors)


def decode_reply(
    reply: wire.Framed, output_names: tuple[str, ...], *, max_bytes: int, cloud: str | None, also: tuple[str, ...] = ()
) -> tuple[dict[str, np.ndarray], int]:
    """The outputs in ``reply`` (copied out of the message) and their payload bytes; ``DATA_LOSS`` when
    they do not decode within ``max_bytes`` each or are not ``output_names`` (the graph outputs the
    tail makes). Names in ``also`` may come too and are dropped (outputs the device holds already, which
    servers from before the reply carried only the tail's own return as well)."""
    try:
        encoded = [e for e in reply.tensors if e.name not in also or e.name in output_names]
        outs = {e.name: codec.decode(e, max_bytes=max_bytes) for e in encoded}
    except CodecError as exc:
        raise CloudError(f"reply from {cloud} does not decode: {exc}", code="DATA_LOSS") from exc
    if set(outs) != set(output_names):
        raise CloudError(
            f"reply from {cloud}: expected outputs {sorted(output_names)}, got {sorted(outs)}", code="DATA_LOSS"
        )
    return {n: np.array(outs[n]) for n in output_names}, sum(e.nbytes for e in encoded)


def frame_result(
    framed: wire.Framed,
    head: HeadResult,
    *,
    cut: str,
    spec: codec.Codec,
    bytes_up: int,
    t_sent: float,
    decode: Callable[[wire.Framed], tuple[dict[str, np.ndarray], int]],
) -> SplitResult:
    """One stream frame's result; a frame the cloud failed carries ``error`` (and no outputs)."""
    reply = framed.header
    common: dict[str, Any] = {
        "cut_id": cut,
        "codec": str(spec),
        "where": "cloud",
        "request_id": head.request_id,
        "head_ms": head.head_ms,
        "rpc_ms": (time.perf_counter() - t_sent) * 1e3,
        "tail_ms": reply.tail_ms,
        "queue_ms": reply.queue_ms,
        "build_ms": reply.build_ms,
        "bytes_up": bytes_up,
        "load": wire.LoadInfo.from_proto(reply.load),
    }
    if reply.error.code:
        err = CloudError(
            f"frame {head.request_id}: {reply.error.code}: {reply.error.message}",
            code=reply.error.code,
            retryable=reply.error.code in wire.RETRYABLE_CODES,
            retry_after_ms=reply.error.retry_after_ms or None,
        )
        return SplitResult(outputs={}, error=err, **common)
    outputs, bytes_down = decode(framed)
    total = head.head_ms + (time.perf_counter() - t_sent) * 1e3
    return SplitResult(outputs=outputs, total_ms=total, bytes_down=bytes_down, **common)


def assemble(
    names: tuple[str, ...], kept: Mapping[str, np.ndarray], made: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The graph outputs in model order, from what the device kept and what the tail made."""
    return {n: kept[n] if n in kept else made[n] for n in names}
