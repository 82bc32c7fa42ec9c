"""Which cloud a request goes to first, and in which order the others are tried (pure).

Every cloud the device knows (a ``--cloud`` list, zeroconf, or the addresses of one name) is a
``Candidate`` with what the device knows of it: its expected queueing delay (``plan.queueing``), its
RTT and this device's own requests on the wire to it. A request pays ``queue_ms + rtt_ms`` at a cloud
on top of what the cut costs, and that sum is the same for every cut that sends (``costmodel``: the
queue and the round trip are per request, not per byte), so the cloud with the lowest
``score_ms`` is also the one that gives the lowest predicted latency for whatever plan is chosen: the
runtime picks the cloud first, then plans with that cloud's queue, and the two choices are jointly
optimal. Our own requests on the wire are priced too (each is ``service_ms / workers`` of wait ahead of
the next one, and among near-ties the cloud with fewer of them goes first), because a load report
arrives only with a reply: without that a burst of concurrent requests would all pile onto the cloud
that looked idle before the burst.

Clouds whose scores lie within a tolerance of the best (``BalanceConfig.tie_ms`` or ``tie_fraction``
of the best) are equally good: they take turns (``turn``, the device's request counter), so idle
servers share the requests and adding a server adds capacity. The rest follow by score: they are the
failover order (a request that fails at one cloud goes to the next, then finishes on the device).

``order`` is a function of its arguments alone; the runtime logs them in the decision
(``Choice.to_json``), and ``replay`` recomputes the order from a decision log.

- ``Candidate(address, queue_ms, rtt_ms | None, inflight, service_ms, workers)``; ``score_ms`` = queue + own
  requests on the wire x service / workers + RTT (unprobed: the slowest probed one's). ``order(candidates, *,
  turn, config=BalanceConfig(tie_ms=1, tie_fraction=0.1, rotate=True)) -> [address]``: the scores within
  max(tie_ms, tie_fraction x best) of the best, fewest own in-flight first, take turns (``turn`` mod their
  count; ``rotate=False``: given order), then the rest by score (the failover order). Queue and RTT are the same
  for every sending cut, so the least-score cloud is also the best for any plan: the runtime picks the cloud,
  then plans with its queue. ``choose(...) -> Choice(turn, candidates, order)`` (``.to_json()`` /
  ``from_json``); ``replay(decision_log_lines) -> [(logged, recomputed)]``. Properties
  (tests/plan/test_balance.py): a permutation; the first within tolerance of the best; a cloud more than the
  tolerance worse never before a better one; n tied clouds each first once per n turns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from splitrt.errors import PlanError


@dataclass(frozen=True, kw_only=True)
class BalanceConfig:
    # Scores within max(tie_ms, tie_fraction x best) of the best take turns (a real difference smaller
    # than that is within the noise of the estimates).
    tie_ms: float = 1.0
    tie_fraction: float = 0.1
    # False: ties keep the given order (the caller's preference, e.g. the finder's RTT ranking).
    rotate: bool = True

    def __post_init__(self) -> None:
        if not (self.tie_ms >= 0 and math.isfinite(self.tie_ms)):
            raise PlanError(f"BalanceConfig.tie_ms: expected a finite value >= 0, got {self.tie_ms!r}")
        if not 0 <= self.tie_fraction < 1:
            raise PlanError(f"BalanceConfig.tie_fraction: expected [0, 1), got {self.tie_fraction!r}")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One cloud as the device sees it now."""

    address: str
    queue_ms: float = 0.0  # expected wait for a worker there (``QueueEstimator.estimate``)
    rtt_ms: float | None = None  # None: not probed yet (priced as the slowest probed one)
    inflight: int = 0  # this device's requests on the wire to it now
    service_ms: float = 0.0  # its last reported service time per request (0: unknown)
    workers: int = 1

    def __post_init__(self) -> None:
        bad = [
            n
            for n, ok in (
                ("queue_ms", self.queue_ms >= 0 and math.isfinite(self.queue_ms)),
                ("rtt_ms", self.rtt_ms is None or (self.rtt_ms >= 0 and math.isfinite(self.rtt_ms))),
                ("inflight", self.inflight >= 0),
                ("workers", self.workers >= 1),
                ("service_ms", self.service_ms >= 0 and math.isfinite(self.service_ms)),
            )
            if not ok
        ]
        if bad:
            raise PlanError(
                f"candidate {self.address!r}: expected finite queue_ms/rtt_ms/service_ms >= 0, "
                f"inflight >= 0 and workers >= 1, got {asdict(self)}"
            )


def score_ms(c: Candidate, *, unknown_rtt_ms: float = 0.0) -> float:
    """What a request pays at ``c`` beyond the plan's compute and bytes: its queue, our own requests
    ahead of it there, and the round trip."""
    # Our own requests on the wire: a service time each, spread over the workers (with none reported
    # yet, ``order`` still sends the next request to a tied cloud with fewer of ours).
    rtt = unknown_rtt_ms if c.rtt_ms is None else c.rtt_ms
    return c.queue_ms + c.inflight * c.service_ms / c.workers + rtt


def tolerance_ms(best_ms: float, config: BalanceConfig | None = None) -> float:
    cfg = config or BalanceConfig()
    return max(cfg.tie_ms, cfg.tie_fraction * best_ms)


def scores(candidates: Sequence[Candidate]) -> list[float]:
    known = [c.rtt_ms for c in candidates if c.rtt_ms is not None]
    unknown = max(known) if known else 0.0
    return [score_ms(c, unknown_rtt_ms=unknown) for c in candidates]


def order(candidates: Sequence[Candidate], *, turn: int, config: BalanceConfig | None = None) -> list[str]:
    """The addresses in the order to try: the tied best with the fewest of our requests on the wire in
    turn (``turn`` picks which goes first), then the others by score (given order among equal scores)."""
    cfg = config or BalanceConfig()
    if turn < 0:
        raise PlanError(f"turn: expected >= 0, got {turn}")
    if len({c.address for c in candidates}) != len(candidates):
        raise PlanError(f"candidates: expected distinct addresses, got {[c.address for c in candidates]}")
    if not candidates:
        return []
    s = scores(candidates)
    best = min(s)
    tol = tolerance_ms(best, cfg)
    tied = [i for i in range(len(candidates)) if s[i] <= best + tol]
    fewest = min(candidates[i].inflight for i in tied)
    first = [i for i in tied if candidates[i].inflight == fewest]
    if cfg.rotate:
        k = turn % len(first)
        first = first[k:] + first[:k]
    rest = sorted((i for i in range(len(candidates)) if i not in first), key=lambda i: (s[i], i))
    return [candidates[i].address for i in first + rest]


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One balancing decision and its inputs (``Decision.extra["balance"]`` in the decision log)."""

    turn: int
    candidates: tuple[Candidate, ...]
    order: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"turn": self.turn, "order": list(self.order), "candidates": [asdict(c) for c in self.candidates]}

    @staticmethod
    def from_json(d: dict[str, object]) -> Choice:
        try:
            cands = d["candidates"]
            got = d["order"]
            if not isinstance(cands, list) or not isinstance(got, list):
                raise TypeError("candidates and order must be lists")
            return Choice(
                turn=int(str(d["turn"])),
                order=tuple(str(a) for a in got),
                candidates=tuple(Candidate(**c) for c in cands),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"balance record: expected keys turn, order, candidates, got {d!r} ({exc})") from exc


def choose(candidates: Sequence[Candidate], *, turn: int, config: BalanceConfig | None = None) -> Choice:
    return Choice(turn=turn, candidates=tuple(candidates), order=tuple(order(candidates, turn=turn, config=config)))


def replay(lines: Iterable[str], config: BalanceConfig | None = None) -> list[tuple[Choice, Choice]]:
    """(logged, recomputed) for every decision-log line (``Decision.to_json``) that holds a balance
    record; the runtime's choices replay when the orders agree."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        extra = json.loads(line).get("extra") or {}
        rec = extra.get("balance")
        if rec is None:
            continue
        logged = Choice.from_json(rec)
        out.append((logged, choose(logged.candidates, turn=logged.turn, config=config)))
    return out


__all__ = ["BalanceConfig", "Candidate", "Choice", "choose", "order", "replay", "score_ms", "scores", "tolerance_ms"]
