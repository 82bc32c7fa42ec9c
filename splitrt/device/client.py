"""Device runtime: run the head of a model locally, ship the crossing tensors, get the outputs back.

``Device(model, "host:port").run(inputs, cut="c3")`` is the Python API apps use. The device holds the
whole model, so any request can also be finished locally: ``run_head`` then ``send`` (cloud) or
``finish_locally`` (tail on this machine) — the controller uses the latter as the fallback when
``send`` raises ``CloudError``.

One gRPC channel per ``Device`` (reused, with keep-alive pings); every call has a deadline
(``DeviceConfig.timeout_s`` unless given). ``send(head, timeout_s=T)`` keeps the whole request, the
cloud's model check included, within ``T``.

The model check (``ensure_model``): a ``Status`` call, once per ``Device``; a failed check (unreachable,
timed out, model missing) is remembered for ``check_backoff_s`` and re-raised without an RPC. If the
cloud lacks the model and allows uploads (and ``DeviceConfig.upload``), ``ensure_model()`` uploads it
with its own ``upload_timeout_s``; on the request path with a deadline (``send(..., timeout_s=T)``) the
upload is never waited for: it starts in a background thread (one per cloud and model in this process)
and the request fails at once with a retryable ``CloudError`` (``UNAVAILABLE``), so the caller finishes
it locally and a later request finds the model there.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from splitrt.errors import CloudError, CodecError, ConfigError, InputError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

DEVICE_CUT = "device"


def read_token(path: Path, what: str = "token file") -> str:
    """The bearer token on the first line of ``path`` (``what`` names the setting in errors)."""
    try:
        return path.read_text().splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise ConfigError(f"{what} {path}: expected a token on the first line") from exc


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    timeout_s: float = 10.0
    codec: str = "fp32"
    output_codec: str = "fp32"
    # Bearer token sent as 'authorization' metadata.
    token: str | None = None
    # TLS: on when ``tls`` or a CA file is given; ``tls_server_name`` overrides the name checked.
    tls: bool = False
    tls_ca_path: Path | None = None
    tls_server_name: str | None = None
    max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES
    keepalive_s: float = 30.0
    # Upload the model once if the cloud lacks it and allows uploads.
    upload: bool = True
    upload_chunk_bytes: int = 1024 * 1024
    upload_timeout_s: float = 60.0
    # A failed model check is re-raised without an RPC for this long.
    check_backoff_s: float = 1.0
    intra_op_threads: int = 0
    # Head/tail sessions kept per cut (LRU).
    session_cache_size: int = 8


@dataclass(frozen=True, kw_only=True)
class HeadResult:
    """The head's work for one request: what crosses the cut (plus the graph inputs, for local tails)."""

    cut_id: str
    crossing: dict[str, np.ndarray]
    head_ms: float
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


@dataclass(frozen=True, kw_only=True)
class SplitResult:
    """Outputs and where the time went (milliseconds)."""

    outputs: dict[str, np.ndarray]
    cut_id: str
    codec: str
    where: str  # "cloud" or "local"
    request_id: str
    head_ms: float = 0.0
    encode_ms: float = 0.0
    rpc_ms: float = 0.0
    decode_ms: float = 0.0
    tail_ms: float = 0.0
    queue_ms: float = 0.0
    total_ms: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    load: wire.LoadInfo | None = None
    # Only for stream frames that failed (outputs then empty).
    error: CloudError | None = None

    @property
    def network_ms(self) -> float:
        """Round trip minus the cloud's queue and tail time: wire + gRPC + (de)serialisation."""
        return self.rpc_ms - self.tail_ms - self.queue_ms

    @property
    def overhead_ms(self) -> float:
        """End to end minus head and tail compute."""
        return self.total_ms - self.head_ms - self.tail_ms

    def timings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "cut_id", "codec", "where", "request_id", "head_ms", "encode_ms", "rpc_ms", "decode_ms",
            "tail_ms", "queue_ms", "total_ms", "bytes_up", "bytes_down")} | {
            "network_ms": self.network_ms, "overhead_ms": self.overhead_ms}


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    up_bytes: int
    down_bytes: int
    seconds: float
    load: wire.LoadInfo


@dataclass
class _CutSessions:
    head_inputs: tuple[str, ...]
    head_outputs: tuple[str, ...]
    tail_inputs: tuple[str, ...]
    tail_outputs: tuple[str, ...]
    head_model: Any
    tail_model: Any
    head: Any = None
    tail: Any = None


# Background uploads in flight, per (cloud address, model sha256): one at a time in this process, even
# across Device objects (the runtime replaces a failed cloud's Device with a fresh one).
_UPLOADS: dict[tuple[str, str], threading.Thread] = {}
_UPLOADS_LOCK = threading.Lock()


def _session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


class Device:
    """A model on this device, optionally paired with a cloud at ``cloud`` ("host:port")."""

    def __init__(self, model: str | Path | Any, cloud: str | None = None, *,
                 config: DeviceConfig | None = None) -> None:
        from splitrt.graph import model as graph_mod

        self.config = config or DeviceConfig()
        self.graph = graph_mod.load(model) if isinstance(model, (str, Path)) else model
        self.sha256: str = self.graph.sha256
        self.cloud = cloud
        self._lock = threading.Lock()
        self._cuts: OrderedDict[str, _CutSessions] = OrderedDict()
        self._full: Any = None
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.SplitInferenceStub | None = None
        # Infer and InferStream with the hand framing of ``splitrt.transport.wire`` (set with the stub).
        self._infer: Any = None
        self._infer_stream: Any = None
        self._model_checked = False
        # A failed model check, re-raised until the monotonic time given.
        self._check_failed: tuple[float, CloudError] | None = None
        self.codec = codec.Codec.parse(self.config.codec)
        self.output_names = tuple(t.name for t in self.graph.outputs)

    # -- local ------------------------------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs as arrays, or ``InputError`` naming the expected and actual name/dtype/shape."""
        expected = {t.name: t for t in self.graph.inputs}
        if set(inputs) != set(expected):
            raise InputError(f"model {self.graph.path.name}: expected inputs {sorted(expected)}, "
                             f"got {sorted(inputs)}")
        out: dict[str, np.ndarray] = {}
        for name, info in expected.items():
            arr = np.asarray(inputs[name])
            if arr.dtype.name != info.dtype:
                raise InputError(f"input {name!r}: expected dtype {info.dtype}, got {arr.dtype.name}")
            if info.shape is not None and not wire.shape_matches(tuple(info.shape), tuple(arr.shape)):
                raise InputError(f"input {name!r}: expected shape {wire.describe_shape(tuple(info.shape))}, "
                                 f"got {list(arr.shape)}")
            out[name] = arr
        return out

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the right dtype and shape (symbolic dimensions as 1)."""
        rng = np.random.default_rng(seed)
        result: dict[str, np.ndarray] = {}
        for t in self.graph.inputs:
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (t.shape or ()))
            dt = np.dtype(t.dtype)
            if dt.kind == "f":
                result[t.name] = rng.standard_normal(shape).astype(dt)
            elif dt.kind == "b":
                result[t.name] = rng.integers(0, 2, shape).astype(dt)
            else:
                result[t.name] = rng.integers(0, 10, shape).astype(dt)
        return result

    def _sessions(self, cut_id: str) -> _CutSessions:
        with self._lock:
            cs = self._cuts.get(cut_id)
            if cs is not None:
                self._cuts.move_to_end(cut_id)
                return cs
        from splitrt.graph import partition

        head, tail = partition.split(self.graph, [cut_id])
        cs = _CutSessions(head_inputs=tuple(head.inputs), head_outputs=tuple(head.outputs),
                          tail_inputs=tuple(tail.inputs), tail_outputs=tuple(tail.outputs),
                          head_model=head.model, tail_model=tail.model)
        with self._lock:
            cs = self._cuts.setdefault(cut_id, cs)
            while len(self._cuts) > self.config.session_cache_size:
                self._cuts.popitem(last=False)
        return cs

    def run_local(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The whole model on this device (reference, and the last resort)."""
        feeds = self.check_inputs(inputs)
        if self._full is None:
            self._full = _session(self.graph.model, self.config.intra_op_threads)
        values = self._full.run(list(self.output_names), feeds)
        return dict(zip(self.output_names, values, strict=True))

    def run_head(self, inputs: Mapping[str, Any], cut: str) -> HeadResult:
        """Run the head of ``cut``; the result holds the tensors the tail needs."""
        feeds = self.check_inputs(inputs)
        cs = self._sessions(cut)
        t0 = time.perf_counter()
        env: dict[str, np.ndarray] = dict(feeds)
        if cs.head_outputs:
            if cs.head is None:
                cs.head = _session(cs.head_model, self.config.intra_op_threads)
            values = cs.head.run(list(cs.head_outputs), {n: feeds[n] for n in cs.head_inputs})
            env.update(zip(cs.head_outputs, values, strict=True))
        head_ms = (time.perf_counter() - t0) * 1e3
        return HeadResult(cut_id=cut, crossing={n: env[n] for n in cs.tail_inputs}, head_ms=head_ms)

    def finish_locally(self, head: HeadResult) -> SplitResult:
        """Run the tail of ``head.cut_id`` here: the fallback when the cloud cannot."""
        cs = self._sessions(head.cut_id)
        t0 = time.perf_counter()
        if cs.tail is None:
            cs.tail = _session(cs.tail_model, self.config.intra_op_threads)
        values = cs.tail.run(list(cs.tail_outputs), head.crossing)
        tail_ms = (time.perf_counter() - t0) * 1e3
        outputs = dict(zip(cs.tail_outputs, values, strict=True))
        return SplitResult(outputs={n: outputs[n] for n in self.output_names}, cut_id=head.cut_id,
                           codec="fp32", where="local", request_id=head.request_id, head_ms=head.head_ms,
                           tail_ms=tail_ms, total_ms=head.head_ms + tail_ms)

    def warm(self, cut: str) -> None:
        """Build ``cut``'s head and tail sessions now, so switching to it later costs no session build."""
        cs = self._sessions(cut)
        if cs.head is None and cs.head_outputs:
            cs.head = _session(cs.head_model, self.config.intra_op_threads)
        if cs.tail is None:
            cs.tail = _session(cs.tail_model, self.config.intra_op_threads)

    # -- cloud ------------------------------------------------------------------------------------
    def _metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.config.token}")] if self.config.token else []

    def stub(self) -> pb_grpc.SplitInferenceStub:
        if self._stub is not None:
            return self._stub
        if not self.cloud:
            raise ConfigError("no cloud: expected Device(model, 'host:port'), got none")
        cfg = self.config
        options = wire.channel_options(cfg.max_message_bytes, cfg.keepalive_s)
        if cfg.tls or cfg.tls_ca_path is not None:
            root = Path(cfg.tls_ca_path).read_bytes() if cfg.tls_ca_path is not None else None
            if cfg.tls_server_name:
                options.append(("grpc.ssl_target_name_override", cfg.tls_server_name))
            channel = grpc.secure_channel(self.cloud, grpc.ssl_channel_credentials(root), options)
        else:
            channel = grpc.insecure_channel(self.cloud, options)
        with self._lock:
            if self._stub is None:
                self._channel = channel
                framed: dict[str, Any] = {"request_serializer": wire.serialize,
                                          "response_deserializer": wire.deserializer(pb.InferReply),
                                          "_registered_method": True}
                self._infer = channel.unary_unary(f"/{wire.SERVICE_NAME}/Infer", **framed)
                self._infer_stream = channel.stream_stream(f"/{wire.SERVICE_NAME}/InferStream", **framed)
                self._stub = pb_grpc.SplitInferenceStub(channel)
            else:
                channel.close()
        assert self._stub is not None
        return self._stub

    def status(self, timeout_s: float | None = None) -> pb.StatusReply:
        try:
            return self.stub().Status(pb.StatusRequest(), timeout=timeout_s or self.config.timeout_s,
                                      metadata=self._metadata())
        except grpc.RpcError as exc:
            raise wire.cloud_error(exc, f"status of {self.cloud}") from exc

    def probe(self, up_bytes: int, down_bytes: int, timeout_s: float | None = None) -> ProbeResult:
        """One echo of ``up_bytes`` up and ``down_bytes`` down (feed netmon with the result)."""
        req = pb.ProbeRequest(payload=bytes(up_bytes), reply_bytes=down_bytes)
        t0 = time.perf_counter()
        try:
            reply = self.stub().Probe(req, timeout=timeout_s or self.config.timeout_s,
                                      metadata=self._metadata())
        except grpc.RpcError as exc:
            raise wire.cloud_error(exc, f"probe of {self.cloud}") from exc
        seconds = time.perf_counter() - t0
        return ProbeResult(up_bytes=up_bytes, down_bytes=len(reply.payload), seconds=seconds,
                           load=wire.LoadInfo.from_proto(reply.load))

    def upload_model(self, timeout_s: float | None = None) -> pb.PutModelReply:
        """Stream the model file to the cloud (verified there by sha256)."""
        data = Path(self.graph.path).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if sha != self.sha256:
            raise CloudError(f"model file {self.graph.path} changed: expected sha256 {self.sha256}, "
                             f"got {sha}",
                             code="FAILED_PRECONDITION")
        step = self.config.upload_chunk_bytes

        def chunks() -> Iterator[pb.ModelChunk]:
            yield pb.ModelChunk(sha256=sha, name=Path(self.graph.path).name, total_bytes=len(data),
                                data=data[:step])
            for i in range(step, len(data), step):
                yield pb.ModelChunk(data=data[i:i + step])

        timeout = timeout_s or self.config.upload_timeout_s
        try:
            return self.stub().PutModel(chunks(), timeout=timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise wire.cloud_error(exc, f"upload of {self.graph.path} to {self.cloud}") from exc

    def ensure_model(self, force: bool = False, *, timeout_s: float | None = None,
                     wait_upload: bool = True) -> None:
        """Make sure the cloud has the model (``CloudError`` if it cannot be made sure of).

        The check is one ``Status`` call with ``timeout_s`` (default ``DeviceConfig.timeout_s``), done once;
        a failed check is re-raised without an RPC for ``check_backoff_s`` (``force`` checks anyway).
        A missing model is uploaded when both sides allow it: here with ``upload_timeout_s``
        (``wait_upload``), or else in a background thread while this call raises a retryable
        ``UNAVAILABLE`` (the request path: no upload within a request's deadline).
        """
        if self._model_checked and not force:
            return
        now = time.monotonic()
        failed = self._check_failed
        if failed is not None and now < failed[0] and not force:
            raise CloudError(f"{failed[1]} (remembered for {failed[0] - now:.2f} s more)",
                             code=failed[1].code, retryable=failed[1].retryable)
        try:
            self._ensure_model(timeout_s, wait_upload)
        except CloudError as exc:
            with self._lock:
                self._check_failed = (time.monotonic() + self.config.check_backoff_s, exc)
            raise
        with self._lock:
            self._model_checked = True
            self._check_failed = None

    def _ensure_model(self, timeout_s: float | None, wait_upload: bool) -> None:
        st = self.status(timeout_s)
        if any(m.sha256 == self.sha256 for m in st.models):
            return
        if not (self.config.upload and st.allow_upload):
            why = "uploads disabled on this device" if not self.config.upload else "server refuses uploads"
            raise CloudError(f"cloud {self.cloud} lacks model {self.sha256[:12]} "
                             f"({self.graph.path}) and {why}", code="NOT_FOUND", retryable=False)
        if wait_upload:
            self.upload_model()
            return
        key = (str(self.cloud), self.sha256)
        with _UPLOADS_LOCK:
            running = _UPLOADS.get(key)
            if running is None or not running.is_alive():
                running = threading.Thread(target=self._background_upload, args=(key,), daemon=True,
                                           name=f"splitrt-upload-{self.sha256[:8]}")
                _UPLOADS[key] = running
                running.start()
        raise CloudError(f"cloud {self.cloud} lacks model {self.sha256[:12]} ({self.graph.path}): expected it "
                         "there, got an upload in progress (in the background; retry later)",
                         code="UNAVAILABLE", retryable=True)

    def _background_upload(self, key: tuple[str, str]) -> None:
        try:
            self.upload_model()
        except Exception as exc:  # CloudError, or the channel closed under us: the next check retries
            with self._lock:
                err = exc if isinstance(exc, CloudError) else CloudError(
                    f"upload of {self.graph.path} to {self.cloud} failed: {exc}", code="UNAVAILABLE")
                self._check_failed = (time.monotonic() + self.config.check_backoff_s, err)
        else:
            with self._lock:
                self._check_failed = None
                self._model_checked = True
        finally:
            with _UPLOADS_LOCK:
                if _UPLOADS.get(key) is threading.current_thread():
                    del _UPLOADS[key]

    def upload_in_progress(self) -> bool:
        """True while a background upload of this model to this cloud runs (started by ``send``)."""
        with _UPLOADS_LOCK:
            t = _UPLOADS.get((str(self.cloud), self.sha256))
        return t is not None and t.is_alive()

    def _request(self, head: HeadResult, spec: codec.Codec) -> tuple[wire.Framed, int]:
        """The ``InferRequest`` for ``head`` and its payload bytes (raw/fp32 payloads are views of the
        head's arrays: the serializer copies them once)."""
        header = pb.InferRequest(model_sha256=self.sha256, cut_id=head.cut_id, codec=str(spec),
                                 request_id=head.request_id, output_codec=self.config.output_codec)
        tensors = [codec.encode(n, a, spec, copy=False) for n, a in head.crossing.items()]
        return wire.Framed(header=header, tensors=tensors), sum(e.nbytes for e in tensors)

    def _decode_reply(self, reply: wire.Framed) -> tuple[dict[str, np.ndarray], int]:
        try:
            encoded = reply.tensors
            # The same decoded-size cap a server applies (a reply may claim any size under zlib).
            cap = 4 * self.config.max_message_bytes
            outs = {e.name: codec.decode(e, max_bytes=cap) for e in encoded}
        except CodecError as exc:
            raise CloudError(f"reply from {self.cloud} does not decode: {exc}", code="DATA_LOSS") from exc
        if set(outs) != set(self.output_names):
            raise CloudError(f"reply from {self.cloud}: expected outputs {sorted(self.output_names)}, "
                             f"got {sorted(outs)}", code="DATA_LOSS")
        return {n: np.array(outs[n]) for n in self.output_names}, sum(e.nbytes for e in encoded)

    def send(self, head: HeadResult, *, codec_spec: str | codec.Codec | None = None,
             timeout_s: float | None = None) -> SplitResult:
        """Ship ``head``'s crossing tensors to the cloud, return the outputs (``CloudError`` on failure)."""
        if head.cut_id == DEVICE_CUT:
            return self.finish_locally(head)
        spec = self.codec if codec_spec is None else codec.Codec.parse(codec_spec)
        t0 = time.perf_counter()
        request, bytes_up = self._request(head, spec)
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
        self.stub()
        infer = self._infer
        t2 = time.perf_counter()
        try:
            reply = infer(request, timeout=left(), metadata=self._metadata())
        except grpc.RpcError as exc:
            err = wire.cloud_error(exc, f"infer {self.sha256[:12]}@{head.cut_id} on {self.cloud}")
            if err.code == "NOT_FOUND" and "model sha256" in str(err) and self.config.upload:
                self._model_checked = False  # the cloud lost the model (restart?): upload once more
                check(force=True)
                try:
                    reply = infer(request, timeout=left(), metadata=self._metadata())
                except grpc.RpcError as exc2:
                    raise wire.cloud_error(exc2, f"infer {self.sha256[:12]}@{head.cut_id} "
                                                 f"on {self.cloud}") from exc2
            else:
                raise err from exc
        t3 = time.perf_counter()
        outputs, bytes_down = self._decode_reply(reply)
        t4 = time.perf_counter()
        return SplitResult(
            outputs=outputs, cut_id=head.cut_id, codec=str(spec), where="cloud", request_id=head.request_id,
            head_ms=head.head_ms, encode_ms=(t1 - t0) * 1e3, rpc_ms=(t3 - t2) * 1e3,
            decode_ms=(t4 - t3) * 1e3, tail_ms=reply.header.tail_ms, queue_ms=reply.header.queue_ms,
            total_ms=head.head_ms + (t4 - t0) * 1e3 - (t2 - t1) * 1e3,
            bytes_up=bytes_up, bytes_down=bytes_down,
            load=wire.LoadInfo.from_proto(reply.header.load))

    def run_detailed(self, inputs: Mapping[str, Any], *, cut: str, codec_spec: str | None = None,
                     timeout_s: float | None = None) -> SplitResult:
        head = self.run_head(inputs, cut)
        if cut == DEVICE_CUT:
            return self.finish_locally(head)
        return self.send(head, codec_spec=codec_spec, timeout_s=timeout_s)

    def run(self, inputs: Mapping[str, Any], *, cut: str, codec_spec: str | None = None,
            timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """Outputs of the model for ``inputs``, split at ``cut`` (``device``: all local)."""
        return self.run_detailed(inputs, cut=cut, codec_spec=codec_spec, timeout_s=timeout_s).outputs

    def stream(self, frames: Iterable[Mapping[str, Any]], *, cut: str,
               codec_spec: str | None = None) -> Iterator[SplitResult]:
        """One result per frame over one bidirectional stream; a failed frame carries ``error``."""
        spec = self.codec if codec_spec is None else codec.Codec.parse(codec_spec)
        self.ensure_model()
        pending: deque[tuple[HeadResult, int, float]] = deque()

        def requests() -> Iterator[wire.Framed]:
            for frame in frames:
                head = self.run_head(frame, cut)
                req, nbytes = self._request(head, spec)
                pending.append((head, nbytes, time.perf_counter()))
                yield req

        self.stub()
        try:
            for framed in self._infer_stream(requests(), metadata=self._metadata()):
                reply = framed.header
                head, bytes_up, t_sent = pending.popleft()
                t_got = time.perf_counter()
                common: dict[str, Any] = {
                    "cut_id": cut, "codec": str(spec), "where": "cloud", "request_id": head.request_id,
                    "head_ms": head.head_ms, "rpc_ms": (t_got - t_sent) * 1e3, "tail_ms": reply.tail_ms,
                    "queue_ms": reply.queue_ms, "bytes_up": bytes_up,
                    "load": wire.LoadInfo.from_proto(reply.load)}
                if reply.error.code:
                    err = CloudError(f"frame {head.request_id}: {reply.error.code}: {reply.error.message}",
                                     code=reply.error.code,
                                     retryable=reply.error.code in wire.RETRYABLE_CODES)
                    yield SplitResult(outputs={}, error=err, **common)
                    continue
                outputs, bytes_down = self._decode_reply(framed)
                total = head.head_ms + (time.perf_counter() - t_sent) * 1e3
                yield SplitResult(outputs=outputs, total_ms=total, bytes_down=bytes_down, **common)
        except grpc.RpcError as exc:
            raise wire.cloud_error(exc, f"stream {self.sha256[:12]}@{cut} on {self.cloud}") from exc

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = None
            self._stub = None
            self._infer = self._infer_stream = None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
