"""Pick a power reader: by name (``--power-reader``, or ``[power] reader`` in devices/<board>.toml), or
detected at start in the order RAPL, Jetson INA3221, Raspberry Pi 5 PMIC (cheap sysfs checks first; the
PMIC costs a process spawn and is only tried where ``vcgencmd`` exists).

Names: ``rapl``, ``rpi5-pmic``, ``jetson-ina3221``, ``csv:PATH`` (external meter), ``fake[:IDLE_W[,CPU_W]]``
(tests and dry runs), ``none`` (no reader: energy stays estimated), ``auto`` (detect).

- ``power_select.open_reader(spec, *, sys_root, run_pmic, start)``: ``rapl | rpi5-pmic | jetson-ina3221 |
  csv:PATH | fake[:IDLE_W[,CPU_W]] | none`` (``ConfigError`` otherwise); ``detect()`` tries RAPL, INA3221, then
  the PMIC (only where vcgencmd exists) -> ``Choice(reader | None, how, skipped)``; ``choose(flag,
  board_reader)``: flag, then board, then detection (``auto`` detects); a named reader that fails raises.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from splitrt.errors import ConfigError, PowerError
from splitrt.profile.power import FakeReader, PowerReader, SampledReader
from splitrt.profile.power_meter import CsvMeterReader
from splitrt.profile.power_pmic import Rpi5Pmic, run_vcgencmd
from splitrt.profile.power_sysfs import SYS_ROOT, JetsonIna3221, RaplReader

NAMES = ("rapl", "rpi5-pmic", "jetson-ina3221", "csv:PATH", "fake[:IDLE_W[,CPU_W]]", "none", "auto")
DETECT_ORDER = ("rapl", "jetson-ina3221", "rpi5-pmic")

# Sampling periods: sysfs reads are cheap; vcgencmd spawns a process (~10 ms) per sample.
INA3221_PERIOD_S = 0.02
PMIC_PERIOD_S = 0.05


@dataclass(frozen=True, kw_only=True)
class Choice:
    """The reader chosen (None: energy stays estimated), how (``flag``, ``board``, ``detected``,
    ``none``) and, for ``detected``/``none``, why each candidate was passed over."""

    reader: PowerReader | None
    how: str
    skipped: tuple[str, ...] = ()


def open_reader(
    spec: str, *, sys_root: Path = SYS_ROOT, run_pmic: Callable[[], str] = run_vcgencmd, start: bool = True
) -> PowerReader | None:
    """Open the reader named ``spec`` (see module doc); ``None`` for ``none``. ``PowerError`` when the
    hardware is absent or unreadable, ``ConfigError`` on an unknown name."""
    kind, _, arg = spec.strip().partition(":")
    if kind == "none":
        return None
    if kind == "rapl":
        return RaplReader(sys_root / "class" / "powercap")
    if kind == "jetson-ina3221":
        sampled = SampledReader(JetsonIna3221(sys_root), period_s=INA3221_PERIOD_S)
        return sampled.start() if start else sampled
    if kind == "rpi5-pmic":
        sampled = SampledReader(Rpi5Pmic(run_pmic), period_s=PMIC_PERIOD_S)
        return sampled.start() if start else sampled
    if kind == "csv" and arg:
        return CsvMeterReader(arg)
    if kind == "fake":
        try:
            figures = [float(x) for x in arg.split(",")] if arg else []
        except ValueError:
            figures = [-1.0]
        if len(figures) > 2 or any(not f >= 0 for f in figures):
            raise ConfigError(f"power reader: expected fake[:IDLE_W[,CPU_W]] with watts >= 0, got {spec!r}")
        return FakeReader(idle_w=figures[0] if figures else 2.0, cpu_w=figures[1] if len(figures) > 1 else 0.0)
    raise ConfigError(f"power reader: expected one of {', '.join(NAMES)}, got {spec!r}")


def detect(*, sys_root: Path = SYS_ROOT, run_pmic: Callable[[], str] | None = None, start: bool = True) -> Choice:
    """The first reader of ``DETECT_ORDER`` that opens and reads; ``Choice(reader=None)`` with the
    reasons when none does. ``run_pmic`` None: the PMIC is tried only where vcgencmd is on PATH."""
    skipped = []
    for name in DETECT_ORDER:
        if name == "rpi5-pmic" and run_pmic is None and shutil.which("vcgencmd") is None:
            skipped.append("rpi5-pmic: no vcgencmd on PATH")
            continue
        try:
            reader = open_reader(name, sys_root=sys_root, run_pmic=run_pmic or run_vcgencmd, start=start)
        except PowerError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        return Choice(reader=reader, how="detected", skipped=tuple(skipped))
    return Choice(reader=None, how="none", skipped=tuple(skipped))


def choose(
    flag: str | None,
    board_reader: str | None = None,
    *,
    sys_root: Path = SYS_ROOT,
    run_pmic: Callable[[], str] | None = None,
    start: bool = True,
) -> Choice:
    """``--power-reader`` first, then the board file's ``[power] reader``, then detection (``auto`` in
    either place detects too). A named reader that cannot read is an error, not a silent estimate."""
    for spec, how in ((flag, "flag"), (board_reader, "board")):
        if spec and spec != "auto":
            reader = open_reader(spec, sys_root=sys_root, run_pmic=run_pmic or run_vcgencmd, start=start)
            return Choice(reader=reader, how=how if reader is not None else "none")
    return detect(sys_root=sys_root, run_pmic=run_pmic, start=start)
