"""An upload's check in a child process at a lower CPU priority, so a client's heavy upload delays mostly
itself.

Checking a large upload (parse, normalise, shape inference, cut enumeration) is mostly Python holding the
interpreter's lock; in a child it holds none of the server's, and at ``NICE`` the kernel runs requests
first. The check takes no worker slot, but still a place among the admitted and its memory in the server's
budget (``admission.admitted``).

One child, started when a server that accepts uploads starts (``warm``) or on first use (``spawn``: a
clean interpreter, its imports done before it lowers its priority), shut down after ``IDLE_S`` without a
check; it exits by itself if the server goes away.
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

__all__ = ["IDLE_S", "NICE", "child_init", "run", "shutdown", "warm"]

# The child's niceness: below the server's requests, still above nothing.
NICE = 10
# A child without a check for this long is shut down (its memory back to the OS).
IDLE_S = 300.0

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_last_used = 0.0
_busy = 0


# What a check needs imported (the upload module's check loads a model through the store).
_CHECK_IMPORTS = ("onnx", "splitrt.cloud.models.store", "splitrt.graph.model")


def child_init(parent: int, *modules: str) -> None:
    """A worker child's initializer: ``modules`` imported first (at the server's priority: work should not
    wait seconds for its imports on a busy host), then the lower priority ``NICE``; the child exits when
    the server ``parent`` that started it is gone."""
    for name in modules:
        importlib.import_module(name)
    os.nice(NICE)

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphaned, daemon=True).start()


def _call(fn: Callable[..., None], args: tuple[Any, ...]) -> tuple[str, str] | None:
    """In the child: ``fn(*args)``; an ``RpcFailure`` comes back as (code name, message)."""
    from splitrt.cloud.capacity.memory import trim

    try:
        fn(*args)
        return None
    except RpcFailure as exc:
        return exc.code.name, exc.message
    finally:
        trim()


def _ensure() -> ProcessPoolExecutor:
    """Under ``_lock``: the pool, started if there is none."""
    global _pool
    if _pool is None:
        ctx = multiprocessing.get_context("spawn")
        _pool = ProcessPoolExecutor(
            max_workers=1, mp_context=ctx, initializer=child_init, initargs=(os.getpid(), *_CHECK_IMPORTS)
        )
    return _pool


def warm() -> None:
    """Start the child now (a server that accepts uploads, at start), so the first upload does not wait
    for a fresh interpreter; it stops after ``IDLE_S`` without a check, like any."""
    global _last_used
    with _lock:
        pool = _ensure()
        _last_used = time.monotonic()
    pool.submit(_noop)  # the pool starts its process on the first task
    timer = threading.Timer(IDLE_S, _shutdown_if_idle)
    timer.daemon = True
    timer.start()


def _noop() -> None:
    pass


def run(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` in the checker child (``fn`` a module-level function, raising ``RpcFailure`` to refuse)."""
    global _pool, _busy, _last_used
    with _lock:
        pool = _ensure()
        _busy += 1
    try:
        result = pool.submit(_call, fn, args).result()
    except BrokenProcessPool as exc:  # the child died (killed: out of memory, most likely)
        with _lock:
            if _pool is pool:
                _pool = None
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "upload check: expected its process to finish, got it killed (out of memory?); nothing stored",
        ) from exc
    finally:
        with _lock:
            _busy -= 1
            _last_used = time.monotonic()
        timer = threading.Timer(IDLE_S, _shutdown_if_idle)
        timer.daemon = True
        timer.start()
    if result is not None:
        raise RpcFailure(grpc.StatusCode[result[0]], result[1])


def _shutdown_if_idle() -> None:
    global _pool
    with _lock:
        if _pool is None or _busy or time.monotonic() - _last_used < IDLE_S - 0.5:
            return
        pool, _pool = _pool, None
    pool.shutdown(wait=False)


def shutdown() -> None:
    """Stop the child now and wait for it (a check in progress finishes first); the next check starts a
    new one. For whoever owns the process's lifetime: tests stop it after the test that started it."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)
