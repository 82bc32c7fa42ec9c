"""What one request of the adaptive runtime returns (``Outcome``), how it ended (``ended``: not sent, or a
fallback) and the names of its tiers (``tier_name``); ``device.runtime`` re-exports ``Outcome``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitrt.device.client.messages import SplitResult
from splitrt.plan.controller import Decision
from splitrt.plan.reserve import NOT_SENT

__all__ = ["Outcome", "ended", "tier_name"]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    request: str
    outputs: dict[str, np.ndarray]
    plan: str
    latency_ms: float
    fallback: bool  # a tier the plan counted on failed (the one before it, or the device, finished)
    server: str | None  # the server that produced the outputs (None: the device)
    decision: Decision
    result: SplitResult
    fallback_reason: str = ""  # why the cloud's part ran locally (each cloud's error, or the deadline)
    route: str = "local"  # the tier the plan sent the request to (``tier_name``), or local
    finished_by: str = "device"  # the tier that produced the outputs
    not_sent: str = ""  # planned for a cloud but never sent (no cloud up, no time after the reserve): why


def tier_name(tier: int, tiers: int) -> str:
    """``device``, then ``edge`` (three tiers) or ``tier1``.., and ``cloud`` for the last."""
    if tier == 0:
        return "device"
    if tier == tiers - 1:
        return "cloud"
    return "edge" if tiers == 3 else f"tier{tier}"


def ended(why: str | None, *, answered: bool) -> tuple[bool, bool]:
    """(not sent, fallback) of a request a server ``answered`` or not, ``why`` a tier the plan counted on
    did not (None: none failed): nothing reached the wire (no cloud, or no time for one after the local
    reserve) is no fallback; any other reason is."""
    not_sent = not answered and why is not None and all(w.startswith(NOT_SENT) for w in why.split("; "))
    return not_sent, why is not None and not not_sent
