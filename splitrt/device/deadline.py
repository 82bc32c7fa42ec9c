"""How much of a request's deadline an RPC may take when the device must still be able to finish the
request itself (the local fallback): ``splitrt.plan.reserve`` (pure, shared with the simulator), named
here for the device's callers.

- ``rpc_timeout_ms(*, deadline_ms, elapsed_ms, local_finish_ms, cold=False) -> float | None``:
  ``reserve.send_budget(...).timeout_ms`` (None: the cloud is not asked).
"""

from __future__ import annotations

from splitrt.plan.reserve import LOCAL_SAFETY, LOCAL_SLACK_MS, MIN_RPC_MS, send_budget

__all__ = ["LOCAL_SAFETY", "LOCAL_SLACK_MS", "MIN_RPC_MS", "rpc_timeout_ms"]


def rpc_timeout_ms(
    *, deadline_ms: float, elapsed_ms: float, local_finish_ms: float, cold: bool = False
) -> float | None:
    """The RPC's timeout, or None when the request should finish here without asking the cloud."""
    return send_budget(
        deadline_ms=deadline_ms, elapsed_ms=elapsed_ms, local_finish_ms=local_finish_ms, cold=cold
    ).timeout_ms
