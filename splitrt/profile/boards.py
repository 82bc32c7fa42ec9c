"""Per-board descriptors (``devices/<name>.toml``) as frozen dataclasses.

A descriptor gives a board's cores, memory, execution providers, a ``cpu_speed_factor`` (how many
times slower than the build host that measured ``profiles/``; used to emulate the board from a host
profile) and power figures for the energy objective. Each number's source is cited in the TOML.

- ``boards.load_board(name | path) -> Board(name, cores, memory_mb, execution_providers, cpu_speed_factor,
  power: Power, ..., power_reader, radio_source)`` from ``devices/<name>.toml`` ($SPLITRT_DEVICES_DIR
  overrides); ``[power] reader`` names the board's power reader (None: detect), ``[power] radio_source`` cites
  the radio figure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitrt import paths
from splitrt.errors import ConfigError
from splitrt.plan.costmodel import Power

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Where descriptors are looked up: $SPLITRT_DEVICES_DIR, else the repository's devices/.
ENV_DIR = "SPLITRT_DEVICES_DIR"


@dataclass(frozen=True, kw_only=True)
class Board:
    name: str
    description: str
    arch: str
    cores: int
    memory_mb: int
    execution_providers: tuple[str, ...]
    cpu_speed_factor: float
    power: Power
    path: Path
    # ``[power] reader``: which power reader the board has (``profile.power_select``); None: detect
    power_reader: str | None = None
    # ``[power] radio_source``: the citation for radio_w (what the radio's energy per byte comes from)
    radio_source: str = ""


#: The reference workload's time on the build host when no shipped profile says otherwise (ms).
FALLBACK_HOST_RESNET50_MS = 27.5


def host_reference_ms() -> float:
    """Whole-model time of the zoo resnet50 in the shipped host profile: what `resnet50_ms` of a board
    is divided by to get its ``cpu_speed_factor``."""
    import json

    path = paths.profiles_dir() / "x86_64-2core__resnet50.json"
    try:
        doc = json.loads(path.read_text())
        return float(doc["runtime"]["whole_model_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return FALLBACK_HOST_RESNET50_MS


def devices_dir() -> Path:
    return paths.devices_dir()


def names(directory: Path | None = None) -> list[str]:
    d = directory or devices_dir()
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in data:
        raise ConfigError(f"{path}: missing key {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{path}: {key} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def load_board(name_or_path: str | Path, directory: Path | None = None) -> Board:
    """Load ``devices/<name>.toml`` (or a path to a TOML file); ``ConfigError`` on a bad file."""
    given = Path(name_or_path)
    path = given if given.suffix == ".toml" else (directory or devices_dir()) / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(names(directory)) or "none"
        raise ConfigError(f"no board descriptor {path} (known boards: {known})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable TOML file: {exc}") from exc
    power = _field(data, "power", dict, path)
    number = (int, float)
    cores = _field(data, "cores", int, path)
    memory_mb = _field(data, "memory_mb", int, path)
    if "resnet50_ms" in data:
        # The board's own figure for the reference workload (zoo resnet50): the factor is relative to
        # whatever the shipped host profile measured, so re-profiling the host keeps boards true.
        board_ms = float(_field(data, "resnet50_ms", number, path))
        if not board_ms > 0:
            raise ConfigError(f"{path}: resnet50_ms must be > 0, got {board_ms}")
        factor = board_ms / host_reference_ms()
    else:
        factor = float(_field(data, "cpu_speed_factor", number, path))
    eps = _field(data, "execution_providers", list, path)
    if cores < 1 or memory_mb < 1:
        raise ConfigError(f"{path}: cores and memory_mb must be >= 1, got {cores} and {memory_mb}")
    if not factor > 0:
        raise ConfigError(f"{path}: cpu_speed_factor must be > 0, got {factor}")
    if not eps or not all(isinstance(e, str) for e in eps):
        raise ConfigError(f"{path}: execution_providers must be a non-empty list of names, got {eps!r}")
    try:
        pw = Power(
            idle_w=float(_field(power, "idle_w", number, path)),
            active_w=float(_field(power, "active_w", number, path)),
            radio_w=float(_field(power, "radio_w", number, path)),
        )
    except ConfigError:
        raise
    except Exception as exc:  # PlanError from Power validation
        raise ConfigError(f"{path}: [power]: {exc}") from exc
    reader = power.get("reader")
    radio_source = power.get("radio_source", "")
    if reader is not None and not (isinstance(reader, str) and reader):
        raise ConfigError(f"{path}: [power] reader must be a reader name (rapl, rpi5-pmic, ...), got {reader!r}")
    if not isinstance(radio_source, str):
        raise ConfigError(f"{path}: [power] radio_source must be a string, got {radio_source!r}")
    return Board(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        arch=str(data.get("arch", "")),
        cores=cores,
        memory_mb=memory_mb,
        execution_providers=tuple(eps),
        cpu_speed_factor=factor,
        power=pw,
        path=path,
        power_reader=reader,
        radio_source=radio_source,
    )


def all_boards(directory: Path | None = None) -> list[Board]:
    return [load_board(n, directory) for n in names(directory)]
