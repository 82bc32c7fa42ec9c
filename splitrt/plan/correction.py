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
bounded so that one outlier cannot price a plan out).

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
  enabled=True)``: one request moves a plan's mean by ``weight`` x its excess, at most ``max_step_fraction`` of
  the smaller of the plan's price (``Observation.price_ms``) and what the request took, or ``min_step_ms``.
- ``Observation(plan, predicted_ms, measured_ms, t_s, price_ms)``: predicted, the price of what no estimator
  learns (the decision's encode + call terms); measured, what the request took beyond its head and its RPC
  (on ``device``: beyond its run); ``price_ms`` the plan's whole price (bounds a step).
  ``Observation.of_request(plan=, priced_ms=, total_ms=, head_ms=, round_trip_ms=, t_s=, price_ms=)`` makes
  one from a request's figures. ``.to_json()`` / ``Observation.from_json(dict)``.
- ``Corrections(config)``: ``.observe(obs) -> index``, ``.offset_ms(plan, now_s) -> ms``, ``.offsets(now_s)
  -> {plan: ms}`` (the plans with evidence), ``.seen``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from splitrt.errors import ConfigError, PlanError

__all__ = ["CorrectionConfig", "Corrections", "Observation"]


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


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One request: the plan it ran, the price of what no estimator learns (encode + call) and what the
    request took beyond its head and its RPC."""

    plan: str
    predicted_ms: float
    measured_ms: float
    t_s: float
    price_ms: float = 0.0  # the plan's whole price (its terms, before correction): bounds one request's step

    def __post_init__(self) -> None:
        for name in ("predicted_ms", "measured_ms", "t_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or (name == "predicted_ms" and value < 0):
                raise PlanError(f"observation {name}: expected a finite number (>= 0 if a price), got {value!r}")

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
    ) -> Observation:
        """A request's observation (the runtime and ``rig.sim`` both make it so): ``priced_ms`` the
        decision's encode + call terms; what it took (``total_ms``) beyond its head (the whole model's run
        on ``device``) and its RPC (``round_trip_ms``, 0 on ``device``: the server's queue, build and tail are
        in it); ``price_ms`` the decision's price before correction."""
        measured = total_ms - head_ms - round_trip_ms
        return Observation(plan=plan, predicted_ms=priced_ms, measured_ms=measured, t_s=t_s, price_ms=price_ms)

    def to_json(self) -> dict[str, object]:
        return {
            "plan": self.plan,
            "predicted_ms": self.predicted_ms,
            "measured_ms": self.measured_ms,
            "t_s": self.t_s,
            "price_ms": self.price_ms,
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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"observation: expected plan, predicted_ms, measured_ms and t_s, got {d!r}") from exc


@dataclass
class _Evidence:
    offset_ms: float  # the mean at t_s
    t_s: float


class Corrections:
    """Per plan key, the decaying mean of what requests measured beyond their price (ms). Not thread-safe:
    the runtime feeds and reads it under its lock."""

    def __init__(self, config: CorrectionConfig | None = None) -> None:
        self.config = config or CorrectionConfig()
        self._plans: dict[str, _Evidence] = {}
        self.seen = 0  # observations fed so far (a decision records it; replay feeds up to it)

    def _decayed(self, ev: _Evidence, now_s: float) -> float:
        age = max(0.0, now_s - ev.t_s)
        return ev.offset_ms * math.exp(-math.log(2.0) * age / self.config.half_life_s)

    def observe(self, obs: Observation) -> int:
        """Feed one request; returns its index (0, 1, ...)."""
        index = self.seen
        self.seen += 1
        if not self.config.enabled:
            return index
        cfg = self.config
        # no plan costs less than nothing: the excess is at least -predicted
        sample = min(cfg.max_offset_ms, max(-obs.predicted_ms, obs.measured_ms - obs.predicted_ms))
        ev = self._plans.get(obs.plan)
        prior = 0.0 if ev is None else self._decayed(ev, obs.t_s)  # no evidence: the model's own price
        # the smaller of the price and what the request took (its head as priced): a price gone wild (a
        # bandwidth estimate 200x low priced a 43 ms request at 97 s) must not move the mean by seconds
        took = obs.price_ms - obs.predicted_ms + obs.measured_ms
        bound = max(cfg.min_step_ms, cfg.max_step_fraction * max(0.0, min(obs.price_ms, took)))
        step = min(bound, max(-bound, cfg.weight * (sample - prior)))
        self._plans[obs.plan] = _Evidence(offset_ms=prior + step, t_s=obs.t_s)
        return index

    def offset_ms(self, plan: str, now_s: float) -> float:
        """What is added to ``plan``'s price at ``now_s`` (0: no evidence, or none left)."""
        ev = self._plans.get(plan)
        if ev is None or not self.config.enabled:
            return 0.0
        return self._decayed(ev, now_s)

    def offsets(self, now_s: float) -> dict[str, float]:
        """Every plan with evidence and its offset at ``now_s``."""
        return {plan: self.offset_ms(plan, now_s) for plan in self._plans} if self.config.enabled else {}
