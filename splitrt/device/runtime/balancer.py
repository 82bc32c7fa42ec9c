"""The runtime's cloud order per request: what the device knows of each cloud, handed to the pure
``plan.balance`` (least expected queue + RTT first, ties in turn), and the record that replays it."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from splitrt.device.runtime.clouds import Cloud
from splitrt.plan.balance import BalanceConfig, Candidate, Choice, choose


class Balancer:
    """Orders the admitting clouds for each request (thread-safe: one turn per request)."""

    def __init__(self, config: BalanceConfig | None = None) -> None:
        self.config = config or BalanceConfig()
        self._turn = 0
        self._lock = threading.Lock()

    def order(self, clouds: Sequence[Cloud], now_s: float) -> tuple[list[Cloud], Choice]:
        """``clouds`` in the order to try, and the choice (its inputs) for the decision log. Read under
        the runtime's lock by the caller: the queue estimates and in-flight counts move together."""
        with self._lock:
            turn = self._turn
            self._turn += 1
        cands = [
            Candidate(
                address=c.address,
                queue_ms=c.queue.estimate(now_s),
                rtt_ms=c.rtt_ms,
                inflight=c.inflight,
                service_ms=c.queue.service_ms,
                workers=max(1, c.workers),
            )
            for c in clouds
        ]
        choice = choose(cands, turn=turn, config=self.config)
        by_address = {c.address: c for c in clouds}
        return [by_address[a] for a in choice.order], choice
