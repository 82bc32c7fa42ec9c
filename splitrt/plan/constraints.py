"""Deployment constraints as a set of allowed cuts (pure): a privacy floor and a device memory ceiling.

- Privacy floor: ``min_head_flops_fraction`` (the head computes at least this share of the model's
  FLOPs before anything leaves the device) and ``no_raw_input`` (no cut whose crossing tensors include a
  graph input: the raw data never leaves). Both rule out ``cloud``; routing cannot meet them, so a
  constrained plan is to be compared with ``device`` alone.
- Memory ceiling: ``device_memory_mb``: a head whose weights + peak activations exceed it does not fit
  on the device (``device`` itself included: a model too big for the board still runs, split).

The solver takes the allowed cuts (``solve(..., cuts=)``, ``ControllerConfig.cuts``); ``price`` says what
the constraints cost at given conditions (the constrained best against the unconstrained best).

``splitrt.plan.constraints`` (pure): ``Constraints(min_head_flops_fraction=0, no_raw_input=False,
device_memory_mb=None)``; ``allowed_cuts(CutFacts, Constraints) -> Allowed(cuts, excluded={cut: reason}, ...)``
(``.note()``, ``.as_dict()``; PlanError when none is left); ``price(table, cond, allowed, ...) ->
Price(constrained, free, cost)``. ``device`` always meets the privacy floor; ``cloud`` never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from splitrt.errors import ConfigError, PlanError
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Power
from splitrt.plan.solver import Plan, solve


@dataclass(frozen=True, kw_only=True)
class Constraints:
    min_head_flops_fraction: float = 0.0
    no_raw_input: bool = False
    device_memory_mb: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_head_flops_fraction <= 1.0:
            raise ConfigError(
                f"min_head_flops: expected a share of the model's FLOPs in [0, 1], got {self.min_head_flops_fraction!r}"
            )
        if self.device_memory_mb is not None and not self.device_memory_mb > 0:
            raise ConfigError(f"device_memory_mb: expected a number of MB > 0, got {self.device_memory_mb!r}")

    @property
    def active(self) -> bool:
        return self.min_head_flops_fraction > 0 or self.no_raw_input or self.device_memory_mb is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "min_head_flops_fraction": self.min_head_flops_fraction,
            "no_raw_input": self.no_raw_input,
            "device_memory_mb": self.device_memory_mb,
        }


#: Why a cut that only moves or reshapes the input is not a candidate: it is ``cloud`` (same data).
LAYOUT_OF_INPUT = "the input moved/reshaped (same data as cloud)"


@dataclass(frozen=True, kw_only=True)
class CutFacts:
    """Per cut (the cost table's order): head FLOPs share, whether it sends a graph input, head memory."""

    ids: tuple[str, ...]
    head_flops_fraction: tuple[float, ...]
    sends_input: tuple[bool, ...]
    head_memory_bytes: tuple[int, ...]
    # The cut sends only the graph inputs, moved/reshaped/cast (``graph.memory.input_layout``): the same
    # data as ``cloud``, so it is ``cloud`` for plans and verdicts. Empty: none is.
    input_layout: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not (len(self.head_flops_fraction) == len(self.sends_input) == len(self.head_memory_bytes) == n):
            raise PlanError(
                f"CutFacts: expected {n} entries per field (one per cut), got "
                f"{len(self.head_flops_fraction)}, {len(self.sends_input)}, {len(self.head_memory_bytes)}"
            )
        if self.input_layout and len(self.input_layout) != n:
            raise PlanError(f"CutFacts: expected {n} input_layout entries (one per cut), got {len(self.input_layout)}")


@dataclass(frozen=True, kw_only=True)
class Allowed:
    cuts: tuple[str, ...]
    excluded: dict[str, str] = field(default_factory=dict)  # cut -> why (privacy | raw input | memory)
    constraints: Constraints = field(default_factory=Constraints)
    total: int = 0

    def note(self) -> str:
        c = self.constraints
        what = [f"head >= {c.min_head_flops_fraction * 100:g} % of FLOPs"] if c.min_head_flops_fraction > 0 else []
        what += ["raw input stays on the device"] if c.no_raw_input else []
        what += [f"device memory <= {c.device_memory_mb:g} MB"] if c.device_memory_mb is not None else []
        reasons = sorted(set(self.excluded.values()))
        counts = ", ".join(f"{sum(1 for r in self.excluded.values() if r == x)} {x}" for x in reasons)
        return (
            f"constraints ({'; '.join(what) or 'none'}): {len(self.cuts)} of {self.total} cuts allowed"
            + (f" ({counts} excluded)" if counts else "")
            + ("; routing cannot comply (cloud excluded)" if CLOUD_CUT in self.excluded else "")
        )

    def as_dict(self) -> dict[str, object]:
        return {
            **self.constraints.as_dict(),
            "allowed": len(self.cuts),
            "total": self.total,
            "excluded": dict(self.excluded),
            "note": self.note(),
        }


def allowed_cuts(facts: CutFacts, constraints: Constraints) -> Allowed:
    """The cuts meeting every constraint; PlanError naming the tightest one when none does."""
    excluded: dict[str, str] = {}
    ceiling = None if constraints.device_memory_mb is None else constraints.device_memory_mb * 1024 * 1024
    for i, cut in enumerate(facts.ids):
        if facts.input_layout and facts.input_layout[i]:
            excluded[cut] = LAYOUT_OF_INPUT
        elif facts.head_flops_fraction[i] < constraints.min_head_flops_fraction - 1e-12 and cut != DEVICE_CUT:
            excluded[cut] = "privacy floor"
        elif constraints.no_raw_input and cut != DEVICE_CUT and (cut == CLOUD_CUT or facts.sends_input[i]):
            excluded[cut] = "raw input"
        elif ceiling is not None and facts.head_memory_bytes[i] > ceiling:
            excluded[cut] = "memory"
    cuts = tuple(c for c in facts.ids if c not in excluded)
    if not cuts:
        smallest = min(m for m in facts.head_memory_bytes if m > 0) if any(facts.head_memory_bytes) else 0
        raise PlanError(
            f"constraints {constraints.as_dict()}: expected at least one cut meeting them, got none "
            f"(the smallest non-empty head needs {smallest / 2**20:.1f} MB)"
        )
    return Allowed(cuts=cuts, excluded=excluded, constraints=constraints, total=len(facts.ids))


@dataclass(frozen=True, kw_only=True)
class Price:
    constrained: Plan
    free: Plan
    cost: float  # objective units (ms, mJ, ms per frame) the constraints add at these conditions

    def as_dict(self) -> dict[str, object]:
        return {
            "constrained": self.constrained.key,
            "unconstrained": self.free.key,
            "cost": self.cost,
            "objective": self.constrained.objective,
        }


def objective_value(plan: Plan) -> float:
    return {"energy": plan.energy_mj, "throughput": plan.period_ms}.get(plan.objective, plan.predicted_ms)


def price(
    table: CostTable,
    cond: Conditions,
    allowed: Allowed | Sequence[str],
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
) -> Price:
    cuts = list(allowed.cuts if isinstance(allowed, Allowed) else allowed)
    constrained = solve(table, cond, objective=objective, power=power, codecs=codecs, cuts=cuts)
    free = solve(table, cond, objective=objective, power=power, codecs=codecs)
    return Price(constrained=constrained, free=free, cost=objective_value(constrained) - objective_value(free))
