"""Bandwidth traces: load, synthesise, query (pure apart from reading files).

A ``Trace`` is piecewise constant: sample ``i`` holds from ``times_s[i]`` until ``times_s[i + 1]``; the
last sample holds for the median sampling interval, which ends the trace at ``duration_s``. Times are
shifted so the first sample is at 0. Like Mahimahi, a trace LOOPS: ``rate_at(t)`` for ``t`` past the
end wraps around, so a replay may run longer than the trace.

Formats
- two columns ``<t_s> <Mbit/s>`` (the Norway HSDPA and FCC sets of ``splitrt/data/traces``);
  ``#`` comments and blank lines are ignored;
- Mahimahi: one integer per line, the time in ms of a delivery opportunity for one 1500-byte packet;
  the trace's period is the last timestamp. It is binned (``bin_ms``, default 500) into rates.
``load(path)`` tells them apart (one column of integers = Mahimahi); bad files raise ``ConfigError``
naming file and line. Synthetic traces: ``step``, ``square``, ``constant``; shipped ones: ``load_shipped``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from splitrt import paths
from splitrt.errors import ConfigError

MAHIMAHI_PACKET_BYTES = 1500


@dataclass(frozen=True)
class Trace:
    """Piecewise-constant bandwidth over time (see module doc); ``rates_mbps`` are Mbit/s >= 0."""

    name: str
    times_s: tuple[float, ...]
    rates_mbps: tuple[float, ...]
    duration_s: float

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.rates_mbps):
            raise ConfigError(
                f"trace {self.name!r}: need as many times as rates (>= 1), got "
                f"{len(self.times_s)} times and {len(self.rates_mbps)} rates"
            )
        if self.times_s[0] != 0.0:
            raise ConfigError(f"trace {self.name!r}: first sample must be at 0 s, got {self.times_s[0]}")
        if any(b <= a for a, b in itertools.pairwise(self.times_s)):
            raise ConfigError(f"trace {self.name!r}: sample times must strictly increase")
        if any(not math.isfinite(r) or r < 0 for r in self.rates_mbps):
            raise ConfigError(f"trace {self.name!r}: rates must be finite and >= 0 Mbit/s")
        if not self.duration_s > self.times_s[-1]:
            raise ConfigError(
                f"trace {self.name!r}: duration {self.duration_s} s must exceed the last "
                f"sample time {self.times_s[-1]} s"
            )

    # ------------------------------------------------------------------------------------ queries
    def index_at(self, t_s: float) -> int:
        """Index of the sample in force at ``t_s`` (wrapping past the end)."""
        if t_s < 0:
            raise ConfigError(f"trace time must be >= 0 s, got {t_s}")
        t = t_s % self.duration_s
        return bisect.bisect_right(self.times_s, t) - 1

    def rate_at(self, t_s: float) -> float:
        """Bandwidth in Mbit/s at ``t_s`` seconds from the start (wrapping past the end)."""
        return self.rates_mbps[self.index_at(t_s)]

    def segments(self) -> list[tuple[float, float, float]]:
        """``(start_s, end_s, mbps)`` for each sample."""
        ends = [*self.times_s[1:], self.duration_s]
        return [(a, b, r) for a, b, r in zip(self.times_s, ends, self.rates_mbps, strict=True)]

    def mean_mbps(self) -> float:
        """Time-weighted mean."""
        return sum((b - a) * r for a, b, r in self.segments()) / self.duration_s

    def median_mbps(self) -> float:
        """Time-weighted median: half of the time the rate is at or below it."""
        return weighted_median([(b - a, r) for a, b, r in self.segments()])

    # ------------------------------------------------------------------------------------ transforms
    def scaled(self, k: float) -> Trace:
        """Every rate multiplied by ``k`` (e.g. 5 turns a 3G trace into an LTE-class one)."""
        if not (k > 0 and math.isfinite(k)):
            raise ConfigError(f"trace scale must be a finite number > 0, got {k}")
        name = self.name if k == 1 else f"{self.name}x{k:g}"
        return replace(self, name=name, rates_mbps=tuple(r * k for r in self.rates_mbps))

    def clipped(self, min_mbps: float) -> Trace:
        """Rates raised to at least ``min_mbps`` (a shaper cannot apply 0 Mbit/s)."""
        return replace(self, rates_mbps=tuple(max(r, min_mbps) for r in self.rates_mbps))

    def window(self, start_s: float, duration_s: float) -> Trace:
        """The part ``[start_s, start_s + duration_s)`` (wrapping), re-based at 0."""
        if start_s < 0 or duration_s <= 0:
            raise ConfigError(f"window needs start_s >= 0 and duration_s > 0, got {start_s}, {duration_s}")
        times = [0.0]
        rates = [self.rate_at(start_s)]
        end, base = start_s + duration_s, 0.0
        while base < end:  # the periods the window spans: every sample time in it is a change
            for t in (base + t for t in self.times_s if start_s < base + t < end):
                times.append(t - start_s)
                rates.append(self.rate_at(t))
            base += self.duration_s
        return Trace(
            name=f"{self.name}[{start_s:g}:{start_s + duration_s:g}]",
            times_s=tuple(times),
            rates_mbps=tuple(rates),
            duration_s=duration_s,
        )


def weighted_median(spans: Iterable[tuple[float, float]]) -> float:
    """The rate (of ``(seconds, Mbit/s)`` spans) at or below which half of the time is spent."""
    segs = sorted(spans, key=lambda s: s[1])
    if not segs:
        raise ConfigError("weighted median of no spans")
    total, acc = sum(d for d, _ in segs), 0.0
    for d, r in segs:
        acc += d
        if acc >= total / 2:
            return r
    return segs[-1][1]


# ------------------------------------------------------------------------------------------- build


def from_samples(
    name: str, times_s: Sequence[float], rates_mbps: Sequence[float], duration_s: float | None = None
) -> Trace:
    """Build a trace from samples; times are re-based at 0; the last sample holds for the median gap."""
    if not times_s:
        raise ConfigError(f"trace {name!r} has no samples")
    t0 = times_s[0]
    times = tuple(float(t) - t0 for t in times_s)
    if duration_s is None:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        duration_s = times[-1] + (statistics.median(gaps) if gaps else 1.0)
    return Trace(name=name, times_s=times, rates_mbps=tuple(float(r) for r in rates_mbps), duration_s=duration_s)


def parse_two_column(text: str, name: str = "trace") -> Trace:
    times, rates = list[float](), list[float]()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{name}:{lineno}: expected 2 columns '<t_s> <Mbit/s>', got {raw!r}")
        try:
            t, r = float(parts[0]), float(parts[1])
        except ValueError as exc:
            raise ConfigError(f"{name}:{lineno}: expected two numbers, got {raw!r}") from exc
        if times and t <= times[-1]:
            raise ConfigError(f"{name}:{lineno}: time {t} s does not increase (previous {times[-1]} s)")
        times.append(t)
        rates.append(r)
    return from_samples(name, times, rates)


def parse_mahimahi(text: str, name: str = "trace", bin_ms: int = 500) -> Trace:
    """Mahimahi delivery opportunities (ms, one 1500-byte packet each), binned into ``bin_ms`` rates."""
    if bin_ms <= 0:
        raise ConfigError(f"bin_ms must be > 0, got {bin_ms}")
    stamps: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            ms = int(line)
        except ValueError as exc:
            raise ConfigError(f"{name}:{lineno}: expected an integer ms timestamp, got {raw!r}") from exc
        if ms < 0 or (stamps and ms < stamps[-1]):
            raise ConfigError(f"{name}:{lineno}: timestamps must be >= 0 and non-decreasing, got {ms}")
        stamps.append(ms)
    if not stamps or stamps[-1] <= 0:
        raise ConfigError(f"{name}: a Mahimahi trace needs at least one timestamp > 0")
    period_ms = stamps[-1]
    n_bins = math.ceil(period_ms / bin_ms)
    counts = [0] * n_bins
    for ms in stamps:
        # An opportunity at ms m covers the interval (m-1, m]: bin by m-1.
        counts[min(max(ms - 1, 0) // bin_ms, n_bins - 1)] += 1
    times = [i * bin_ms / 1000 for i in range(n_bins)]
    last_len = period_ms - (n_bins - 1) * bin_ms
    rates = [
        c * MAHIMAHI_PACKET_BYTES * 8 / 1e6 / ((bin_ms if i < n_bins - 1 else last_len) / 1000)
        for i, c in enumerate(counts)
    ]
    return Trace(name=name, times_s=tuple(times), rates_mbps=tuple(rates), duration_s=period_ms / 1000)


def parse(text: str, name: str = "trace") -> Trace:
    """Two-column or Mahimahi, told apart by the first data line."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            return parse_mahimahi(text, name) if len(line.split()) == 1 else parse_two_column(text, name)
    raise ConfigError(f"{name}: trace is empty")


def load(path: str | Path) -> Trace:
    """Load a trace file (either format, ``parse``); its name is the file's stem."""
    p = Path(path)
    try:
        return parse(p.read_text(), p.stem)
    except OSError as exc:
        raise ConfigError(f"cannot read trace file {p}: {exc}") from exc


# ------------------------------------------------------------------------------------- synthetic


def constant(mbps: float, duration_s: float = 60.0) -> Trace:
    return Trace(name=f"constant-{mbps:g}", times_s=(0.0,), rates_mbps=(float(mbps),), duration_s=float(duration_s))


def step(levels_mbps: Iterable[float], step_s: float = 10.0) -> Trace:
    """Each level held for ``step_s`` seconds, in order."""
    levels = [float(x) for x in levels_mbps]
    if not levels or step_s <= 0:
        raise ConfigError(f"step needs >= 1 level and step_s > 0, got {levels} and {step_s}")
    return Trace(
        name="step-" + "-".join(f"{x:g}" for x in levels),
        times_s=tuple(i * step_s for i in range(len(levels))),
        rates_mbps=tuple(levels),
        duration_s=len(levels) * step_s,
    )


def square(low_mbps: float, high_mbps: float, period_s: float = 20.0, duration_s: float | None = None) -> Trace:
    """Square wave: half a period at each level, the high one first; ``duration_s`` defaults to one period."""
    if period_s <= 0:
        raise ConfigError(f"square wave period must be > 0, got {period_s}")
    duration = period_s if duration_s is None else duration_s
    levels = [high_mbps if i % 2 == 0 else low_mbps for i in range(math.ceil(duration / (period_s / 2)))]
    w = step(levels, period_s / 2).window(0.0, float(duration))
    return replace(w, name=f"square-{low_mbps:g}-{high_mbps:g}-{period_s:g}s")


# --------------------------------------------------------------------------------------- shipped


def shipped() -> list[str]:
    """Names of the traces shipped in the package, e.g. ``hsdpa/bus`` (see its README for sources)."""
    return sorted(f"{p.parent.name}/{p.stem}" for p in paths.traces_dir().glob("*/*.log"))


def load_shipped(name: str) -> Trace:
    """Load a shipped trace by name (``hsdpa/bus``); the trace's name is that name."""
    names = shipped()
    if name not in names:
        raise ConfigError(f"unknown shipped trace {name!r}; expected one of {', '.join(names)}")
    return replace(load(paths.traces_dir() / f"{name}.log"), name=name)
