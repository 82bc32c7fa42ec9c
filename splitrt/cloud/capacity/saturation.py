"""Health NOT_SERVING while admission has been saturated for ``threshold_s`` (``Limits.saturated_s``),
SERVING again once it is not: ``Saturation`` is the pure decision, ``HealthGate.tick`` applies it to the
``grpc_health`` servicer (``""`` and the SplitInference service) on the watchdog's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from splitrt.cloud.common import log_event
from splitrt.transport import wire

__all__ = ["HealthGate", "Saturation", "saturated"]


def saturated(admission: Any, door: Any) -> bool:
    """Every worker and queue place is held (``admission.Admission``), or the inference lane is full
    (``guard.door.FrontDoor``)."""
    full = admission.admitted >= admission.workers + admission.max_queue
    return bool(full or door.inside["infer"] >= door.caps["infer"])


class Saturation:
    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.since_s: float | None = None  # when the current saturated spell began

    def update(self, saturated: bool, now_s: float) -> bool:
        if not saturated:
            self.since_s = None
            return False
        if self.since_s is None:
            self.since_s = now_s
        return now_s - self.since_s >= self.threshold_s


class HealthGate:
    """Called from one thread (the watchdog's)."""

    def __init__(
        self,
        health: Any,
        saturated: Callable[[], bool],
        threshold_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.health, self.saturated, self.clock = health, saturated, clock
        self.saturation = Saturation(threshold_s)
        self.degraded = False

    def tick(self) -> None:
        now = self.clock()
        degraded = self.saturation.update(self.saturated(), now)
        if degraded == self.degraded:
            return
        self.degraded = degraded
        if degraded:
            log_event("saturated", seconds=self.saturation.threshold_s, health="NOT_SERVING")
        else:
            log_event("unsaturated", health="SERVING")
        from grpc_health.v1 import health_pb2

        serving = health_pb2.HealthCheckResponse
        for name in ("", wire.SERVICE_NAME):
            self.health.set(name, serving.NOT_SERVING if degraded else serving.SERVING)
