"""Raspberry Pi 5 power from its PMIC's ADC: ``vcgencmd pmic_read_adc`` prints one line per channel::

     VDD_CORE_A current(7)=1.95567000A
     VDD_CORE_V volt(15)=0.87247780V
        EXT5V_V volt(24)=4.98480000V

A rail with both a current (``_A``) and a voltage (``_V``) line contributes current x voltage; voltage-only
channels (EXT5V, BATT) carry no current and add nothing. The sum covers the PMIC's rails (SoC, DRAM,
3V3/1V8 I/O, Wi-Fi), not the 5 V input: USB, the fan and conversion losses are outside it, so it reads
below a USB-C meter (an external meter, ``csv:PATH``, sees the whole board).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Callable

from splitrt.errors import PowerError

COMMAND = ("vcgencmd", "pmic_read_adc")

_LINE = re.compile(r"^\s*(?P<rail>\S+)_(?P<kind>[AV])\s+(?:current|volt)\(\d+\)=(?P<value>\S+?)[AV]\s*$")


def parse_pmic(text: str) -> dict[str, tuple[float, float]]:
    """``{rail: (current_a, voltage_v)}`` for every rail with both lines (unparseable values skipped)."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            (amps if m["kind"] == "A" else volts)[m["rail"]] = value
    return {rail: (amps[rail], volts[rail]) for rail in sorted(amps.keys() & volts.keys())}


def pmic_power_w(text: str) -> float:
    rails = parse_pmic(text)
    if not rails:
        raise PowerError(
            f"`{' '.join(COMMAND)}`: expected lines like 'VDD_CORE_A current(7)=1.2A' with matching _V lines, "
            f"got {text.strip()[:80]!r}"
        )
    return sum(a * v for a, v in rails.values())


def run_vcgencmd(timeout_s: float = 2.0) -> str:
    exe = shutil.which(COMMAND[0])
    if exe is None:
        raise PowerError(f"expected {COMMAND[0]} on PATH (Raspberry Pi OS), got none")
    try:
        proc = subprocess.run([exe, *COMMAND[1:]], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PowerError(f"`{' '.join(COMMAND)}`: expected output, got {exc}") from exc
    if proc.returncode != 0:
        raise PowerError(
            f"`{' '.join(COMMAND)}`: expected exit 0, got {proc.returncode}: {proc.stderr.strip()[:120]} "
            "(a Pi 5 firmware is needed; the user must be in the video group)"
        )
    return proc.stdout


class Rpi5Pmic:
    """A ``PowerSource``: the PMIC rails summed, from one ``vcgencmd pmic_read_adc`` (~10 ms a call)."""

    name = "rpi5-pmic"

    def __init__(self, run: Callable[[], str] = run_vcgencmd) -> None:
        self._run = run
        self.power_w()  # fail now, in the caller, when the command is missing or prints garbage

    def power_w(self) -> float:
        return pmic_power_w(self._run())
