"""The cloud's queue as a plan term (pure: every call takes ``now_s``).

A server reports, in every reply, ``Status`` and ``Probe``, how many requests it holds (``queue_depth``:
waiting + running), its worker slots and its smoothed service time per request. The expected wait of
the next request sent there (``expected_wait_ms``) is the plan's ``queue_ms`` term: the same for every
cut that sends (a queued request waits for a worker whatever its tail), 0 for ``device``. So a queueing
server moves the plan towards the device as a whole, and the cut among the sending ones is still chosen
by compute and bytes.

``QueueEstimator`` smooths those predictions and the waits requests actually met, fades them as they
age (a queue drains: a minute-old report of a full queue says little), and remembers a refusal
(RESOURCE_EXHAUSTED with a ``retry-after-ms`` hint): until the hint expires the server is not offered
to the planner at all (``refused``), and the wait afterwards is priced at least as a full queue.

- ``expected_wait_ms(queue_depth=, workers=, service_ms=)``: M/M/c given the state, ``max(0, n - c + 1) x
  service / c`` (PlanError on nonsense). ``QueueEstimator(QueueConfig(alpha, half_life_s, max_wait_ms,
  default_retry_after_ms))``: ``.add_load(now_s, *, queue_depth, workers, service_ms)`` (queue_depth not
  counting the request whose reply carried it), ``.add_wait(now_s, wait_ms)``, ``.add_refusal(now_s, *,
  retry_after_ms)``, ``.refused(now_s)`` (True until the hint expires), ``.estimate(now_s) -> ms`` (an EWMA that
  halves per ``half_life_s`` without news). One per cloud (``device.runtime.clouds.Cloud.queue``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from splitrt.errors import PlanError


def expected_wait_ms(*, queue_depth: int, workers: int, service_ms: float) -> float:
    """Expected wait for a worker of a request arriving to ``queue_depth`` others at ``workers`` slots.

    M/M/c conditioned on the state: with n >= c in the system the newcomer waits for n - c + 1
    departures, and with c busy exponential servers departures come every service / c on average, so
    wait = (n - c + 1) x service / c; with n < c a slot is free (0). Exponential service is the
    pessimistic reading of tails whose time varies with the model and cut each request runs (the server
    mixes them); its memorylessness makes the state the server reports enough, with no arrival rate
    to estimate (which one device cannot see for a fleet). One less than that (n - c) x service / c
    would be the deterministic-service figure when the running requests just started.
    """
    if workers < 1 or queue_depth < 0 or not (service_ms >= 0 and math.isfinite(service_ms)):
        raise PlanError(
            f"queue state: expected workers >= 1, queue_depth >= 0 and a finite service_ms >= 0, "
            f"got {workers}, {queue_depth} and {service_ms!r}"
        )
    ahead = queue_depth - workers + 1
    return 0.0 if ahead <= 0 else ahead * service_ms / workers


@dataclass(frozen=True, kw_only=True)
class QueueConfig:
    # Weight of a new sample in the smoothed wait (a queue changes per request: react fast).
    alpha: float = 0.5
    # The smoothed wait halves per half_life_s without news (an unobserved queue drains).
    half_life_s: float = 2.0
    # A wait estimate is capped here (a server reporting absurd numbers must not pin the plan).
    max_wait_ms: float = 60_000.0
    # A refusal without a hint keeps the server out of plans this long.
    default_retry_after_ms: float = 100.0

    def __post_init__(self) -> None:
        for name, ok in (
            ("alpha", 0.0 < self.alpha <= 1.0),
            ("half_life_s", self.half_life_s > 0),
            ("max_wait_ms", self.max_wait_ms > 0),
            ("default_retry_after_ms", self.default_retry_after_ms >= 0),
        ):
            if not ok:
                raise PlanError(f"QueueConfig.{name}: expected a value in range, got {getattr(self, name)!r}")


class QueueEstimator:
    """Expected queueing delay at one server (``estimate(now_s)``, milliseconds), from its load reports
    (``add_load``), waits requests met (``add_wait``) and refusals (``add_refusal``)."""

    def __init__(self, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self._value_ms = 0.0
        self._t_s: float | None = None
        self.refused_until_s = -math.inf
        self.service_ms = 0.0  # the last service time the server reported
        self.refusals = 0

    def _add(self, now_s: float, sample_ms: float) -> float:
        x = min(self.config.max_wait_ms, max(0.0, sample_ms))
        prior = self.estimate(now_s)
        self._value_ms = x if self._t_s is None else prior + self.config.alpha * (x - prior)
        self._t_s = now_s
        return x

    def add_load(self, now_s: float, *, queue_depth: int, workers: int, service_ms: float) -> float:
        """A load report (``queue_depth`` others, not counting the request whose reply carried it);
        returns the wait it predicts. A server that reports no workers (an older one) is ignored."""
        if workers < 1:
            return 0.0
        if service_ms > 0:
            self.service_ms = service_ms
        return self._add(now_s, expected_wait_ms(queue_depth=queue_depth, workers=workers, service_ms=self.service_ms))

    def add_wait(self, now_s: float, wait_ms: float) -> float:
        """The wait a request met (the reply's ``queue_ms``)."""
        return self._add(now_s, wait_ms)

    def add_refusal(self, now_s: float, *, retry_after_ms: float | None) -> float:
        """A RESOURCE_EXHAUSTED refusal: out of plans until the hint expires, then priced at least as
        waiting out the hint. Returns the hint used, milliseconds."""
        hint = self.config.default_retry_after_ms if retry_after_ms is None else max(0.0, retry_after_ms)
        self.refused_until_s = max(self.refused_until_s, now_s + hint / 1e3)
        self.refusals += 1
        self._add(now_s, max(hint, self.estimate(now_s)))
        return hint

    def refused(self, now_s: float) -> bool:
        """True while the last refusal's hint runs."""
        return now_s < self.refused_until_s

    def estimate(self, now_s: float) -> float:
        if self._t_s is None:
            return 0.0
        age = max(0.0, now_s - self._t_s)
        return float(self._value_ms * 0.5 ** (age / self.config.half_life_s))


__all__ = ["QueueConfig", "QueueEstimator", "expected_wait_ms"]
