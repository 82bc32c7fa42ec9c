"""What a client holds, bounded: a ``Lease`` per call, armed while the server waits on the client, is
cancelled with its gRPC status by the ``Watchdog`` thread when it runs out (that ends gRPC's unbounded
wait for a message). It owns the bytes of replies not yet taken (``hold``/``unhold``); ``Lease.end``, the
call's one end path, gives them back and runs ``on_end``.
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


def _nothing() -> None:
    pass


class Lease:
    """One call's time limit (``arm`` before waiting on the client, ``disarm`` after) and the bytes it holds
    until it ends (``hold``); ``end`` once the call ends, from any thread, any number of times."""

    __slots__ = (
        "_clock",
        "_give_back",
        "_lock",
        "_on_end",
        "code",
        "context",
        "deadline_s",
        "ended",
        "fired",
        "held_bytes",
        "life",
        "reason",
    )

    def __init__(
        self,
        context: Any,
        clock: Callable[[], float],
        *,
        give_back: Callable[[int], None] = lambda nbytes: None,
        on_end: Callable[[], None] = lambda: None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.context = context
        self._clock = clock
        self._give_back = give_back
        self._on_end = on_end
        # Held for a few bytecodes: a watchdog's leases share one (no lock made per call).
        self._lock = lock if lock is not None else threading.Lock()
        self.held_bytes = 0  # reserved by the owner, given back (``give_back``) when the call ends
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

    def hold(self, nbytes: int) -> bool:
        """Own ``nbytes`` the caller reserved until the call ends; False (nothing owned: the caller gives them
        back) when it has ended already."""
        with self._lock:
            if self.ended:
                return False
            self.held_bytes += nbytes
            return True

    def unhold(self, nbytes: int) -> None:
        """Give back ``nbytes`` of those held (a streamed reply the client took) now, not at the call's end."""
        with self._lock:
            nbytes = min(nbytes, self.held_bytes)
            self.held_bytes -= nbytes
        if nbytes > 0:
            self._give_back(nbytes)

    def end(self) -> None:
        """The call ended: the watchdog forgets the lease, its bytes go back, ``on_end`` runs; once."""
        with self._lock:
            if self.ended:
                return
            self.ended = True
            nbytes, self.held_bytes = self.held_bytes, 0
            # Dropped: an owner's bound method closes a cycle (owner -> lease -> owner) that held the
            # call's gRPC state until the collector ran (~20 objects a call, a gen-0 pass per ~30 calls).
            on_end, self._on_end = self._on_end, _nothing
        if nbytes:
            self._give_back(nbytes)
        on_end()

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
        self._leases_lock = threading.Lock()  # the leases' own (``Lease.hold``, ``end``): not held with ``_lock``
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

    def lease(
        self,
        context: Any,
        *,
        give_back: Callable[[int], None] = lambda nbytes: None,
        on_end: Callable[[], None] = lambda: None,
    ) -> Lease:
        """A lease for the call ``context``: its bytes go back through ``give_back``, then ``on_end`` runs,
        when it ends (``Lease.end``)."""
        lease = Lease(context, self._clock, give_back=give_back, on_end=on_end, lock=self._leases_lock)
        with self._lock:
            self._leases.add(lease)
        return lease

    def held(self) -> int:
        with self._lock:
            return sum(not x.ended for x in self._leases)

    def held_bytes(self) -> int:
        """The bytes the calls not yet ended hold (``Lease.hold``)."""
        with self._lock:
            return sum(x.held_bytes for x in self._leases)

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
