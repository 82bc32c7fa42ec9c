"""The device daemon (``splitrt daemon --config FILE``): the long-running service on the board.

One ``AdaptiveDevice`` per configured model (per-request plan, local fallback, failover, probes), a
``CloudFinder`` when discovery is on, and three faces:

- a local gRPC API for apps (``LocalInference`` in ``proto/splitrt.proto``: ``Infer``, ``GetPlan``) on a
  unix socket and/or a loopback TCP address; :class:`LocalClient` is the Python client;
- a Prometheus text-format endpoint (``GET /metrics`` over HTTP on 127.0.0.1): request latency
  histogram, requests/failed/fallbacks/switches, current cut, bandwidth and RTT estimates, clouds up;
- SIGTERM: stop accepting, finish in-flight requests (``drain_timeout_s``), close, exit 0.

Configuration is TOML, flat keys with units in their names (see :data:`TOP_KEYS`, :data:`MODEL_KEYS`),
loaded into frozen dataclasses; relative paths are relative to the config file. Example::

    board = "rpi4"                     # devices/<board>.toml: speed factor for the FLOPs prior, power
    objective = "latency"              # latency | energy | throughput
    deadline_ms = 2000
    policy = "adaptive"                # adaptive | route | periodic:SECONDS | fixed:PLAN
    # constraints (optional): min_head_flops = 0.2 (privacy floor: a FLOPs share the device computes
    # first), no_raw_input = true (the input never leaves), device_memory_mb = 512 | "board"
    clouds = ["10.0.0.5:50051"]        # static clouds, preferred first
    discovery = true                   # also follow clouds advertised via mDNS
    api_socket_path = "/run/splitrt/daemon.sock"
    api_address = "127.0.0.1:50100"
    metrics_port = 9464
    decision_log_path = "/var/log/splitrt/decisions.jsonl"

    [[model]]
    name = "resnet50"
    path = "/var/lib/splitrt/models/resnet50.onnx"   # or zoo:NAME
    # profile_device_path / profile_cloud_path: measured profiles; else profiles/ shipped for the
    # model, else a FLOPs prior scaled by the board's cpu_speed_factor.
    # dims = ["sequence=128"] / shapes = ["x=1x3x48x320"] / sample_path = "s.npz" (as --dim/--shape/
    # --sample): the shape a model with free dims is priced at (other request shapes are scaled from it).

The cost table choice is shared with ``splitrt run``: :func:`select_cost_table`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import grpc
import numpy as np

from splitrt import paths
from splitrt.errors import CloudError, CodecError, ConfigError, InputError, ProfileError, SplitrtError
from splitrt.graph import shapes
from splitrt.transport import codec, credentials, promtext, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger("splitrt.device.daemon")

#: GFLOP/s of the build host that measured profiles/ (resnet50: 8.2 GFLOP in ~94 ms, squeezenet 0.7
#: GFLOP in ~6.4 ms): the FLOPs prior's reference, divided by a board's cpu_speed_factor.
HOST_GFLOPS = 80.0
PROFILES_ENV = paths.PROFILES_ENV
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# -- cost table -------------------------------------------------------------------------------------


def profiles_dir() -> Path:
    """$SPLITRT_PROFILES_DIR, else the checkout's ``profiles/``."""
    return paths.profiles_dir()


def select_cost_table(
    mg: Any,
    *,
    profile_device: Path | None = None,
    profile_cloud: Path | None = None,
    board: Any = None,
    directory: Path | None = None,
) -> tuple[Any, str]:
    """``(CostTable, where it came from)``: both profiles when given; else a shipped profile of this
    model (``<hostclass>__<stem>.json`` matching its sha256; this host class first) as device and cloud,
    head times scaled by the board's ``cpu_speed_factor``; else the FLOPs prior (``priors.flops_table``)."""
    from splitrt.profile import priors, profiler

    factor = float(board.cpu_speed_factor) if board is not None else 1.0
    if (profile_device is None) != (profile_cloud is None):
        raise ConfigError(
            "profiles: expected both a device and a cloud profile, got only "
            f"{'the device' if profile_cloud is None else 'the cloud'} one"
        )
    if profile_device is not None and profile_cloud is not None:
        dev = profiler.load_profile(profile_device, sha256=mg.sha256)
        cloud = profiler.load_profile(profile_cloud, sha256=mg.sha256)
        return profiler.cost_table(dev, cloud), f"profiles {profile_device} (device) and {profile_cloud} (cloud)"
    d = directory or profiles_dir()
    stem = Path(mg.path).stem
    candidates = sorted(d.glob(f"*__{stem}.json")) if d.is_dir() else []
    mine = f"{profiler.host_class()}__{stem}.json"
    candidates.sort(key=lambda p: p.name != mine)
    for path in candidates:
        try:
            prof = profiler.load_profile(path, sha256=mg.sha256)
        except ProfileError:
            continue  # another model of the same name
        scaled = f", device head times x{factor:g} (board {board.name})" if board is not None else ""
        return profiler.cost_table(prof, prof, device_speed_factor=factor), f"shipped profile {path}{scaled}"
    table = priors.flops_table(mg, device_gflops=HOST_GFLOPS / factor, cloud_gflops=HOST_GFLOPS)
    return table, (
        f"FLOPs prior (device {HOST_GFLOPS / factor:g} GFLOP/s, cloud {HOST_GFLOPS:g} GFLOP/s): "
        f"no profile of {stem} in {d}"
    )


def _constrained(runtime_config: Any, mg: Any, table: Any, config: DaemonConfig, board: Any, name: str) -> Any:
    """The runtime config with the constraints' allowed cuts, and the split-vs-route verdict logged once."""
    from dataclasses import replace

    from splitrt.plan import explain
    from splitrt.plan.constraints import Constraints
    from splitrt.plan.costmodel import DEFAULT_POWER
    from splitrt.profile.cutfacts import allowed_for, memory_mb

    cons = Constraints(
        min_head_flops_fraction=config.min_head_flops,
        no_raw_input=config.no_raw_input,
        device_memory_mb=memory_mb(config.device_memory_mb, board),
    )
    allowed = allowed_for(mg, table, cons)
    cuts = allowed.cuts if allowed is not None else None
    if allowed is not None:
        log.info("model %s: %s", name, allowed.note())
    v = explain.explain(
        table,
        rtt_ms=40.0,
        power=board.power if board is not None else DEFAULT_POWER,
        codecs=config.codecs,
        cuts=cuts,
        objectives=(config.objective,),
    )
    log.info("model %s: split vs route (%s): %s", name, "details: splitrt plan MODEL --explain", v.summary)
    if cuts is None:
        return runtime_config
    return replace(runtime_config, controller=replace(runtime_config.controller, cuts=cuts))


# -- configuration ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str
    path: str  # file path (absolute after loading) or zoo:NAME
    profile_device_path: Path | None = None
    profile_cloud_path: Path | None = None
    shapes: tuple[str, ...] = ()  # NAME=1x3xHxW, as --shape
    dims: tuple[str, ...] = ()  # SYMBOL=N, as --dim
    sample_path: Path | None = None  # .npz of inputs, as --sample


@dataclass(frozen=True, kw_only=True)
class DaemonConfig:
    models: tuple[ModelConfig, ...]
    board: str | None = None
    objective: str = "latency"
    deadline_ms: float = 5000.0
    policy: str = "adaptive"
    codecs: tuple[str, ...] = ("fp32",)
    clouds: tuple[str, ...] = ()
    discovery: bool = False
    discovery_interfaces: tuple[str, ...] = ()
    tls: bool = False
    tls_ca_path: Path | None = None
    token_path: Path | None = None
    upload: bool = True
    api_socket_path: Path | None = None
    api_address: str | None = "127.0.0.1:50100"
    metrics_address: str = "127.0.0.1"
    metrics_port: int | None = 9464
    decision_log_path: Path | None = None
    drain_timeout_s: float = 10.0
    intra_op_threads: int = 0
    api_workers: int = 8
    min_head_flops: float = 0.0
    no_raw_input: bool = False
    device_memory_mb: float | str | None = None  # MB, or "board" (the board file's memory_mb)


# key -> (types, expected, is_path). Order = documentation order.
TOP_KEYS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "board": ((str,), "a board name (devices/*.toml) or a .toml path", False),
    "objective": ((str,), "latency, energy or throughput", False),
    "deadline_ms": ((int, float), "a number of milliseconds > 0", False),
    "policy": ((str,), "adaptive, route, periodic:SECONDS or fixed:PLAN", False),
    "codecs": ((list,), "a list of codec names (fp32, fp16, int8, int8c[+zlib])", False),
    "clouds": ((list,), "a list of HOST:PORT strings", False),
    "discovery": ((bool,), "true or false", False),
    "discovery_interfaces": ((list,), "a list of IP addresses to bind mDNS to", False),
    "tls": ((bool,), "true or false", False),
    "tls_ca_path": ((str,), "a PEM file path", True),
    "token_path": ((str,), "a file path (bearer token on the first line)", True),
    "upload": ((bool,), "true or false", False),
    "api_socket_path": ((str,), 'a unix socket path, or "" for none', True),
    "api_address": ((str,), '127.0.0.1:PORT (loopback only), or "" for none', False),
    "metrics_address": ((str,), "a loopback IP address", False),
    "metrics_port": ((int,), "a TCP port 0-65535 (0: any free port), or -1 for none", False),
    "decision_log_path": ((str,), "a file path (JSON lines)", True),
    "drain_timeout_s": ((int, float), "a number of seconds >= 0", False),
    "intra_op_threads": ((int,), "an integer >= 0 (0: onnxruntime's default)", False),
    "api_workers": ((int,), "an integer >= 1", False),
    "min_head_flops": ((int, float), "a share of the model's FLOPs in [0, 1] (privacy floor)", False),
    "no_raw_input": ((bool,), "true or false (privacy floor: the input never leaves the device)", False),
    "device_memory_mb": ((int, float, str), 'a number of MB > 0 or "board" (memory ceiling)', False),
}
MODEL_KEYS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "name": ((str,), "a non-empty name", False),
    "path": ((str,), "an .onnx file path or zoo:NAME", False),
    "profile_device_path": ((str,), "a profile JSON path (splitrt profile)", True),
    "profile_cloud_path": ((str,), "a profile JSON path (splitrt profile)", True),
    "shapes": ((list,), "a list of NAME=1x3xHxW strings (as --shape)", False),
    "dims": ((list,), "a list of SYMBOL=N strings (as --dim)", False),
    "sample_path": ((str,), "an .npz of input arrays (as --sample)", True),
}
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def _typed(where: str, key: str, value: Any, spec: tuple[tuple[type, ...], str, bool]) -> Any:
    kinds, expected, _ = spec
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        raise ConfigError(f"{where}: key {key!r}: expected {expected}, got {value!r} ({type(value).__name__})")
    return value


def _path(base: Path, value: str) -> Path | None:
    if value == "":
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _str_list(where: str, key: str, value: list[Any], expected: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: key {key!r}: expected {expected}, got {value!r}")
    return tuple(value)


def _check_hostport(where: str, key: str, value: str, *, loopback: bool) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{where}: key {key!r}: expected HOST:PORT, got {value!r}")
    if loopback and host not in _LOOPBACK:
        raise ConfigError(
            f"{where}: key {key!r}: expected a loopback address (127.0.0.1:PORT; the local API "
            f"has no authentication), got {value!r}"
        )


def parse_config(data: Mapping[str, Any], *, base_dir: Path, where: str = "config") -> DaemonConfig:
    """``DaemonConfig`` from parsed TOML; ``ConfigError`` names the key, what was expected and what came."""
    unknown = sorted(set(data) - set(TOP_KEYS) - {"model"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}: expected one of {sorted([*TOP_KEYS, 'model'])}")
    kw: dict[str, Any] = {}
    for key, spec in TOP_KEYS.items():
        if key not in data:
            continue
        value = _typed(where, key, data[key], spec)
        if spec[2]:
            value = _path(base_dir, value)
        kw[key] = value
    for key, expected in (
        ("codecs", TOP_KEYS["codecs"][1]),
        ("clouds", TOP_KEYS["clouds"][1]),
        ("discovery_interfaces", TOP_KEYS["discovery_interfaces"][1]),
    ):
        if key in kw:
            kw[key] = _str_list(where, key, kw[key], expected)
    for c in kw.get("clouds", ()):
        _check_hostport(where, "clouds", c, loopback=False)
    for c in kw.get("codecs", ()):
        try:
            codec.Codec.parse(c)
        except CodecError as exc:
            raise ConfigError(f"{where}: key 'codecs': expected codec names, got {c!r} ({exc})") from exc
    if "api_address" in kw:
        kw["api_address"] = kw["api_address"] or None
        if kw["api_address"] is not None:
            _check_hostport(where, "api_address", kw["api_address"], loopback=True)
    if "metrics_port" in kw:
        port = kw["metrics_port"]
        if not -1 <= port < 65536:
            raise ConfigError(f"{where}: key 'metrics_port': expected {TOP_KEYS['metrics_port'][1]}, got {port!r}")
        kw["metrics_port"] = None if port == -1 else port
    if "metrics_address" in kw and kw["metrics_address"] not in _LOOPBACK:
        raise ConfigError(f"{where}: key 'metrics_address': expected a loopback address, got {kw['metrics_address']!r}")
    for key in ("deadline_ms",):
        if key in kw and not (math.isfinite(kw[key]) and kw[key] > 0):
            raise ConfigError(f"{where}: key {key!r}: expected {TOP_KEYS[key][1]}, got {kw[key]!r}")
    for key in ("drain_timeout_s", "intra_op_threads"):
        if key in kw and not kw[key] >= 0:
            raise ConfigError(f"{where}: key {key!r}: expected {TOP_KEYS[key][1]}, got {kw[key]!r}")
    if "api_workers" in kw and kw["api_workers"] < 1:
        raise ConfigError(f"{where}: key 'api_workers': expected an integer >= 1, got {kw['api_workers']!r}")
    from splitrt.plan.constraints import Constraints
    from splitrt.plan.solver import OBJECTIVES

    mem = kw.get("device_memory_mb")
    if isinstance(mem, str) and mem != "board":
        raise ConfigError(f"{where}: key 'device_memory_mb': expected {TOP_KEYS['device_memory_mb'][1]}, got {mem!r}")
    try:
        Constraints(
            min_head_flops_fraction=float(kw.get("min_head_flops", 0.0)),
            device_memory_mb=None if mem in (None, "board") else mem,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if mem == "board" and "board" not in kw:
        raise ConfigError(f"{where}: key 'device_memory_mb': \"board\" needs a board key, got none")
    if "objective" in kw and kw["objective"] not in OBJECTIVES:
        raise ConfigError(f"{where}: key 'objective': expected one of {', '.join(OBJECTIVES)}, got {kw['objective']!r}")
    raw_models = data.get("model")
    if not isinstance(raw_models, list) or not raw_models:
        raise ConfigError(
            f"{where}: key 'model': expected at least one [[model]] table with name and path, got {raw_models!r}"
        )
    models = []
    for i, m in enumerate(raw_models):
        mw = f"{where}: model[{i}]"
        if not isinstance(m, dict):
            raise ConfigError(f"{mw}: expected a table, got {m!r}")
        bad = sorted(set(m) - set(MODEL_KEYS))
        if bad:
            raise ConfigError(f"{mw}: unknown key {bad[0]!r}: expected one of {sorted(MODEL_KEYS)}")
        for req in ("name", "path"):
            if req not in m:
                raise ConfigError(f"{mw}: missing key {req!r}: expected {MODEL_KEYS[req][1]}")
        mk: dict[str, Any] = {}
        for key, spec in MODEL_KEYS.items():
            if key in m:
                value = _typed(mw, key, m[key], spec)
                mk[key] = _path(base_dir, value) if spec[2] else value
        if not mk["name"]:
            raise ConfigError(f"{mw}: key 'name': expected a non-empty name, got ''")
        if not mk["path"].startswith("zoo:"):
            mk["path"] = str(_path(base_dir, mk["path"]))
        if (mk.get("profile_device_path") is None) != (mk.get("profile_cloud_path") is None):
            raise ConfigError(f"{mw}: expected both profile_device_path and profile_cloud_path, got only one")
        for key in ("shapes", "dims"):
            if key in mk:
                mk[key] = _str_list(mw, key, mk[key], MODEL_KEYS[key][1])
        try:
            shapes.binding_from(mk.get("shapes", ()), mk.get("dims", ()))
        except ConfigError as exc:
            raise ConfigError(f"{mw}: {exc}") from exc
        models.append(ModelConfig(**mk))
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: model names: expected unique names, got {names}")
    cfg = DaemonConfig(models=tuple(models), **kw)
    if cfg.api_address is None and cfg.api_socket_path is None:
        raise ConfigError(f"{where}: expected api_address or api_socket_path (or both), got neither")
    from splitrt.device.runtime import RuntimeConfig

    try:
        RuntimeConfig(deadline_ms=cfg.deadline_ms, policy=cfg.policy)
    except ConfigError as exc:
        raise ConfigError(f"{where}: key {str(exc).split(':')[0]!r}: {exc}") from exc
    return cfg


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config {p}: cannot read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {p}: expected TOML, got a parse error: {exc}") from exc
    return parse_config(data, base_dir=p.resolve().parent, where=f"config {p}")


# -- metrics ----------------------------------------------------------------------------------------


@dataclass
class _ModelStats:
    requests: int = 0
    failed: int = 0
    fallbacks: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    latency_sum_s: float = 0.0
    latency_count: int = 0

    def observe(self, seconds: float) -> None:
        for i, b in enumerate(LATENCY_BUCKETS_S):
            if seconds <= b:
                self.buckets[i] += 1
        self.latency_sum_s += seconds
        self.latency_count += 1


# The text format is rendered by ``splitrt.transport.promtext`` (the cloud server's metrics share it).
_label = promtext.label
_num = promtext.num


# -- the daemon -------------------------------------------------------------------------------------


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


@dataclass
class _Model:
    config: ModelConfig
    device: Any  # AdaptiveDevice
    table_source: str
    stats: _ModelStats = field(default_factory=_ModelStats)


class Daemon:
    """Build with a ``DaemonConfig``; ``start()`` opens the API and metrics; ``stop()`` drains."""

    def __init__(self, config: DaemonConfig, *, log_file: TextIO | None = None) -> None:
        from splitrt.device.client import DeviceConfig, read_token
        from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
        from splitrt.plan.controller import ControllerConfig
        from splitrt.plan.costmodel import DEFAULT_POWER
        from splitrt.profile import boards

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
        runtime_config = RuntimeConfig(
            deadline_ms=config.deadline_ms,
            policy=config.policy,
            controller=ControllerConfig(objective=config.objective, codecs=config.codecs),
        )
        self._log_file: TextIO | None = None
        if config.decision_log_path is not None:
            config.decision_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(config.decision_log_path, "a", encoding="utf-8")  # noqa: SIM115
        decision_log = log_file or self._log_file
        self.models: dict[str, _Model] = {}
        try:
            for mc in config.models:
                mg = _load_model(mc)
                table, source = select_cost_table(
                    mg, profile_device=mc.profile_device_path, profile_cloud=mc.profile_cloud_path, board=board
                )
                log.info("model %s (%s): cost table from %s", mc.name, mg.sha256[:12], source)
                model_config = _constrained(runtime_config, mg, table, config, board, mc.name)
                dev = AdaptiveDevice(
                    mg,
                    table,
                    [] if config.discovery else list(config.clouds),
                    config=model_config,
                    device_config=device_config,
                    power=board.power if board is not None else DEFAULT_POWER,
                    log=decision_log,
                )
                self.models[mc.name] = _Model(config=mc, device=dev, table_source=source)
            self.finder: Any = None
            if config.discovery:
                from splitrt.device.finder import CloudFinder

                self.finder = CloudFinder(
                    [m.device for m in self.models.values()],
                    static=config.clouds,
                    interfaces=list(config.discovery_interfaces) or None,
                )
        except BaseException:
            self._close_models()
            raise
        self._server: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
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
        _add_local_servicer(_LocalServicer(self), server)  # garbage bytes: INVALID_ARGUMENT
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
            self._http = _metrics_server(self, cfg.metrics_address, cfg.metrics_port)
            host = str(self._http.server_address[0])
            self.metrics_url = f"http://{host}:{self._http.server_address[1]}/metrics"
            threading.Thread(target=self._http.serve_forever, name="splitrt-metrics", daemon=True).start()
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
    def model(self, name: str) -> _Model:
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
        model: _Model,
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
                    st.observe(time.perf_counter() - t0)
                self.in_flight -= 1
                self._idle.notify_all()

    def plan(self, model: _Model) -> dict[str, Any]:
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
        """Prometheus text exposition format (0.0.4)."""
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, dict[str, str], float]]) -> None:
            promtext.family(lines, name, kind, help_text, samples)

        with self._lock:
            stats = {
                n: (
                    m,
                    _ModelStats(
                        m.stats.requests,
                        m.stats.failed,
                        m.stats.fallbacks,
                        list(m.stats.buckets),
                        m.stats.latency_sum_s,
                        m.stats.latency_count,
                    ),
                )
                for n, m in self.models.items()
            }
            in_flight = self.in_flight
        statuses = {n: m.device.status() for n, (m, _) in stats.items()}
        family("splitrt_up", "gauge", "1 while the daemon serves.", [("", {}, 1.0)])
        family("splitrt_in_flight_requests", "gauge", "Requests being served now.", [("", {}, float(in_flight))])
        family(
            "splitrt_requests_total",
            "counter",
            "Requests received through the local API (incl. failed).",
            [("", {"model": n}, float(s.requests)) for n, (_, s) in stats.items()],
        )
        family(
            "splitrt_requests_failed_total",
            "counter",
            "Requests that returned an error (bad input).",
            [("", {"model": n}, float(s.failed)) for n, (_, s) in stats.items()],
        )
        family(
            "splitrt_fallbacks_total",
            "counter",
            "Requests whose cloud part ran on the device.",
            [("", {"model": n}, float(s.fallbacks)) for n, (_, s) in stats.items()],
        )
        family(
            "splitrt_plan_switches_total",
            "counter",
            "Changes of plan (cut or codec).",
            [("", {"model": n}, float(st.get("switches", 0) or 0)) for n, st in statuses.items()],
        )
        hist: list[tuple[str, dict[str, str], float]] = []
        for n, (_, s) in stats.items():
            for b, c in zip(LATENCY_BUCKETS_S, s.buckets, strict=True):
                hist.append(("_bucket", {"model": n, "le": _num(b)}, float(c)))
            hist.append(("_bucket", {"model": n, "le": "+Inf"}, float(s.latency_count)))
            hist.append(("_sum", {"model": n}, s.latency_sum_s))
            hist.append(("_count", {"model": n}, float(s.latency_count)))
        family("splitrt_request_latency_seconds", "histogram", "End-to-end latency of successful requests.", hist)
        cut_samples = []
        index_samples = []
        for n, (m, _) in stats.items():
            plan = statuses[n].get("plan")
            if plan:
                cut = str(plan).split("@")[0]
                cut_samples.append(("", {"model": n, "plan": str(plan), "cut": cut}, 1.0))
                ids = list(m.device.table.ids)
                index_samples.append(("", {"model": n}, float(ids.index(cut)) if cut in ids else -1.0))
        family("splitrt_current_cut", "gauge", "1 for the plan in use (labels: plan, cut).", cut_samples)
        family(
            "splitrt_current_cut_index", "gauge", "Index of the cut in use (0 = cloud, last = device).", index_samples
        )
        family(
            "splitrt_bandwidth_estimate_mbps",
            "gauge",
            "Link bandwidth estimate, Mbit/s.",
            [("", {"model": n}, float(st["bandwidth_mbps"])) for n, st in statuses.items()],
        )
        family(
            "splitrt_rtt_estimate_ms",
            "gauge",
            "Link RTT estimate, milliseconds.",
            [("", {"model": n}, float(st["rtt_ms"])) for n, st in statuses.items()],
        )
        family(
            "splitrt_link_confidence",
            "gauge",
            "Confidence of the link estimate, 0-1.",
            [("", {"model": n}, float(st["confidence"])) for n, st in statuses.items()],
        )
        family(
            "splitrt_cloud_up",
            "gauge",
            "1 when a known cloud is usable.",
            [
                ("", {"model": n, "cloud": str(c["address"])}, 1.0 if c["up"] else 0.0)
                for n, st in statuses.items()
                for c in st["clouds"]
            ],
        )
        return "\n".join(lines) + "\n"


def _metrics_server(daemon: Daemon, host: str, port: int) -> ThreadingHTTPServer:
    return promtext.http_server(host, port, daemon.metrics_text)


class _LocalServicer(pb_grpc.LocalInferenceServicer):
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    def _model(self, name: str, context: grpc.ServicerContext) -> _Model:
        try:
            return self.d.model(name)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
        raise AssertionError("unreachable")

    def Infer(self, request: pb.LocalInferRequest, context: grpc.ServicerContext) -> pb.LocalInferReply:
        m = self._model(request.model, context)
        rid = request.request_id or uuid.uuid4().hex[:12]
        inputs: dict[str, np.ndarray] = {}
        try:
            for t in request.tensors:
                if t.name in inputs:
                    raise InputError(f"tensor {t.name!r}: expected each input once, got it twice")
                inputs[t.name] = codec.decode(wire.from_proto(t))
        except (CodecError, InputError) as exc:
            self._count_failed(m)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            out = self.d.infer(m, inputs, deadline_ms=request.deadline_ms or None, request=rid)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SplitrtError as exc:
            log.warning("request %s failed: %s", rid, exc)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        reply = pb.LocalInferReply(
            request_id=rid, plan=out.plan, latency_ms=out.latency_ms, fallback=out.fallback, server=out.server or ""
        )
        raw = codec.Codec.parse("fp32")
        for name, value in out.outputs.items():
            wire.add_tensor(reply.outputs, codec.encode(name, np.asarray(value), raw))
        return reply

    def _count_failed(self, m: _Model) -> None:
        with self.d._lock:
            m.stats.requests += 1
            m.stats.failed += 1

    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext) -> pb.GetPlanReply:
        m = self._model(request.model, context)
        p = self.d.plan(m)
        clouds = [
            pb.CloudState(
                address=str(c["address"]),
                up=bool(c["up"]),
                rtt_ms=float(c["rtt_ms"]) if c["rtt_ms"] is not None else -1.0,
                last_error=str(c["last_error"]),
            )
            for c in p["clouds"]
        ]
        return pb.GetPlanReply(
            model=m.config.name,
            sha256=p["sha256"],
            plan=p["plan"] or "",
            policy=p["policy"],
            objective=p["objective"],
            bandwidth_mbps=p["bandwidth_mbps"],
            rtt_ms=p["rtt_ms"],
            confidence=p["confidence"],
            device_load=p["device_load"],
            cloud_load=p["cloud_load"],
            clouds=clouds,
            completed=p["completed"],
            failed=p["failed"],
            fallbacks=p["fallbacks"],
            switches=p["switches"],
            cost_table=p["cost_table"],
        )


def _add_local_servicer(servicer: _LocalServicer, server: grpc.Server) -> None:
    """The generated ``add_LocalInferenceServicer_to_server``, but bytes that do not parse are
    INVALID_ARGUMENT naming the expected message (the generated handlers answer INTERNAL)."""

    def method(call: Any, request_type: Any, reply_type: Any) -> grpc.RpcMethodHandler:
        full_name = request_type.DESCRIPTOR.full_name

        def deserialize(data: bytes) -> Any:
            try:
                return request_type.FromString(data)
            except Exception as exc:  # protobuf's DecodeError, bad UTF-8 in a string field, ...
                return wire.Malformed(
                    f"expected a protobuf-encoded {full_name}, got {len(data)} bytes that "
                    f"do not parse ({type(exc).__name__}: {str(exc)[:200]})"
                )

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, wire.Malformed):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return call(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=deserialize, response_serializer=reply_type.SerializeToString
        )

    name = pb.DESCRIPTOR.services_by_name["LocalInference"].full_name
    handlers = {
        "Infer": method(servicer.Infer, pb.LocalInferRequest, pb.LocalInferReply),
        "GetPlan": method(servicer.GetPlan, pb.GetPlanRequest, pb.GetPlanReply),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


# -- client -----------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LocalResult:
    request_id: str
    outputs: dict[str, np.ndarray]
    plan: str
    latency_ms: float
    fallback: bool
    server: str | None


class LocalClient:
    """Apps' client of the daemon: ``LocalClient("unix:/run/splitrt/daemon.sock")`` or
    ``LocalClient("127.0.0.1:50100")``. ``infer`` raises ``InputError`` for inputs the model rejects
    (INVALID_ARGUMENT) and ``CloudError`` (with the gRPC ``code``) for anything else."""

    def __init__(self, address: str, *, timeout_s: float = 60.0) -> None:
        if address.startswith("/"):
            address = f"unix:{address}"
        self.address = address
        self.timeout_s = timeout_s
        mb = wire.DEFAULT_MAX_MESSAGE_BYTES
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_send_message_length", mb), ("grpc.max_receive_message_length", mb)]
        )
        self._stub = pb_grpc.LocalInferenceStub(self._channel)

    def _error(self, exc: grpc.RpcError, what: str) -> SplitrtError:
        code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == "INVALID_ARGUMENT":
            return InputError(details)
        return CloudError(
            f"daemon {self.address}: {what}: {code}: {details}", code=code, retryable=code in wire.RETRYABLE_CODES
        )

    def infer(
        self, inputs: Mapping[str, Any], *, model: str = "", deadline_ms: float = 0.0, request_id: str = ""
    ) -> LocalResult:
        req = pb.LocalInferRequest(model=model, deadline_ms=deadline_ms, request_id=request_id)
        raw = codec.Codec.parse("fp32")
        for name, value in inputs.items():
            wire.add_tensor(req.tensors, codec.encode(name, np.ascontiguousarray(value), raw))
        try:
            reply = self._stub.Infer(req, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc, "Infer") from exc
        outputs = {t.name: codec.decode(wire.from_proto(t)) for t in reply.outputs}
        return LocalResult(
            request_id=reply.request_id,
            outputs=outputs,
            plan=reply.plan,
            latency_ms=reply.latency_ms,
            fallback=reply.fallback,
            server=reply.server or None,
        )

    def plan(self, model: str = "") -> pb.GetPlanReply:
        try:
            return self._stub.GetPlan(pb.GetPlanRequest(model=model), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc, "GetPlan") from exc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- entry point ------------------------------------------------------------------------------------


def run(config_path: str | Path, *, ready_out: TextIO | None = None) -> int:
    """``splitrt daemon --config FILE``: start, print one JSON "ready" line, serve until SIGTERM/SIGINT."""
    config = load_config(config_path)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    daemon = Daemon(config)
    try:
        endpoints = daemon.start()
    except BaseException:
        daemon.stop(grace_s=0)
        raise
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
