"""``PutModel``: a device uploads a model the server does not have; stored only if whole and usable. It
writes one temporary file, ``<store>/.upload-<random>.part`` (exclusive, 0600; the device's name is never
a path), at most ``max_model_bytes``, charged to the quotas chunk by chunk; the bytes must hash to the
declared sha256 and be one self-contained ONNX model (no external data, no sparse initializer, at most
``max_nodes`` nodes and ``MAX_OUTPUTS`` outputs) that loads, checked in ``CHECKER``'s niced child under
``guard(bytes)``; then it is renamed to ``<store>/<sha256>.onnx``. Otherwise the file is removed. The
threat model: docs/operator/security.md.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import grpc

from splitrt.cloud.common import RpcFailure, disk_failure, log_event
from splitrt.cloud.models.children import Children
from splitrt.cloud.models.store import ModelStore
from splitrt.graph.walk import count_nodes, external_locations, sparse_initializers
from splitrt.transport import splitrt_pb2 as pb

_HEX = frozenset("0123456789abcdef")
# Graph outputs an upload may have: a tail build costs O(outputs^2) memory; real models have tens at most.
MAX_OUTPUTS = 1024
CHECK_IDLE_S = 300.0  # a checker child idle this long is stopped
CHECKER = Children(
    "upload check", imports=("onnx", "splitrt.cloud.models.store", "splitrt.graph.model"), idle_s=CHECK_IDLE_S
)


@dataclass(frozen=True, kw_only=True)
class Quota:
    """What uploads may add to the store (``--max-store-mb``, ``--max-models``) and the largest graph."""

    max_store_bytes: int | None = None
    max_models: int | None = None
    max_nodes: int | None = None


def _claim(store: ModelStore, quota: Quota, size: int, models: int, declared: int = 0) -> None:
    """Hold ``size`` more bytes and ``models`` more models against the quotas or raise RESOURCE_EXHAUSTED;
    ``declared`` bytes must fit but are not held (a trickle must not squat a declared size)."""

    def check(held: int, count: int) -> None:
        if models and quota.max_models is not None and count >= quota.max_models:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"upload: the store holds {count} models (uploads in progress included), expected "
                f"fewer than {quota.max_models} (--max-models); nothing stored",
            )
        more = max(size, declared)
        if quota.max_store_bytes is not None and held + more > quota.max_store_bytes:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"upload: {more} bytes more would bring the store to {held + more} bytes, expected at "
                f"most {quota.max_store_bytes} (--max-store-mb); nothing stored",
            )

    store.claim(size, models, check)


def receive_model(
    store: ModelStore,
    chunks: Iterator[pb.ModelChunk],
    *,
    allow_upload: bool,
    max_model_bytes: int,
    quota: Quota | None = None,
    guard: Callable[[int], AbstractContextManager[object]] | None = None,
) -> pb.PutModelReply:
    """Write the chunks to a temporary file in the store's directory, check the sha256 the first chunk
    names, the size and that the model loads, then move it in place as ``<sha256>.onnx``."""
    quota = quota or Quota()
    if not allow_upload:
        raise RpcFailure(
            grpc.StatusCode.PERMISSION_DENIED, "uploads are disabled: expected a server started with --allow-upload"
        )
    it = iter(chunks)
    first = next(it, None)
    if first is None:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "upload: expected at least one chunk, got none")
    sha = first.sha256.lower()
    if len(sha) != 64 or not set(sha) <= _HEX:
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"upload: expected a hex sha256 of 64 characters, got {first.sha256[:80]!r}",
        )
    if store.has(sha):
        return pb.PutModelReply(sha256=sha, already_present=True, bytes=store.entry(sha).bytes)
    limit = max_model_bytes
    if first.total_bytes > limit:
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"upload: expected at most {limit} bytes, got total_bytes {first.total_bytes}",
        )
    _claim(store, quota, 0, 1, declared=first.total_bytes)
    claimed = 0

    def charge(nbytes: int) -> None:  # each chunk as it arrives, before it is written
        nonlocal claimed
        _claim(store, quota, nbytes, 0)
        claimed += nbytes

    tmp = store.root / f".upload-{uuid.uuid4().hex}.part"
    size = 0
    try:
        size = _write(tmp, first, it, sha, limit, charge)
        with guard(size) if guard is not None else nullcontext():
            CHECKER.run(_check_model, tmp, store.root, quota.max_nodes)
        final = store.root / f"{sha}.onnx"
        os.replace(tmp, final)
        store.add(sha, final)
    except OSError as exc:  # the server's disk (full, read-only): not the request's fault
        raise disk_failure(exc, "upload: cannot store the model") from exc
    finally:
        tmp.unlink(missing_ok=True)
        store.unclaim(claimed, 1)  # stored or not: the store's own count takes over
    log_event("model_uploaded", model=sha[:12], bytes=size, name=first.name[:120])
    return pb.PutModelReply(sha256=sha, already_present=False, bytes=size)


def _write(
    tmp: Path, first: pb.ModelChunk, rest: Iterator[pb.ModelChunk], sha: str, limit: int, charge: Callable[[int], None]
) -> int:
    """Stream the chunks into ``tmp`` under ``limit``, each ``charge``d first; check size and hash."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        for chunk in _chain(first, rest):
            size += len(chunk.data)
            if size > limit:
                raise RpcFailure(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"upload: expected at most {limit} bytes, got more; nothing stored",
                )
            charge(len(chunk.data))
            h.update(chunk.data)
            f.write(chunk.data)
        f.flush()
        os.fsync(f.fileno())
    got = h.hexdigest()
    if got != sha:
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"upload: sha256 mismatch, expected {sha}, got {got} ({size} bytes); nothing stored",
        )
    if first.total_bytes and size != first.total_bytes:
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT, f"upload: expected {first.total_bytes} bytes, got {size}; nothing stored"
        )
    return size


def _check_model(path: Path, root: Path, max_nodes: int | None = None) -> None:
    """The upload must be one self-contained ONNX model that loads (normalises, passes the checker)."""
    import onnx

    from splitrt.graph import model as graph_mod

    def refuse(why: str) -> RpcFailure:
        return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"upload: {why}; nothing stored")

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise refuse(f"expected an ONNX model, got bytes that do not parse ({type(exc).__name__})") from exc
    locations = external_locations(proto)  # on any tensor (``graph.walk``)
    sparse = sparse_initializers(proto)
    nodes, outputs = count_nodes(proto), len(proto.graph.output)
    del proto
    if outputs > MAX_OUTPUTS:
        raise refuse(f"expected at most {MAX_OUTPUTS} graph outputs, got {outputs}")
    if max_nodes is not None and nodes > max_nodes:
        raise refuse(f"expected at most {max_nodes} nodes (--max-nodes), got {nodes}")
    if locations:
        raise refuse(
            f"expected a self-contained model (no external data), got external-data location {locations[0][:200]!r}"
        )
    if sparse:  # onnxruntime runs them, but a model cut into segments cannot carry them
        raise refuse(
            f"expected dense initializers, got {len(sparse)} sparse (first {sparse[0][:120]!r}); "
            "store them dense (onnx.numpy_helper)"
        )
    try:
        graph_mod.load(path)
    except Exception as exc:  # ModelError, or whatever onnx raises on a strange model
        raise refuse(f"not a usable ONNX model ({str(exc).replace(str(path), 'the upload')[:500]})") from exc


def _chain(first: pb.ModelChunk, rest: Iterator[pb.ModelChunk]) -> Iterator[pb.ModelChunk]:
    yield first
    yield from rest
