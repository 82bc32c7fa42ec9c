"""The device daemon's process (``splitrt daemon --config FILE``): the long-running service on the board.

One runtime per configured model over its path of tiers (:func:`.runtimes.build_runtime`: per-request
plan, local fallback, failover, probes), a
``CloudFinder`` when discovery is on, and three faces: the local API for apps (:mod:`.api`), the
Prometheus endpoint (:mod:`.metrics`), and SIGTERM: stop accepting, finish in-flight requests
(``drain_timeout_s``), close, exit 0. The configuration is :mod:`.config`; the cost table choice,
shared with ``splitrt run``, is :func:`.costs.select_cost_table`.

- ``Daemon(config).start() -> endpoints`` (``api_address``, ``api_socket``, ``metrics_url``),
  ``.stop(grace_s)``; the ``run()`` entry prints one JSON ``{"event": "ready", ...}`` line on stdout,
  ``{"event": "stopped"}`` at exit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO, cast
from wsgiref.simple_server import WSGIServer

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from splitrt._gc import freeze_startup
from splitrt._signals import stop_on_signals
from splitrt.device.daemon import api, metrics
from splitrt.device.daemon.config import DaemonConfig, ModelConfig, load_config
from splitrt.device.daemon.costs import select_cost_table
from splitrt.device.daemon.preflight import preflight
from splitrt.device.daemon.runtimes import ServedModel, build_runtime
from splitrt.errors import ConfigError, InputError
from splitrt.graph import shapes
from splitrt.transport import credentials, promserve, wire

log = logging.getLogger("splitrt.device.daemon")


def check(config: DaemonConfig) -> None:
    """What ``splitrt daemon --check`` runs: ``preflight`` and the start's own checks (models loaded, cost
    tables chosen, runtimes and their policies built), without listening, browsing or writing a log."""
    preflight(config)  # the copy below has no log path to check
    quiet: DaemonConfig = replace(cast(Any, config), decision_log_path=None, discovery=False)  # a pydantic dataclass
    daemon = Daemon(quiet)
    daemon.stop(grace_s=0)


def _load_model(mc: ModelConfig) -> Any:
    """The model's graph, bound at its configured shapes: a FLOPs prior (or a scaled profile) is priced
    there. Unbound, free dims count as 1 until a request's shape is seen: said once in the log."""
    from splitrt.graph import model as graph
    from splitrt.graph import zoo

    binding = shapes.binding_from(mc.shapes, mc.dims, mc.sample_path)
    if not binding.empty:
        return graph.load(zoo.resolve(mc.path), binding, notice=lambda msg: log.info("model %s: %s", mc.name, msg))
    mg = graph.load(zoo.resolve(mc.path))
    free = [t.name for t in mg.inputs if any(not isinstance(d, int) for d in (t.shape or ()))]
    if free:
        log.warning(
            "model %s: inputs %s have free dims and no shapes/dims/sample_path: it is priced with "
            "them counted as 1 (set them to the shapes requests will have)",
            mc.name,
            free,
        )
    return mg


class Daemon:
    """Build with a ``DaemonConfig``; ``start()`` opens the API and metrics; ``stop()`` drains."""

    def __init__(self, config: DaemonConfig, *, log_file: TextIO | None = None) -> None:
        from splitrt.device.client import DeviceConfig, read_token
        from splitrt.profile import boards

        preflight(config)  # a path or name the start would fail on, said before anything is opened
        self.config = config
        self._lock = threading.Lock()
        self.in_flight = 0
        self._idle = threading.Condition(self._lock)
        self.started_s = time.monotonic()
        board = boards.load_board(config.board) if config.board else None
        token = None
        if config.token_path is not None:  # a secret: refused when group or others can read it (as ssh)
            credentials.check_private(config.token_path, "token_path")
            token = read_token(config.token_path, "token_path")
            if not (config.tls or config.tls_ca_path is not None):
                log.warning(
                    "token_path is set but tls is off: the bearer token travels unencrypted to every "
                    "cloud (set tls = true, and tls_ca_path for a private CA)"
                )
        device_config = DeviceConfig(
            token=token,
            tls=config.tls,
            tls_ca_path=config.tls_ca_path,
            upload=config.upload,
            intra_op_threads=config.intra_op_threads,
        )
        self._log_file: TextIO | None = None
        if config.decision_log_path is not None:
            config.decision_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(config.decision_log_path, "a", encoding="utf-8")  # noqa: SIM115
        decision_log = log_file or self._log_file
        self.models: dict[str, ServedModel] = {}
        try:
            for mc in config.models:
                mg = _load_model(mc)
                table, source = select_cost_table(
                    mg,
                    profile_device=mc.profile_device_path,
                    profile_cloud=mc.profile_cloud_path,
                    board=board,
                    codecs=config.codecs,
                    min_agreement=config.min_agreement,
                    name=f"model {mc.name!r}",
                )
                log.info("model %s (%s): cost table from %s", mc.name, mg.sha256[:12], source)
                dev = build_runtime(
                    config,
                    mc,
                    mg,
                    table,
                    board=board,
                    device_config=device_config,
                    log=decision_log,
                    table_source=source,
                )
                self.models[mc.name] = ServedModel(config=mc, device=dev, table_source=source)
            self.finder: Any = None
            if config.discovery:
                from splitrt.device.discovery import CloudFinder

                # Two tiers only (config refuses discovery on a longer path): AdaptiveDevices.
                adaptive: list[Any] = [m.device for m in self.models.values()]
                self.finder = CloudFinder(
                    adaptive,
                    static=config.clouds,
                    interfaces=list(config.discovery_interfaces) or None,
                )
        except BaseException:
            self._close_models()
            raise
        self._server: grpc.Server | None = None
        self._http: WSGIServer | None = None
        self.latency = metrics.latency_histogram()
        for name in self.models:  # every model's histogram shows from the first scrape
            self.latency.labels(model=name)
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(metrics.Collector(self._metrics_snapshot, self.latency))
        self.api_address: str | None = None
        self.metrics_url: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        cfg = self.config
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.api_workers, thread_name_prefix="splitrt-api"),
            options=wire.server_options(wire.DEFAULT_MAX_MESSAGE_BYTES),
            maximum_concurrent_rpcs=cfg.api_workers * 4,
        )
        api.add_local_servicer(api.LocalServicer(self), server)  # garbage bytes: INVALID_ARGUMENT
        if cfg.api_address is not None:
            host, _, _port = cfg.api_address.rpartition(":")
            bound = server.add_insecure_port(cfg.api_address)
            if bound == 0:
                raise ConfigError(f"api_address {cfg.api_address}: expected a free port, got a bind failure")
            self.api_address = f"{host}:{bound}"
        if cfg.api_socket_path is not None:
            sock = cfg.api_socket_path
            sock.parent.mkdir(parents=True, exist_ok=True)
            if sock.exists() or sock.is_symlink():
                sock.unlink()
            if server.add_insecure_port(f"unix:{sock}") == 0:
                raise ConfigError(f"api_socket_path {sock}: expected a bindable unix socket, got a bind failure")
        server.start()
        self._server = server
        if cfg.api_socket_path is not None:
            os.chmod(cfg.api_socket_path, 0o660)
        if cfg.metrics_port is not None:
            self._http, self.metrics_url = promserve.serve(
                self._registry, cfg.metrics_address, cfg.metrics_port, name="splitrt-metrics"
            )
        return self.endpoints()

    def endpoints(self) -> dict[str, Any]:
        return {
            "api_address": self.api_address,
            "api_socket": str(self.config.api_socket_path) if self.config.api_socket_path else None,
            "metrics_url": self.metrics_url,
            "models": {
                n: {"sha256": m.device.graph.sha256, "cost_table": m.table_source} for n, m in self.models.items()
            },
        }

    def stop(self, grace_s: float | None = None) -> None:
        """Refuse new calls, let in-flight ones finish (``drain_timeout_s``), then close everything."""
        grace = self.config.drain_timeout_s if grace_s is None else grace_s
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        with self._idle:  # requests made in-process (not via the API) finish too
            self._idle.wait_for(lambda: self.in_flight == 0, timeout=grace)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self._close_models()
        if self.config.api_socket_path is not None:
            self.config.api_socket_path.unlink(missing_ok=True)

    def _close_models(self) -> None:
        finder = getattr(self, "finder", None)
        if finder is not None:
            finder.close()
            self.finder = None
        for m in getattr(self, "models", {}).values():
            m.device.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Daemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=2.0)

    # -- requests -----------------------------------------------------------------------------------
    def model(self, name: str) -> ServedModel:
        if not name:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise InputError(f"model: expected one of {sorted(self.models)} (the daemon serves several), got ''")
        m = self.models.get(name)
        if m is None:
            m = next(
                (x for x in self.models.values() if x.device.graph.sha256.startswith(name.lower()) and len(name) >= 8),
                None,
            )
        if m is None:
            raise KeyError(f"model {name!r}: expected one of {sorted(self.models)} (or a sha256), got {name!r}")
        return m

    def infer(
        self,
        model: ServedModel,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline_ms: float | None = None,
        request: str | None = None,
    ) -> Any:
        with self._lock:
            self.in_flight += 1
        t0 = time.perf_counter()
        ok = False
        fallback = False
        try:
            out = model.device.infer(inputs, request=request, deadline_ms=deadline_ms or None)
            ok = True
            fallback = out.fallback
            return out
        finally:
            with self._lock:
                st = model.stats
                st.requests += 1
                st.failed += int(not ok)
                st.fallbacks += int(fallback)
                if ok:
                    self.latency.labels(model=model.config.name).observe(time.perf_counter() - t0)
                self.in_flight -= 1
                self._idle.notify_all()

    def count_failed(self, model: ServedModel) -> None:
        """A request refused before it reached the runtime (inputs that do not decode)."""
        with self._lock:
            model.stats.requests += 1
            model.stats.failed += 1

    def plan(self, model: ServedModel) -> dict[str, Any]:
        status = model.device.status()
        with self._lock:
            failed = model.stats.failed
        return {
            **status,
            "model": model.config.name,
            "sha256": model.device.graph.sha256,
            "objective": self.config.objective,
            "cost_table": model.table_source,
            "failed": failed,
        }

    def metrics_text(self) -> str:
        """Prometheus text exposition format (0.0.4), as ``GET /metrics`` answers."""
        return generate_latest(self._registry).decode()

    def _metrics_snapshot(self) -> tuple[metrics.Snapshot, int]:
        with self._lock:
            stats = {n: (m, m.stats.copy()) for n, m in self.models.items()}
            in_flight = self.in_flight
        return {n: (s, m.device.status(), list(m.device.table.ids)) for n, (m, s) in stats.items()}, in_flight


def run(config_path: str | Path, *, ready_out: TextIO | None = None) -> int:
    """``splitrt daemon --config FILE``: start, print one JSON "ready" line, serve until SIGTERM/SIGINT/SIGHUP."""
    config = load_config(config_path)
    stop = stop_on_signals()
    daemon = Daemon(config)
    try:
        endpoints = daemon.start()
    except BaseException:
        daemon.stop(grace_s=0)
        raise
    freeze_startup()  # what start-up built is never walked by a full collection again (splitrt._gc)
    out = ready_out or sys.stdout
    out.write(json.dumps({"event": "ready", **endpoints}) + "\n")
    out.flush()
    for name, m in endpoints["models"].items():
        print(f"splitrt daemon: model {name}: cost table from {m['cost_table']}", file=sys.stderr)
    while not stop.wait(0.5):
        pass
    t0 = time.monotonic()
    print(f"splitrt daemon: stopping, draining up to {config.drain_timeout_s:g} s", file=sys.stderr)
    daemon.stop()
    out.write(json.dumps({"event": "stopped", "drain_s": round(time.monotonic() - t0, 3)}) + "\n")
    out.flush()
    return 0
