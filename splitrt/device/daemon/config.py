"""The daemon's configuration: TOML with flat keys, units in their names (:data:`TOP_KEYS`,
:data:`MODEL_KEYS`), loaded into frozen dataclasses; relative paths are relative to the config file.
Example::

    board = "rpi4"                     # devices/<board>.toml: speed factor for the FLOPs prior, power
    objective = "latency"              # latency | energy | throughput
    deadline_ms = 2000
    policy = "adaptive"                # adaptive | route | periodic:SECONDS | fixed:PLAN
    # constraints (optional): min_head_flops = 0.2 (privacy floor: a FLOPs share the device computes
    # first), no_raw_input = true (the input never leaves), device_memory_mb = 512 | "board"
    clouds = ["10.0.0.5:50051"]        # static clouds, preferred first
    discovery = true                   # also follow clouds advertised via mDNS
    # a path of three tiers (device -> edge -> cloud): edge = "10.0.0.2:50051" (a `splitrt serve --next`
    # server; clouds: where to go when the edge is down, else learned from the edge), or the path hop by
    # hop: hops = ["10.0.0.2:50051", "10.0.0.5:50051"] (a hop may be a list of servers);
    # edge_speed_factor = 4.0: the edge's compute times as a multiple of the cloud's (default 1)
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

- ``load_config(path) / parse_config(dict, base_dir=) -> DaemonConfig`` (frozen; ``ModelConfig`` per
  ``[[model]]``); unknown keys and wrong types raise ``ConfigError`` naming the key, expected and got.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitrt.errors import CodecError, ConfigError
from splitrt.graph import shapes
from splitrt.transport import codec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


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
    # The path of tiers after the device (``path``): an edge between the device and the clouds, or hops.
    edge: str | None = None
    hops: tuple[tuple[str, ...], ...] = ()
    edge_speed_factor: float = 1.0  # the edge's compute times / the cloud's (as a board's cpu_speed_factor)
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

    @property
    def path(self) -> tuple[tuple[str, ...], ...]:
        """The static servers of each hop after the device (tiers = 1 + hops): ``hops``, else ``edge`` then
        ``clouds``, else ``clouds``. An empty hop is learned (discovery; an edge's next tier)."""
        if self.hops:
            return self.hops
        if self.edge is not None:
            return ((self.edge,), self.clouds)
        return (self.clouds,)


# key -> (types, expected, is_path). Order = documentation order.
TOP_KEYS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "board": ((str,), "a board name (devices/*.toml) or a .toml path", False),
    "objective": ((str,), "latency, energy or throughput", False),
    "deadline_ms": ((int, float), "a number of milliseconds > 0", False),
    "policy": ((str,), "adaptive, route, periodic:SECONDS or fixed:PLAN", False),
    "codecs": ((list,), "a list of codec names (fp32, fp16, int8, int8c[+zstd|+zlib])", False),
    "clouds": ((list,), "a list of HOST:PORT strings", False),
    "edge": ((str,), "HOST:PORT of a server between the device and the clouds (splitrt serve --next)", False),
    "hops": ((list,), "a list of hops after the device, each HOST:PORT or a list of HOST:PORT", False),
    "edge_speed_factor": ((int, float), "a number > 0 (the edge's compute times / the cloud's)", False),
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


#: Tiers the daemon's runtime serves today: the device and up to two servers (edge, cloud).
MAX_HOPS = 2


def _parse_path(where: str, kw: dict[str, Any]) -> None:
    """``edge`` / ``hops`` checked and normalised in ``kw`` (hops: a tuple of tuples of HOST:PORT)."""
    if "hops" in kw and ("edge" in kw or "clouds" in kw):
        given = " and ".join(k for k in ("edge", "clouds") if k in kw)
        raise ConfigError(f"{where}: key 'hops': expected hops alone (the whole path), or edge/clouds, got {given} too")
    if "edge" in kw:
        _check_hostport(where, "edge", kw["edge"], loopback=False)
    if "hops" not in kw:
        return
    raw, hops = kw["hops"], []
    if not 1 <= len(raw) <= MAX_HOPS:
        raise ConfigError(
            f"{where}: key 'hops': expected 1 to {MAX_HOPS} hops (device -> edge -> cloud), got {len(raw)}: {raw!r}"
        )
    for i, hop in enumerate(raw):
        servers = hop if isinstance(hop, list) else [hop]
        if not servers or not all(isinstance(a, str) for a in servers):
            raise ConfigError(f"{where}: key 'hops': hop {i}: expected HOST:PORT or a list of them, got {hop!r}")
        for a in servers:
            _check_hostport(where, "hops", a, loopback=False)
        hops.append(tuple(servers))
    kw["hops"] = tuple(hops)


def _check_tiers(where: str, cfg: DaemonConfig) -> None:
    """What the daemon does not do over three tiers yet (discovery), refused by name."""
    if len(cfg.path) > 1 and cfg.discovery:
        raise ConfigError(
            f"{where}: a path of three tiers (edge or two hops): expected discovery = false (the edge names "
            "its next tier), got true"
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
    _parse_path(where, kw)
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
    for key in ("deadline_ms", "edge_speed_factor"):
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
    _check_tiers(where, cfg)
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
