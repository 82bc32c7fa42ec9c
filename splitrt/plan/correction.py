"""A cost model that corrects itself (pure, sans-IO): per plan, what requests cost beyond their price.

The estimators (``plan.netmon``) learn from every request what the link and the two sides' loads are: its head
feeds the device's, its RPC the link's and the server's. What none of them sees is the rest of what the device
pays: encoding the crossing tensors, building and parsing the messages, the runtime's own work around a call,
and anything else the table does not price for one plan (a codec path slower or faster on this board than
profiled: a cgroup quota lets a 0.6 ms burst run at full speed where the profile's x17.5 says 10 ms). The cost
table prices part of it (the ``encode_ms`` and ``call_ms`` terms); each request compares that price with what
it measured beyond its head and its RPC, and ``Corrections`` keeps, per plan key, an exponentially weighted
mean of the difference in ms. (Correcting everything beyond the head instead, estimators' lag included, was
tried: on the rig a bandwidth dip priced the cloud plans up on top of the link estimate, adaptive ran
``device`` 7-8 times where the routers did not, and the grid's adaptive / best router went to 1.17-1.20 in two
cells.) The controller adds the plan's ``offset_ms(plan, now_s)`` to its price before it compares plans (and
shows it as the decision's ``correction_ms`` term), so a plan that costs more than it was priced is dropped
within a few requests (``weight`` 0.5: 50, 75, 88 % of the excess after one, two, three requests, each step
bounded so that one outlier cannot price a plan out). An outlier (a step beyond the bound, from a request whose
own excess is beyond it too) moves the mean by ``min_step_ms`` until the plan's next request confirms it: on the
rig one slow encode in a device-load burst (82 ms where 2 were priced) priced cloud@jpeg50 30 ms up, adaptive
left it for cloud@jpeg75 (10 ms dearer, inside the hysteresis margin once there) and held that for the rest of
the cell; every strategy did so in 2-3 of 16 cells. A request timed while the device's load estimate still lags
its latest sample by more than ``max_load_lag`` (a burst starting or ending: ``LoadEstimator.device_lag``,
``Observation.load_lag``) is no evidence at all: it was priced at a load it did not meet, which any plan would
have met (two slow requests at a burst's start confirmed each other, priced cloud@jpeg50 ~40 ms up and the rig
held cloud@jpeg75 for a cell, 1.10x the best router).

What a plan sends is priced with the profile's bytes: for an image codec at the input, the mean over the
profile's photographs (at jpeg90 9-30 KB for a 224 x 224 photo, 18 KB on average; the rig's photograph makes
16.4 KB). The frames a camera sends are alike from one to the next, so each request that uploaded tells
what the plan's next frame will weigh: ``Corrections`` keeps, per plan, the ratio of the bytes sent to the
bytes priced (the first request's, then half of each new one's; no decay: a frame does not grow stale the
way a cost does), and the controller prices the upload with it (``bytes_ratio``).

A plan whose uploads are too small to tell the link's rate (RTT-dominated) lets the bandwidth estimate go
stale, so the device probes it: a probe of twice the RTT at the link's rate, which the plan's next request
may queue behind (12.6 Mbit/s, 80 ms: some requests waited ~100-160 ms and mid, priced ~220 ms with its
correction, cost 262 ms). That wait is the plan's: no estimator prices it, and the excess's step bound
treats each long wait as an outlier. ``Corrections`` keeps, per plan, the mean wait its requests met
(``Observation.probe_wait_ms``, ``WAIT_WEIGHT`` per request, each at most the plan's price), and
``offset_ms`` adds it to the plan's mean excess. The link's sample leaves the wait out
(``ReplyObservation.probe_wait_s``): it timed the probe, not the link (a 5 KB request queued 150 ms behind one
read 0.4 Mbit/s on a 3 Mbit/s link and adaptive fled to a device plan 1.3x its price). The price: a plan whose
uploads are RTT-dominated keeps bandwidth stale and draws more probes (fixed cloud plans in 80 drawn
cases: geometric mean +3 %, worst 1.8x; adaptive -0.5 %, its regret's worst 1.045 -> 1.014). Only such a
plan is charged: a plan whose upload is a bandwidth sample keeps the estimate fresh itself, and
``of_request`` leaves out the wait its request met (``draws_probes``; a probe that opened a rig turn cost
cloud@jpeg90 37 ms and adaptive fled to cloud@jpeg95 for 11 requests). Nor is a plan charged the probe an
idle link drew: a request that started more than ``idle_gap_s`` after the previous one ended (or the first)
met a probe any plan would have met (a rig cell's first request waits for the link's first probe: 150 ms
would price its plan 30 ms up before any request of its own, more than cloud@jpeg50 is cheaper than jpeg75).

The quality variants of one image codec at one cut (``cloud@jpeg50``, ``cloud@jpeg75``, ...) share that mean
(``evidence_key``): they run the same encoder on the same tensor, so what their requests cost beyond the price
is the board's, not the quality's, and a stall the plan in use met would have met the others. Kept apart, a
device-load burst's slow encodes (22 and 62 ms where 3 were priced, a demo run at host load 4-5) priced
cloud@jpeg50 up alone, and route, route-codec and adaptive all left it for cloud@jpeg75 (~10 ms dearer, held
inside the hysteresis margin for 16-28 of 48 requests). What each sends (``bytes_ratio``) and the probe waits
its uploads draw stay per plan: they do depend on the quality.

Some of what a request meets is the board's, not its plan's: on a busy board a quota period (26-80 ms) lands
on about one remote call in four, whatever the plan. Kept per plan, two such outliers in a row priced the plan
in use ~20 ms up, the plans without evidence looked cheaper by as much, and adaptive ran through splits the
routers never tried (1.13-1.19x the best router in the rig's busy-board cells). So an outlier's step (one beyond
the bound, ``clipped``) is split: ``shared_fraction`` of it goes to a part every plan that calls a server
carries (``shared_ms``), the rest to the plan's own mean; a step within the bound is the plan's own. The
shared part goes stale faster (``shared_half_life_s``), so an excess that persists on one plan ends up its
own: a plan 1.5x its price is still dropped, after six requests where it took four (the simulated grid's
property test), and in simulation with a quarter of the calls stalled adaptive holds the plan the routers
hold (``tests/plan/test_correction.py``). ``device`` makes no call and carries none of it.

Evidence goes stale: the mean decays toward 0 (the model's own price) with ``half_life_s`` since the
plan's last request. A dropped plan is thus tried again once the evidence against it is old enough that
its decayed price beats the plan in use, and one request there renews the evidence: a plan that stays
dearer than priced costs one request every few half-lives (the exploration of a decaying correction),
and a plan whose cost came back is taken back.

Replay: the observations are the state. Each one is fed in order (``observe`` returns its index), and a
decision records ``seen`` (how many had been fed when it was made); ``plan.replay.replay`` rebuilds
the state by feeding the logged observations (``Observation.to_json``, in the log line of the request
that made them) up to each decision's ``seen``.

- ``CorrectionConfig(half_life_s=10, weight=0.5, max_step_fraction=0.15, min_step_ms=5, max_offset_ms=10000,
  max_load_lag=0.3, idle_gap_s=0.5, shared_fraction=0.75, shared_half_life_s=2, enabled=True)``: one request moves a
  plan's mean by ``weight`` x its excess, at most
  ``max_step_fraction`` of the smaller of the plan's price (``Observation.price_ms``) and what the request took,
  or ``min_step_ms``; a step beyond that bound moves it by ``min_step_ms`` unless the plan's previous step was
  beyond it too, or the request's own excess is within the bound (it cost its price: the plan's news, not an
  outlier); a request whose ``load_lag`` exceeds ``max_load_lag`` does not move it; a request that
  started ``idle_gap_s`` after the previous one ended does not move the plan's mean wait; ``shared_fraction`` of a
  step beyond the bound goes to the part every calling plan carries, which halves in ``shared_half_life_s``.
- ``Observation(plan, predicted_ms, measured_ms, t_s, price_ms, sent_bytes=0, priced_bytes=0,
  probe_wait_ms=0, load_lag=0)``: predicted, the price of what no estimator learns (the decision's encode + call terms);
  measured, what the request took beyond its head and its RPC (on ``device``: beyond its run); ``price_ms``
  the plan's whole price (bounds a step); ``sent_bytes`` what it uploaded on its first hop and
  ``priced_bytes`` what the table priced there (0: not known, nothing learnt); ``probe_wait_ms`` how long
  of its RPC it queued behind the device's own bandwidth probe; ``load_lag`` the device load estimate's lag
  when it ended. ``Observation.of_request(plan=, priced_ms=, total_ms=, head_ms=, round_trip_ms=, t_s=,
  price_ms=, sent_bytes=0, priced_bytes=0, probe_wait_ms=0, upload_ms=None, rtt_ms=0, load_lag=0)`` (the
  wait left out when ``draws_probes(upload_ms, rtt_ms)`` is False) makes one from a request's figures.
  ``.to_json()`` / ``Observation.from_json(dict)``.
- ``evidence_key(plan) -> str``: the key a plan's excess is kept under (its image codecs without quality).
- ``Corrections(config)``: ``.observe(obs) -> index``, ``.offset_ms(plan, now_s) -> ms`` (its own mean, its wait
  and, unless ``device``, ``.shared_ms(now_s)``), ``.offsets(now_s, codecs)
  -> {plan: ms}`` (the plans with evidence, a shared key's over the image codecs among ``codecs``),
  ``.bytes_ratio(plan) -> float`` (1: no evidence), ``.bytes_ms(table, plan, bandwidth_mbps)`` (that ratio's upload
  beyond the price), ``.bytes_plans()``, ``.seen``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from splitrt.errors import ConfigError, PlanError
from splitrt.plan.costmodel import DEVICE_CUT, IMAGE_CODECS, MS_PER_BYTE_AT_1MBPS, CostTable
from splitrt.plan.netmon import LinkConfig
from splitrt.plan.path import parse_plan

__all__ = ["CorrectionConfig", "Corrections", "Observation", "draws_probes", "evidence_key"]

#: A request's bytes over the priced ones, clipped (a frame 20x its price is a different input, not a
#: frame of this camera's) ...
BYTES_RATIO_RANGE = (0.05, 20.0)
#: ... and how far one request moves a plan's ratio toward its own.
BYTES_WEIGHT = 0.5
#: How far one request moves a plan's mean wait behind the device's own probes toward its own: about one
#: request in four meets a probe (a probe every 0.5-1 s), so the mean is over about five. Not clipped by
#: ``max_step_fraction`` (a wait is bounded by the probe the device chose to send: no stall of the host's),
#: only by the plan's price.
WAIT_WEIGHT = 0.2


#: An image codec's quality variants (``transport.imagecodec``'s ``jpegQ`` / ``webpQ``), and a key's shared
#: image codec (``@jpeg``: ``evidence_key``'s result).
_FORMATS = "|".join(IMAGE_CODECS)
_QUALITY = re.compile(rf"@({_FORMATS})\d{{1,3}}(?=>|$)")
_SHARED = re.compile(rf"@({_FORMATS})(?=>|$)")


def evidence_key(plan: str) -> str:
    """The key ``plan``'s excess is kept under: the plan with each image codec's quality dropped
    (``cloud@jpeg75`` -> ``cloud@jpeg``; any other plan is its own key)."""
    return _QUALITY.sub(r"@\1", plan)


@dataclass(frozen=True, kw_only=True)
class CorrectionConfig:
    # The evidence of a plan's requests halves toward the model's own price in this long since the last.
    half_life_s: float = 10.0
    # How much one request moves the plan's mean (0.5: half of the excess it measured).
    weight: float = 0.5
    # One outlier (a stall, a swapped-out process, a probe on the wire) must not price a plan out: one
    # request moves the mean by at most this share of the plan's price (or of what it took, if less), or
    # min_step_ms (a 1.5x plan still
    # takes 3-4 requests to learn; one request of +800 ms on a 220 ms plan moves it 33 ms, not 400).
    max_step_fraction: float = 0.15
    min_step_ms: float = 5.0
    max_offset_ms: float = 10_000.0
    # A request timed while the device's load estimate lags its latest sample by more than this (relative:
    # a burst's start or end, which the estimate follows in ~3 samples) tells nothing of the plan.
    max_load_lag: float = 0.3
    # A request that started this long after the previous one ended met the probes an idle link draws (the
    # link estimate is stale after ``LinkConfig.probe_after_s``): its wait is not its plan's.
    idle_gap_s: float = 0.5
    # Of an outlier's step (beyond the bound), the share every plan that calls a server learns with it
    # (``shared_ms``): what the board adds around any call is not one plan's. The rest, and every step within
    # the bound, is the plan's own.
    shared_fraction: float = 0.75
    # The shared part halves in this long since the last outlier: an excess that persists on one plan ends up
    # its own (steps within the bound), so the plan is still dropped against the others.
    shared_half_life_s: float = 2.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if not (self.half_life_s > 0 and math.isfinite(self.half_life_s)):
            raise ConfigError(f"half_life_s: expected a finite number > 0, got {self.half_life_s!r}")
        if not 0.0 < self.weight <= 1.0:
            raise ConfigError(f"weight: expected (0, 1], got {self.weight!r}")
        if not (self.max_step_fraction > 0 and self.min_step_ms > 0 and math.isfinite(self.min_step_ms)):
            raise ConfigError(
                f"expected max_step_fraction > 0 and min_step_ms > 0, got {self.max_step_fraction!r} and "
                f"{self.min_step_ms!r}"
            )
        if not (self.max_offset_ms > 0 and math.isfinite(self.max_offset_ms)):
            raise ConfigError(f"max_offset_ms: expected a finite number > 0, got {self.max_offset_ms!r}")
        if not self.max_load_lag > 0:
            raise ConfigError(f"max_load_lag: expected a number > 0, got {self.max_load_lag!r}")
        if not self.idle_gap_s >= 0:
            raise ConfigError(f"idle_gap_s: expected a number >= 0, got {self.idle_gap_s!r}")
        if not 0.0 <= self.shared_fraction < 1.0:
            raise ConfigError(f"shared_fraction: expected [0, 1), got {self.shared_fraction!r}")
        if not (self.shared_half_life_s > 0 and math.isfinite(self.shared_half_life_s)):
            raise ConfigError(f"shared_half_life_s: expected a finite number > 0, got {self.shared_half_life_s!r}")


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One request: the plan it ran, the price of what no estimator learns (encode + call) and what the
    request took beyond its head and its RPC."""

    plan: str
    predicted_ms: float
    measured_ms: float
    t_s: float
    price_ms: float = 0.0  # the plan's whole price (its terms, before correction): bounds one request's step
    sent_bytes: float = 0.0  # what the request uploaded on its first hop (0: not known)
    priced_bytes: float = 0.0  # what the table priced there (0: not known)
    probe_wait_ms: float = 0.0  # of its RPC, the wait behind the device's own bandwidth probe on the wire
    load_lag: float = 0.0  # how far the device's load estimate lagged its latest sample when it ended

    def __post_init__(self) -> None:
        for name in ("predicted_ms", "measured_ms", "t_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or (name == "predicted_ms" and value < 0):
                raise PlanError(f"observation {name}: expected a finite number (>= 0 if a price), got {value!r}")
        for name in ("sent_bytes", "priced_bytes", "probe_wait_ms", "load_lag"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise PlanError(f"observation {name}: expected a finite number >= 0, got {value!r}")

    @staticmethod
    def of_request(
        *,
        plan: str,
        priced_ms: float,
        total_ms: float,
        head_ms: float,
        round_trip_ms: float,
        t_s: float,
        price_ms: float = 0.0,
        sent_bytes: float = 0.0,
        priced_bytes: float = 0.0,
        probe_wait_ms: float = 0.0,
        upload_ms: float | None = None,
        rtt_ms: float = 0.0,
        load_lag: float = 0.0,
    ) -> Observation:
        """A request's observation (the runtime and ``rig.sim`` both make it so): ``priced_ms`` the
        decision's encode + call terms; what it took (``total_ms``) beyond its head (the whole model's run
        on ``device``) and its RPC (``round_trip_ms``, 0 on ``device``: the server's queue, build and tail are
        in it); ``price_ms`` the decision's price before correction. ``upload_ms`` and ``rtt_ms``: the decision's
        upload and RTT terms (None: not known); a plan whose upload is a bandwidth sample (``draws_probes``
        False) keeps the estimate fresh itself, so the probe its request met is none of its making (the
        rig's turns start with one): its wait is not the plan's."""
        measured = total_ms - head_ms - round_trip_ms
        if upload_ms is not None and not draws_probes(upload_ms, rtt_ms):
            probe_wait_ms = 0.0
        return Observation(
            plan=plan,
            predicted_ms=priced_ms,
            measured_ms=measured,
            t_s=t_s,
            price_ms=price_ms,
            sent_bytes=sent_bytes,
            priced_bytes=priced_bytes,
            probe_wait_ms=probe_wait_ms,
            load_lag=load_lag,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "plan": self.plan,
            "predicted_ms": self.predicted_ms,
            "measured_ms": self.measured_ms,
            "t_s": self.t_s,
            "price_ms": self.price_ms,
            "sent_bytes": self.sent_bytes,
            "priced_bytes": self.priced_bytes,
            "probe_wait_ms": self.probe_wait_ms,
            "load_lag": self.load_lag,
        }

    @staticmethod
    def from_json(d: dict[str, object]) -> Observation:
        try:
            return Observation(
                plan=str(d["plan"]),
                predicted_ms=float(d["predicted_ms"]),  # type: ignore[arg-type]
                measured_ms=float(d["measured_ms"]),  # type: ignore[arg-type]
                t_s=float(d["t_s"]),  # type: ignore[arg-type]
                price_ms=float(d.get("price_ms", 0.0)),  # type: ignore[arg-type]
                sent_bytes=float(d.get("sent_bytes", 0.0)),  # type: ignore[arg-type]
                priced_bytes=float(d.get("priced_bytes", 0.0)),  # type: ignore[arg-type]
                probe_wait_ms=float(d.get("probe_wait_ms", 0.0)),  # type: ignore[arg-type]
                load_lag=float(d.get("load_lag", 0.0)),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"observation: expected plan, predicted_ms, measured_ms and t_s, got {d!r}") from exc


def draws_probes(
    upload_ms: float, rtt_ms: float, min_transfer_fraction: float = LinkConfig.min_transfer_fraction
) -> bool:
    """Whether a plan's requests leave the bandwidth estimate stale, so that the device probes the link
    for them: their upload (``upload_ms``, beside the round trip ``rtt_ms``) is below
    ``min_transfer_fraction`` of the whole (``LinkConfig``'s default), which the estimator ignores. Only such
    a plan's requests queue behind probes of its own making (``Observation.probe_wait_ms``): on the rig a
    cloud@jpeg90 request (97 ms upload, 83 ms RTT) met a 187 ms probe at a turn's start, its plan was priced
    37 ms up, and adaptive left it for cloud@jpeg95 (no such evidence) and held that 11 requests."""
    return upload_ms < min_transfer_fraction * (upload_ms + rtt_ms)


@dataclass
class _Evidence:
    offset_ms: float  # the mean at t_s
    t_s: float
    clipped: int = 0  # the last request's step: +1 / -1 an outlier up / down (clipped to the bound), 0 not


class Corrections:
    """Per plan key, the decaying mean of what requests measured beyond their price (ms). Not thread-safe:
    the runtime feeds and reads it under its lock."""

    def __init__(self, config: CorrectionConfig | None = None) -> None:
        self.config = config or CorrectionConfig()
        self._plans: dict[str, _Evidence] = {}
        self._bytes: dict[str, float] = {}  # per plan: bytes sent / bytes priced
        self._waits: dict[str, _Evidence] = {}  # per plan: the mean wait behind the device's own probes
        self._last_end_s: float | None = None  # when the latest request fed ended
        self._shared: _Evidence | None = None  # what every plan calling a server shares (``shared_fraction``)
        self.seen = 0  # observations fed so far (a decision records it; replay feeds up to it)

    def _decayed(self, ev: _Evidence, now_s: float, half_life_s: float | None = None) -> float:
        age = max(0.0, now_s - ev.t_s)
        return ev.offset_ms * math.exp(-math.log(2.0) * age / (half_life_s or self.config.half_life_s))

    def observe(self, obs: Observation) -> int:
        """Feed one request; returns its index (0, 1, ...)."""
        index = self.seen
        self.seen += 1
        if not self.config.enabled:
            return index
        if obs.sent_bytes > 0 and obs.priced_bytes > 0:
            sample = min(BYTES_RATIO_RANGE[1], max(BYTES_RATIO_RANGE[0], obs.sent_bytes / obs.priced_bytes))
            known = self._bytes.get(obs.plan)
            self._bytes[obs.plan] = sample if known is None else known + BYTES_WEIGHT * (sample - known)
        cfg = self.config
        # what the request took (its head and RPC as priced), and whether the device had sent nothing for
        # longer than the link estimate stays fresh before it started
        took = obs.price_ms - obs.predicted_ms + obs.measured_ms
        after_idle = self._last_end_s is None or obs.t_s - took / 1e3 - self._last_end_s > cfg.idle_gap_s
        self._last_end_s = obs.t_s if self._last_end_s is None else max(self._last_end_s, obs.t_s)
        wait = self._waits.get(obs.plan)
        known = 0.0 if wait is None else self._decayed(wait, obs.t_s)
        # the probe an idle link drew is none of the plan's making (the rig's turns each start with one)
        if not after_idle and (wait is not None or obs.probe_wait_ms > 0):
            # at most the plan's price: a probe sized at a wrong estimate (the prior 10 Mbit/s on a 1 Mbit/s
            # link: 1.6 s on the wire) says nothing of the next ones
            waited = min(obs.probe_wait_ms, obs.price_ms) if obs.price_ms > 0 else obs.probe_wait_ms
            self._waits[obs.plan] = _Evidence(offset_ms=known + WAIT_WEIGHT * (waited - known), t_s=obs.t_s)
        if obs.load_lag > cfg.max_load_lag:  # priced at a load it did not meet: no plan's fact
            return index
        # no plan costs less than nothing: the excess is at least -predicted
        sample = min(cfg.max_offset_ms, max(-obs.predicted_ms, obs.measured_ms - obs.predicted_ms))
        key = evidence_key(obs.plan)
        ev = self._plans.get(key)
        own = 0.0 if ev is None else self._decayed(ev, obs.t_s)  # no evidence: the model's own price
        calls = obs.plan != DEVICE_CUT
        shared = self.shared_ms(obs.t_s) if calls else 0.0
        prior = own + shared
        # the smaller of the price and what the request took (its head as priced): a price gone wild (a
        # bandwidth estimate 200x low priced a 43 ms request at 97 s) must not move the mean by seconds
        bound = max(cfg.min_step_ms, cfg.max_step_fraction * max(0.0, min(obs.price_ms, took)))
        raw = cfg.weight * (sample - prior)
        # a request that cost what it was priced is no outlier, however far the mean has run up: after two
        # stalls in a row it is the plan's own news (held to ``min_step_ms`` it left a 25 % stalled plan
        # 28 ms dear, and adaptive fled to a split 20 ms dearer: 1.05-1.11x the routers in simulation)
        clipped = 0 if abs(sample) <= bound else 1 if raw > bound else -1 if raw < -bound else 0
        if clipped and (ev is None or ev.clipped != clipped):
            # a lone outlier (a load burst's slow encode, a cold first call): a few ms until the plan's next
            # request confirms it, or the plan it ran is priced out for what any plan would have met
            step = clipped * cfg.min_step_ms
        else:
            step = min(bound, max(-bound, raw))
        part = cfg.shared_fraction if calls and clipped else 0.0  # an outlier: the board's, as often as not
        self._plans[key] = _Evidence(offset_ms=own + (1.0 - part) * step, t_s=obs.t_s, clipped=clipped)
        if calls:
            self._shared = _Evidence(offset_ms=shared + part * step, t_s=obs.t_s)
        return index

    def shared_ms(self, now_s: float) -> float:
        """The part of its offset every plan that calls a server carries at ``now_s`` (``shared_fraction`` of the
        outliers' steps, halving in ``shared_half_life_s``; 0: none learnt, or none left)."""
        if not self.config.enabled or self._shared is None:
            return 0.0
        return self._decayed(self._shared, now_s, self.config.shared_half_life_s)

    def offset_ms(self, plan: str, now_s: float) -> float:
        """What is added to ``plan``'s price at ``now_s``: its own mean and mean probe wait, and, unless
        ``device``, the shared part (0: no evidence, or none left)."""
        if not self.config.enabled:
            return 0.0
        ev, wait = self._plans.get(evidence_key(plan)), self._waits.get(plan)
        own = 0.0 if ev is None else self._decayed(ev, now_s)
        return (
            own
            + (0.0 if wait is None else self._decayed(wait, now_s))
            + (0.0 if plan == DEVICE_CUT else self.shared_ms(now_s))
        )

    def bytes_ratio(self, plan: str) -> float:
        """What ``plan``'s requests sent over what the table priced (1: no evidence, or corrections off)."""
        return self._bytes.get(plan, 1.0) if self.config.enabled else 1.0

    def bytes_ms(self, table: CostTable, plan: str, bandwidth_mbps: float) -> float:
        """The upload of what ``plan``'s requests sent beyond (or short of) ``table``'s price, at
        ``bandwidth_mbps`` (0: no evidence, or a plan over more tiers or not in ``table``)."""
        ratio = self.bytes_ratio(plan)
        if ratio == 1.0 or ">" in plan:
            return 0.0
        cut, codec = parse_plan(plan, table.codecs[0])
        if cut not in table.ids or codec not in table.codecs:
            return 0.0
        sent = float(table.sent_bytes[table.index(cut), table.codec_index(codec)])
        return (ratio - 1.0) * sent * MS_PER_BYTE_AT_1MBPS / max(bandwidth_mbps, 1e-6)

    def bytes_plans(self) -> list[str]:
        """The plans whose bytes have evidence (``bytes_ratio``)."""
        return list(self._bytes) if self.config.enabled else []

    def offsets(self, now_s: float, codecs: Sequence[str] = ()) -> dict[str, float]:
        """Every plan with evidence and its offset at ``now_s``; a key shared by an image codec's quality
        variants stands for each of them among ``codecs`` (a table's)."""
        if not self.config.enabled:
            return {}
        plans = set(self._waits)
        for key in self._plans:
            if _SHARED.search(key) is None:
                plans.add(key)
                continue
            plans.update(p for c in codecs if evidence_key(p := _SHARED.sub(f"@{c}", key)) == key)
        return {plan: self.offset_ms(plan, now_s) for plan in plans}
