"""How busy the server is: bounded admission of requests, and the host CPU it reports as load."""

from __future__ import annotations

import threading
import time

import psutil

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
