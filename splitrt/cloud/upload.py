"""``PutModel``: a device uploads a model the server does not have; stored only if whole and usable."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator

import grpc

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.cloud.store import ModelStore
from splitrt.errors import ModelError, SplitrtError
from splitrt.transport import splitrt_pb2 as pb


def receive_model(store: ModelStore, chunks: Iterator[pb.ModelChunk], *, allow_upload: bool,
                  max_model_bytes: int) -> pb.PutModelReply:
    """Write the chunks to a temporary file in the store's directory, check the sha256 the first chunk
    names, the size and that the model loads, then move it in place as ``<sha256>.onnx``."""
    if not allow_upload:
        raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED,
                         "uploads are disabled: expected a server started with --allow-upload")
    it = iter(chunks)
    first = next(it, None)
    if first is None:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         "upload: expected at least one chunk, got none")
    sha = first.sha256.lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"upload: expected a hex sha256 of 64 characters, got {first.sha256!r}")
    if store.has(sha):
        return pb.PutModelReply(sha256=sha, already_present=True, bytes=store.entry(sha).bytes)
    limit = max_model_bytes
    if first.total_bytes > limit:
        raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"upload: expected at most {limit} bytes, got total_bytes {first.total_bytes}")
    root = store.root
    tmp = root / f".upload-{uuid.uuid4().hex}.part"
    h = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in _chain(first, it):
                size += len(chunk.data)
                if size > limit:
                    raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     f"upload: expected at most {limit} bytes, got more")
                h.update(chunk.data)
                f.write(chunk.data)
        got = h.hexdigest()
        if got != sha:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"upload: sha256 mismatch, expected {sha}, got {got} ({size} bytes); "
                             "nothing stored")
        if first.total_bytes and size != first.total_bytes:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"upload: expected {first.total_bytes} bytes, got {size}; nothing stored")
        from splitrt.graph import model as graph_mod

        try:
            graph_mod.load(tmp)
        except ModelError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"upload: not a usable ONNX model ({exc}); nothing stored") from exc
        final = root / f"{sha}.onnx"
        os.replace(tmp, final)
        store.add(sha, final)
    except SplitrtError as exc:
        raise RpcFailure(grpc.StatusCode.INTERNAL, f"upload failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    log_event("model_uploaded", model=sha[:12], bytes=size)
    return pb.PutModelReply(sha256=sha, already_present=False, bytes=size)


def _chain(first: pb.ModelChunk, rest: Iterator[pb.ModelChunk]) -> Iterator[pb.ModelChunk]:
    yield first
    yield from rest
