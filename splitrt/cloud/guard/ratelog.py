"""A log a flood cannot fill: the first ``burst`` events of a kind per interval are logged, the rest
counted into one ``suppressed`` line per interval (with the busiest peers); served requests too
(``request``), unless ``every_request``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from splitrt.cloud.capacity.admission import current_client
from splitrt.cloud.common import log_event

__all__ = ["RateLog"]


class RateLog:
    def __init__(
        self,
        *,
        interval_s: float = 10.0,
        burst: int = 5,
        every_request: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self.every_request = every_request
        self._clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._logged: Counter[str] = Counter()
        self._suppressed: Counter[str] = Counter()
        self._peers: Counter[str] = Counter()
        self._kinds: dict[tuple[str, str], str] = {}

    def event(self, event: str, level: int = logging.WARNING, *, peer: str = "", kind: str = "", **fields: Any) -> None:
        """Log ``event`` now, or count it in the interval's summary when its kind (``kind``, by default the
        event's name) has had its burst."""
        if self._admit(kind or event, peer):
            log_event(event, level, peer=peer, **fields)

    def _admit(self, kind: str, peer: str) -> bool:
        """True when an event of ``kind`` is to be logged now; else it is counted for the summary."""
        self.flush()
        with self._lock:
            if self._logged[kind] >= self.burst:
                self._suppressed[kind] += 1
                if peer and (peer in self._peers or len(self._peers) < 1024):  # bounded: peers are clients'
                    self._peers[peer] += 1
                return False
            self._logged[kind] += 1
            return True

    def request(
        self,
        event: str,
        level: int = logging.INFO,
        *,
        code: str,
        lazy: Callable[[], dict[str, Any]] | None = None,
        **fields: Any,
    ) -> None:
        """One served request: logged (``every_request``, or within its code's ``burst``), else counted as
        ``<event>:<code>``; ``lazy()``: more fields, made only for a line logged."""
        peer = current_client()
        if self.every_request or self._admit(self._kinds.get((event, code)) or self._kind(event, code), peer):
            log_event(event, level, peer=peer, code=code, **fields, **(lazy() if lazy is not None else {}))

    def _kind(self, event: str, code: str) -> str:
        kind = self._kinds[(event, code)] = f"{event}:{code}"  # bounded: events and status codes are few
        return kind

    def flush(self, force: bool = False) -> None:
        """At the end of an interval: one ``suppressed`` line if anything was (the watchdog calls this
        every tick, so the summary comes even when the flood stopped)."""
        now = self._clock()
        if not force and now - self._start < self.interval_s:  # most calls: no lock (checked again under it)
            return
        with self._lock:
            if not force and now - self._start < self.interval_s:
                return
            counts, peers, elapsed = dict(self._suppressed), self._peers.most_common(5), now - self._start
            self._start = now
            self._logged.clear()
            self._suppressed.clear()
            self._peers.clear()
        if counts:
            log_event("suppressed", logging.WARNING, interval_s=round(elapsed, 3), counts=counts, top_peers=dict(peers))
