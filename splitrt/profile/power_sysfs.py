"""Power readers on sysfs: Linux powercap/RAPL energy counters and the Jetson INA3221 rail monitors.

Both take the sysfs root as an argument, so tests run them on a tree they wrote under tmp_path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from splitrt.errors import PowerError

RAPL_ROOT = Path("/sys/class/powercap")
SYS_ROOT = Path("/sys")

# Top-level zones only: ``intel-rapl:0`` is a package; ``intel-rapl:0:0`` (core, uncore, dram) are parts
# of it and would count twice.
_TOP_ZONE = re.compile(r"^intel-rapl:\d+$")


def read_number(path: Path) -> float:
    """One number from a sysfs file; ``PowerError`` naming the path when it is missing or unreadable."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise PowerError(f"{path}: expected a power/energy file, got no such file") from None
    except PermissionError:
        raise PowerError(
            f"{path}: expected a readable file, got permission denied (RAPL counters are root-only since "
            "Linux 5.10: run as root or `sudo chmod o+r` the energy_uj files)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PowerError(f"{path}: expected a readable file, got {exc}") from exc
    try:
        return float(text)
    except ValueError:
        raise PowerError(f"{path}: expected a number, got {text[:40]!r}") from None


@dataclass(frozen=True, kw_only=True)
class RaplZone:
    name: str
    energy_path: Path
    max_range_uj: float


def rapl_zones(root: Path = RAPL_ROOT) -> list[RaplZone]:
    """The top-level RAPL zones under ``root`` (packages; ``psys``, which contains them, left out)."""
    if not root.is_dir():
        raise PowerError(f"{root}: expected the powercap sysfs directory, got no such directory")
    zones = []
    for d in sorted(root.iterdir()):
        if not _TOP_ZONE.match(d.name):
            continue
        try:
            label = (d / "name").read_text(encoding="ascii").strip()
        except OSError:
            label = d.name
        if label == "psys":  # the whole platform: already includes the packages
            continue
        zones.append(
            RaplZone(
                name=f"{d.name}/{label}",
                energy_path=d / "energy_uj",
                max_range_uj=read_number(d / "max_energy_range_uj"),
            )
        )
    if not zones:
        raise PowerError(f"{root}: expected intel-rapl:N zones, got none")
    return zones


class RaplReader:
    """Sum of the package counters, each unwrapped: a reading below the previous one means the counter
    passed ``max_energy_range_uj`` and restarted from 0 (read at least once per wrap: ~40 min at 100 W)."""

    name = "rapl"

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.root = root
        self.zones = rapl_zones(root)
        self._last = [read_number(z.energy_path) for z in self.zones]
        self._total_uj = 0.0

    def energy_uj(self) -> float:
        for i, z in enumerate(self.zones):
            raw = read_number(z.energy_path)
            delta = raw - self._last[i]
            if delta < 0:
                delta += z.max_range_uj
            self._last[i] = raw
            self._total_uj += delta
        return self._total_uj

    def close(self) -> None:
        pass


# Rails that are the board's whole input: when one is present the others are parts of it.
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass(frozen=True, kw_only=True)
class Rail:
    label: str
    power_mw_path: Path | None = None  # old iio driver: in_powerN_input (mW)
    voltage_mv_path: Path | None = None  # hwmon: inN_input (mV)
    current_ma_path: Path | None = None  # hwmon: currN_input (mA)

    def power_w(self) -> float:
        if self.power_mw_path is not None:
            return read_number(self.power_mw_path) / 1e3
        assert self.voltage_mv_path is not None and self.current_ma_path is not None
        return read_number(self.voltage_mv_path) * read_number(self.current_ma_path) / 1e6


def _label(path: Path, default: str) -> str:
    try:
        return path.read_text(encoding="ascii").strip() or default
    except OSError:
        return default


def ina3221_rails(root: Path = SYS_ROOT) -> list[Rail]:
    """INA3221 channels under ``root``: the hwmon driver (JetPack 5+: ``class/hwmon/hwmon*/`` named
    ``ina3221``, ``inN_label``, ``inN_input`` mV, ``currN_input`` mA) or the older iio one (JetPack 4:
    ``bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_N``, ``in_powerN_input`` mW)."""
    rails: list[Rail] = []
    for hw in sorted(root.glob("class/hwmon/hwmon*")):
        if _label(hw / "name", "") != "ina3221":
            continue
        for volt in sorted(hw.glob("in[0-9]*_input")):
            n = volt.name[2 : -len("_input")]
            curr = hw / f"curr{n}_input"
            label = _label(hw / f"in{n}_label", f"{hw.name}/in{n}")
            if curr.exists() and label != "NC":  # unconnected channels are labelled NC
                rails.append(Rail(label=label, voltage_mv_path=volt, current_ma_path=curr))
    for dev in sorted(root.glob("bus/i2c/drivers/ina3221x/*/iio:device*")):
        for pw in sorted(dev.glob("in_power[0-9]*_input")):
            n = pw.name[len("in_power") : -len("_input")]
            rails.append(Rail(label=_label(dev / f"rail_name_{n}", f"{dev.name}/power{n}"), power_mw_path=pw))
    return rails


class JetsonIna3221:
    """A ``PowerSource``: the board input rail (VDD_IN / POM_5V_IN) when present, else every rail summed."""

    name = "jetson-ina3221"

    def __init__(self, root: Path = SYS_ROOT) -> None:
        rails = ina3221_rails(root)
        if not rails:
            raise PowerError(
                f"{root}: expected INA3221 rails (class/hwmon/hwmon*/name = ina3221, or "
                "bus/i2c/drivers/ina3221x/*/iio:device*/in_power*_input), got none"
            )
        total = [r for r in rails if r.label in TOTAL_RAILS]
        self.rails = total or rails
        self.power_w()  # fail now, naming the file, rather than on the sampling thread

    def power_w(self) -> float:
        return sum(r.power_w() for r in self.rails)
