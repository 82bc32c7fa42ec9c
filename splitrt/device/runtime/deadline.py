"""How much of a request's deadline an RPC may take when the device must still be able to finish the
request itself (the local fallback): ``splitrt.plan.reserve`` (pure, shared with the simulator), named
here for the device's callers.

- ``rpc_timeout_ms(*, deadline_ms, elapsed_ms, local_finish_ms, cold=False) -> float | None``:
  ``reserve.send_budget(...).timeout_ms`` (None: the cloud is not asked).
- ``budget(table, cut, *, device_factor, deadline_ms, elapsed_ms, cold) -> reserve.Budget``: the runtime's,
  with the local finish of ``cut`` priced from its cost table at the device's load factor.
"""

from __future__ import annotations

from splitrt.plan import reserve
from splitrt.plan.costmodel import DEVICE_CUT, CostTable
from splitrt.plan.reserve import LOCAL_SAFETY, LOCAL_SLACK_MS, MIN_RPC_MS, send_budget

__all__ = ["LOCAL_SAFETY", "LOCAL_SLACK_MS", "MIN_RPC_MS", "budget", "rpc_timeout_ms"]


def budget(
    table: CostTable, cut: str, *, device_factor: float, deadline_ms: float, elapsed_ms: float, cold: bool
) -> reserve.Budget:
    """The RPC's budget for ``cut`` (``plan.reserve.send_budget``, as the simulator decides it): the local
    finish is kept in reserve unless that would stop the plan's best chance (the local finish late
    anyway; a cold tail's first request)."""
    local_ms = reserve.local_finish_ms(
        float(table.head_ms[table.index(DEVICE_CUT)]), float(table.head_ms[table.index(cut)]), device_factor
    )
    return send_budget(deadline_ms=deadline_ms, elapsed_ms=elapsed_ms, local_finish_ms=local_ms, cold=cold)


def rpc_timeout_ms(
    *, deadline_ms: float, elapsed_ms: float, local_finish_ms: float, cold: bool = False
) -> float | None:
    """The RPC's timeout, or None when the request should finish here without asking the cloud."""
    return send_budget(
        deadline_ms=deadline_ms, elapsed_ms=elapsed_ms, local_finish_ms=local_finish_ms, cold=cold
    ).timeout_ms
