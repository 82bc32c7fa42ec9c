"""Runs that end when they must: ``Canceller.run`` terminates a tail run (onnxruntime's
``RunOptions.terminate``, checked between kernels) and raises RpcFailure: DEADLINE_EXCEEDED at the
deadline, RESOURCE_EXHAUSTED past ``limit_s`` (``runlimit``) or over the RSS limit (the newest ``suspect``
run first, else the newest), CANCELLED on its ``CallToken``, UNAVAILABLE after ``cancel_all``.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from splitrt.cloud.capacity.arena import SHRINK_OPTION
from splitrt.cloud.capacity.memory import trim
from splitrt.cloud.common import MAX_WAIT_S, RpcFailure, log_event
from splitrt.errors import SplitrtError
from splitrt.graph import partition
from splitrt.graph.ort_errors import is_onnxruntime_error, mapped


class CallToken:
    """A call's cancellation (the client went away): the servicer fires it from gRPC's callback."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self._listeners: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            listeners, self._listeners = self._listeners, []
        for fn in listeners:
            fn()

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` on cancel (at once if already cancelled); returns how to stop listening."""
        with self._lock:
            if not self.cancelled:
                self._listeners.append(fn)
                return lambda: self._drop(fn)
        fn()
        return lambda: None

    def _drop(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)


class Run:
    """One segment run: its ``RunOptions`` and why it was terminated (None: it was not)."""

    def __init__(self, what: str, deadline: float, deadline_ms: float, limit_s: float | None = None) -> None:
        import onnxruntime as ort

        self.limit_s = limit_s
        self.options = ort.RunOptions()
        self.options.log_severity_level = 4  # a terminated run is expected here, not an error to print
        self.what = what
        self.deadline = deadline
        self.deadline_ms = deadline_ms
        self.reason: tuple[grpc.StatusCode, str] | None = None
        self.done = False
        self.suspect = False  # sizes no shape tells: first to go when memory runs out
        self.peak_rss = 0  # the process's RSS, sampled by the watch while this ran
        self.over_memory = False  # terminated by the memory watch

    def terminate(self, code: grpc.StatusCode, message: str) -> None:
        if self.reason is None and not self.done:
            self.reason = (code, message)
            self.options.terminate = True

    def failure(self, exc: BaseException) -> RpcFailure:
        """What an exception out of ``session.run`` means for the client."""
        if self.reason is not None and self.over_memory and self.peak_rss:
            return RpcFailure(
                self.reason[0], f"{self.what}: {self.reason[1]} (peak {self.peak_rss / 2**20:.0f} MB while it ran)"
            )
        if self.reason is not None:
            return RpcFailure(self.reason[0], f"{self.what}: {self.reason[1]}")
        if isinstance(exc, SplitrtError):  # onnxruntime's, mapped: the message names what and the shapes
            return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"{self.what} failed on the given tensors: {exc}")


# After a run, the watch keeps sampling at its period this long, so the next run needs no wake.
BUSY_S = 1.0
# The longest wait between two RSS samples while runs go on, however far below the limit the RSS is.
MAX_PERIOD_S = 0.05


def sample_wait_s(rss: int, limit: int, growth: int | None, period_s: float, max_s: float = MAX_PERIOD_S) -> float:
    """When to sample the RSS next: growing at most ``growth`` bytes per ``period_s``, it cannot pass
    ``limit + growth`` before then; ``period_s`` at or over ``limit``, or with no ``growth`` given."""
    if growth is None or growth <= 0 or rss >= limit:
        return period_s
    return min(max_s, max(period_s, period_s * (limit + growth - rss) / growth))


class Canceller:
    """Terminates runs at their deadline (one watchdog thread), on their call's cancel, at shutdown,
    and over the memory budget (``rss_limit_bytes``: newest run first). The RSS is sampled every
    ``period_s`` while runs go on; given ``growth_bytes`` (what it may grow per ``period_s``), less often
    while far below the limit (``sample_wait_s``)."""

    def __init__(
        self,
        *,
        rss_limit_bytes: int | None = None,
        rss: Callable[[], int] | None = None,
        period_s: float = 0.01,
        growth_bytes: int | None = None,
    ) -> None:
        self.rss_limit_bytes = rss_limit_bytes
        self._rss = rss
        self.period_s = period_s
        self.growth_bytes = growth_bytes
        self.every_s = period_s  # the wait before the next RSS sample, from the last one
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, Run]] = []
        self._seq = itertools.count()
        self._running: dict[int, Run] = {}
        self._closed = False
        self.terminated = 0
        # When the watch wakes next, and until when it samples though nothing runs: a run needing it no
        # sooner wakes nobody (a wake per request took the GIL from that request).
        self._wake_at = 0.0
        self._busy_until = 0.0
        self._thread = threading.Thread(target=self._watch, name="splitrt-canceller", daemon=True)
        self._thread.start()

    def run(
        self,
        session: Any,
        outputs: list[str],
        feeds: dict[str, Any],
        *,
        what: str,
        deadline: float,
        token: CallToken | None = None,
        limit_s: float | None = None,
        suspect: bool = False,
        shrink_arena: bool = False,
    ) -> list[Any]:
        """``session.run`` ended as the module says (``deadline``: monotonic s); INVALID_ARGUMENT when the
        run itself fails. ``suspect``: first to go over memory; ``shrink_arena``: see ``arena``."""
        now = time.monotonic()
        deadline = min(deadline, now + MAX_WAIT_S)
        capped = limit_s is not None and now + limit_s < deadline
        run = Run(what, deadline, (deadline - now) * 1e3, limit_s if capped else None)
        run.suspect = suspect
        if shrink_arena:
            run.options.add_run_config_entry(*SHRINK_OPTION)
        if capped and limit_s is not None:
            deadline = now + limit_s
        if self._closed:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, f"{what}: the server is shutting down")
        seq = next(self._seq)
        with self._lock:
            heapq.heappush(self._heap, (deadline, seq, run))
            self._running[seq] = run
            # Sampling already: the next sample is due anyway (the RSS's growth is bounded, not a run's).
            every = self.every_s if now < self._busy_until else self.period_s
            first_check = now + every if self.rss_limit_bytes is not None else deadline
            if min(deadline, first_check) < self._wake_at:
                self._lock.notify()
        unlisten = token.listen(lambda: self._call_ended(run)) if token is not None else (lambda: None)
        try:
            if now >= deadline:
                run.terminate(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before it started")
            values = session.run(outputs, feeds, run.options)
            return partition.pass_through(outputs, feeds, values)
        except Exception as exc:  # onnxruntime's mapped to InputError/ModelError; any other is this run's too
            # ``ort_errors.onnxruntime_errors``, inlined: a generator context per run cost microseconds.
            err = exc
            if is_onnxruntime_error(exc):
                err = mapped(exc, what, stage="run", feeds=feeds)
                err.__cause__ = exc
            raise run.failure(err) from err
        finally:
            run.done = True
            unlisten()
            with self._lock:
                self._running.pop(seq, None)
                if len(self._heap) > 2 * len(self._running) + 64:  # finished runs far from their deadline
                    self._heap = [e for e in self._heap if not e[2].done]
                    heapq.heapify(self._heap)
            if run.reason is not None:
                with self._lock:
                    self.terminated += 1
                if run.reason[0] == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    trim()  # a terminated run's activations back to the OS, not kept as heap
                log_event("run_terminated", what=what, code=run.reason[0].name, reason=run.reason[1])

    @staticmethod
    def _call_ended(run: Run) -> None:
        # gRPC ends a call at its deadline too (often just before the watchdog): say which it was.
        if time.monotonic() >= run.deadline - 0.05:
            run.terminate(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"ran past the request's deadline of {run.deadline_ms:.0f} ms: terminated",
            )
        else:
            run.terminate(grpc.StatusCode.CANCELLED, "the client cancelled the call: terminated")

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def cancel_all(self, code: grpc.StatusCode, message: str) -> int:
        """Terminate every run (shutdown); later runs are refused."""
        with self._lock:
            self._closed = True
            runs = list(self._running.values())
            self._lock.notify()
        for r in runs:
            r.terminate(code, message)
        return len(runs)

    def _sample(self) -> int | None:
        """The process's RSS, or None when it cannot be read now (no descriptor left): the watch must live."""
        assert self._rss is not None
        try:
            return self._rss()
        except OSError:
            return None

    def _watch(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, run = heapq.heappop(self._heap)
                    if not run.done and run.limit_s is not None:
                        run.terminate(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"ran for {run.limit_s:g} s, expected at most {run.limit_s:g} s per run on this "
                            "server (--max-run-s; derived from the segment's measured time and the model's "
                            "size): terminated",
                        )
                    elif not run.done:
                        run.terminate(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"ran past the request's deadline of {run.deadline_ms:.0f} ms: terminated",
                        )
                wait = self._heap[0][0] - now if self._heap else MAX_WAIT_S
                if self._running:
                    self._busy_until = now + BUSY_S
                if self.rss_limit_bytes is not None and now < self._busy_until:
                    wait = min(wait, self.every_s)
                wait = max(0.001, min(wait, MAX_WAIT_S))
                self._wake_at = now + wait
                self._lock.wait(timeout=wait)
                self._wake_at = 0.0  # awake: a new run needs no notify to be seen
                runs = sorted(self._running.items())
            newest = max(runs, key=lambda sr: (sr[1].suspect, sr[0]))[1] if runs else None
            if newest is not None and self.rss_limit_bytes is not None and self._rss is not None:
                rss = self._sample()
                if rss is None:
                    self.every_s = self.period_s
                    continue
                for _, r in runs:
                    r.peak_rss = max(r.peak_rss, rss)
                if rss > self.rss_limit_bytes:  # freed but kept by malloc does not count against a run
                    trim()  # a terminated run's activations back to the OS, not kept as heap
                    rss = self._sample() or rss
                self.every_s = sample_wait_s(rss, self.rss_limit_bytes, self.growth_bytes, self.period_s)
                if rss > self.rss_limit_bytes:
                    if newest.reason is None and not newest.done:  # later samples must not clear it
                        newest.over_memory = True
                    newest.terminate(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the server's memory reached {rss / 2**20:.0f} MB while it ran, expected at "
                        f"most {self.rss_limit_bytes / 2**20:.0f} MB (--max-memory-mb): terminated",
                    )
