"""The daemon's configuration: TOML with flat keys, units in their names (:data:`TOP_KEYS`,
:data:`MODEL_KEYS`), loaded into frozen dataclasses; relative paths are relative to the config file.
Example::

    board = "rpi4"                     # devices/<board>.toml: speed factor for the FLOPs prior, power
    objective = "latency"              # latency | energy | throughput
    deadline_ms = 2000
    policy = "adaptive"                # adaptive | route | route-codec | periodic:SECONDS | fixed:PLAN
    # codecs = ["fp32", "int8+zstd"]  # allowed codecs (default fp32); each one the profile prices
    # min_agreement = 0.99             # lossy codecs only where the profile's samples agreed (0: off)
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
  ``[[model]]``); unknown keys, wrong types and values out of range raise ``ConfigError`` naming the key,
  what was expected (the field's description: ``TOP_KEYS``, ``MODEL_KEYS``) and what came.

One schema: ``DaemonConfig`` and ``ModelConfig`` are pydantic dataclasses (frozen, keyword-only), so a
config built in Python (``DaemonConfig(...)``, ``dataclasses.replace``) is checked by the same rules as a
TOML file; ``parse_config`` only adds what a file needs (the ``[[model]]`` tables, paths relative to it).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from splitrt.errors import CodecError, ConfigError
from splitrt.graph import shapes
from splitrt.plan.constraints import Constraints
from splitrt.plan.controller import parse_policy
from splitrt.plan.solver import OBJECTIVES
from splitrt.profile.accuracy import MIN_AGREEMENT
from splitrt.transport import codec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
#: Tiers the daemon's runtime serves today: the device and up to two servers (edge, cloud).
MAX_HOPS = 2


def _resolve(value: Any, info: ValidationInfo) -> Any:
    """A path key: "" is none; ``~`` expanded; relative to the config file's directory when read from one."""
    if not isinstance(value, str | Path):
        return value  # the type check names it
    if value == "":
        return None
    p = Path(value).expanduser()
    base = (info.context or {}).get("base_dir")
    return p if p.is_absolute() or base is None else Path(base) / p


def _hostport(value: str, *, loopback: bool = False) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if loopback and host not in _LOOPBACK:
        raise ValueError(
            f"expected a loopback address (127.0.0.1:PORT; the local API has no authentication), got {value!r}"
        )
    return value


def _policy(value: str) -> str:
    try:
        parse_policy(value)
    except ConfigError as exc:  # pydantic reports ValueErrors
        raise ValueError(str(exc).removeprefix("policy: ")) from exc
    return value


def _codec(value: str) -> str:
    try:
        codec.Codec.parse(value)
    except CodecError as exc:
        raise ValueError(f"expected codec names, got {value!r} ({exc})") from exc
    return value


def _one_of(choices: tuple[str, ...], what: str | None = None) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected {what or 'one of ' + ', '.join(choices)}, got {value!r}")
        return value

    return check


PathKey = Annotated[Path | None, BeforeValidator(_resolve)]
HostPort = Annotated[StrictStr, AfterValidator(_hostport)]
Objective = Annotated[StrictStr, AfterValidator(_one_of(OBJECTIVES))]
PolicySpec = Annotated[StrictStr, AfterValidator(_policy)]
CodecName = Annotated[StrictStr, AfterValidator(_codec)]
Loopback = Annotated[StrictStr, AfterValidator(_one_of(_LOOPBACK, "a loopback address"))]
Number = Annotated[float, Strict()]  # an int or a float (TOML), never a bool or a string
Names = tuple[Annotated[StrictStr, Field(min_length=1)], ...]
_STRICT = ConfigDict(extra="forbid")


@dataclass(frozen=True, kw_only=True, config=_STRICT)
class ModelConfig:
    name: StrictStr = Field(min_length=1, description="a non-empty name")
    # file path (absolute after loading) or zoo:NAME
    path: StrictStr = Field(description="an .onnx file path or zoo:NAME")
    profile_device_path: PathKey = Field(default=None, description="a profile JSON path (splitrt profile)")
    profile_cloud_path: PathKey = Field(default=None, description="a profile JSON path (splitrt profile)")
    shapes: Names = Field(default=(), description="a list of NAME=1x3xHxW strings (as --shape)")
    dims: Names = Field(default=(), description="a list of SYMBOL=N strings (as --dim)")
    sample_path: PathKey = Field(default=None, description="an .npz of input arrays (as --sample)")

    @field_validator("path")
    @classmethod
    def _model_path(cls, value: str, info: ValidationInfo) -> str:
        return value if value.startswith("zoo:") else str(_resolve(value, info))

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if (self.profile_device_path is None) != (self.profile_cloud_path is None):
            raise ValueError("expected both profile_device_path and profile_cloud_path, got only one")
        try:
            shapes.binding_from(self.shapes, self.dims)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return self


@dataclass(frozen=True, kw_only=True, config=_STRICT)
class DaemonConfig:
    models: tuple[ModelConfig, ...] = Field(min_length=1, description="at least one [[model]] table with name and path")
    board: StrictStr | None = Field(default=None, description="a board name (devices/*.toml) or a .toml path")
    objective: Objective = Field(default="latency", description=f"one of {', '.join(OBJECTIVES)}")
    deadline_ms: Number = Field(default=5000.0, gt=0, allow_inf_nan=False, description="a number of milliseconds > 0")
    policy: PolicySpec = Field(
        default="adaptive", description="adaptive, route, route-codec, periodic:SECONDS or fixed:PLAN"
    )
    codecs: tuple[CodecName, ...] = Field(
        default=("fp32",), description="a list of codec names (fp32, fp16, int8, int8c[+zstd|+zlib])"
    )
    # the accuracy guard, as `splitrt plan --min-agreement` (0: off, lossy codecs priced by their bytes)
    min_agreement: Number = Field(
        default=MIN_AGREEMENT,
        ge=0,
        le=1,
        description=f"a share in [0, 1]: lossy codecs only where the profile's samples agreed at least this "
        f"often (default {MIN_AGREEMENT}; 0: guard off)",
    )
    clouds: tuple[HostPort, ...] = Field(default=(), description="a list of HOST:PORT strings")
    # The path of tiers after the device (``path``): an edge between the device and the clouds, or hops.
    edge: HostPort | None = Field(
        default=None, description="HOST:PORT of a server between the device and the clouds (splitrt serve --next)"
    )
    hops: tuple[tuple[StrictStr, ...], ...] = Field(
        default=(), description="a list of hops after the device, each HOST:PORT or a list of HOST:PORT"
    )
    # the edge's compute times / the cloud's (as a board's cpu_speed_factor)
    edge_speed_factor: Number = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="a number > 0 (the edge's compute times / the cloud's)"
    )
    discovery: StrictBool = Field(default=False, description="true or false")
    discovery_interfaces: Names = Field(default=(), description="a list of IP addresses to bind mDNS to")
    tls: StrictBool = Field(default=False, description="true or false")
    tls_ca_path: PathKey = Field(default=None, description="a PEM file path")
    token_path: PathKey = Field(default=None, description="a file path (bearer token on the first line)")
    upload: StrictBool = Field(default=True, description="true or false")
    api_socket_path: PathKey = Field(default=None, description='a unix socket path, or "" for none')
    api_address: StrictStr | None = Field(
        default="127.0.0.1:50100", description='127.0.0.1:PORT (loopback only), or "" for none'
    )
    metrics_address: Loopback = Field(default="127.0.0.1", description="a loopback IP address")
    metrics_port: StrictInt | None = Field(
        default=9464, description="a TCP port 0-65535 (0: any free port), or -1 for none"
    )
    decision_log_path: PathKey = Field(default=None, description="a file path (JSON lines)")
    drain_timeout_s: Number = Field(default=10.0, ge=0, description="a number of seconds >= 0")
    intra_op_threads: StrictInt = Field(default=0, ge=0, description="an integer >= 0 (0: onnxruntime's default)")
    api_workers: StrictInt = Field(default=8, ge=1, description="an integer >= 1")
    min_head_flops: Number = Field(default=0.0, description="a share of the model's FLOPs in [0, 1] (privacy floor)")
    no_raw_input: StrictBool = Field(
        default=False, description="true or false (privacy floor: the input never leaves the device)"
    )
    # MB, or "board" (the board file's memory_mb)
    device_memory_mb: Number | Literal["board"] | None = Field(
        default=None, description='a number of MB > 0 or "board" (memory ceiling)'
    )

    @property
    def path(self) -> tuple[tuple[str, ...], ...]:
        """The static servers of each hop after the device (tiers = 1 + hops): ``hops``, else ``edge`` then
        ``clouds``, else ``clouds``. An empty hop is learned (discovery; an edge's next tier)."""
        if self.hops:
            return self.hops
        if self.edge is not None:
            return ((self.edge,), self.clouds)
        return (self.clouds,)

    @field_validator("hops", mode="before")
    @classmethod
    def _hops(cls, raw: Any) -> Any:
        if raw == ():
            return ()  # the default (``dataclasses.replace`` passes it again); a file's [] is refused below
        if not isinstance(raw, list | tuple):
            return raw  # the type check names it
        if not 1 <= len(raw) <= MAX_HOPS:
            raise ValueError(f"expected 1 to {MAX_HOPS} hops (device -> edge -> cloud), got {len(raw)}: {raw!r}")
        hops = []
        for i, hop in enumerate(raw):
            servers = hop if isinstance(hop, list | tuple) else [hop]
            if not servers or not all(isinstance(a, str) for a in servers):
                raise ValueError(f"hop {i}: expected HOST:PORT or a list of them, got {hop!r}")
            hops.append(tuple(_hostport(a) for a in servers))
        return tuple(hops)

    @field_validator("api_address", mode="before")
    @classmethod
    def _api_address(cls, value: Any) -> Any:
        if value == "":
            return None
        return _hostport(value, loopback=True) if isinstance(value, str) else value

    @field_validator("metrics_port")
    @classmethod
    def _metrics_port(cls, value: int | None) -> int | None:
        if value is not None and not -1 <= value < 65536:
            raise ValueError(f"expected a TCP port 0-65535 (0: any free port), or -1 for none, got {value!r}")
        return None if value == -1 else value

    @model_validator(mode="after")
    def _consistent(self) -> DaemonConfig:
        if self.hops and (self.edge is not None or self.clouds):
            given = " and ".join(k for k, v in (("edge", self.edge), ("clouds", self.clouds)) if v)
            raise ValueError(f"key 'hops': expected hops alone (the whole path), or edge/clouds, got {given} too")
        if len(self.path) > 1 and self.discovery:
            raise ValueError(
                "a path of three tiers (edge or two hops): expected discovery = false (the edge names "
                "its next tier), got true"
            )
        mem = self.device_memory_mb
        try:
            Constraints(
                min_head_flops_fraction=self.min_head_flops,
                device_memory_mb=mem if isinstance(mem, float) else None,
            )
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        if mem == "board" and self.board is None:
            raise ValueError("key 'device_memory_mb': \"board\" needs a board key, got none")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names: expected unique names, got {names}")
        if self.api_address is None and self.api_socket_path is None:
            raise ValueError("expected api_address or api_socket_path (or both), got neither")
        return self


def _described(cls: type) -> dict[str, str]:
    fields = cls.__pydantic_fields__  # type: ignore[attr-defined]
    return {k: f.description or "" for k, f in fields.items()}


#: key -> what it expects (the schema's descriptions; documentation order). ``model`` is MODEL_KEYS' table.
TOP_KEYS: dict[str, str] = {k: v for k, v in _described(DaemonConfig).items() if k != "models"}
MODEL_KEYS: dict[str, str] = _described(ModelConfig)
_ADAPTER = TypeAdapter(DaemonConfig)


def _message(where: str, err: Any) -> tuple[tuple[Any, ...], str]:
    """(the place it names, the message) of one pydantic error, in the house's words: the key, what it
    expects (its field's description), what came."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    keys, top = TOP_KEYS, True
    if loc[:1] == ("models",) and len(loc) > 1 and isinstance(loc[1], int):
        where, keys, top = f"{where}: model[{loc[1]}]", MODEL_KEYS, False
        if len(loc) == 2 and kind != "value_error":
            return loc, f"{where}: expected a table, got {value!r}"
        loc = loc[2:]
    elif loc[:1] == ("models",):
        loc, keys = ("model", *loc[1:]), {**TOP_KEYS, "model": _described(DaemonConfig)["models"]}
    place = (where, *loc[:1])
    if kind == "value_error":
        cause = (err.get("ctx") or {}).get("error")
        text = str(cause) if cause is not None else err["msg"]
        return place, f"{where}: key {loc[0]!r}: {text}" if loc else f"{where}: {text}"
    key = loc[0]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return place, f"{where}: unknown key {key!r}: expected one of {sorted([*keys, 'model'] if top else keys)}"
    if kind == "missing":
        return place, f"{where}: missing key {key!r}: expected {keys.get(key, '')}"
    return place, f"{where}: key {key!r}: expected {keys.get(key, '')}, got {value!r} ({type(value).__name__})"


def _config_error(where: str, exc: ValidationError) -> ConfigError:
    said: dict[tuple[Any, ...], str] = {}
    for err in exc.errors():
        if err["type"] == "too_short" and err.get("input"):
            continue  # a list whose items failed counts as short too: the items' errors say why
        place, text = _message(where, err)
        said.setdefault(place, text)  # a union or a list fails once per member: its first says it
    return ConfigError("; ".join(said.values()))


def _raising_config_errors(cls: type) -> None:
    """``cls(...)`` (and ``dataclasses.replace``) raise ``ConfigError``, not pydantic's error."""
    init = cls.__init__  # type: ignore[misc]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise _config_error(cls.__name__, exc) from None

    cls.__init__ = __init__  # type: ignore[misc]


_raising_config_errors(ModelConfig)
_raising_config_errors(DaemonConfig)


def parse_config(data: Mapping[str, Any], *, base_dir: Path, where: str = "config") -> DaemonConfig:
    """``DaemonConfig`` from parsed TOML (``[[model]]`` tables, paths relative to ``base_dir``);
    ``ConfigError`` names each key that is wrong, what was expected and what came."""
    if "models" in data:  # the field's name, not the file's key
        raise ConfigError(f"{where}: unknown key 'models': expected one of {sorted([*TOP_KEYS, 'model'])}")
    raw = {("models" if k == "model" else k): v for k, v in data.items()}
    if not isinstance(raw.get("models"), list) or not raw["models"]:
        raise ConfigError(
            f"{where}: key 'model': expected at least one [[model]] table with name and path, got {data.get('model')!r}"
        )
    try:
        return _ADAPTER.validate_python(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise _config_error(where, exc) from None


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config {p}: cannot read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {p}: expected TOML, got a parse error: {exc}") from exc
    return parse_config(data, base_dir=p.resolve().parent, where=f"config {p}")
