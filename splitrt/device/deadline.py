"""How much of a request's deadline an RPC may take when the device must still be able to finish the
request itself (the local fallback) within that deadline.

The local finish is kept in reserve: its expected time (profiled, scaled by the device's load) times
``LOCAL_SAFETY`` (a profile is a median; a loaded device runs slower than it said a moment ago), plus
``LOCAL_SLACK_MS`` for what follows a timed-out RPC before the tail starts (the client-side deadline
firing late, the failure being recorded). What remains is the RPC's timeout; when nothing remains the
cloud is not worth asking and the request finishes here, on time.
"""

from __future__ import annotations

__all__ = ["LOCAL_SAFETY", "LOCAL_SLACK_MS", "rpc_timeout_ms"]

LOCAL_SAFETY = 1.5
LOCAL_SLACK_MS = 10.0
# An RPC shorter than this cannot complete even on loopback: finish locally instead.
MIN_RPC_MS = 1.0


def rpc_timeout_ms(*, deadline_ms: float, elapsed_ms: float, local_finish_ms: float) -> float | None:
    """The RPC's timeout, or None when the deadline leaves no room for one after the local reserve."""
    left = deadline_ms - elapsed_ms - (max(0.0, local_finish_ms) * LOCAL_SAFETY + LOCAL_SLACK_MS)
    return left if left >= MIN_RPC_MS else None
