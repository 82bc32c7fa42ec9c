"""The server's memory budget: one ledger of the bytes it holds beyond its baseline, and the estimates
(``*_bytes``) of what it decides to hold; ``cancel.Canceller`` checks the real RSS beside them. The design and
the measurements behind each factor: docs/operator/limits.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import grpc
import psutil

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.errors import ConfigError

MB = 1 << 20
#: Frees at least ``n`` bytes of unused cache entries if it can (``MemoryBudget.add_evictor``).
Evictor = Callable[[int, "str | None"], int]
#: ``splitrt serve``'s default: the Kubernetes manifest's 2 GiB less 1/8 that no estimate sees.
DEFAULT_MAX_MEMORY_BYTES = 1792 * MB
#: Largest peak activation memory one request may need (``--max-request-mb``).
DEFAULT_MAX_REQUEST_BYTES = 256 * MB

# Estimated from the segment before the session exists (an RSS delta is wrong when builds overlap).
SESSION_BYTES_FACTOR = 2.0
SESSION_BYTES_FIXED = 8 * MB
BUILD_PEAK_FACTOR = 4.5
# A loaded ``ModelGraph``: the normalised proto plus per-node Python objects.
GRAPH_BYTES_FACTOR = 1.3
GRAPH_BYTES_PER_NODE = 4 * 1024
# Added to the RSS measured at start: gRPC's server and the first session's one-time set-up.
STARTUP_BYTES = 32 * MB
# Loading a model transiently holds copies of its proto.
LOAD_PEAK_FACTOR = 4


def build_peak_bytes(model_initializer_bytes: int) -> int:
    """Reserved while a tail session builds, from the whole model's weights."""
    return int(model_initializer_bytes * BUILD_PEAK_FACTOR) + SESSION_BYTES_FIXED


SESSION_PEAK_FACTOR = 3.5  # a session opened from a segment's file (``builder``)
CHILD_BUILD_FACTOR = 4.5  # the builder's child making a segment
# Children at rest (the same pod's memory); the checker's comes and goes, so it is counted all the time.
TRACKER_RESIDENT_BYTES = 13 * MB
BUILDER_RESIDENT_BYTES = 100 * MB
CHECKER_RESIDENT_BYTES = 84 * MB


def children_resident_bytes(*, builder: bool, checker: bool) -> int:
    """What a server's child processes hold at rest, counted in its baseline."""
    total = (BUILDER_RESIDENT_BYTES if builder else 0) + (CHECKER_RESIDENT_BYTES if checker else 0)
    return total + (TRACKER_RESIDENT_BYTES if checker and not builder else 0)  # the builder's counts it


def session_peak_bytes(segment_initializer_bytes: int) -> int:
    """Reserved while a session opens from a segment's file (the segment's weights are known by then)."""
    return int(segment_initializer_bytes * SESSION_PEAK_FACTOR) + SESSION_BYTES_FIXED


def child_build_bytes(model_file_bytes: int) -> int:
    """Reserved while the builder's child makes a segment, from the file's size (under-counts a model of
    many small nodes, which ``--max-nodes`` bounds)."""
    return int(model_file_bytes * CHILD_BUILD_FACTOR) + SESSION_BYTES_FIXED


# A reply not yet taken holds its bytes and gRPC core's copy; smaller ones go uncounted (the lanes bound them).
REPLY_HELD_FACTOR = 2
REPLY_COUNTED_BYTES = 64 * 1024


def reply_held_bytes(reply_bytes: int) -> int:
    """What a reply of ``reply_bytes`` (serialised) holds until its client takes it; 0 below the count."""
    return REPLY_HELD_FACTOR * reply_bytes if reply_bytes >= REPLY_COUNTED_BYTES else 0


def session_bytes(initializer_bytes: int) -> int:
    return int(initializer_bytes * SESSION_BYTES_FACTOR) + SESSION_BYTES_FIXED


def graph_bytes(proto_bytes: int, nodes: int) -> int:
    return int(proto_bytes * GRAPH_BYTES_FACTOR) + nodes * GRAPH_BYTES_PER_NODE


def watch_limit(limit_bytes: int | None) -> int | None:
    """The RSS at which running requests are terminated: below the budget by what memory can grow in one
    sample of the watch."""
    return None if limit_bytes is None else limit_bytes - min(64 * MB, limit_bytes // 16)


def limit_for(available_bytes: int, baseline_bytes: int) -> int:
    """The smallest budget leaving ``available_bytes`` to reserve above ``baseline_bytes`` and the watch's
    headroom (``watch_limit``'s inverse)."""
    total = baseline_bytes + available_bytes
    small = -(-total * 16 // 15)  # headroom limit/16: limit - limit//16 >= total
    return small if small // 16 < 64 * MB else total + 64 * MB


def rss_bytes() -> int:
    """This process's RSS: ``/proc/self/statm`` through a descriptor kept per pid, else psutil (not Linux).
    Asked every 10 ms holding the GIL: psutil's read took 49 us against 12 (2026-12, load 12)."""
    global _self, _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        try:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:  # no /proc
            if _self is None or _self.pid != pid:
                _self = psutil.Process()
            return int(_self.memory_info().rss)
    return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE_BYTES


_self: psutil.Process | None = None
_statm: tuple[int, int] | None = None  # (pid, descriptor)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def trim() -> None:
    """Give freed heap memory back to the OS (glibc's ``malloc_trim``; a no-op elsewhere)."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes
        import ctypes.util

        try:
            _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


class MemoryBudget:
    """Bytes reserved against ``limit_bytes - baseline_bytes - headroom_bytes`` (None: no limit);
    ``reserve`` never waits: it evicts through the evictors, else raises RESOURCE_EXHAUSTED."""

    def __init__(self, limit_bytes: int | None, baseline_bytes: int = 0, headroom_bytes: int = 0) -> None:
        if limit_bytes is not None and limit_bytes <= baseline_bytes + headroom_bytes:
            raise ConfigError(
                f"max_memory_bytes: expected more than the {baseline_bytes / MB:.0f} MB the process "
                f"holds at start and {headroom_bytes / MB:.0f} MB of headroom, got {limit_bytes / MB:.0f} MB"
            )
        self.limit_bytes = limit_bytes
        self.baseline_bytes = baseline_bytes
        # The estimates' error margin: plan below the RSS at which the watch terminates runs.
        self.headroom_bytes = headroom_bytes
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.peak_bytes = 0
        self.refused = 0
        self._evictors: list[Evictor] = []

    @property
    def available_bytes(self) -> float:
        if self.limit_bytes is None:
            return float("inf")
        return float(self.limit_bytes - self.baseline_bytes - self.headroom_bytes)

    def add_evictor(self, evict: Evictor) -> None:
        """``evict(n, build_for)`` releases at least ``n`` bytes of unused entries if it can (sparing what
        clients other than ``build_for`` use now) and returns what it freed."""
        self._evictors.append(evict)

    def try_reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self.used_bytes + nbytes > self.available_bytes:
                return False
            self.used_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.used_bytes)
            return True

    def reserve(self, nbytes: int, what: str, *, build_for: str | None = None) -> int:
        """Reserve ``nbytes``, evicting if needed, or raise RESOURCE_EXHAUSTED naming need and free."""
        nbytes = max(0, int(nbytes))
        for _ in range(4):  # evictions race with other reservations: retry a few times, then refuse
            if self.try_reserve(nbytes):
                return nbytes
            with self._lock:
                short = int(self.used_bytes + nbytes - self.available_bytes)
            freed = 0
            for evict in self._evictors:
                if short <= 0:
                    break
                n = evict(short, build_for)
                short, freed = short - n, freed + n
            if freed:
                trim()  # the evicted entries' pages back to the OS before the new allocation comes
            if short > 0 and self.try_reserve(nbytes):
                return nbytes
            if short > 0:
                break
        with self._lock:
            self.refused += 1
            used = self.used_bytes
        log_event(
            "memory_refused",
            what=what,
            need_mb=round(nbytes / MB, 1),
            used_mb=round(used / MB, 1),
            budget_mb=round(self.available_bytes / MB, 1),
        )
        limit_mb = (self.limit_bytes or 0) / MB
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what}: needs ~{nbytes / MB:.0f} MB, expected at most the {self._free_mb(used):.0f} MB "
            f"free of the server's memory budget (--max-memory-mb {limit_mb:.0f}, "
            f"{self.baseline_bytes / MB:.0f} MB held at start, {used / MB:.0f} MB by requests in "
            "flight and sessions in use"
            + (", and tails other clients use now are not evicted for a new one)" if build_for is not None else ")"),
        )

    def _free_mb(self, used: int) -> float:
        return max(0.0, (self.available_bytes - used) / MB)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used_bytes = max(0, self.used_bytes - int(nbytes))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "limit_bytes": self.limit_bytes,
                "baseline_bytes": self.baseline_bytes,
                "used_bytes": self.used_bytes,
                "peak_bytes": self.peak_bytes,
                "refused": self.refused,
            }


def process_budget(limit_bytes: int | None, *, builder: bool, checker: bool) -> MemoryBudget:
    """The ledger of a server owning this process, its baseline measured now (onnxruntime imported)."""
    if limit_bytes is None:
        return MemoryBudget(None)
    import onnxruntime  # noqa: F401  (part of the baseline, not of the budget)

    baseline = rss_bytes() + STARTUP_BYTES + children_resident_bytes(builder=builder, checker=checker)
    return MemoryBudget(limit_bytes, baseline, headroom_bytes=limit_bytes - (watch_limit(limit_bytes) or limit_bytes))
