"""Power readers: one interface over the energy counters and power rails a board exposes.

A ``PowerReader`` gives the energy used since it was opened (``energy_uj()``, cumulative, never
decreasing); the energy of an interval is the difference of two readings. Counter hardware (Linux
powercap/RAPL) is read directly; rails that only give instantaneous power (Raspberry Pi 5 PMIC, Jetson
INA3221) are ``PowerSource``s sampled on a background thread by ``SampledReader`` and integrated
(trapezoids); an external meter's CSV stream is integrated from its own timestamps (``power_meter``).
The readers live in ``power_sysfs`` (RAPL, INA3221), ``power_pmic`` (Pi 5) and ``power_meter`` (CSV);
``power_select`` opens one by name (``[power] reader`` in devices/*.toml, ``--power-reader``) or
detects one.

Every energy figure splitrt reports carries a source: ``measured`` (a reader) or ``estimated`` (the
board file's power figures times predicted times).

- ``PowerReader`` protocol: ``.name``, ``.energy_uj() -> float`` (cumulative since opened, non-decreasing; an
  interval's energy is the difference), ``.close()``. ``PowerSource``: ``.name``, ``.power_w()``, integrated by
  ``SampledReader(source, period_s, clock)`` (trapezoids on a daemon thread, ``.start()``; ``.sample()`` by hand
  in tests). Readers: ``RaplReader(root=/sys/class/powercap)`` (top-level ``intel-rapl:N`` zones, ``psys`` left
  out, each counter unwrapped at ``max_energy_range_uj``), ``JetsonIna3221(root=/sys)`` (hwmon ``inN_input`` mV
  x ``currN_input`` mA, or iio ``in_powerN_input`` mW; only ``VDD_IN``/``POM_5V_IN`` when present, else every
  rail), ``Rpi5Pmic(run)`` (``vcgencmd pmic_read_adc``: current x voltage per rail with both lines),
  ``CsvMeterReader(path)`` (``<unix s>,<watts>`` lines, non-blocking file/FIFO/tty, integrated on the meter's
  timestamps), ``FakeReader( idle_w, cpu_w, clock, cpu_clock)``. A missing, unreadable or garbled file/command
  is ``PowerError`` (a ``ProfileError``) naming the path and what it expected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from splitrt.errors import PowerError

MEASURED = "measured"
ESTIMATED = "estimated"

Clock = Callable[[], float]


class PowerReader(Protocol):
    """Energy used since the reader was opened, in microjoules (cumulative, non-decreasing)."""

    name: str

    def energy_uj(self) -> float: ...

    def close(self) -> None: ...


class PowerSource(Protocol):
    """Instantaneous power of a board's rails (watts); sampled and integrated by ``SampledReader``."""

    name: str

    def power_w(self) -> float: ...


class SampledReader:
    """Integrates a ``PowerSource`` sampled every ``period_s`` on a daemon thread (``start()``).

    ``energy_uj()`` is the integral up to now: the trapezoids between samples plus the last sample's
    power held since, so an interval's energy does not wait for the next sample. Tests drive
    ``sample()`` by hand with a fake clock and never start the thread.
    """

    def __init__(self, source: PowerSource, *, period_s: float = 0.05, clock: Clock = time.monotonic) -> None:
        if not period_s > 0:
            raise PowerError(f"expected a sampling period > 0 s, got {period_s!r}")
        self.name = source.name
        self.source = source
        self.period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: PowerError | None = None
        self._total_uj = 0.0
        self._last_t_s = clock()
        self._last_w = source.power_w()  # fails here, in the caller, if the rails cannot be read
        self.samples = 1

    def sample(self) -> None:
        power_w = self.source.power_w()
        now_s = self._clock()
        with self._lock:
            self._total_uj += (now_s - self._last_t_s) * (self._last_w + power_w) / 2 * 1e6
            self._last_t_s, self._last_w = now_s, power_w
            self.samples += 1

    def start(self) -> SampledReader:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"power-{self.name}", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except PowerError as exc:  # surfaced by the next energy_uj() in the caller's thread
                self._error = exc
                return

    def energy_uj(self) -> float:
        if self._error is not None:
            raise self._error
        with self._lock:
            return self._total_uj + (self._clock() - self._last_t_s) * self._last_w * 1e6

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.period_s + 1.0)


class FakeReader:
    """For tests and dry runs: ``idle_w`` all the time plus ``cpu_w`` per second of this process's CPU
    time, so busy intervals cost more than idle ones. Clocks are injectable."""

    def __init__(
        self,
        *,
        idle_w: float = 2.0,
        cpu_w: float = 0.0,
        clock: Clock = time.monotonic,
        cpu_clock: Clock = time.process_time,
        name: str = "fake",
    ) -> None:
        if not (idle_w >= 0 and cpu_w >= 0):
            raise PowerError(f"expected idle_w >= 0 and cpu_w >= 0, got {idle_w!r} and {cpu_w!r}")
        self.name = name
        self.idle_w, self.cpu_w = idle_w, cpu_w
        self._clock, self._cpu_clock = clock, cpu_clock
        self._t0_s, self._cpu0_s = clock(), cpu_clock()

    def energy_uj(self) -> float:
        wall_s = self._clock() - self._t0_s
        cpu_s = self._cpu_clock() - self._cpu0_s
        return (self.idle_w * wall_s + self.cpu_w * cpu_s) * 1e6

    def close(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class Interval:
    """What one measured interval cost: energy, wall time, and how many times the work ran."""

    energy_uj: float
    duration_s: float
    runs: int

    @property
    def power_w(self) -> float:
        return self.energy_uj / 1e6 / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def energy_per_run_mj(self) -> float:
        return self.energy_uj / 1e3 / max(self.runs, 1)


def measure_interval(
    reader: PowerReader,
    work: Callable[[], object] | None,
    *,
    min_s: float,
    min_runs: int = 1,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Interval:
    """Run ``work`` back to back (or sleep, when None: the idle baseline) for at least ``min_s`` and
    ``min_runs`` times, and read the energy before and after."""
    e0_uj, t0_s = reader.energy_uj(), clock()
    runs = 0
    if work is None:
        sleep(min_s)
    else:
        while runs < min_runs or clock() - t0_s < min_s:
            work()
            runs += 1
    e1_uj, t1_s = reader.energy_uj(), clock()
    if e1_uj < e0_uj:
        raise PowerError(f"{reader.name}: expected a non-decreasing energy reading, got {e0_uj} then {e1_uj} uJ")
    return Interval(energy_uj=e1_uj - e0_uj, duration_s=t1_s - t0_s, runs=runs)
