"""How much of a request's deadline the remote call gets, given the local fallback (pure: the runtime and
the simulator both decide through :func:`send_budget`, so ``splitrt sim`` predicts what ``run`` does).

The local finish (the tail run here when the cloud does not answer) is kept in reserve: its expected time
(the table's, times the device's load) times ``LOCAL_SAFETY`` (a profile is a median; a loaded device
runs slower than it said a moment ago) plus ``LOCAL_SLACK_MS`` (the client's deadline firing late, the
failure being recorded). The RPC gets what is left, so a stalled cloud still leaves time to finish here.

The reserve never stops an offload that is the plan's best chance:

- when the local finish cannot meet the deadline anyway (``elapsed + reserve > deadline``), keeping it in
  reserve would only guarantee a late answer: the RPC gets the whole remaining budget, and never less
  than the local finish itself (``max(left, local_finish_ms)``: waiting for the cloud that long costs no
  more than finishing here would have);
- a cold tail (the first time this runtime sends this cut to this server, which then builds the tail
  session, seconds for a big model) gets the whole remaining budget too: a reserve-limited RPC would
  expire during every first build (the server finishes the build and keeps the session, so only that
  first request can be late).

Otherwise, with less than ``MIN_RPC_MS`` left after the reserve, the request is not sent at all: that is
no fallback (nothing reached the wire), and is reported as ``Budget.sent`` False with its reason.

- ``send_budget(*, deadline_ms, elapsed_ms, local_finish_ms, cold=False) -> Budget(timeout_ms, reason,
  reserve_ms)``; ``timeout_ms`` None: do not send.
- ``local_finish_ms(head_ms_device, head_ms_cut, device_factor)``: the table's local finish of a cut.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOCAL_SAFETY", "LOCAL_SLACK_MS", "MIN_RPC_MS", "Budget", "local_finish_ms", "send_budget"]

LOCAL_SAFETY = 1.5
LOCAL_SLACK_MS = 10.0
# An RPC shorter than this cannot complete even on loopback: finish locally instead.
MIN_RPC_MS = 1.0

RESERVE = "reserve"  # the RPC gets what the local reserve leaves
LATE_ANYWAY = "local finish misses the deadline anyway: the whole budget"
COLD = "cold tail: the whole budget (the server builds it)"
NOT_SENT = "no time left for the cloud after the local reserve"


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The RPC's timeout (None: not sent, the request finishes here on time) and why."""

    timeout_ms: float | None
    reason: str
    reserve_ms: float

    @property
    def sent(self) -> bool:
        return self.timeout_ms is not None


def local_finish_ms(head_ms_device: float, head_ms_cut: float, device_factor: float) -> float:
    """The local finish of a cut from the table: the whole model's head minus the cut's, at the load."""
    return max(0.0, head_ms_device - head_ms_cut) * max(1.0, device_factor)


def send_budget(*, deadline_ms: float, elapsed_ms: float, local_finish_ms: float, cold: bool = False) -> Budget:
    """How long the RPC may take (see the module's docstring for the rules)."""
    local = max(0.0, local_finish_ms)
    reserve = local * LOCAL_SAFETY + LOCAL_SLACK_MS
    left = deadline_ms - elapsed_ms
    if left < reserve:  # the local finish would be late (or nearly) anyway
        return Budget(timeout_ms=max(left, local, MIN_RPC_MS), reason=LATE_ANYWAY, reserve_ms=reserve)
    if cold:
        return Budget(timeout_ms=max(left, MIN_RPC_MS), reason=COLD, reserve_ms=reserve)
    if left - reserve < MIN_RPC_MS:
        return Budget(timeout_ms=None, reason=NOT_SENT, reserve_ms=reserve)
    return Budget(timeout_ms=left - reserve, reason=RESERVE, reserve_ms=reserve)
