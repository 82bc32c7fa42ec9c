"""The objectives a plan can minimise, dispatched in one place (pure)."""

from __future__ import annotations

from splitrt.errors import PlanError

OBJECTIVES = ("latency", "energy", "throughput")


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise PlanError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")


def objective_value(objective: str, *, latency_ms: float, energy_mj: float, period_ms: float) -> float:
    """What ``objective`` minimises: ms end to end, device mJ, or ms per pipelined frame."""
    check_objective(objective)
    return {"latency": latency_ms, "energy": energy_mj}.get(objective, period_ms)


__all__ = ["OBJECTIVES", "check_objective", "objective_value"]
