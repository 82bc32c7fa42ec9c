"""How long one tail run may take, whatever its deadline (fair queuing cannot preempt a run): the
operator's ``--max-run-s``, else ``RUN_FACTOR`` x the larger of the segment's measured service time and a
prior from the model's weights, at least ``RUN_FLOOR_S``. Terminated runs are never measured. Pure.
"""

from __future__ import annotations

__all__ = ["PRIOR_BYTES_PER_S", "RUN_FACTOR", "RUN_FLOOR_S", "run_limit_s"]

RUN_FLOOR_S = 2.0
RUN_FACTOR = 20.0
PRIOR_BYTES_PER_S = 100e6


def run_limit_s(*, flag_s: float | None, measured_ms: float, model_bytes: int) -> float:
    if flag_s is not None:
        return flag_s
    expected_s = max(measured_ms / 1e3, model_bytes / PRIOR_BYTES_PER_S)
    return max(RUN_FLOOR_S, RUN_FACTOR * expected_s)
