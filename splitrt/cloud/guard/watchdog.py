"""Time limits on what a client holds: a ``Lease`` per call, armed while the server waits on the client
(a request body, the next stream frame or upload chunk, the client taking a reply; a Watch stream's
whole life) and cancelled with a gRPC status by the ``Watchdog`` thread when it runs out. A call that
ends sets ``Lease.ended``; the watchdog forgets the lease at its next step (the call's end touches no
lock but its own).

gRPC's synchronous server waits for a request message with no timeout of its own; cancelling the call
from another thread ends the wait (the handler's read raises) and answers with the lease's status.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from splitrt.cloud.common import log

__all__ = ["Lease", "Watchdog", "cancel_call"]


def cancel_call(context: Any, code: grpc.StatusCode, details: str) -> None:
    """End a server call from any thread with ``code`` and ``details`` (grpcio's servicer context has no
    public form of this with a status; ``context.cancel()``, CANCELLED, is the fallback)."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        if call is not None:
            call.cancel(code.value[0], details)
            return
    except Exception:  # a grpcio without the private call object: plain cancel below
        log.debug("cancel with status failed; cancelling plainly", exc_info=True)
    context.cancel()


class Lease:
    """One call's time limit; ``arm`` before waiting on the client, ``disarm`` after."""

    __slots__ = ("_clock", "code", "context", "deadline_s", "ended", "fired", "life", "reason")

    def __init__(self, context: Any, clock: Callable[[], float]) -> None:
        self.context = context
        self._clock = clock
        self.deadline_s: float | None = None
        self.code = grpc.StatusCode.DEADLINE_EXCEEDED
        self.reason = ""
        self.fired = False  # the watchdog ended the call
        self.ended = False  # the call ended: the watchdog forgets the lease on its next step
        # A cap on the call's whole life (a Watch stream), kept while ``arm``/``disarm`` come and go.
        self.life: tuple[float, str, grpc.StatusCode] | None = None

    def arm(self, timeout_s: float, reason: str, code: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED) -> None:
        self.code, self.reason = code, reason
        self.deadline_s = self._clock() + timeout_s

    def disarm(self) -> None:
        self.deadline_s = None

    def arm_life(self, timeout_s: float, reason: str, code: grpc.StatusCode) -> None:
        self.life = (self._clock() + timeout_s, reason, code)

    def due(self, now_s: float) -> bool:
        """True when a limit ran out (then ``code``/``reason`` say which)."""
        if self.fired or self.ended:
            return False
        if self.life is not None and now_s >= self.life[0]:
            _, self.reason, self.code = self.life
            return True
        return self.deadline_s is not None and now_s >= self.deadline_s


class Watchdog:
    """A daemon thread that ends calls whose lease ran out, every ``tick_s``; ``on_tick`` callables run
    on the same thread (the rate-limited log's summary)."""

    def __init__(
        self,
        *,
        tick_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tick_s = tick_s
        self._clock = clock
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_tick: list[Callable[[], None]] = []

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="splitrt-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def lease(self, context: Any) -> Lease:
        lease = Lease(context, self._clock)
        with self._lock:
            self._leases.add(lease)
        return lease

    def held(self) -> int:
        with self._lock:
            return sum(not x.ended for x in self._leases)

    def check(self) -> int:
        """Forget the leases of ended calls; end every call whose lease ran out; returns how many (the
        thread's one step)."""
        now = self._clock()
        with self._lock:
            self._leases = {x for x in self._leases if not x.ended}
            due = [x for x in self._leases if x.due(now)]
            for lease in due:
                lease.fired = True
        for lease in due:
            cancel_call(lease.context, lease.code, lease.reason)
        return len(due)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.check()
                for hook in self.on_tick:
                    hook()
            except Exception:  # the watchdog must outlive any one bad call
                log.exception("watchdog step failed")
