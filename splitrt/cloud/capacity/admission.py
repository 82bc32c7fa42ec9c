"""How busy the server is: bounded admission of requests (``fairq`` decides who runs next), and the load
(``pb.Load``) every reply, ``Probe`` and ``Status`` carries. A full queue is refused before anything is
decoded: RESOURCE_EXHAUSTED with ``retry-after-ms`` (``wire.RETRY_AFTER_KEY``; stream frames:
``Error.retry_after_ms``), the expected wait of a request arriving now.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc
import psutil

from splitrt.cloud.capacity.fairq import RUN, FairConfig, FairQueue
from splitrt.cloud.capacity.memory import MemoryBudget
from splitrt.cloud.common import RpcFailure
from splitrt.errors import ConfigError
from splitrt.transport import splitrt_pb2 as pb

T = TypeVar("T")


class Admission:
    """``workers`` run, ``max_queue`` wait, the rest are refused (``admit``/``leave``); ``run`` holds a worker
    for ``fn``'s run, per client (``serving``; in-process calls are the client ``""``)."""

    def __init__(
        self,
        workers: int,
        max_queue: int,
        *,
        heavy_workers: int | None = None,
        active_window_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if workers < 1 or max_queue < 0:
            raise ConfigError(f"workers >= 1 and max_queue >= 0 expected, got {workers} and {max_queue}")
        if heavy_workers is not None and heavy_workers < 1:
            raise ConfigError(f"heavy_workers: expected >= 1, got {heavy_workers}")
        self.workers = workers
        self.max_queue = max_queue
        self.queue = FairQueue(
            FairConfig(workers=workers, heavy_workers=heavy_workers, active_window_s=active_window_s)
        )
        self._clock = clock
        self._lock = threading.Lock()
        # A waiting ticket's lock, held until a dispatch grants it (None: in ``run``'s first dispatch); a
        # bare lock, not an Event: a Condition and its waiter list per queued request cost more.
        self._granted: dict[int, threading.Lock | None] = {}
        self._now: set[int] = set()  # tickets granted, not yet seen by their ``run``
        self._tickets = itertools.count(1)
        self._over_share: set[int] = set()  # granted tickets of clients over their share (``fairq.over_share``)
        self.admitted = 0
        self.running = 0
        self.cpu = CpuMeter()

    def enter(self, what: str, retry_after_ms: Callable[[], float]) -> None:
        """A place among the admitted (``leave`` gives it back), or RESOURCE_EXHAUSTED naming ``what`` and
        the hint ``retry_after_ms()``."""
        with self._lock:
            full = self.admitted >= self.workers + self.max_queue
            self.admitted += int(not full)
        if full:
            hint = retry_after_ms()
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{what}: server busy, queue depth {self.admitted}, expected at most {self.workers + self.max_queue}"
                f" (workers {self.workers} + queue {self.max_queue}); retry after {hint:g} ms",
                retry_after_ms=hint,
            )

    def run(self, fn: Callable[[bool], T], timeout_s: float, *, what: str, kind: str = RUN) -> T:
        """``fn(yielding)`` in a worker of ``kind`` waited for up to ``timeout_s`` (DEADLINE_EXCEEDED naming
        ``what``); ``yielding``: the client is over its share (its run should yield the CPU)."""
        t0 = time.monotonic()
        ticket = next(self._tickets)
        end = t0 + max(0.0, timeout_s)
        with self._lock:
            self._granted[ticket] = None
            self.queue.arrive(ticket, current_client(), kind, self._clock())
            self._dispatch()
            granted = ticket in self._now
            if granted:  # a worker at once (nothing contends): no lock to wait on, no second round
                self._now.remove(ticket)
                del self._granted[ticket]
                self.running += 1
                yielding = ticket in self._over_share
            else:
                ready = self._granted[ticket] = threading.Lock()
                ready.acquire()
        if not granted:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    break
                if ready.acquire(timeout=min(left, REDISPATCH_S)):
                    break
                with self._lock:  # also now and then: the per-client cap loosens when others go quiet
                    self._dispatch()
            with self._lock:
                del self._granted[ticket]
                granted = ticket in self._now  # a grant racing the timeout is kept
                if granted:
                    self._now.remove(ticket)
                    self.running += 1
                    yielding = ticket in self._over_share
                else:
                    self.queue.cancel(ticket, self._clock())
                    self._dispatch()
        if not granted:
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"waited {(time.monotonic() - t0) * 1e3:.1f} ms for a worker ({what}): expected one within "
                "the deadline",
            )
        try:
            return fn(yielding)
        finally:
            with self._lock:
                if self._over_share:
                    self._over_share.discard(ticket)
                self.queue.finish(ticket, self._clock())
                self.running -= 1
                self._dispatch()

    def leave(self) -> None:
        with self._lock:
            self.admitted -= 1

    def load(self, service_ms: float) -> pb.Load:
        """How busy the server is now, as every reply, Probe and Status carries it."""
        return pb.Load(
            queue_depth=self.admitted,
            running=self.running,
            workers=self.workers,
            cpu_percent=self.cpu.percent(),
            service_ms=service_ms,
            max_queue=self.max_queue,
        )

    def load_factor(self) -> float:
        """Load as a multiplier of tail compute time (1.0 = idle; discovery's TXT ``load``)."""
        cpu = min(self.cpu.percent(), 95.0) / 100.0
        return max(1.0, self.admitted / max(1, self.workers), 1.0 / (1.0 - cpu))

    def _dispatch(self) -> None:
        """Under ``_lock``: grant free workers and wake their threads."""
        now = self._clock()
        for ticket in self.queue.dispatch(now):
            if self.queue.over_share(self.queue.running[ticket].client, now):
                self._over_share.add(ticket)
            self._now.add(ticket)
            ready = self._granted[ticket]
            if ready is not None:  # else its thread is in ``run``'s first dispatch, under this lock
                ready.release()


_serving = threading.local()  # the client of the call a thread serves (set by the front door)
REDISPATCH_S = 0.1


def serving(client: str) -> None:
    """The calling thread now serves ``client`` (the front door, before a call's handler runs)."""
    _serving.client = client


def current_client() -> str:
    try:
        return _serving.client  # a str (``serving``); no getattr call per run
    except AttributeError:
        return ""


def prepay(nbytes: int) -> None:
    """The front door reserved ``nbytes`` for this thread's call: ``admitted`` reserves only the rest."""
    _serving.prepaid = nbytes


def prepaid() -> int:
    return int(getattr(_serving, "prepaid", 0))


@contextmanager
def admitted(admission: Admission, budget: MemoryBudget, what: str, nbytes: int) -> Iterator[None]:
    """A place among the admitted (RESOURCE_EXHAUSTED when full) and ``nbytes`` reserved; no worker slot
    (Probe and uploads)."""
    admission.enter(what, lambda: 1000.0)
    try:
        held = budget.reserve(max(0, nbytes - prepaid()), what)
        try:
            yield
        finally:
            budget.release(held)
    finally:
        admission.leave()


class CpuMeter:
    """Host CPU utilisation, refreshed at most every ``period_s`` (psutil's non-blocking form)."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self._lock = threading.Lock()
        psutil.cpu_percent(interval=None)
        self._t = time.monotonic()
        self._value = 0.0

    def percent(self) -> float:
        with self._lock:
            now = time.monotonic()
            if now - self._t >= self.period_s:
                # No descriptor left for /proc/stat: the last figure stands.
                with contextlib.suppress(OSError):
                    self._value = float(psutil.cpu_percent(interval=None))
                self._t = now
            return self._value
