"""What device and cloud share about the wire: proto <-> codec conversions, channel options, errors.

Kept apart from ``codec`` (pure, no protobuf) and from ``cloud``/``device`` (one side each).

- Infer and InferStream are framed by hand on both ends (``wire.serialize``, ``wire.deserializer`` /
  ``wire.lenient_deserializer``): a ``wire.Framed(header, tensors)`` is the message without its tensors plus the
  ``Encoded`` tensors, whose payloads are joined once when sending and are read-only views of the received bytes
  when receiving. Same bytes as protobuf's encoding (field order aside), so stock peers interoperate both ways.
  Each payload is preceded by a ``Tensor.pad`` field (zeros) that puts it at a multiple of ``wire.ALIGN_BYTES``
  (16) in the message, so received views are aligned and used in place.
- The server reads a ``ProbeRequest`` with ``wire.probe_deserializer``: a ``ProbeBody(header, payload_bytes)``,
  the payload measured but never copied (protobuf's parse of a 64 MiB probe holds gRPC's polling thread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
import numpy as np

from splitrt.errors import CloudError
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.codec import Encoded

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVICE_NAME = "splitrt.v1.SplitInference"
# Status codes after which the same request may succeed later, elsewhere, or locally.
RETRYABLE_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED", "INTERNAL", "UNKNOWN"}
)

# ONNX Runtime type strings -> numpy dtype names.
ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


def to_proto(e: Encoded) -> pb.Tensor:
    return pb.Tensor(name=e.name, dtype=e.dtype, shape=list(e.shape), codec=e.codec, payload=bytes(e.payload))


def add_tensor(repeated: Any, e: Encoded) -> int:
    """Append ``e`` to a repeated Tensor field in place (no message copy); returns the payload bytes."""
    repeated.add(name=e.name, dtype=e.dtype, shape=e.shape, codec=e.codec, payload=bytes(e.payload))
    return len(e.payload)


def from_proto(t: pb.Tensor) -> Encoded:
    return Encoded(name=t.name, dtype=t.dtype, shape=tuple(int(d) for d in t.shape), codec=t.codec, payload=t.payload)


# -- Infer/InferStream messages framed by hand ------------------------------------------------------
# Protobuf would copy each payload into the message, again when serialising, and twice more when
# parsing (upb copies on parse and on field access). ``serialize`` writes the message without its
# tensors with protobuf, then each Tensor's fields with the payload bytes appended in one join;
# ``deserialize`` walks the wire format and keeps every payload as a view of the received bytes. The
# bytes are the proto's own encoding (field order aside), so stock protobuf peers interoperate.
# ``serialize`` also writes a ``Tensor.pad`` field (zeros) before each payload so that the payload starts
# at a multiple of ``ALIGN_BYTES`` in the message: received bytes objects start 16-byte aligned (CPython
# on 64-bit), so the views ``deserialize`` hands out are aligned for any dtype and numpy/onnxruntime
# use them in place instead of copying (an unaligned float32 input costs onnxruntime a copy).

# The repeated Tensor field of each framed message type, Tensor.payload and Tensor.pad.
_TENSOR_FIELDS = {pb.InferRequest: 5, pb.InferReply: 2}
_PAYLOAD_FIELD = 5
_PAD_FIELD = 15
_LEN = 2  # wire type of length-delimited fields
ALIGN_BYTES = 16
_ZEROS = bytes(ALIGN_BYTES + 8)


@dataclass(frozen=True)
class Framed:
    """An ``InferRequest``/``InferReply`` whose tensors travel outside protobuf: ``header`` is the message
    without them, ``tensors`` the encoded tensors (payloads may be views)."""

    header: Any
    tensors: list[Encoded]

    def to_message(self) -> Any:
        """The equivalent protobuf message (copies the payloads)."""
        message = type(self.header)()
        message.CopyFrom(self.header)
        field = message.DESCRIPTOR.fields_by_number[_TENSOR_FIELDS[type(message)]].name
        for e in self.tensors:
            add_tensor(getattr(message, field), e)
        return message


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Keys written on every message, encoded once.
_FIELD_KEYS = {t: _varint(n << 3 | _LEN) for t, n in _TENSOR_FIELDS.items()}
_PAYLOAD_KEY = _varint(_PAYLOAD_FIELD << 3 | _LEN)


def _varint_size(n: int) -> int:
    return (n.bit_length() + 6) // 7 or 1


def serialize(message: Framed | Any) -> bytes:
    """gRPC serializer: a ``Framed`` message in one copy of its payloads (or any protobuf message)."""
    if not isinstance(message, Framed):
        return bytes(message.SerializeToString())
    field_key = _FIELD_KEYS[type(message.header)]
    key_len = len(field_key)
    header = message.header.SerializeToString()
    parts: list[bytes | memoryview] = [header]
    offset = len(header)
    for e in message.tensors:
        head = pb.Tensor(name=e.name, dtype=e.dtype, shape=e.shape, codec=e.codec).SerializeToString()
        n = len(e.payload)
        payload_key = _PAYLOAD_KEY + _varint(n)
        before = len(head) + len(payload_key)
        fixed = before + n
        pad = _pad_field(offset + key_len + before, fixed) if n else b""
        size = _varint(fixed + len(pad))
        parts += [field_key, size, head, pad, payload_key, e.payload]
        offset += key_len + len(size) + fixed + len(pad)
    return b"".join(parts)


def _pad_field(before: int, fixed: int) -> bytes:
    """The ``Tensor.pad`` field (or nothing) that puts the payload at a multiple of ``ALIGN_BYTES``, given
    the payload's offset ``before`` without the tensor's length varint and the pad, and the tensor's size
    ``fixed`` without the pad (the length varint grows with the pad)."""
    # The smallest pad when the length varint keeps its size (nearly always): no search, one check.
    size = _varint_size(fixed)
    extra = -(before + size) % ALIGN_BYTES
    if extra == 1:
        extra += ALIGN_BYTES  # a pad field takes at least 2 bytes (key, length 0)
    if extra and _varint_size(fixed + extra) != size:
        extra = _pad_search(before, fixed)
    return b"" if extra == 0 else bytes([_PAD_FIELD << 3 | _LEN, extra - 2]) + _ZEROS[: extra - 2]


def _pad_search(before: int, fixed: int) -> int:
    """``_pad_field``'s pad length when the pad moves the length varint across a 7-bit boundary."""
    for extra in range(ALIGN_BYTES + 8):
        if extra != 1 and (before + _varint_size(fixed + extra) + extra) % ALIGN_BYTES == 0:
            return extra
    raise AssertionError("unreachable: some pad of at most ALIGN_BYTES + 1 bytes aligns the payload")


def _read_varint(buf: memoryview, i: int, n: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        if i >= n:
            break
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7
    raise ValueError(f"protobuf: expected a varint at byte {i}, got a truncated or overlong one")


def _split(
    buf: memoryview, wanted: int, *, every: bool, drop: int = -1
) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """The fields of ``buf``: ``(value offset, end)`` of each length-delimited field numbered ``wanted`` (only
    the last unless ``every``: memory bounded by the message, not its field count), and the ``[start, end)``
    runs of the others but ``drop`` (adjacent ones merged: a message's other fields are usually one run, so
    one slice to parse and no join). Raises ``ValueError`` on a malformed field."""
    hits: list[tuple[int, int]] = []
    rest: list[list[int]] = []
    i, n = 0, len(buf)
    while i < n:
        start = i
        key = buf[i]
        if key < 0x80:  # one-byte varints (every key and most lengths here) read inline: per request
            i += 1
        else:
            key, i = _read_varint(buf, i, n)
        number, wire_type = key >> 3, key & 7
        value = i
        if wire_type == 0:
            _, end = _read_varint(buf, i, n)
        elif wire_type == 1 or wire_type == 5:
            end = i + (8 if wire_type == 1 else 4)
        elif wire_type == _LEN:
            if i < n and buf[i] < 0x80:
                size, value = buf[i], i + 1
            else:
                size, value = _read_varint(buf, i, n)
            end = value + size
        else:
            raise ValueError(f"protobuf: expected wire type 0, 1, 2 or 5, got {wire_type} at byte {start}")
        if end > n:
            raise ValueError(f"protobuf: field {number} needs {end - start} bytes, got {n - start}")
        if number == wanted and wire_type == _LEN:
            if every or not hits:
                hits.append((value, end))
            else:
                hits[0] = (value, end)  # the last occurrence wins, as in protobuf
        elif number == drop:
            pass
        elif rest and rest[-1][1] == start:
            rest[-1][1] = end
        else:
            rest.append([start, end])
        i = end
    return hits, rest


def _joined(buf: memoryview, spans: list[list[int]]) -> bytes:
    if len(spans) == 1:  # protobuf parses a memoryview as it does bytes (its stubs say bytes only)
        return cast(bytes, buf[spans[0][0] : spans[0][1]])
    return b"".join(buf[s:e] for s, e in spans)


def _tensor(buf: memoryview) -> Encoded:
    hits, rest = _split(buf, _PAYLOAD_FIELD, every=False, drop=_PAD_FIELD)
    payload = buf[hits[0][0] : hits[0][1]] if hits else buf[0:0]
    t = pb.Tensor.FromString(_joined(buf, rest))
    return Encoded(name=t.name, dtype=t.dtype, shape=tuple(t.shape), codec=t.codec, payload=payload)


def deserializer(message_type: Any) -> Callable[[bytes], Framed]:
    """gRPC deserializer of ``InferRequest`` or ``InferReply`` bytes (any valid encoding) into a
    ``Framed`` whose payloads are read-only views of the received bytes."""
    tensor_field = _TENSOR_FIELDS[message_type]

    def deserialize(data: bytes) -> Framed:
        buf = memoryview(data).toreadonly()
        hits, rest = _split(buf, tensor_field, every=True)
        tensors = [_tensor(buf[value:end]) for value, end in hits]
        return Framed(header=message_type.FromString(_joined(buf, rest)), tensors=tensors)

    return deserialize


@dataclass(frozen=True)
class Malformed:
    """What ``lenient_deserializer`` gives for bytes that are not a valid message: the server answers
    INVALID_ARGUMENT with ``message`` (gRPC would answer INTERNAL, which clients treat as retryable)."""

    message: str


def lenient_deserializer(message_type: Any, parse: Callable[[bytes], Any] | None = None) -> Callable[[bytes], Any]:
    """``parse`` (default ``deserializer(message_type)``) that returns ``Malformed`` instead of raising on
    garbage bytes."""
    strict = parse or deserializer(message_type)
    full_name = message_type.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return strict(data)
        except Exception as exc:  # ValueError (our framing), protobuf's DecodeError, bad UTF-8, ...
            return Malformed(
                f"expected a protobuf-encoded {full_name}, got {len(data)} bytes that do "
                f"not parse ({type(exc).__name__}: {exc})"
            )

    return deserialize


_PROBE_PAYLOAD_FIELD = 1  # ProbeRequest.payload


@dataclass(frozen=True)
class ProbeBody:
    """A received ``ProbeRequest``: ``header`` is every field but the payload, ``payload_bytes`` how many
    payload bytes came. The payload is only measured, never copied or parsed."""

    header: pb.ProbeRequest
    payload_bytes: int


def probe_deserializer(data: bytes) -> ProbeBody | Malformed:
    """gRPC deserializer of ``ProbeRequest`` bytes that skips the payload.

    gRPC's Python server deserialises a request on its one polling thread, holding the interpreter:
    protobuf's parse of a 64 MiB probe copies the payload into fresh memory, ~0.1 s during which no
    other call's events (new calls, messages, replies) are handled. Here the payload costs a few
    varints; ``Malformed`` instead of raising on bytes that do not parse (INVALID_ARGUMENT)."""
    try:
        buf = memoryview(data).toreadonly()
        hits, rest = _split(buf, _PROBE_PAYLOAD_FIELD, every=False)
        payload_bytes = hits[0][1] - hits[0][0] if hits else 0
        return ProbeBody(header=pb.ProbeRequest.FromString(_joined(buf, rest)), payload_bytes=payload_bytes)
    except Exception as exc:  # ValueError (our framing), protobuf's DecodeError
        return Malformed(
            f"expected a protobuf-encoded {pb.ProbeRequest.DESCRIPTOR.full_name}, got {len(data)} bytes "
            f"that do not parse ({type(exc).__name__}: {exc})"
        )


def channel_options(max_message_bytes: int, keepalive_s: float) -> list[tuple[str, Any]]:
    """Client channel options: raised message limits, keep-alive pings, a channel-local subchannel pool.

    The local pool matters for failover: with gRPC's process-wide pool, a "fresh" channel to a server
    that refused a connection shares the old subchannel and waits out gRPC's reconnect backoff (1 s,
    growing to minutes) instead of ours, so a restarted server stays unused long after it is back.
    """
    return [
        ("grpc.use_local_subchannel_pool", 1),
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
    service_ms: float = 0.0  # smoothed tail time per request (0: none served yet, or an older server)
    max_queue: int = 0

    @classmethod
    def from_proto(cls, load: pb.Load) -> LoadInfo:
        return cls(
            queue_depth=load.queue_depth,
            running=load.running,
            workers=load.workers,
            cpu_percent=load.cpu_percent,
            service_ms=load.service_ms,
            max_queue=load.max_queue,
        )


#: Trailing metadata key of a RESOURCE_EXHAUSTED answer (queue full): when to retry, milliseconds.
RETRY_AFTER_KEY = "retry-after-ms"
# A Probe's declared payload + reply bytes: the server reserves memory for them before reading the body
# (an undeclared probe is reserved at its worst case, one that sends more than it declared is refused).
PROBE_BYTES_KEY = "splitrt-probe-bytes"


def retry_after_ms(metadata: Any) -> float | None:
    """The ``retry-after-ms`` value in gRPC (trailing) metadata, or None when absent or unreadable."""
    for key, value in metadata or ():
        if key == RETRY_AFTER_KEY:
            try:
                ms = float(value)
            except (TypeError, ValueError):
                return None
            return ms if ms >= 0 and ms == ms else None
    return None


def cloud_error(exc: grpc.RpcError, what: str) -> CloudError:
    """Map a gRPC error to ``CloudError`` (code name, retryable, the server's retry hint) with the
    server's message."""
    code_obj = exc.code() if hasattr(exc, "code") else None
    code = code_obj.name if code_obj is not None else "UNKNOWN"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return CloudError(
        f"{what}: {code}: {details}",
        code=code,
        retryable=code in RETRYABLE_CODES,
        retry_after_ms=retry_after_ms(trailing),
    )


def ort_dtype(type_str: str) -> str:
    return ORT_DTYPES.get(type_str, type_str)


def shape_matches(expected: tuple[int | str | None, ...], actual: tuple[int, ...]) -> bool:
    """True when ``actual`` fits ``expected`` (symbolic/unknown dims match any size)."""
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual, strict=True):  # noqa: SIM110 (no genexpr: per tensor of every request)
        if isinstance(e, int) and e >= 0 and e != a:
            return False
    return True


def describe_shape(shape: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def as_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)
