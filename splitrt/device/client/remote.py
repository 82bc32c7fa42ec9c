"""A model's cloud, seen from the device: the transport to it, the model check and upload, and one
request's round trip (encode the head's tensors, call, decode the outputs). ``client.Device`` pairs one with
its local sessions; the adaptive runtime keeps one per server it knows (``runtime.clouds``), with no
sessions of its own.

- ``Remote(graph, "host:port", config=DeviceConfig(...), transport=None)``: ``.send(head, codec_spec=,
  timeout_s=, next_cut=) -> SplitResult`` (``CloudError(code=<grpc status name>, retryable=...)``; cut
  ``device`` is ``CutError``: it has no tail), ``.probe(up_bytes, down_bytes, timeout_s=, next_bytes=) ->
  ProbeResult``, ``.status()``, ``.stub()``, ``.ensure_model(...)``, ``.upload_model()``,
  ``.upload_in_progress()``, ``.request(head, spec) -> (Framed, bytes up)``, ``.decode(reply, head)``,
  ``.transport()``, ``.close()``. The contracts of the check, the upload and the deadline are
  ``client``'s (its docstring).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from splitrt.device.client.config import DeviceConfig
from splitrt.device.client.messages import (
    HeadResult,
    Hops,
    ProbeResult,
    SplitResult,
    assemble,
    decode_reply,
    encode_request,
)
from splitrt.device.client.upload import ModelUploader
from splitrt.errors import CloudError, ConfigError, CutError
from splitrt.plan.costmodel import DEVICE_CUT
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport.base import Transport
from splitrt.transport.grpc_transport import ClientOptions, GrpcTransport
from splitrt.transport.v2 import V2Transport, is_v2

__all__ = ["Remote"]


class _CloudLink:
    """The transport to the cloud: the injected one, or a ``GrpcTransport`` to ``cloud`` built from the
    config on first use (and again after ``close``). Shared by ``Remote`` and its ``ModelUploader``
    without a reference back to the ``Remote``: a dropped ``Remote`` (the runtime drops a failed cloud's)
    is freed at once, and its channel with it."""

    def __init__(self, cloud: str | None, config: DeviceConfig, transport: Transport | None, sha256: str = "") -> None:
        self.cloud = transport.address if cloud is None and transport is not None else cloud
        self.sha256 = sha256  # the model's: a v2 transport reports it in status
        self.config = config
        self._injected = transport
        self._transport = transport
        self._lock = threading.Lock()

    def name(self) -> str:
        return str(self.cloud)

    def get(self) -> Transport:
        link = self._transport
        if link is not None:
            return link
        if not self.cloud:
            raise ConfigError("no cloud: expected Device(model, 'host:port'), got none")
        cfg = self.config
        options: ClientOptions = {
            "token": cfg.token,
            "max_message_bytes": cfg.max_message_bytes,
            "tls": cfg.tls,
            "tls_ca_path": cfg.tls_ca_path,
            "tls_server_name": cfg.tls_server_name,
        }
        built: Transport
        if is_v2(self.cloud):  # v2://host:port: a standard serving engine (Open Inference Protocol v2)
            built = V2Transport(self.cloud, model_sha256=self.sha256, **options)
        else:
            built = GrpcTransport(self.cloud, keepalive_s=cfg.keepalive_s, **options)
        with self._lock:
            if self._transport is None:
                self._transport = built
            return self._transport

    def close(self) -> None:
        with self._lock:
            link, self._transport = self._transport, self._injected
        if link is not None:
            link.close()


class SendOptions(TypedDict, total=False):
    """``Remote.send``'s keywords."""

    codec_spec: str | codec.Codec | None
    timeout_s: float | None
    next_cut: str | None


class Remote:
    """The cloud of one model (``graph``) at ``cloud`` ("host:port"), through ``transport`` (None: a
    ``GrpcTransport``, or ``V2Transport`` for ``v2://``, built on first use from ``config``)."""

    def __init__(
        self, graph: Any, cloud: str | None, *, config: DeviceConfig, transport: Transport | None = None
    ) -> None:
        self.config = config
        self.sha256: str = graph.sha256
        self.output_names = tuple(t.name for t in graph.outputs)
        self.codec = codec.Codec.parse(config.codec)
        self._cloud = _CloudLink(cloud, config, transport, sha256=self.sha256)
        self._uploads = ModelUploader(
            path=Path(graph.path),
            sha256=graph.file_sha256,
            config=config,
            link=self._cloud.get,
            cloud=self._cloud.name,
        )

    @property
    def cloud(self) -> str | None:
        """The cloud's address ("host:port"); set it before the first call."""
        return self._cloud.cloud

    @cloud.setter
    def cloud(self, address: str | None) -> None:
        self._cloud.cloud = address

    def transport(self) -> Transport:
        """The transport to the cloud (built on first use)."""
        return self._cloud.get()

    def stub(self) -> pb_grpc.SplitInferenceStub:
        """The generated gRPC stub on this device's channel (stock protobuf framing)."""
        link = self.transport()
        if not isinstance(link, GrpcTransport):
            raise ConfigError(f"stub: expected a gRPC transport, got {type(link).__name__}")
        return link.stub()

    def status(self, timeout_s: float | None = None) -> pb.StatusReply:
        return self.transport().status(timeout_s=timeout_s or self.config.timeout_s)

    def probe(
        self,
        up_bytes: int,
        down_bytes: int,
        timeout_s: float | None = None,
        *,
        next_bytes: tuple[int, int] | None = None,
    ) -> ProbeResult:
        """One echo of ``up_bytes`` up and ``down_bytes`` down (feed netmon with the result);
        ``next_bytes=(up, down)``: an edge also probes its next tier with these sizes."""
        req = pb.ProbeRequest(payload=bytes(up_bytes), reply_bytes=down_bytes)
        if next_bytes is not None:
            req.next_probe, req.next_payload_bytes, req.next_reply_bytes = True, next_bytes[0], next_bytes[1]
        t0 = time.perf_counter()
        reply = self.transport().probe(req, timeout_s=timeout_s or self.config.timeout_s)
        seconds = time.perf_counter() - t0
        ok = next_bytes is not None and not reply.next_error.code
        return ProbeResult(
            up_bytes=up_bytes,
            down_bytes=len(reply.payload),
            seconds=seconds,
            load=wire.LoadInfo.from_proto(reply.load),
            next_ms=reply.next_ms if ok else None,
            next_error=f"{reply.next_error.code}: {reply.next_error.message}" if reply.next_error.code else "",
            next_load=wire.LoadInfo.from_proto(reply.next_load) if ok else None,
        )

    def upload_model(self, timeout_s: float | None = None) -> pb.PutModelReply:
        """Stream the model file to the cloud (verified there by sha256)."""
        return self._uploads.upload(timeout_s)

    def ensure_model(self, force: bool = False, *, timeout_s: float | None = None, wait_upload: bool = True) -> None:
        """Make sure the cloud has the model (``CloudError`` if it cannot be made sure of).

        The check is one ``Status`` call with ``timeout_s`` (default ``DeviceConfig.timeout_s``), done once;
        a failed check is re-raised without an RPC for ``check_backoff_s`` (``force`` checks anyway).
        A missing model is uploaded when both sides allow it: here with ``upload_timeout_s``
        (``wait_upload``), or else in a background thread while this call raises a retryable
        ``UNAVAILABLE`` (the request path: no upload within a request's deadline).
        """
        self._uploads.ensure(force, timeout_s=timeout_s, wait_upload=wait_upload)

    def upload_in_progress(self) -> bool:
        """True while a background upload of this model to this cloud runs (started by ``send``)."""
        return self._uploads.in_progress()

    @property
    def checked(self) -> bool:
        """The model check passed (tests set it to skip the check against servers without Status)."""
        return self._uploads.checked

    @checked.setter
    def checked(self, value: bool) -> None:
        self._uploads.checked = value

    def request(
        self, head: HeadResult, spec: codec.Codec, next_cut: str = "", next_codec: str = ""
    ) -> tuple[wire.Framed, int]:
        return encode_request(
            head,
            spec,
            sha256=self.sha256,
            output_codec=self.config.output_codec,
            next_cut_id=next_cut,
            next_codec=next_codec,
        )

    def decode(self, reply: wire.Framed, head: HeadResult) -> tuple[dict[str, np.ndarray], int]:
        """The graph outputs: the reply's (only those the tail made) with the ones the head kept."""
        made = tuple(n for n in self.output_names if n not in head.kept)
        # The same decoded-size cap a server applies (a reply may claim any size under zlib).
        outs, nbytes = decode_reply(
            reply, made, max_bytes=4 * self.config.max_message_bytes, cloud=self.cloud, also=tuple(head.kept)
        )
        return assemble(self.output_names, head.kept, outs), nbytes

    def send(
        self,
        head: HeadResult,
        *,
        codec_spec: str | codec.Codec | None = None,
        timeout_s: float | None = None,
        next_cut: str | None = None,
    ) -> SplitResult:
        """Ship ``head``'s crossing tensors to the cloud, return the outputs (``CloudError`` on failure).
        ``next_cut``: the server is an edge that runs up to this cut and forwards the rest (``.hops``)."""
        if head.cut_id == DEVICE_CUT:
            raise CutError("cut 'device' has no tail to send: finish it locally (Device.send does)")
        spec = self.codec if codec_spec is None else codec.Codec.parse(codec_spec)
        t0 = time.perf_counter()
        request, bytes_up = self.request(head, spec, next_cut or "", str(spec) if next_cut else "")
        t1 = time.perf_counter()
        # With ``timeout_s``: one deadline for the whole request, the model check included, and a missing
        # model is uploaded in the background. Without (the blocking API): the check and an upload take
        # their own timeouts, then the call gets ``DeviceConfig.timeout_s``.
        wait_upload = timeout_s is None
        deadline = t0 + (timeout_s or self.config.timeout_s)

        def left() -> float:
            return max(0.001, deadline - time.perf_counter())

        def check(force: bool = False) -> None:
            nonlocal deadline
            if wait_upload:
                self.ensure_model(force)
                deadline = time.perf_counter() + self.config.timeout_s
            else:
                self.ensure_model(force, timeout_s=left(), wait_upload=False)

        check()
        link = self.transport()
        t2 = time.perf_counter()
        try:
            reply = link.infer(request, timeout_s=left())
        except CloudError as err:
            if not (err.code == "NOT_FOUND" and "model sha256" in str(err) and self.config.upload):
                raise
            self.checked = False  # the cloud lost the model (restart?): upload once more
            check(force=True)
            reply = link.infer(request, timeout_s=left())
        t3 = time.perf_counter()
        outputs, bytes_down = self.decode(reply, head)
        t4 = time.perf_counter()
        return SplitResult(
            outputs=outputs,
            cut_id=head.cut_id,
            codec=str(spec),
            where="cloud",
            request_id=head.request_id,
            head_ms=head.head_ms,
            encode_ms=(t1 - t0) * 1e3,
            rpc_ms=(t3 - t2) * 1e3,
            decode_ms=(t4 - t3) * 1e3,
            tail_ms=reply.header.tail_ms,
            queue_ms=reply.header.queue_ms,
            build_ms=reply.header.build_ms,
            total_ms=head.head_ms + (t4 - t0) * 1e3 - (t2 - t1) * 1e3,
            check_ms=(t2 - t1) * 1e3,
            bytes_up=bytes_up,
            bytes_down=bytes_down,
            load=wire.LoadInfo.from_proto(reply.header.load),
            hops=Hops.from_reply(reply.header) if next_cut else None,
        )

    def close(self) -> None:
        self._cloud.close()
