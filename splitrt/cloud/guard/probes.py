"""Probes paid for before their body is read: the front door holds 3 x the payload + reply bytes a call
declares (``wire.PROBE_BYTES_KEY``; undeclared: the worst case) in the memory budget, at most
``PROBE_BUDGET_SHARE`` of it and never evicting; an RTT ping (<= ``PROBE_FREE_BYTES``) holds nothing. An
address whose probe body was read and then refused has its next ones refused unread for
``PROBE_PENALTY_S``. ``ProbeGate`` is thread-safe.
"""

from __future__ import annotations

import threading
from typing import Any

from splitrt.cloud.capacity.memory import MemoryBudget
from splitrt.transport import wire

__all__ = ["ProbeGate", "declared"]

#: Probes carrying less than this (payload + reply) are not admitted (RTT pings).
PROBE_FREE_BYTES = 64 * 1024
#: The largest reply a Probe may ask for: devices probe with at most 1 MiB (``netmon.suggest_probe_bytes``).
PROBE_MAX_REPLY_BYTES = 16 << 20
#: The largest payload a Probe may send, for the same reason: receiving a message holds gRPC's polling
#: thread (and the interpreter) while it is copied.
PROBE_MAX_PAYLOAD_BYTES = 16 << 20
# Probes together hold at most this share of the memory budget (the rest is inference's).
PROBE_BUDGET_SHARE = 0.5
PROBE_PENALTY_S = 60.0
_MAX_PENALISED = 4096  # addresses remembered; the expired are forgotten first


def declared(metadata: Any) -> int | None:
    for key, value in metadata or ():
        if key == wire.PROBE_BYTES_KEY:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
            return int(text) if text.isdigit() and len(text) <= 19 else None
    return None


class ProbeGate:
    def __init__(self, budget: MemoryBudget, max_message_bytes: int) -> None:
        self.budget = budget
        self.max_message_bytes = max_message_bytes
        self.held_bytes = 0
        self.penalty: dict[str, float] = {}  # address -> until (the caller's clock)
        self._lock = threading.Lock()

    @property
    def cap_bytes(self) -> int:
        return PROBE_MAX_PAYLOAD_BYTES + min(PROBE_MAX_REPLY_BYTES, self.max_message_bytes)

    def need_bytes(self, declared_bytes: int | None) -> int:
        if declared_bytes is not None and declared_bytes <= PROBE_FREE_BYTES:
            return 0  # an RTT ping: nothing to pay for (a lie is refused once read)
        worst = self.max_message_bytes + min(PROBE_MAX_REPLY_BYTES, self.max_message_bytes)
        return 3 * (declared_bytes if declared_bytes is not None else worst)

    def try_hold(self, nbytes: int) -> tuple[bool, float]:
        share = PROBE_BUDGET_SHARE * self.budget.available_bytes
        with self._lock:
            fits = self.held_bytes + nbytes <= share and self.budget.try_reserve(nbytes)
            if fits:
                self.held_bytes += nbytes
        return fits, share

    def release(self, nbytes: int) -> None:
        if nbytes:
            with self._lock:
                self.held_bytes -= nbytes
            self.budget.release(nbytes)

    def penalize(self, address: str, now_s: float) -> None:
        with self._lock:
            if len(self.penalty) >= _MAX_PENALISED:
                self.penalty = {a: t for a, t in self.penalty.items() if t > now_s}
            self.penalty[address] = now_s + PROBE_PENALTY_S

    def wait_s(self, address: str, now_s: float) -> float:
        with self._lock:
            return self.penalty.get(address, 0.0) - now_s
