"""A request's tensors against what its tail expects: checked on arrival from names, dtypes and shapes
alone (nothing allocated), decoded only in a worker slot (decoded memory <= workers x
``max_decoded_bytes``). ``small_integers`` reads the values that may decide sizes for ``graph.peak``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import grpc
import numpy as np

from splitrt.cloud.common import RpcFailure
from splitrt.cloud.models.tails import Tail
from splitrt.errors import CodecError
from splitrt.transport import codec, wire


def check_inputs(request: wire.Framed, tail: Tail, max_decoded_bytes: int) -> int:
    """Names, dtypes, shapes and decoded sizes of the request's tensors (RpcFailure if wrong);
    returns the payload bytes. Symbolic dimensions accept any size, so the size cap is what bounds
    the memory a request may claim."""
    expected = {name: (dtype, shape) for name, dtype, shape in tail.inputs}
    given = {t.name: t for t in request.tensors}
    if len(given) != len(request.tensors) or set(given) != set(expected):
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"cut {request.header.cut_id!r}: expected tensors {sorted(expected)}, "
            f"got {[t.name for t in request.tensors]}",
        )
    nbytes = total = 0
    cap = max_decoded_bytes
    for name, (dtype, shape) in expected.items():
        t = given[name]
        got_shape = t.shape
        if t.dtype != dtype:
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT, f"tensor {name!r}: expected dtype {dtype}, got {t.dtype or '(empty)'}"
            )
        # No declared shape (a tensor the model leaves unshaped and the segment was split unbound): any
        # rank; onnxruntime checks what the tail's nodes need.
        if shape is not None and not wire.shape_matches(shape, got_shape):
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"tensor {name!r}: expected shape {wire.describe_shape(shape)}, got {list(got_shape)}",
            )
        nbytes += t.nbytes
        try:
            need = codec.decoded_bytes(t)
        except CodecError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        total += need
        if need > cap:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tensor {name!r}: shape {list(got_shape)} {t.dtype} ({t.codec}) decodes to "
                f"{need} bytes, expected at most {cap} (max_decoded_bytes)",
            )
    if total > cap:
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"cut {request.header.cut_id!r}: tensors decode to {total} bytes in total, "
            f"expected at most {cap} (max_decoded_bytes)",
        )
    return nbytes


def decode_inputs(request: wire.Framed, max_decoded_bytes: int) -> dict[str, np.ndarray]:
    """The request's tensors decoded (after ``check_inputs``); raw/fp32 ones are views of the
    received bytes."""
    feeds: dict[str, np.ndarray] = {}
    for t in request.tensors:
        try:
            feeds[t.name] = codec.decode(t, max_bytes=max_decoded_bytes)
        except CodecError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
    return feeds


# A shape or a count is a few numbers; an integer tensor larger than this is data (token ids), not a size.
MAX_ELEMENTS = 64
_INTEGER = frozenset(("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"))
# Floats too: Resize's scales, or a count cast from a float (their values pass to shape inference as well).
_NUMERIC = _INTEGER | {"float16", "float32", "float64"}


def small_integers(tensors: Iterable[codec.Encoded]) -> dict[str, np.ndarray]:
    """The numeric tensors of at most ``MAX_ELEMENTS`` elements, decoded (a tensor that does not decode is
    skipped: the request is refused when its inputs are decoded)."""
    out: dict[str, np.ndarray] = {}
    for t in tensors:
        if t.dtype not in _NUMERIC:
            continue
        shape = tuple(map(int, t.shape))  # no genexprs: per tensor of every request
        if (shape and min(shape) < 0) or math.prod(shape) > MAX_ELEMENTS:
            continue
        try:
            out[t.name] = np.array(codec.decode(t, max_bytes=8 * MAX_ELEMENTS))  # quantised: decodes to float
        except CodecError:
            continue
    return out


def small_integer_arrays(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """As ``small_integers``, from decoded tensors."""
    return {
        k: np.array(v)
        for k, v in feeds.items()
        if np.asarray(v).dtype.name in _NUMERIC and np.asarray(v).size <= MAX_ELEMENTS
    }
