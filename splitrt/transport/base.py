"""The calls a device makes to one cloud, as an interface (``GrpcTransport`` is the real one).

Requests and replies are the messages of ``proto/splitrt.proto``; Infer and InferStream carry them
hand-framed (``wire.Framed``) so tensor payloads are never copied by protobuf. Every method raises
``CloudError(code=<gRPC status name>, retryable=...)`` on failure, whatever carries the bytes, so the
device's fallback logic does not depend on the transport. Auth, TLS and message limits are the
transport's own configuration (given when it is built), not per-call arguments.

- ``Transport`` protocol: ``.address``, ``.infer(Framed, *, timeout_s) -> Framed``, ``.infer_stream(frames, *,
  timeout_s=None)``, ``.probe(req, *, timeout_s)``, ``.status(*, timeout_s)``, ``.put_model(chunks, *,
  timeout_s)``, ``.close()``; every failure is ``CloudError(code=<grpc status name>, retryable=...,
  retry_after_ms=...)``, mapped in one place (``wire.cloud_error``, which reads ``retry-after-ms`` from the
  trailing metadata).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire


class Transport(Protocol):
    """A connection to one cloud's ``SplitInference`` service."""

    @property
    def address(self) -> str:
        """Where the cloud is ("host:port"), for error messages and per-cloud bookkeeping."""
        ...

    def infer(self, request: wire.Framed, *, timeout_s: float) -> wire.Framed:
        """One ``InferRequest`` -> its ``InferReply`` (both framed)."""
        ...

    def infer_stream(self, requests: Iterable[wire.Framed], *, timeout_s: float | None = None) -> Iterator[wire.Framed]:
        """One reply per request over one bidirectional stream; a failed frame is a reply whose
        ``header.error`` is set (only a failure of the whole stream raises)."""
        ...

    def probe(self, request: pb.ProbeRequest, *, timeout_s: float) -> pb.ProbeReply: ...

    def status(self, *, timeout_s: float) -> pb.StatusReply: ...

    def put_model(self, chunks: Iterable[pb.ModelChunk], *, timeout_s: float) -> pb.PutModelReply:
        """Stream a model file (first chunk: sha256, name, total_bytes) to the cloud."""
        ...

    def close(self) -> None:
        """Release the connection; a later call may open a new one."""
        ...


# What a failing call was doing, in the words of the error message (shared so that every transport's
# CloudError reads the same).
def describe_infer(header: Any, address: str, *, stream: bool = False) -> str:
    """``infer <sha256[:12]>@<cut> on <address>`` (``stream ...`` for InferStream); ``header`` an
    ``InferRequest`` or None when no request went out yet."""
    verb = "stream" if stream else "infer"
    if header is None:
        return f"{verb} on {address}"
    return f"{verb} {header.model_sha256[:12]}@{header.cut_id} on {address}"


def describe_upload(first: pb.ModelChunk | None, address: str) -> str:
    return f"upload of {first.name if first is not None else 'a model'} to {address}"
