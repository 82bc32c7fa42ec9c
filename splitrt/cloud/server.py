"""The cloud inference server's lifecycle: ``CloudServer(ServerConfig(...)).start() -> port`` wires the
parts (``config``, ``guard``, ``handler``, ``capacity``, ``models``, ``metrics``, ``advertise``), serves
every ``*.onnx`` of ``models_dir`` under its sha256 and drains at ``stop``: new calls refused, NOT_SERVING,
runs still going near the end of ``drain_timeout_s`` terminated. Statuses: NOT_FOUND, INVALID_ARGUMENT
(never INTERNAL for bad bytes), RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, CANCELLED, UNAUTHENTICATED,
PERMISSION_DENIED, FAILED_PRECONDITION (a stored model that does not load, split or run), UNAVAILABLE
(shutting down). One JSON line per event on ``splitrt.cloud``; tokens never appear.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from concurrent import futures
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from splitrt import __version__
from splitrt.cloud.capacity.admission import Admission, admitted
from splitrt.cloud.capacity.cancel import Canceller
from splitrt.cloud.capacity.fairq import HEAVY
from splitrt.cloud.capacity.memory import (
    LOAD_PEAK_FACTOR,
    process_budget,
    rss_bytes,
    watch_limit,
)
from splitrt.cloud.capacity.niced import NicePool
from splitrt.cloud.capacity.saturation import HealthGate, saturated
from splitrt.cloud.common import log_event
from splitrt.cloud.config import ServerConfig, tail_threads, tokens_from_file
from splitrt.cloud.guard import security
from splitrt.cloud.guard.door import FrontDoor
from splitrt.cloud.guard.limits import grpc_options
from splitrt.cloud.handler.infer import Handler
from splitrt.cloud.handler.nexthop import NextHop
from splitrt.cloud.handler.servicer import Servicer, add_health, add_servicer
from splitrt.cloud.metrics import ServerStats, metrics_http
from splitrt.cloud.models.builder import Builder
from splitrt.cloud.models.store import ModelStore
from splitrt.cloud.models.tails import TailCache
from splitrt.cloud.models.upload import CHECKER, Quota, receive_model
from splitrt.cloud.models.warm import WarmStart
from splitrt.errors import ConfigError
from splitrt.transport import imagecodec, wire
from splitrt.transport import splitrt_pb2 as pb

__all__ = ["CloudServer", "ServerConfig", "tail_threads", "tokens_from_file"]


class CloudServer:
    """The gRPC server; start in-process (``port=0`` picks a free port) or via ``splitrt serve``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        config.check()
        # Refuses an open server nobody asked for, and uploads without a token.
        self.exposure = security.exposure(config)
        self.admission = Admission(config.workers, config.max_queue)
        self.niced = NicePool(config.workers, config.over_share_nice)
        self.budget = process_budget(
            config.max_memory_bytes, builder=config.build_in_child, checker=config.allow_upload
        )
        self.store = ModelStore(config.models_dir, budget=self.budget, max_nodes=config.max_nodes)
        self.tails = TailCache(
            self.store,
            config.segment_cache_size,
            tail_threads(config),
            budget=self.budget,
            in_slot=functools.partial(self.admission.run, kind=HEAVY),  # builds: the heavy lane (fairq)
            # As many children as builds may run at once (the heavy lane's cap).
            builder=Builder(self.admission.queue.config.heavy_cap) if config.build_in_child else None,
            niced=self.niced,  # uploaded models' sessions are opened there
        )
        watch = watch_limit(config.max_memory_bytes)
        growth = None if watch is None or config.max_memory_bytes is None else config.max_memory_bytes - watch
        self.canceller = Canceller(rss_limit_bytes=watch, rss=rss_bytes, growth_bytes=growth)
        self.max_decoded_bytes = config.decoded_cap_bytes
        self.stats = ServerStats()  # per-request outcomes: service times, metrics
        self.metrics_url: str | None = None
        self._metrics_http: Any = None
        self.health = health.HealthServicer()
        self.port = 0
        self._server: grpc.Server | None = None
        # The SplitInference methods; ``start`` registers them. Callable without a gRPC server (an
        # in-process transport): constructing a CloudServer binds no port.
        self.servicer = Servicer(self)
        self.next_hop = NextHop(config.next_tier, config.max_message_bytes)
        self.door = FrontDoor(
            tokens=config.tokens,
            limits=config.limits,
            infer_calls=max(config.limits.max_calls, config.workers + config.max_queue + 8),
            retry_after_ms=lambda: self.stats.retry_after_ms(
                queue_depth=self.admission.admitted, workers=self.admission.workers
            ),
            budget=self.budget,  # Probe bodies paid for before they are read
            max_message_bytes=config.max_message_bytes,
        )
        self.watchdog, self.ratelog = self.door.watchdog, self.door.ratelog
        self.handler = Handler(
            admission=self.admission,
            budget=self.budget,
            canceller=self.canceller,
            niced=self.niced,
            store=self.store,
            tails=self.tails,
            next_hop=self.next_hop,
            stats=self.stats,
            ratelog=self.ratelog,
            default_deadline_s=config.default_deadline_s,
            max_decoded_bytes=self.max_decoded_bytes,
            max_request_bytes=config.max_request_bytes,
            max_run_s=config.limits.max_run_s,
        )
        self.health_gate = HealthGate(
            self.health, lambda: saturated(self.admission, self.door), config.limits.saturated_s
        )
        self.warm = WarmStart(
            config.warm,
            store=self.store,
            tails=self.tails,
            models_dir=config.models_dir,
            remember=config.warm_file,
            limit=config.segment_cache_size,
            deadline_s=config.default_deadline_s,
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> int:
        cfg = self.config
        threads = self.door.threads
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="splitrt-cloud"),
            interceptors=[self.door],
            options=wire.server_options(cfg.max_message_bytes) + grpc_options(cfg.limits),
            # The lanes admit calls (``guard.door``); this backstop only bounds refusals waiting for a thread.
            maximum_concurrent_rpcs=4 * threads,
        )
        add_servicer(self.servicer, server)
        add_health(self.health, server)  # garbage bytes: INVALID_ARGUMENT, not INTERNAL
        address = f"{cfg.host}:{cfg.port}"
        try:
            if cfg.tls_cert_path is not None and cfg.tls_key_path is not None:
                creds = grpc.ssl_server_credentials(
                    [(Path(cfg.tls_key_path).read_bytes(), Path(cfg.tls_cert_path).read_bytes())]
                )
                port = server.add_secure_port(address, creds)
            else:
                port = server.add_insecure_port(address)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise ConfigError(f"cannot listen on {address}: expected a free port, got a bind failure")
        if cfg.metrics_port is not None:  # before gRPC serves: a taken port fails the start cleanly
            try:
                self._metrics_http, self.metrics_url = metrics_http(self, cfg.metrics_host, cfg.metrics_port)
            except ConfigError:
                server.stop(0)
                raise
        server.start()
        if cfg.allow_upload:  # the upload checker's child process, ready before the first upload
            CHECKER.warm()
        if self.tails.builder is not None:  # and the segment builder's, before the first tail
            self.tails.builder.children.warm()
        imagecodec.warm()  # Pillow's set-up, before the first image-coded request (~20 ms)
        self.watchdog.on_tick.append(self.health_gate.tick)
        self.watchdog.start()
        self._server = server
        self.port = port
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(wire.SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        exp = self.exposure
        log_event(
            "listening",
            host=cfg.host,
            port=port,
            tls=exp.tls,
            auth=exp.auth,
            insecure=exp.insecure,
            models=len(self.store.models()),
            workers=cfg.workers,
            allow_upload=cfg.allow_upload,
            version=__version__,
            metrics_url=self.metrics_url,
            lanes=self.door.caps,
        )
        if self.metrics_url is not None and not security.is_loopback(cfg.metrics_host):
            log_event("metrics_public", logging.WARNING, url=self.metrics_url, warning="no TLS, no token")
        if exp.insecure:
            log_event(
                "insecure", logging.WARNING, host=cfg.host, port=port, tls=exp.tls, auth=exp.auth, warning=exp.warning
            )
        self.warm.start()
        return port

    @property
    def served(self) -> int:
        return self.stats.by_code["OK"]  # requests answered OK (one dict read: no lock)

    @property
    def secure(self) -> bool:
        """TLS and bearer tokens (``--advertise`` says ``secure=1``)."""
        return self.exposure.secure

    @property
    def address(self) -> str:
        host = self.config.host
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def stop(self, grace_s: float | None = None) -> None:
        """Refuse new calls, drain for ``grace_s`` (default ``drain_timeout_s``), terminating runs still going
        near its end (UNAVAILABLE); ``busy()`` says if one is stuck inside a kernel all the same."""
        if self._server is None:  # never started (in-process) or stopped: its uploads' niced threads may run
            self.niced.close()
            return
        grace = self.config.drain_timeout_s if grace_s is None else grace_s
        self.health.enter_graceful_shutdown()
        log_event("draining", grace_s=grace, queue_depth=self.admission.admitted)
        done = self._server.stop(grace)
        margin = min(2.0, grace / 4)  # left for terminated runs to return and their replies to go out
        if not done.wait(max(0.0, grace - margin)):
            n = self.canceller.cancel_all(grpc.StatusCode.UNAVAILABLE, "the server is shutting down: terminated")
            log_event("drain_terminated", logging.WARNING, runs=n)
            done.wait(margin)
        else:
            self.canceller.cancel_all(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        self._server = None
        self.warm.stop()
        self.watchdog.stop()
        self.ratelog.flush(force=True)
        self.next_hop.close()
        self.niced.close()
        if self.tails.builder is not None:
            self.tails.builder.close()
        self.warm.join(max(1.0, grace))
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        log_event("stopped", served=self.served, running=self.canceller.running())

    def busy(self) -> bool:
        """A run has not returned (stuck in one kernel after ``stop`` terminated it)."""
        return self.canceller.running() > 0

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
        return self.admission.load(self.stats.service_ms())

    def load_factor(self) -> float:
        return self.admission.load_factor()

    def model_hashes(self) -> list[str]:
        return [m.sha256 for m in self.store.models()]

    def status(self) -> pb.StatusReply:
        self.store.scan()  # models copied into the directory since the last look (stat only: cheap)
        models = [pb.ModelInfo(sha256=m.sha256, name=m.path.name, bytes=m.bytes) for m in self.store.models()]
        segments = [
            pb.SegmentInfo(model_sha256=s, cut_id=c, hits=h, service_ms=self.stats.segment_service_ms(s, c))
            for s, c, h in self.tails.snapshot()
        ]
        cfg = self.config
        errors = self.stats.errors()
        return pb.StatusReply(
            version=__version__,
            models=models,
            segments=segments,
            load=self.load(),
            allow_upload=cfg.allow_upload,
            max_message_bytes=cfg.max_message_bytes,
            segment_cache_size=cfg.segment_cache_size,
            max_queue=cfg.max_queue,
            served=self.served,
            insecure=self.exposure.insecure,
            security_warning=self.exposure.warning,
            errors=sum(errors.values()),
            errors_by_code=errors,
            next_address=self.next_hop.address,
        )

    def put_model(self, chunks: Iterator[pb.ModelChunk], time_remaining_s: float | None = None) -> pb.PutModelReply:
        # The servicer calls this (not ``receive_model``) so that a test may wrap it on the instance.
        cfg = self.config

        def guard(size: int) -> AbstractContextManager[None]:
            # Admitted, the load's peak reserved; no worker slot (the check runs in ``upload.CHECKER``).
            return admitted(self.admission, self.budget, "upload check", size * LOAD_PEAK_FACTOR)

        return receive_model(
            self.store,
            chunks,
            allow_upload=cfg.allow_upload,
            max_model_bytes=cfg.max_model_bytes,
            quota=Quota(max_store_bytes=cfg.max_store_bytes, max_models=cfg.max_models, max_nodes=cfg.max_nodes),
            guard=guard,
        )

    def admitted(self, what: str, nbytes: int) -> AbstractContextManager[None]:
        """A place among the admitted and ``nbytes`` of the budget (Probe)."""
        return admitted(self.admission, self.budget, what, nbytes)
