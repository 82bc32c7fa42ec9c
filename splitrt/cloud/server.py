"""The cloud inference server: runs the tails of split models for devices, over gRPC.

``CloudServer(ServerConfig(models_dir=...)).start()`` serves every ``*.onnx`` in the directory under
the sha256 of its bytes (files dropped in later are found on the first request that names them).
A request names the model, the cut and carries the crossing tensors; the server builds the tail
segment (``splitrt.graph.partition.split(graph, [cut])[-1]``) into an onnxruntime session on first use and
keeps it in an LRU cache bounded by ``segment_cache_size`` sessions.

Concurrency and memory are bounded: at most ``workers`` tails run at once, at most ``max_queue`` more
requests wait (beyond that: RESOURCE_EXHAUSTED at once), a waiting request gives up at its deadline
(DEADLINE_EXCEEDED), gRPC caps concurrent RPCs and message sizes (``max_message_bytes``). A request's
tensors are checked (names, dtypes, shapes, and their decoded size against ``max_decoded_bytes``, per
tensor and in total: RESOURCE_EXHAUSTED) before it waits, but decoded (zlib inflated, dequantised) only
once it holds a worker slot. So received messages take at most ``(workers + max_queue + 8) *
max_message_bytes`` and decoded inputs at most ``workers * max_decoded_bytes`` (plus the tails' own
activations and their encoded outputs). ``stop()`` stops accepting calls, marks health NOT_SERVING and
drains in-flight calls for ``drain_timeout_s``.

Every request is logged as one JSON line on the ``splitrt.cloud`` logger.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from splitrt import __version__
from splitrt.errors import CodecError, ConfigError, CutError, ModelError, SplitrtError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

log = logging.getLogger("splitrt.cloud")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    models_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    allow_upload: bool = False
    tls_cert_path: Path | None = None
    tls_key_path: Path | None = None
    # Bearer tokens accepted (empty: no auth). ``tokens_from_file`` reads one per line.
    tokens: tuple[str, ...] = ()
    workers: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    max_queue: int = 32
    segment_cache_size: int = 16
    max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES
    # Cap on the decoded size of one request's input tensors (each and in total); None: 4 x
    # max_message_bytes, what an int8 payload filling a message decodes to as float32.
    max_decoded_bytes: int | None = None
    # Used when the caller set no deadline.
    default_deadline_s: float = 60.0
    drain_timeout_s: float = 10.0
    max_model_bytes: int = 4 * 1024**3
    # onnxruntime intra-op threads per tail session (0: onnxruntime's default).
    intra_op_threads: int = 0


def tokens_from_file(path: Path) -> tuple[str, ...]:
    """Bearer tokens, one per line (blank lines and ``#`` comments ignored)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"token file {path}: cannot read ({exc.strerror})") from exc
    tokens = tuple(s.strip() for s in lines if s.strip() and not s.strip().startswith("#"))
    if not tokens:
        raise ConfigError(f"token file {path}: expected at least one token, got none")
    return tokens


class RpcFailure(Exception):
    """Internal: a request fails with a gRPC status (mapped to abort or to a stream frame's error)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _sha256_file(path: Path) -> str:
    """The model's identity exactly as the device computes it (external data included)."""
    from splitrt.graph.model import model_sha256

    return model_sha256(path)


@dataclass
class _ModelEntry:
    sha256: str
    path: Path
    bytes: int
    graph: Any = None


class ModelStore:
    """The models of a directory, by sha256 of their bytes; graphs are loaded on first use."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigError(f"models directory {self.root}: expected a directory, got "
                              f"{'a file' if self.root.exists() else 'nothing'}")
        self._lock = threading.Lock()
        self._by_sha: dict[str, _ModelEntry] = {}
        self._seen: dict[Path, tuple[float, int, str]] = {}
        self._graph_locks: dict[str, threading.Lock] = {}
        self.scan()

    def scan(self) -> None:
        """Index new or changed ``*.onnx`` files (hashes only what changed)."""
        with self._lock:
            present = set()
            for path in sorted(self.root.glob("*.onnx")):
                try:
                    st = path.stat()
                except OSError:
                    continue
                present.add(path)
                key = (st.st_mtime, st.st_size)
                seen = self._seen.get(path)
                if seen is not None and seen[:2] == key:
                    continue
                sha = _sha256_file(path)
                self._seen[path] = (st.st_mtime, st.st_size, sha)
                if sha not in self._by_sha:
                    self._by_sha[sha] = _ModelEntry(sha256=sha, path=path, bytes=st.st_size)
            for path in set(self._seen) - present:
                sha = self._seen.pop(path)[2]
                entry = self._by_sha.get(sha)
                if entry is not None and entry.path == path:
                    del self._by_sha[sha]

    def models(self) -> list[_ModelEntry]:
        with self._lock:
            return sorted(self._by_sha.values(), key=lambda e: e.path.name)

    def has(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._by_sha

    def entry(self, sha256: str) -> _ModelEntry:
        with self._lock:
            entry = self._by_sha.get(sha256)
        if entry is None:
            self.scan()
            with self._lock:
                entry = self._by_sha.get(sha256)
        if entry is None:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND,
                             f"model sha256 {sha256!r} not found: expected one of {len(self._by_sha)} "
                             f"models in {self.root}")
        return entry

    def graph(self, sha256: str) -> Any:
        entry = self.entry(sha256)
        if entry.graph is not None:
            return entry.graph
        with self._lock:
            glock = self._graph_locks.setdefault(sha256, threading.Lock())
        with glock:
            if entry.graph is None:
                from splitrt.graph import model as graph_mod

                try:
                    entry.graph = graph_mod.load(entry.path)
                except ModelError as exc:
                    raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"model {entry.path.name} cannot be loaded: {exc}") from exc
        return entry.graph

    def add(self, sha256: str, path: Path) -> None:
        st = path.stat()
        with self._lock:
            self._seen[path] = (st.st_mtime, st.st_size, sha256)
            self._by_sha.setdefault(sha256, _ModelEntry(sha256=sha256, path=path, bytes=st.st_size))


@dataclass
class Tail:
    """A ready tail session and what it expects."""

    session: Any
    inputs: list[tuple[str, str, tuple[int | str | None, ...]]]
    outputs: list[str]
    hits: int = 0


class TailCache:
    """LRU cache of tail sessions keyed by (model sha256, cut id); builds each key once."""

    def __init__(self, store: ModelStore, capacity: int, intra_op_threads: int) -> None:
        if capacity < 1:
            raise ConfigError(f"segment_cache_size: expected >= 1, got {capacity}")
        self.store = store
        self.capacity = capacity
        self.intra_op_threads = intra_op_threads
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Tail] = OrderedDict()
        self._building: dict[tuple[str, str], threading.Lock] = {}

    def get(self, sha256: str, cut_id: str) -> Tail:
        key = (sha256, cut_id)
        with self._lock:
            tail = self._cache.get(key)
            if tail is not None:
                self._cache.move_to_end(key)
                tail.hits += 1
                return tail
            build_lock = self._building.setdefault(key, threading.Lock())
        with build_lock:
            with self._lock:
                tail = self._cache.get(key)
            if tail is None:
                tail = self._build(sha256, cut_id)
            with self._lock:
                self._cache[key] = tail
                self._cache.move_to_end(key)
                tail.hits += 1
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
                self._building.pop(key, None)
            return tail

    def _build(self, sha256: str, cut_id: str) -> Tail:
        import onnxruntime as ort

        from splitrt.graph import partition

        graph = self.store.graph(sha256)
        try:
            segment = partition.split(graph, [cut_id])[-1]
        except CutError as exc:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND,
                             f"cut {cut_id!r} of model {sha256[:12]}: {exc}") from exc
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = self.intra_op_threads
        try:
            session = ort.InferenceSession(segment.model.SerializeToString(), opts,
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise RpcFailure(grpc.StatusCode.INTERNAL,
                             f"tail of model {sha256[:12]} at cut {cut_id!r} does not load: {exc}") from exc
        inputs: list[tuple[str, str, tuple[int | str | None, ...]]] = [
            (i.name, wire.ort_dtype(i.type), tuple(d if isinstance(d, int) else None for d in i.shape))
            for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        log_event("tail_built", model=sha256[:12], cut=cut_id, inputs=len(inputs))
        return Tail(session=session, inputs=inputs, outputs=outputs)

    def snapshot(self) -> list[tuple[str, str, int]]:
        with self._lock:
            return [(k[0], k[1], t.hits) for k, t in self._cache.items()]


class Admission:
    """Bounded admission: ``workers`` run, ``max_queue`` wait, the rest are refused."""

    def __init__(self, workers: int, max_queue: int) -> None:
        if workers < 1 or max_queue < 0:
            raise ConfigError(f"workers >= 1 and max_queue >= 0 expected, got {workers} and {max_queue}")
        self.workers = workers
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(workers)
        self.admitted = 0
        self.running = 0

    def admit(self) -> bool:
        with self._lock:
            if self.admitted >= self.workers + self.max_queue:
                return False
            self.admitted += 1
            return True

    def acquire(self, timeout_s: float) -> bool:
        ok = self._slots.acquire(timeout=max(0.0, timeout_s))
        if ok:
            with self._lock:
                self.running += 1
        return ok

    def release_slot(self) -> None:
        with self._lock:
            self.running -= 1
        self._slots.release()

    def leave(self) -> None:
        with self._lock:
            self.admitted -= 1


class _CpuMeter:
    """Host CPU utilisation, refreshed at most every ``period_s`` (psutil's non-blocking form)."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        psutil.cpu_percent(interval=None)
        self._t = time.monotonic()
        self._value = 0.0

    def percent(self) -> float:
        with self._lock:
            now = time.monotonic()
            if now - self._t >= self.period_s:
                self._value = float(psutil.cpu_percent(interval=None))
                self._t = now
            return self._value


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One JSON line on the ``splitrt.cloud`` logger."""
    if log.isEnabledFor(level):
        record = {"ts": round(time.time(), 6), "event": event, **fields}
        log.log(level, json.dumps(record, default=str))


class _Servicer:
    """SplitInference (registered by ``_add_servicer``)."""

    def __init__(self, server: CloudServer) -> None:
        self.s = server

    def Infer(self, request: wire.Framed | wire.Malformed, context: grpc.ServicerContext) -> wire.Framed:
        try:
            if isinstance(request, wire.Malformed):
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"Infer: {request.message}")
            return self.s.infer(request, context.time_remaining())
        except RpcFailure as exc:
            context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc

    def InferStream(self, request_iterator: Iterator[wire.Framed | wire.Malformed],
                    context: grpc.ServicerContext) -> Iterator[wire.Framed | pb.InferReply]:
        for request in request_iterator:
            if isinstance(request, wire.Malformed):  # the frame has no readable request_id
                yield pb.InferReply(load=self.s.load(), error=pb.Error(
                    code=grpc.StatusCode.INVALID_ARGUMENT.name, message=f"InferStream: {request.message}"))
                continue
            try:
                yield self.s.infer(request, context.time_remaining())
            except RpcFailure as exc:
                yield pb.InferReply(request_id=request.header.request_id, load=self.s.load(),
                                    error=pb.Error(code=exc.code.name, message=exc.message))

    def Probe(self, request: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeReply:
        n = int(request.reply_bytes)
        if n > self.s.config.max_message_bytes - 1024:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"probe reply_bytes: expected at most {self.s.config.max_message_bytes - 1024}, "
                          f"got {n}")
        return pb.ProbeReply(payload=bytes(n), received_bytes=len(request.payload), load=self.s.load())

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return self.s.status()

    def PutModel(self, request_iterator: Iterator[pb.ModelChunk],
                 context: grpc.ServicerContext) -> pb.PutModelReply:
        try:
            return self.s.put_model(request_iterator)
        except RpcFailure as exc:
            context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from exc


def _add_servicer(servicer: _Servicer, server: grpc.Server) -> None:
    """The generated ``add_SplitInferenceServicer_to_server``, but Infer and InferStream use the hand
    framing of ``splitrt.transport.wire`` (same bytes on the wire, payloads never copied by protobuf)."""
    framed: dict[str, Any] = {"request_deserializer": wire.lenient_deserializer(pb.InferRequest),
                              "response_serializer": wire.serialize}

    def stock(request: Any, reply: Any) -> dict[str, Any]:
        return {"request_deserializer": request.FromString, "response_serializer": reply.SerializeToString}

    handlers = {
        "Infer": grpc.unary_unary_rpc_method_handler(servicer.Infer, **framed),
        "InferStream": grpc.stream_stream_rpc_method_handler(servicer.InferStream, **framed),
        "Probe": grpc.unary_unary_rpc_method_handler(servicer.Probe, **stock(pb.ProbeRequest, pb.ProbeReply)),
        "Status": grpc.unary_unary_rpc_method_handler(servicer.Status, **stock(pb.StatusRequest, pb.StatusReply)),
        "PutModel": grpc.stream_unary_rpc_method_handler(servicer.PutModel,
                                                         **stock(pb.ModelChunk, pb.PutModelReply)),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(wire.SERVICE_NAME, handlers)


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class _TokenInterceptor(grpc.ServerInterceptor):
    """Bearer-token auth for every method except the standard health service."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        method = handler_call_details.method or ""
        if method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        auth = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                auth = value if isinstance(value, str) else value.decode()
        given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
        ok = bool(given) and any(hmac.compare_digest(given, t) for t in self._tokens)
        handler = continuation(handler_call_details)
        if ok or handler is None:
            return handler
        log_event("unauthenticated", logging.WARNING, method=method, had_token=bool(auth))
        reason = "a bearer token" if not auth else "a valid bearer token"
        return _deny_handler(handler, f"expected {reason} in the 'authorization' metadata")


class CloudServer:
    """The gRPC server; start in-process (``port=0`` picks a free port) or via ``splitrt serve``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        if (config.tls_cert_path is None) != (config.tls_key_path is None):
            raise ConfigError("TLS needs both a certificate and a key, got only one")
        self.store = ModelStore(config.models_dir)
        self.tails = TailCache(self.store, config.segment_cache_size, config.intra_op_threads)
        self.admission = Admission(config.workers, config.max_queue)
        self.max_decoded_bytes = (4 * config.max_message_bytes if config.max_decoded_bytes is None
                                  else config.max_decoded_bytes)
        if self.max_decoded_bytes < 1:
            raise ConfigError(f"max_decoded_bytes: expected >= 1, got {config.max_decoded_bytes}")
        self.cpu = _CpuMeter()
        self.served = 0
        self._served_lock = threading.Lock()
        self._bytes_in = threading.local()
        self.health = health.HealthServicer()
        self.port = 0
        self._server: grpc.Server | None = None
        # Test hook: called in the worker slot just before the tail runs (with the request's header).
        self.before_tail: Callable[[pb.InferRequest], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> int:
        cfg = self.config
        concurrency = cfg.workers + cfg.max_queue + 8
        interceptors = [_TokenInterceptor(cfg.tokens)] if cfg.tokens else []
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="splitrt-cloud"),
            interceptors=interceptors,
            options=wire.server_options(cfg.max_message_bytes),
            maximum_concurrent_rpcs=concurrency,
        )
        _add_servicer(_Servicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        address = f"{cfg.host}:{cfg.port}"
        try:
            if cfg.tls_cert_path is not None and cfg.tls_key_path is not None:
                creds = grpc.ssl_server_credentials(
                    [(Path(cfg.tls_key_path).read_bytes(), Path(cfg.tls_cert_path).read_bytes())])
                port = server.add_secure_port(address, creds)
            else:
                port = server.add_insecure_port(address)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise ConfigError(f"cannot listen on {address}: expected a free port, got a bind failure")
        server.start()
        self._server = server
        self.port = port
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(wire.SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        log_event("listening", host=cfg.host, port=port, tls=cfg.tls_cert_path is not None,
                  auth=bool(cfg.tokens), models=len(self.store.models()), workers=cfg.workers,
                  allow_upload=cfg.allow_upload, version=__version__)
        return port

    @property
    def address(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def stop(self, grace_s: float | None = None) -> None:
        """Refuse new calls, drain in-flight ones for ``grace_s`` (default ``drain_timeout_s``)."""
        if self._server is None:
            return
        grace = self.config.drain_timeout_s if grace_s is None else grace_s
        self.health.enter_graceful_shutdown()
        log_event("draining", grace_s=grace, queue_depth=self.admission.admitted)
        self._server.stop(grace).wait()
        self._server = None
        log_event("stopped", served=self.served)

    def wait(self, timeout_s: float | None = None) -> bool:
        return True if self._server is None else bool(self._server.wait_for_termination(timeout_s))

    def __enter__(self) -> CloudServer:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=1.0)

    # -- requests ----------------------------------------------------------------------------------
    def load(self) -> pb.Load:
        a = self.admission
        return pb.Load(queue_depth=a.admitted, running=a.running, workers=a.workers,
                       cpu_percent=self.cpu.percent())

    def load_factor(self) -> float:
        """Load as a multiplier of tail compute time (1.0 = idle; discovery's TXT ``load``): requests
        admitted per worker or 1 / (1 - CPU busy share), whichever says busier."""
        a = self.admission
        cpu = min(self.cpu.percent(), 95.0) / 100.0
        return max(1.0, a.admitted / max(1, a.workers), 1.0 / (1.0 - cpu))

    def model_hashes(self) -> list[str]:
        return [m.sha256 for m in self.store.models()]

    def infer(self, request: wire.Framed, time_remaining_s: float | None) -> wire.Framed:
        """Run the tail for an ``InferRequest`` (``wire.Framed``); the reply is an ``InferReply``."""
        t0 = time.perf_counter()
        header = request.header
        fields: dict[str, Any] = {"request_id": header.request_id, "model": header.model_sha256[:12],
                                  "cut": header.cut_id, "codec": header.codec}
        try:
            reply = self._infer(request, time_remaining_s, t0)
        except RpcFailure as exc:
            log_event("infer", logging.WARNING, **fields, code=exc.code.name, error=exc.message,
                      total_ms=round((time.perf_counter() - t0) * 1e3, 3))
            raise
        with self._served_lock:
            self.served += 1
        log_event("infer", **fields, code="OK", tail_ms=round(reply.header.tail_ms, 3),
                  queue_ms=round(reply.header.queue_ms, 3), total_ms=round((time.perf_counter() - t0) * 1e3, 3),
                  bytes_in=getattr(self._bytes_in, "value", 0))
        return reply

    def _infer(self, request: wire.Framed, time_remaining_s: float | None, t0: float) -> wire.Framed:
        header = request.header
        deadline_s = self.config.default_deadline_s if time_remaining_s is None else time_remaining_s
        if not self.admission.admit():
            a = self.admission
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"server busy: queue depth {a.admitted}, expected at most "
                             f"{a.workers + a.max_queue} (workers {a.workers} + queue {a.max_queue})")
        try:
            tail = self.tails.get(header.model_sha256, header.cut_id)
            bytes_in = self._check_inputs(request, tail)  # cheap: nothing inflated or allocated yet
            try:
                out_codec = codec.Codec.parse(header.output_codec or "fp32")
            except CodecError as exc:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            remaining = deadline_s - (time.perf_counter() - t0)
            if not self.admission.acquire(remaining):
                raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"waited {(time.perf_counter() - t0) * 1e3:.1f} ms for a worker: expected "
                                 f"one within the deadline of {deadline_s * 1e3:.1f} ms")
            t_run = time.perf_counter()
            try:
                # Decoded only in a worker slot: at most ``workers`` requests inflate at once.
                feeds = self._decode_inputs(request)
                if self.before_tail is not None:
                    self.before_tail(header)
                t_run = time.perf_counter()
                try:
                    values = tail.session.run(tail.outputs, feeds)
                except Exception as exc:  # onnxruntime's own exception types
                    raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                                     f"tail of cut {header.cut_id!r} failed on the given tensors: "
                                     f"{exc}") from exc
                t_done = time.perf_counter()
            finally:
                self.admission.release_slot()
            reply = pb.InferReply(request_id=header.request_id, tail_ms=(t_done - t_run) * 1e3,
                                  queue_ms=(t_run - t0) * 1e3, load=self.load())
            try:
                outputs = [codec.encode(n, np.asarray(v), out_codec, copy=False)
                           for n, v in zip(tail.outputs, values, strict=True)]
            except CodecError as exc:
                raise RpcFailure(grpc.StatusCode.INTERNAL, f"cannot encode outputs: {exc}") from exc
            self._bytes_in.value = bytes_in
            return wire.Framed(header=reply, tensors=outputs)
        finally:
            self.admission.leave()

    def _check_inputs(self, request: wire.Framed, tail: Tail) -> int:
        """Names, dtypes, shapes and decoded sizes of the request's tensors (RpcFailure if wrong);
        returns the payload bytes. Symbolic dimensions accept any size, so the size cap is what bounds
        the memory a request may claim."""
        expected = {name: (dtype, shape) for name, dtype, shape in tail.inputs}
        given = {t.name: t for t in request.tensors}
        if len(given) != len(request.tensors) or set(given) != set(expected):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"cut {request.header.cut_id!r}: expected tensors {sorted(expected)}, "
                             f"got {[t.name for t in request.tensors]}")
        nbytes = total = 0
        cap = self.max_decoded_bytes
        for name, (dtype, shape) in expected.items():
            t = given[name]
            got_shape = t.shape
            if t.dtype != dtype:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"tensor {name!r}: expected dtype {dtype}, got {t.dtype or '(empty)'}")
            if not wire.shape_matches(shape, got_shape):
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"tensor {name!r}: expected shape {wire.describe_shape(shape)}, "
                                 f"got {list(got_shape)}")
            nbytes += t.nbytes
            try:
                need = codec.decoded_bytes(t)
            except CodecError as exc:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            total += need
            if need > cap:
                raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 f"tensor {name!r}: shape {list(got_shape)} {t.dtype} ({t.codec}) decodes to "
                                 f"{need} bytes, expected at most {cap} (max_decoded_bytes)")
        if total > cap:
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"cut {request.header.cut_id!r}: tensors decode to {total} bytes in total, "
                             f"expected at most {cap} (max_decoded_bytes)")
        return nbytes

    def _decode_inputs(self, request: wire.Framed) -> dict[str, np.ndarray]:
        """The request's tensors decoded (after ``_check_inputs``); raw/fp32 ones are views of the
        received bytes."""
        feeds: dict[str, np.ndarray] = {}
        for t in request.tensors:
            try:
                feeds[t.name] = codec.decode(t, max_bytes=self.max_decoded_bytes)
            except CodecError as exc:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return feeds

    def status(self) -> pb.StatusReply:
        self.store.scan()  # models copied into the directory since the last look (stat only: cheap)
        models = [pb.ModelInfo(sha256=m.sha256, name=m.path.name, bytes=m.bytes) for m in self.store.models()]
        segments = [pb.SegmentInfo(model_sha256=s, cut_id=c, hits=h) for s, c, h in self.tails.snapshot()]
        cfg = self.config
        return pb.StatusReply(version=__version__, models=models, segments=segments, load=self.load(),
                              allow_upload=cfg.allow_upload, max_message_bytes=cfg.max_message_bytes,
                              segment_cache_size=cfg.segment_cache_size, max_queue=cfg.max_queue,
                              served=self.served)

    def put_model(self, chunks: Iterator[pb.ModelChunk]) -> pb.PutModelReply:
        if not self.config.allow_upload:
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
        if self.store.has(sha):
            return pb.PutModelReply(sha256=sha, already_present=True, bytes=self.store.entry(sha).bytes)
        limit = self.config.max_model_bytes
        if first.total_bytes > limit:
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"upload: expected at most {limit} bytes, got total_bytes {first.total_bytes}")
        root = self.store.root
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
            self.store.add(sha, final)
        except SplitrtError as exc:
            raise RpcFailure(grpc.StatusCode.INTERNAL, f"upload failed: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        log_event("model_uploaded", model=sha[:12], bytes=size)
        return pb.PutModelReply(sha256=sha, already_present=False, bytes=size)


def _chain(first: pb.ModelChunk, rest: Iterator[pb.ModelChunk]) -> Iterator[pb.ModelChunk]:
    yield first
    yield from rest
