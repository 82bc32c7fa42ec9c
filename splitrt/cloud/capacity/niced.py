"""Runs that yield the CPU: ``NicePool.call`` runs ``fn`` on threads ``nice`` steps below the server's
priority (a client over its share, an upload's tail, a run-limited segment) and returns or raises what it
did; the caller keeps the worker slot, deadline and memory. Own threads: an unprivileged thread cannot
raise its priority again. Linux only (elsewhere ``setpriority`` renices the process): else inline.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from splitrt.errors import ConfigError

__all__ = ["DEFAULT_NICE", "NicePool"]

DEFAULT_NICE = 10

T = TypeVar("T")


def _lower(steps: int) -> None:
    """This thread ``steps`` nice values below the thread that started it (the server's priority)."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):  # not allowed here (a sandbox): the thread runs at the usual priority
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))


class NicePool:
    """``threads`` threads ``nice`` steps below the server's priority (0: disabled, ``call`` runs inline)."""

    def __init__(self, threads: int, nice: int = DEFAULT_NICE) -> None:
        if threads < 1 or not 0 <= nice <= 19:
            raise ConfigError(f"NicePool: expected threads >= 1 and 0 <= nice <= 19, got {threads} and {nice}")
        self.threads = threads
        self.nice = nice
        self.enabled = nice > 0 and sys.platform.startswith("linux")
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if not self.enabled:
            return fn(*args, **kwargs)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.threads,
                    thread_name_prefix="splitrt-niced",
                    initializer=_lower,
                    initargs=(self.nice,),
                )
            pool = self._pool
        return pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """No new runs here; those running finish (their deadline's terminate still reaches them)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self.enabled = False
        if pool is not None:
            pool.shutdown(wait=False)  # one thread per worker slot: nothing queued here to cancel
