"""Model work (an upload's check, the making of tail segments) in spawned child processes at ``NICE``: it
holds none of the server's GIL, and the kernel runs requests first. ``Children.run(fn, *args)`` returns
``fn(*args)`` or re-raises its ``RpcFailure``; a killed child is RESOURCE_EXHAUSTED, a run after or cut by
``stop(final=True)`` UNAVAILABLE. With ``idle_s``, idle children are stopped; orphans exit.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import grpc

from splitrt.cloud.common import RpcFailure

__all__ = ["NICE", "Children", "noop"]

NICE = 10


def child_init(parent: int, modules: tuple[str, ...]) -> None:
    """A child's initializer: import ``modules`` (at the server's priority), then lower it to ``NICE``;
    exit when ``parent`` is gone."""
    for name in modules:
        importlib.import_module(name)
    os.nice(NICE)

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """In the child: (True, ``fn(*args)``), or (False, (code name, message)) for an ``RpcFailure``."""
    from splitrt.cloud.capacity.memory import trim

    try:
        return True, fn(*args)
    except RpcFailure as exc:
        return False, (exc.code.name, exc.message)
    finally:
        trim()


def noop() -> None:
    """Nothing, in a child: a pool starts its process on its first task (``warm``)."""


class Children:
    """A pool of ``max_workers`` child processes at ``NICE``, started on first use or ``warm``."""

    def __init__(
        self, what: str, *, max_workers: int = 1, imports: tuple[str, ...] = (), idle_s: float | None = None
    ) -> None:
        self.what = what
        self.max_workers = max_workers
        self.imports = imports
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._final = False
        self._busy = 0
        self._last_used = 0.0

    def _ensure(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._final:  # a call still running after the server stopped: no new children
                raise RpcFailure(grpc.StatusCode.UNAVAILABLE, f"the server is shutting down: no {self.what} now")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.max_workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=child_init,
                    initargs=(os.getpid(), self.imports),
                )
            self._busy += 1
            return self._pool

    def _done(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_used = time.monotonic()
        if self.idle_s is not None:
            timer = threading.Timer(self.idle_s, self._stop_if_idle)
            timer.daemon = True
            timer.start()

    def warm(self) -> None:
        """Start the children now, so the first piece of work does not wait for a fresh interpreter."""
        pool = self._ensure()
        try:
            for _ in range(self.max_workers):
                pool.submit(noop)
        finally:
            self._done()

    def run(self, fn: Callable[..., Any], *args: Any, what: str | None = None) -> Any:
        what = what or self.what
        pool = self._ensure()
        try:
            ok, result = pool.submit(_call, fn, args).result()
        except BrokenProcessPool as exc:  # stopped by a final ``stop``, or killed (out of memory, most likely)
            with self._lock:
                if self._pool is pool:
                    self._pool = None
                final = self._final
            if final:
                raise RpcFailure(
                    grpc.StatusCode.UNAVAILABLE, f"the server is shutting down: {what} was not finished"
                ) from exc
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{what}: expected its process to finish, got it killed (out of memory?)",
            ) from exc
        finally:
            self._done()
        if not ok:
            raise RpcFailure(grpc.StatusCode[result[0]], result[1])
        return result

    def _stop_if_idle(self) -> None:
        assert self.idle_s is not None
        with self._lock:
            if self._pool is None or self._busy or time.monotonic() - self._last_used < self.idle_s - 0.5:
                return
            pool, self._pool = self._pool, None
        pool.shutdown(wait=False)

    def stop(self, *, terminate: bool = False, final: bool = False) -> None:
        """Stop the children: wait for the work in progress, or (``terminate``) abandon it; the next run
        starts new ones unless ``final``."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._final = self._final or final
        if pool is None:
            return
        if terminate:
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=terminate)
