"""Link and load estimators: pure cores fed with measured samples and ``now_s``.

No sockets, no clocks, no sessions: the device runtime (or the rig, or a test) measures real transfers
and probes and feeds them in; the controller reads :class:`LinkEstimate` / :class:`LoadEstimate`.

Bandwidth estimator — *harmonic mean of the last N informative samples, with step detection, weighted
by recency*. Why this and not an EWMA:

- the harmonic mean of rates is the throughput of equal-sized transfers over the window, it always
  lies between the smallest and largest sample in the window, and it is dominated by the slow samples:
  a single burst (e.g. a transfer that fit in a socket buffer) cannot inflate it, and a drop shows in
  the very next estimate (one 1 Mbit/s sample among seven at 20 gives 6.4 Mbit/s);
- an EWMA reacts to a step at a fixed rate, so it is either jumpy under noise or slow after a step;
  the harmonic mean alone is slow *upwards* (it needs most of the window to forget a slow past).
  Hence step detection: when ``step_samples`` consecutive samples all lie beyond ``step_ratio`` of
  the estimate made from the samples before them, on the same side, the older samples are dropped.
  Under ±20% noise two samples differ by at most 1.5×, below the default ratio 2, so noise never
  triggers a reset; a 20 → 1 Mbit/s step (or 1 → 20) is fully reflected after two samples.
- a sample counts ``0.5 ** (age / recency_half_life_s)``, its age taken from the newest sample (so the
  estimate does not move between samples): a link's rate holds for about a second (the HSDPA traces
  change every second, by 1.2-2x: no step), and the rig's requests, 4 a second, showed the newest
  transfer to be the best forecast of the next. Unweighted, the window of 8 lagged two seconds behind
  (inception_v1's cloud@jpeg90 on the rig: 7 % median error of the latency; 3.4 % weighted at 0.15 s).
  0.15 s, not less: at 10 requests a second under +-20 % noise a shorter memory flaps the plan.

RTT estimator — the minimum of the last ``rtt_window`` samples (the propagation part, as TCP's and BBR's
min-RTT filters): queueing only ever adds to a sample (a probe sent while a request's bytes fill the link
waits behind them; on the rig at 4 requests/s the median of 5 probes ran 13-20 ms above the path's 80 ms,
which every plan that sends was priced with), and a spike (a retransmit, a GC pause) never lowers one. It
follows a persistent rise within ``rtt_window`` samples, a fall at once. Transfers are corrected with the
same minimum, so queueing in the RTT samples never makes the bandwidth look higher than it is.

A lone slow sample is news until the next sample: the estimate drops at once, but as the harmonic mean
of the window takes one sample (``confirm_slow``: one 0.6 Mbit/s sample among seven at 5 gives 2.6), not
as the newest sample (which recency weighting lets set the estimate alone); the next sample confirms it
(a step: the reset keeps both) or contradicts it. If the next sample is back within ``step_ratio`` of the
estimate before it, the slow one is dropped (at most one per ``forgive_slow_s``: a link whose transfers
are often slow keeps them), so one stalled transfer does not hold a low estimate for ``max_sample_age_s``
while the plan it caused sends nothing to contradict it.

Small transfers are RTT-dominated: their ``seconds`` minus the RTT is mostly noise. A sample counts
for bandwidth only if it has at least ``min_bytes`` and its transfer part (``seconds - rtt``) is at
least ``min_transfer_fraction`` of its duration; otherwise it is ignored (counted in ``ignored``),
except as a lower bound: the rate the bytes would have had in ``min_transfer_fraction`` of the time, if
above the estimate, is added as a sample (counted in ``floors``); else a too low estimate sizes probes
too small to ever correct it.

Confidence (in [0, 1]) = count × freshness × consistency: ``min(1, n / full_confidence_samples)``,
``0.5 ** (age_s / half_life_s)`` of the newest sample, and ``1 / (1 + cv)`` of the window (cv = the
coefficient of variation of the rates). The link's confidence is the smaller of bandwidth's and RTT's.

Directions differ (uplink vs downlink): keep one :class:`LinkEstimator` per direction if both matter.

- ``LinkEstimator(config: LinkConfig | None)``: ``.add_transfer(now_s, bytes, seconds) -> bool`` (seconds net of
  the cloud's compute; RTT-dominated samples are ignored, returns False, unless their lower bound lies above the
  estimate: then it is added, returns True), ``.add_rtt(now_s, rtt_ms)``, ``.add_rate(now_s, mbps)``,
  ``.estimate(now_s) -> LinkEstimate``, ``.needs_probe(now_s)``, ``.needs_bandwidth_probe(now_s)``,
  ``.probe_started(now_s)``, ``.suggest_probe_bytes(target_s=0.05) -> int``. One estimator per direction.
- ``LinkEstimate(bandwidth_mbps, rtt_ms, confidence)`` frozen; with no samples it carries the config's priors
  and confidence 0. Bandwidth: harmonic mean of the last ``window`` samples with step reset (2 samples beyond
  2x), each weighted by its recency (``recency_half_life_s``; None: equal weights); RTT: minimum of the
  last ``rtt_window``; confidence in [0, 1] halves per ``half_life_s`` of sample age.
- ``LoadEstimator(config: LoadConfig | None)``: ``.add_device(now_s, *, other_util, freq_mhz=None,
  profiled_freq_mhz=None)``, ``.add_head(now_s, *, measured_ms, profiled_ms)`` (device speed, a slow EWMA that
  does not fade), ``.add_cloud(now_s, *, queue_wait_s, profiled_tail_s, tail_s=None)``, ``.estimate(now_s) ->
  LoadEstimate(device_factor, cloud_factor, queue_ms=0)``: multipliers of profiled compute times (device =
  utilisation factor x speed; below 1 when faster than profiled); load fades back to 1 as the samples age. A
  load sample moves the estimate through the median of the last 3 samples, the older two aged like the estimate
  (a one-off spike moves nothing; stale samples do not outvote a fresh one after a gap). The runtime feeds
  ``add_cloud`` with ``queue_wait_s=0`` (as the simulator does): the queue is ``LoadEstimate.queue_ms``, filled
  in from the target cloud's ``QueueEstimator``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from splitrt.errors import ConfigError, PlanError

__all__ = [
    "LinkConfig",
    "LinkEstimate",
    "LinkEstimator",
    "LoadConfig",
    "LoadEstimate",
    "LoadEstimator",
]

_BITS_PER_MBIT = 1e6


@dataclass(frozen=True, kw_only=True)
class LinkEstimate:
    """What the controller plans with: bandwidth in Mbit/s, RTT in ms, confidence in [0, 1]."""

    bandwidth_mbps: float
    rtt_ms: float
    confidence: float


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    window: int = 8
    step_ratio: float = 2.0
    step_samples: int = 2
    rtt_window: int = 5
    min_bytes: int = 4096
    min_transfer_fraction: float = 0.2
    half_life_s: float = 10.0
    full_confidence_samples: int = 3
    # Bandwidth samples older than this are dropped (the newest two always stay): when only probes
    # feed the estimate (the plan keeps everything on the device, one probe a second) the window of 8
    # would otherwise hold a dip for many seconds after the link recovered. 3 s: about what a window
    # of 8 transfers spans at 3 requests/s; at 5 s the rig's adaptive stayed on the device 2-3 s after
    # a 3G dip had passed (two dip samples outweighed three healthy probes). None keeps them until the
    # window pushes them out.
    max_sample_age_s: float | None = 3.0
    # A sample counts half per this many seconds it is older than the newest (module doc); None: all alike.
    recency_half_life_s: float | None = 0.15
    # A lone slow sample that the next one contradicts (back within step_ratio of the estimate before
    # it) is dropped then: one stalled transfer on a busy host (453 ms among 190 ms ones on the rig)
    # pulled the estimate from 5 to 0.85 Mbit/s and held it there for max_sample_age_s, while the plan it
    # sent to the device carried no transfer to contradict it. At most one per this many seconds, so a
    # link whose transfers are often slow keeps them all. None: never dropped.
    forgive_slow_s: float | None = 3.0
    # Until the next sample confirms it, a lone slow sample counts as one sample of the window, not as the
    # newest (recency weighting would let it alone set the estimate): one stalled transfer (373 ms among
    # ~200 ms ones on the rig) took the estimate from 2.7 to 0.93 Mbit/s, adaptive left cloud@jpeg90 for
    # ``device`` (262 ms) and stayed 10 requests. A real step is the next sample's too: the step reset then
    # takes it in full, one request later. False: the newest sample's weight, as any other.
    confirm_slow: bool = True
    # Probe when bandwidth or RTT has no sample this recent. 0.5 s: after a dip sends the plan to the
    # device, only probes tell when the link is back (bench/bench_sim.py over the HSDPA traces: adaptive
    # vs the best fixed strategy worst 1.017 at 0.5 s, 1.025 at 1 s). A bandwidth probe takes about two
    # RTTs of the link, so an idle link carries probes ~30 % of the time at 80 ms RTT.
    probe_after_s: float = 0.5
    min_probe_interval_s: float = 0.5
    prior_bandwidth_mbps: float = 10.0
    prior_rtt_ms: float = 20.0

    def __post_init__(self) -> None:
        checks = [
            ("window", self.window >= 1, self.window),
            ("step_ratio", self.step_ratio > 1.0, self.step_ratio),
            ("step_samples", 1 <= self.step_samples <= self.window, self.step_samples),
            ("rtt_window", self.rtt_window >= 1, self.rtt_window),
            ("min_bytes", self.min_bytes >= 0, self.min_bytes),
            ("min_transfer_fraction", 0.0 <= self.min_transfer_fraction < 1.0, self.min_transfer_fraction),
            ("half_life_s", self.half_life_s > 0, self.half_life_s),
            ("full_confidence_samples", self.full_confidence_samples >= 1, self.full_confidence_samples),
            ("probe_after_s", self.probe_after_s > 0, self.probe_after_s),
            ("max_sample_age_s", self.max_sample_age_s is None or self.max_sample_age_s > 0, self.max_sample_age_s),
            (
                "recency_half_life_s",
                self.recency_half_life_s is None or self.recency_half_life_s > 0,
                self.recency_half_life_s,
            ),
            ("min_probe_interval_s", self.min_probe_interval_s >= 0, self.min_probe_interval_s),
            ("prior_bandwidth_mbps", self.prior_bandwidth_mbps > 0, self.prior_bandwidth_mbps),
            ("prior_rtt_ms", self.prior_rtt_ms >= 0, self.prior_rtt_ms),
        ]
        for name, ok, value in checks:
            if not ok:
                raise ConfigError(f"LinkConfig.{name}: expected a valid value, got {value!r}")


@dataclass(frozen=True)
class _Rate:
    t_s: float
    mbps: float
    raw: tuple[int, float] | None = None  # (bytes, seconds) of a transfer timed before any RTT sample


def _finite(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise PlanError(f"{name}: expected a finite number, got {value!r}")
    return v


def _harmonic(rates: list[float]) -> float:
    return len(rates) / sum(1.0 / r for r in rates)


def _freshness(age_s: float, half_life_s: float) -> float:
    return float(0.5 ** (max(0.0, age_s) / half_life_s))


class LinkEstimator:
    """Bandwidth + RTT of one link from real transfers and probes. Pure: every call takes ``now_s``.

    >>> est = LinkEstimator()
    >>> est.add_rtt(0.0, 10.0)
    >>> est.add_transfer(0.1, 1_250_000, 1.01)   # 10 Mbit in 1 s + 10 ms RTT
    True
    >>> round(est.estimate(0.1).bandwidth_mbps, 3)
    10.0
    """

    def __init__(self, config: LinkConfig | None = None) -> None:
        self.config = config or LinkConfig()
        self._rates: deque[_Rate] = deque(maxlen=self.config.window)
        self._pending = 0  # trailing samples beyond step_ratio of the estimate before them
        self._pending_side = 0
        self._rtts: deque[tuple[float, float]] = deque(maxlen=self.config.rtt_window)
        self._last_probe_s: float | None = None
        self.ignored = 0
        self.floors = 0  # RTT-dominated transfers counted as a lower bound (see add_transfer)
        self.steps = 0
        self.forgiven = 0  # lone slow samples dropped (LinkConfig.forgive_slow_s)
        self._forgiven_s: float | None = None

    # -- feeding ---------------------------------------------------------------------------------
    def add_rtt(self, now_s: float, rtt_ms: float) -> None:
        """An RTT sample in ms (a Probe with no payload, or a transfer too small to carry bytes)."""
        rtt = _finite("rtt_ms", rtt_ms)
        if rtt < 0:
            raise PlanError(f"rtt_ms: expected >= 0, got {rtt_ms!r}")
        first = not self._rtts
        self._rtts.append((_finite("now_s", now_s), rtt))
        if first and any(r.raw for r in self._rates):
            # Transfers timed before any RTT sample were netted of nothing (a 150 KB transfer over an
            # 80 ms link read 6.6 instead of 11.5 Mbit/s); net them of this RTT now.
            renetted = [self._net(r) for r in self._rates]
            self._rates.clear()
            self._rates.extend(r for r in renetted if r is not None)
            self._pending, self._pending_side = 0, 0

    def _net(self, r: _Rate) -> _Rate | None:
        if r.raw is None:
            return r
        nbytes, secs = r.raw
        transfer_s = secs - self._rtt_floor_ms() / 1000.0
        if transfer_s <= 0 or transfer_s < self.config.min_transfer_fraction * secs:
            return None
        return _Rate(r.t_s, nbytes * 8 / _BITS_PER_MBIT / transfer_s)

    def add_transfer(self, now_s: float, bytes: int, seconds: float) -> bool:
        """A real transfer of ``bytes`` that took ``seconds`` (the cloud's compute time already
        subtracted by the caller). Returns True when it counted for bandwidth, False when it was too
        small to tell (RTT-dominated) and was ignored."""
        now = _finite("now_s", now_s)
        secs = _finite("seconds", seconds)
        if bytes < 0 or secs < 0:
            raise PlanError(f"transfer: expected bytes >= 0 and seconds >= 0, got {bytes!r}, {seconds!r}")
        rtt_s = self._rtt_floor_ms() / 1000.0
        transfer_s = secs - rtt_s
        if bytes < self.config.min_bytes or bytes == 0:
            self.ignored += 1
            return False
        if transfer_s <= 0 or transfer_s < self.config.min_transfer_fraction * secs:
            # RTT-dominated: the rate cannot be told, but it has a lower bound. Below that the estimate
            # is wrong, and would stay wrong: probes are sized from the estimate, so on a link 10x
            # faster than estimated every probe is RTT-dominated and ignored (the simulator kept a
            # 2 Mbit/s estimate for 100 s on a 20-25 Mbit/s link). The bound lifts it until probes
            # measure. The bytes took at most ``min_transfer_fraction`` of the time (the RTT floor is
            # the least RTT seen, so the real RTT was no less); if the RTT looks longer than the whole
            # transfer (it has just dropped), only the whole time bounds it.
            cap_s = secs if transfer_s <= 0 else self.config.min_transfer_fraction * secs
            floor = bytes * 8 / _BITS_PER_MBIT / cap_s if cap_s > 0 else math.inf
            if self._rtts and math.isfinite(floor) and floor > self.bandwidth_mbps():
                self._add_rate(now, floor)
                self.floors += 1
                return True
            self.ignored += 1
            return False
        self._add_rate(now, bytes * 8 / _BITS_PER_MBIT / transfer_s, raw=None if self._rtts else (bytes, secs))
        return True

    def add_rate(self, now_s: float, mbps: float) -> None:
        """A bandwidth sample already net of RTT (e.g. from a probe that timed its payload alone)."""
        rate = _finite("mbps", mbps)
        if rate <= 0:
            raise PlanError(f"mbps: expected > 0, got {mbps!r}")
        self._add_rate(_finite("now_s", now_s), rate)

    def _add_rate(self, now_s: float, mbps: float, raw: tuple[int, float] | None = None) -> None:
        cfg = self.config
        settled = list(self._rates)[: len(self._rates) - self._pending]
        side = 0
        if settled:
            before = _harmonic([r.mbps for r in settled])
            if mbps > before * cfg.step_ratio:
                side = 1
            elif mbps < before / cfg.step_ratio:
                side = -1
        if side == 0 and self._pending == 1 and self._pending_side == -1 and self._forgivable(now_s):
            self._rates.pop()  # the lone slow sample (the newest): this one says the link is as before
            self._forgiven_s = now_s
            self.forgiven += 1
        if side != 0 and side == self._pending_side:
            self._pending += 1
        elif side != 0:
            self._pending, self._pending_side = 1, side
        else:
            self._pending, self._pending_side = 0, 0
        self._rates.append(_Rate(now_s, mbps, raw))
        if self._pending >= cfg.step_samples:
            keep = list(self._rates)[-self._pending :]
            self._rates.clear()
            self._rates.extend(keep)
            self._pending, self._pending_side = 0, 0
            self.steps += 1
        if cfg.max_sample_age_s is not None:
            while len(self._rates) > 2 and now_s - self._rates[0].t_s > cfg.max_sample_age_s:
                self._rates.popleft()
        # the window may have pushed settled samples out: pending can never exceed the window
        self._pending = min(self._pending, len(self._rates))

    def _forgivable(self, now_s: float) -> bool:
        window = self.config.forgive_slow_s
        return window is not None and (self._forgiven_s is None or now_s - self._forgiven_s >= window)

    def probe_started(self, now_s: float) -> None:
        """Tell the estimator a probe went out, so :meth:`needs_probe` does not ask again at once."""
        self._last_probe_s = _finite("now_s", now_s)

    # -- reading ---------------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        """Bandwidth samples currently in the window."""
        return len(self._rates)

    def _rtt_floor_ms(self) -> float:
        return min(r for _, r in self._rtts) if self._rtts else 0.0

    def bandwidth_mbps(self) -> float:
        if not self._rates:
            return self.config.prior_bandwidth_mbps
        rates = list(self._rates)
        if self.config.confirm_slow and self._pending == 1 and self._pending_side == -1 and len(rates) > 1:
            # a lone slow sample, unconfirmed: one of the window's n samples (the harmonic mean's weight),
            # beside the estimate the others make (LinkConfig.confirm_slow)
            n = len(rates)
            return n / ((n - 1) / self._weighted(rates[:-1]) + 1 / rates[-1].mbps)
        return self._weighted(rates)

    def _weighted(self, rates: list[_Rate]) -> float:
        """The harmonic mean of ``rates``, each weighted by its recency (from the newest of them)."""
        h = self.config.recency_half_life_s
        if h is None:
            return _harmonic([r.mbps for r in rates])
        newest = rates[-1].t_s
        weights = [_freshness(newest - r.t_s, h) for r in rates]
        return sum(weights) / sum(w / r.mbps for w, r in zip(weights, rates, strict=True))

    def rtt_ms(self) -> float:
        return self._rtt_floor_ms() if self._rtts else self.config.prior_rtt_ms

    def bandwidth_confidence(self, now_s: float) -> float:
        cfg = self.config
        if not self._rates:
            return 0.0
        rates = [r.mbps for r in self._rates]
        count = min(1.0, len(rates) / cfg.full_confidence_samples)
        fresh = _freshness(now_s - self._rates[-1].t_s, cfg.half_life_s)
        mean = sum(rates) / len(rates)
        var = sum((r - mean) ** 2 for r in rates) / len(rates)
        cv = math.sqrt(var) / mean
        return max(0.0, min(1.0, count * fresh / (1.0 + cv)))

    def rtt_confidence(self, now_s: float) -> float:
        cfg = self.config
        if not self._rtts:
            return 0.0
        count = min(1.0, len(self._rtts) / cfg.full_confidence_samples)
        return max(0.0, min(1.0, count * _freshness(now_s - self._rtts[-1][0], cfg.half_life_s)))

    def estimate(self, now_s: float) -> LinkEstimate:
        now = _finite("now_s", now_s)
        return LinkEstimate(
            bandwidth_mbps=self.bandwidth_mbps(),
            rtt_ms=self.rtt_ms(),
            confidence=min(self.bandwidth_confidence(now), self.rtt_confidence(now)),
        )

    def last_sample_s(self) -> float | None:
        times = [self._rates[-1].t_s] if self._rates else []
        times += [self._rtts[-1][0]] if self._rtts else []
        return max(times) if times else None

    def needs_probe(self, now_s: float) -> bool:
        """True when bandwidth or RTT has no sample newer than ``probe_after_s`` and no probe went out
        within ``min_probe_interval_s``."""
        cfg = self.config
        if self._last_probe_s is not None and now_s - self._last_probe_s < cfg.min_probe_interval_s:
            return False
        if not self._rates or not self._rtts:
            return True
        newest = min(self._rates[-1].t_s, self._rtts[-1][0])
        return now_s - newest >= cfg.probe_after_s

    def rtt_age_s(self, now_s: float) -> float | None:
        """Seconds since the newest RTT sample (None: none yet)."""
        return now_s - self._rtts[-1][0] if self._rtts else None

    def needs_bandwidth_probe(self, now_s: float) -> bool:
        """True when bandwidth has no sample newer than ``probe_after_s`` (transfers keep it fresh;
        an RTT-only probe is enough otherwise)."""
        return not self._rates or now_s - self._rates[-1].t_s >= self.config.probe_after_s

    def suggest_probe_bytes(self, target_s: float = 0.05, lo: int = 16 * 1024, hi: int = 1 << 20) -> int:
        """Payload for a probe that takes about ``target_s`` at the current estimate (clipped to
        [lo, hi]) — big enough not to be RTT-dominated, small enough to be cheap."""
        want = self.bandwidth_mbps() * _BITS_PER_MBIT / 8 * target_s
        return int(max(lo, min(hi, want)))


# ---------------------------------------------------------------------------------------------------
# Load


@dataclass(frozen=True, kw_only=True)
class LoadEstimate:
    """Multipliers of profiled compute costs: ``device_factor`` for the head (and local fallback),
    ``cloud_factor`` for the tail. Below 1 when a side runs faster than profiled. ``queue_ms``: the
    expected wait for a worker at the cloud (``plan.queueing``), its own plan term, not in the factor."""

    device_factor: float
    cloud_factor: float
    queue_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LoadConfig:
    alpha: float = 0.5
    max_util: float = 0.9
    half_life_s: float = 10.0
    min_factor: float = 0.5  # a cloud measured faster than its profile counts (down to 2x faster)
    max_factor: float = 50.0
    # Device speed: measured head time / (profiled time x the utilisation factor), from heads of at
    # least min_profiled_ms; a slow EWMA that never fades, because a profile's error persists (a board
    # that runs warmer than when it was profiled, a per-model error of the speed factor).
    speed_alpha: float = 0.2
    min_speed: float = 0.5
    max_speed: float = 2.0
    min_profiled_ms: float = 20.0
    # A head timed while the utilisation estimate still lags its latest sample by more than this fraction
    # (a burst starting or ending: the median and the EWMA take ~3 samples) is not a speed sample: the
    # burst's slow-down would be learnt as the board's, for good (squeezenet, a 2x burst: speed 1.36, and
    # 20 s of splits that cost 115 ms against the device's 99, in the simulator).
    settle_fraction: float = 0.15

    def __post_init__(self) -> None:
        checks = [
            ("alpha", 0.0 < self.alpha <= 1.0, self.alpha),
            ("max_util", 0.0 <= self.max_util < 1.0, self.max_util),
            ("half_life_s", self.half_life_s > 0, self.half_life_s),
            ("min_factor", 0.0 < self.min_factor <= 1.0, self.min_factor),
            ("max_factor", self.max_factor >= 1.0, self.max_factor),
            ("speed_alpha", 0.0 < self.speed_alpha <= 1.0, self.speed_alpha),
            ("min_speed", 0.0 < self.min_speed <= 1.0, self.min_speed),
            ("max_speed", self.max_speed >= 1.0, self.max_speed),
            ("min_profiled_ms", self.min_profiled_ms >= 0.0, self.min_profiled_ms),
            ("settle_fraction", self.settle_fraction > 0.0, self.settle_fraction),
        ]
        for name, ok, value in checks:
            if not ok:
                raise ConfigError(f"LoadConfig.{name}: expected a valid value, got {value!r}")


def _median3(recent: list[float], x: float, pad: float) -> tuple[list[float], float]:
    """One-off spikes (a cold session build, a GC pause) are not load: the median of the last 3 samples
    (missing ones count as ``pad``), so only what is seen twice in a row moves an estimate."""
    recent = [*recent, x][-3:]
    return recent, sorted([pad] * (3 - len(recent)) + recent)[1]


class _Ewma:
    """EWMA of a factor whose distance from 1 fades with age (stale load news means nominal load)."""

    def __init__(self, cfg: LoadConfig) -> None:
        self.cfg = cfg
        self.value: float | None = None
        self.t_s = 0.0
        self._recent: list[tuple[float, float]] = []  # (time, factor) of the last samples

    def add(self, now_s: float, x: float) -> None:
        x = min(self.cfg.max_factor, max(self.cfg.min_factor, x))
        # Past samples vote in the median aged as the estimate is: after the plan has left the cloud
        # for a few seconds, two samples of a spike must not outvote the first fresh one (the cloud
        # estimate went *up* on a fast tail, 2.0 -> 2.45, and sent the next request back to the device).
        aged = [1.0 + (v - 1.0) * _freshness(now_s - t, self.cfg.half_life_s) for t, v in self._recent]
        _, med = _median3(aged, x, 1.0)
        self._recent = [*self._recent, (now_s, x)][-2:]
        prior = self.get(now_s)
        self.value = med if self.value is None else prior + self.cfg.alpha * (med - prior)
        self.t_s = now_s

    def get(self, now_s: float) -> float:
        if self.value is None:
            return 1.0
        fade = _freshness(now_s - self.t_s, self.cfg.half_life_s)
        return 1.0 + (self.value - 1.0) * fade

    def lag(self, now_s: float) -> float:
        """How far the estimate is from its latest sample (both aged alike), relative: 0 when it is not
        catching up with a change (or has no sample)."""
        if not self._recent:
            return 0.0
        fade = _freshness(now_s - self.t_s, self.cfg.half_life_s)
        latest = 1.0 + (self._recent[-1][1] - 1.0) * fade
        return abs(self.get(now_s) / latest - 1.0)

    def settled(self, now_s: float, fraction: float) -> bool:
        """Whether the estimate is within ``fraction`` of its latest sample: not still catching up."""
        return self.lag(now_s) <= fraction


class LoadEstimator:
    """Device and cloud load factors from samples. Pure: every call takes ``now_s``.

    Device: ``other_util`` is the CPU utilisation in [0, 1] of *other* processes (the caller subtracts
    splitrt's own, e.g. psutil system percent minus the process's percent / ncpu); our compute gets the
    remaining share, so costs scale by ``1 / (1 - util)`` (util capped at ``max_util``), and by
    ``profiled_freq / freq`` when the CPU is throttled below the frequency the profile was measured at.
    Times the device's measured speed (``add_head``): what the heads actually take over what the
    profile says, net of that utilisation, so a profile that is off by 15 % (the rig measured its
    per-model calibrations 0.86-1.30 x off) is corrected from the requests themselves.

    Cloud: the server reports the queue wait of a request; the device measures the tail time (the
    server's compute time of the request) and knows the profiled tail time; the factor is
    ``(queue_wait + measured_tail) / profiled_tail``. A status with no measured tail (e.g. from a
    Probe or the discovery TXT) uses the profiled time for the tail part.
    """

    def __init__(self, config: LoadConfig | None = None) -> None:
        self.config = config or LoadConfig()
        self._device = _Ewma(self.config)
        self._cloud = _Ewma(self.config)
        self.device_speed = 1.0  # measured / profiled head time, net of utilisation (see add_head)
        self._speed_recent: list[float] = []

    def add_device(
        self,
        now_s: float,
        *,
        other_util: float,
        freq_mhz: float | None = None,
        profiled_freq_mhz: float | None = None,
    ) -> float:
        """Feed one device sample; returns the instantaneous factor it implies."""
        util = _finite("other_util", other_util)
        if not 0.0 <= util <= 1.0:
            raise PlanError(f"other_util: expected a fraction in [0, 1], got {other_util!r}")
        factor = 1.0 / (1.0 - min(util, self.config.max_util))
        if freq_mhz and profiled_freq_mhz and freq_mhz > 0 and profiled_freq_mhz > 0:
            factor *= max(1.0, profiled_freq_mhz / freq_mhz)
        self._device.add(_finite("now_s", now_s), factor)
        return factor

    def add_head(self, now_s: float, *, measured_ms: float, profiled_ms: float) -> float | None:
        """Feed the measured time of a head (the whole model on the device plan) and its profiled time;
        returns the speed sample it implies, or None for heads too short to tell (< min_profiled_ms) and
        heads timed while the utilisation estimate still lags its latest sample (``settle_fraction``).
        The utilisation factor at ``now_s`` is divided out: a burst is load, not the board's speed."""
        cfg = self.config
        measured = _finite("measured_ms", measured_ms)
        profiled = _finite("profiled_ms", profiled_ms)
        if profiled < max(cfg.min_profiled_ms, 1e-9) or measured <= 0:
            return None
        if not self._device.settled(_finite("now_s", now_s), cfg.settle_fraction):
            return None
        x = min(cfg.max_speed, max(cfg.min_speed, measured / (profiled * self._device.get(now_s))))
        self._speed_recent, med = _median3(self._speed_recent, x, self.device_speed)
        self.device_speed += cfg.speed_alpha * (med - self.device_speed)
        return x

    def device_lag(self, now_s: float) -> float:
        """How far the device's load estimate still lags its latest sample (relative, 0: settled): a request
        timed while it lags was priced at a load it did not meet (``plan.correction``'s ``max_load_lag``)."""
        return self._device.lag(_finite("now_s", now_s))

    def add_cloud(
        self, now_s: float, *, queue_wait_s: float, profiled_tail_s: float, tail_s: float | None = None
    ) -> float:
        """Feed one cloud observation; returns the instantaneous factor it implies."""
        wait = _finite("queue_wait_s", queue_wait_s)
        prof = _finite("profiled_tail_s", profiled_tail_s)
        if wait < 0 or prof <= 0:
            raise PlanError(f"cloud sample: expected queue_wait_s >= 0 and profiled_tail_s > 0, got {wait}, {prof}")
        tail = prof if tail_s is None else _finite("tail_s", tail_s)
        factor = (wait + max(0.0, tail)) / prof
        self._cloud.add(_finite("now_s", now_s), factor)
        return factor

    def estimate(self, now_s: float) -> LoadEstimate:
        return LoadEstimate(
            device_factor=self._device.get(now_s) * self.device_speed, cloud_factor=self._cloud.get(now_s)
        )
