"""How busy the server is: bounded admission of requests, and the host CPU it reports as load."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import psutil

from splitrt.cloud.common import RpcFailure
from splitrt.cloud.memory import MemoryBudget
from splitrt.errors import ConfigError


class Admission:
    """Bounded admission: ``workers`` run, ``max_queue`` wait, the rest are refused."""

    def __init__(self, workers: int, max_queue: int) -> None:
        if workers < 1 or max_queue < 0:
            raise ConfigError(f"workers >= 1 and max_queue >= 0 expected, got {workers} and {max_queue}")
        self.workers = workers
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(workers)
        self.admitted = 0
        self.running = 0

    def admit(self) -> bool:
        with self._lock:
            if self.admitted >= self.workers + self.max_queue:
                return False
            self.admitted += 1
            return True

    def acquire(self, timeout_s: float) -> bool:
        ok = self._slots.acquire(timeout=max(0.0, timeout_s))
        if ok:
            with self._lock:
                self.running += 1
        return ok

    def release_slot(self) -> None:
        with self._lock:
            self.running -= 1
        self._slots.release()

    def leave(self) -> None:
        with self._lock:
            self.admitted -= 1


@contextmanager
def admitted(
    admission: Admission, budget: MemoryBudget, what: str, nbytes: int, *, slot_timeout_s: float | None = None
) -> Iterator[None]:
    """Probe and uploads are admitted like inference: a place among the admitted (RESOURCE_EXHAUSTED
    when full), their bytes reserved in the budget, and with ``slot_timeout_s`` a worker slot (an
    upload's check computes like a request)."""
    if not admission.admit():
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what}: server busy, queue depth {admission.admitted}, expected at most "
            f"{admission.workers + admission.max_queue} (workers + queue)",
            retry_after_ms=1000.0,
        )
    try:
        held = budget.reserve(nbytes, what)
        try:
            if slot_timeout_s is None:
                yield
                return
            if not admission.acquire(min(slot_timeout_s, 86400.0)):
                raise RpcFailure(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{what}: expected a worker slot within the deadline, got none free in time",
                )
            try:
                yield
            finally:
                admission.release_slot()
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
                self._value = float(psutil.cpu_percent(interval=None))
                self._t = now
            return self._value
