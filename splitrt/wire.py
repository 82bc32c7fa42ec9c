"""What device and cloud share about the wire: proto <-> codec conversions, channel options, errors.

Kept apart from ``codec`` (pure, no protobuf) and from ``cloud``/``device`` (one side each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from splitrt import splitrt_pb2 as pb
from splitrt.codec import Encoded
from splitrt.errors import CloudError

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVICE_NAME = "splitrt.v1.SplitInference"
# Status codes after which the same request may succeed later, elsewhere, or locally.
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED",
                             "INTERNAL", "UNKNOWN"})

# ONNX Runtime type strings -> numpy dtype names.
ORT_DTYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
    "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


def to_proto(e: Encoded) -> pb.Tensor:
    return pb.Tensor(name=e.name, dtype=e.dtype, shape=list(e.shape), codec=e.codec, payload=e.payload)


def add_tensor(repeated: Any, e: Encoded) -> int:
    """Append ``e`` to a repeated Tensor field in place (no message copy); returns the payload bytes."""
    repeated.add(name=e.name, dtype=e.dtype, shape=e.shape, codec=e.codec, payload=e.payload)
    return len(e.payload)


def from_proto(t: pb.Tensor) -> Encoded:
    return Encoded(name=t.name, dtype=t.dtype, shape=tuple(int(d) for d in t.shape), codec=t.codec,
                   payload=t.payload)


def channel_options(max_message_bytes: int, keepalive_s: float) -> list[tuple[str, Any]]:
    """Client channel options: raised message limits, keep-alive pings."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def server_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Server options: raised message limits; accept the clients' keep-alive pings."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.so_reuseport", 0),
    ]


@dataclass(frozen=True, kw_only=True)
class LoadInfo:
    """The cloud's load as reported in a reply."""

    queue_depth: int
    running: int
    workers: int
    cpu_percent: float

    @classmethod
    def from_proto(cls, load: pb.Load) -> LoadInfo:
        return cls(queue_depth=load.queue_depth, running=load.running, workers=load.workers,
                   cpu_percent=load.cpu_percent)


def cloud_error(exc: grpc.RpcError, what: str) -> CloudError:
    """Map a gRPC error to ``CloudError`` (code name, retryable) with the server's message."""
    code_obj = exc.code() if hasattr(exc, "code") else None
    code = code_obj.name if code_obj is not None else "UNKNOWN"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return CloudError(f"{what}: {code}: {details}", code=code, retryable=code in RETRYABLE_CODES)


def ort_dtype(type_str: str) -> str:
    return ORT_DTYPES.get(type_str, type_str)


def shape_matches(expected: tuple[int | str | None, ...], actual: tuple[int, ...]) -> bool:
    """True when ``actual`` fits ``expected`` (symbolic/unknown dims match any size)."""
    if len(expected) != len(actual):
        return False
    return all(not isinstance(e, int) or e < 0 or e == a for e, a in zip(expected, actual, strict=True))


def describe_shape(shape: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def as_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)
