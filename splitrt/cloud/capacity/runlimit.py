"""How long one tail run may take before it is terminated, whatever its deadline: fair queuing cannot
preempt a running job, so an endless run under a long deadline would hold its worker for that long.

``run_limit_s(flag_s=, measured_ms=, model_bytes=)``: the operator's ``--max-run-s`` when given; else
``RUN_FACTOR`` times what the run should take, at least ``RUN_FLOOR_S``. What it should take is the
segment's measured service time (the server's own profile of it: the EWMA of its successful runs, 0 before
the first) or, larger, a prior from the model's size (``PRIOR_BYTES_PER_S`` of weights per second: a
model's compute grows with its weights). Terminated runs are never measured, so the limit cannot be
raised by runs that hit it. Pure.
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
