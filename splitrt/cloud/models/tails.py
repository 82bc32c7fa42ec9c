"""Tail sessions (a model's cloud part at a cut), built on first use in a worker slot, one build per key,
kept in an LRU bounded in bytes by the ``MemoryBudget`` and in entries by ``capacity``; a leased tail is
never evicted. An uploaded model's tail is opened, and run, on the ``niced`` threads (``Tail.untrusted``).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from splitrt.cloud.capacity.admission import current_client
from splitrt.cloud.capacity.arena import Arena
from splitrt.cloud.capacity.arena import session_options as arena_options
from splitrt.cloud.capacity.memory import (
    MemoryBudget,
    build_peak_bytes,
    child_build_bytes,
    session_bytes,
    session_peak_bytes,
    trim,
)
from splitrt.cloud.capacity.niced import NicePool
from splitrt.cloud.common import RpcFailure, log_event
from splitrt.cloud.models.builder import Builder, segment_of
from splitrt.cloud.models.store import ModelStore, is_upload_name
from splitrt.errors import ConfigError, ModelError
from splitrt.graph.memory import tensor_bytes
from splitrt.graph.ort_errors import onnxruntime_errors


class InSlot(Protocol):
    """Runs a build in a worker slot (``Admission.run`` in the heavy lane), DEADLINE_EXCEEDED without one."""

    def __call__(self, fn: Callable[[bool], Tail], timeout_s: float, *, what: str) -> Tail: ...


@dataclass
class Tail:
    """A ready tail session and what it expects."""

    session: Any
    # (name, dtype, declared shape); shape None: any rank, () a scalar.
    inputs: list[tuple[str, str, tuple[int | str | None, ...] | None]]
    outputs: list[str]
    hits: int = 0
    bytes: int = 0  # what the budget holds for it
    users: int = 0  # requests running it now
    skeleton: Any = None  # the segment without its weights' data (``peak``)
    static_peak: Any = None  # ``builder.Made.static_peak``
    sizing: frozenset[str] | None = None  # ``builder.Made.sizing``; None: worked out on first need
    run_limited: bool = False  # a run hit ``runlimit``: its runs take the heavy lane since
    untrusted: bool = False  # an upload's: opened and run on ``niced`` threads
    # Client -> when it last got this tail (monotonic s), pruned to ``HOT_S`` beyond ``RECENT_MAX`` clients.
    recent: dict[str, float] = field(default_factory=dict)

    def used_by(self, client: str, now_s: float) -> None:
        self.recent[client] = now_s
        if len(self.recent) > RECENT_MAX:
            self.recent = {c: t for c, t in self.recent.items() if now_s - t < HOT_S}

    def hot_for_others(self, client: str, now_s: float) -> bool:
        return any(c != client and now_s - t < HOT_S for c, t in self.recent.items())


# A tail another client got within this many seconds is not evicted for a new tail (cut-naming floods).
HOT_S = 2.0
RECENT_MAX = 16

# Largest output onnxruntime (>= 1.27) may constant-fold: graph.normalise's bound (its own default is 1 GiB).
ORT_FOLD_MAX_BYTES = 64 * 2**20
_ORT_FOLD_LIMIT_KEY = "optimization.constant_folding_max_output_size_in_bytes"


class TailCache:
    """LRU cache of tail sessions keyed by (model sha256, cut id); builds each key once."""

    def __init__(
        self,
        store: ModelStore,
        capacity: int,
        intra_op_threads: int,
        *,
        budget: MemoryBudget | None = None,
        in_slot: InSlot | None = None,
        builder: Builder | None = None,
        niced: NicePool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ConfigError(f"segment_cache_size: expected >= 1, got {capacity}")
        self.store = store
        self.capacity = capacity
        self.intra_op_threads = intra_op_threads
        self.budget = budget if budget is not None else MemoryBudget(None)
        self.budget.add_evictor(self.evict)
        self._in_slot = in_slot
        self.arena = Arena(self.budget)
        self.builder = builder  # None: segments made here, holding the GIL
        self.niced = niced  # None: uploads' sessions opened on the caller's thread
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Tail] = OrderedDict()
        self._building: dict[tuple[str, str], threading.Lock] = {}
        # Called with (sha256, cut id) after each lease whose block ended without an exception.
        self.on_lease: Callable[[str, str], None] | None = None
        self.cache_hits = 0
        self.cache_misses = 0
        self.evicted = 0

    @contextmanager
    def lease(self, sha256: str, cut_id: str, *, timeout_s: float | None = None) -> Iterator[Tail]:
        """The tail, not evicted while the caller holds it."""
        tail = self.get(sha256, cut_id, timeout_s=timeout_s, pin=True)
        ok = False
        try:
            yield tail
            ok = True
        finally:
            self.unpin(tail, sha256, cut_id, ok=ok)

    def unpin(self, tail: Tail, sha256: str, cut_id: str, *, ok: bool) -> None:
        """The end of a lease taken as ``get(..., pin=True)`` (``lease`` without a generator context, for the
        request path); ``ok``: the holder's work ended without an exception."""
        with self._lock:
            tail.users -= 1
        if ok and self.on_lease is not None:
            self.on_lease(sha256, cut_id)

    def get(self, sha256: str, cut_id: str, *, timeout_s: float | None = None, pin: bool = False) -> Tail:
        """The cached tail, built if missing (a build in flight waited for, DEADLINE_EXCEEDED past
        ``timeout_s``); ``pin`` counts the caller as a user."""
        key = (sha256, cut_id)
        t0 = time.monotonic()
        with self._lock:
            tail = self._cache.get(key)
            if tail is not None:
                self._cache.move_to_end(key)
                tail.hits += 1
                tail.users += int(pin)
                tail.used_by(current_client(), self._clock())
                self.cache_hits += 1
                return tail
            build_lock = self._building.setdefault(key, threading.Lock())
        if not build_lock.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            raise RpcFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"building the tail of cut {cut_id!r}: expected the build in progress to finish within the "
                "deadline, got it still running",
            )
        try:
            try:
                with self._lock:
                    tail = self._cache.get(key)
                    if tail is not None:
                        tail.users += int(pin)
                built = tail is None
                if tail is None:
                    left = None if timeout_s is None else timeout_s - (time.monotonic() - t0)
                    tail = self._build_in_slot(sha256, cut_id, left)
                    tail.users += int(pin)
                with self._lock:
                    self.cache_misses += int(built)
                    self.cache_hits += int(not built)
                    tail.used_by(current_client(), self._clock())
                    self._cache[key] = tail
                    self._cache.move_to_end(key)
                    tail.hits += 1
                    excess = self._over_capacity()
                for old in excess:
                    self.budget.release(old.bytes)
                return tail
            finally:
                # Also on failure (unknown cuts must not grow it); only this lock (a later caller's may be set).
                with self._lock:
                    if self._building.get(key) is build_lock:
                        del self._building[key]
        finally:
            build_lock.release()

    def _over_capacity(self) -> list[Tail]:
        """Entries beyond ``capacity``, least recently used first, skipping those in use (lock held)."""
        out: list[Tail] = []
        for key in list(self._cache):
            if len(self._cache) <= self.capacity:
                break
            if self._cache[key].users == 0:
                out.append(self._cache.pop(key))
                self.evicted += 1
        return out

    def evict(self, nbytes: int, build_for: str | None = None) -> int:
        """The budget's evictor: drop unused LRU tails, sparing those hot for others than ``build_for``,
        until ``nbytes`` are freed; returns the bytes released."""
        freed = 0
        now = self._clock()
        with self._lock:
            for key in list(self._cache):
                if freed >= nbytes:
                    break
                tail = self._cache[key]
                if tail.users == 0 and (build_for is None or not tail.hot_for_others(build_for, now)):
                    del self._cache[key]
                    freed += tail.bytes
                    self.evicted += 1
                    log_event("tail_evicted", model=key[0][:12], cut=key[1], mb=round(tail.bytes / 2**20, 1))
        self.budget.release(freed)
        return freed

    def _build_in_slot(self, sha256: str, cut_id: str, timeout_s: float | None) -> Tail:
        if self.builder is not None:  # what the child already refused for good: no slot for it
            self.builder.check_known(self.store.entry(sha256.partition("~")[0]).path, sha256, cut_id)
        if self._in_slot is None:
            return self._build(sha256, cut_id)
        return self._in_slot(
            lambda _yielding: self._build(sha256, cut_id),
            3600.0 if timeout_s is None else timeout_s,
            what=f"building the tail of cut {cut_id!r}",
        )

    def _build(self, sha256: str, cut_id: str) -> Tail:
        if self.builder is not None:
            return self._build_from_child(sha256, cut_id, self.builder)
        with self.store.pinned(sha256):  # the graph stays in the ledger while this build holds it
            return self._build_here(sha256, cut_id)

    def _build_here(self, sha256: str, cut_id: str) -> Tail:
        graph = self.store.graph(sha256)
        # The build's transient peak, from the whole model's weights; the session keeps its share.
        weights = sum(tensor_bytes(t) for t in graph.model.graph.initializer)
        held = self.budget.reserve(
            build_peak_bytes(weights),
            f"tail session of model {sha256[:12]} at cut {cut_id!r}",
            build_for=current_client(),
        )
        try:
            from splitrt.graph import partition
            from splitrt.graph.peak import skeleton

            segment = segment_of(graph, sha256, cut_id, self.store.root)
            del graph
            cost = session_bytes(sum(tensor_bytes(t) for t in segment.model.graph.initializer))
            skel = skeleton(segment.model)
            # From the segment, not the session: onnxruntime reports "no declared shape" as [], like a scalar.
            inputs = partition.declared_inputs(segment.model)
            data = segment.model.SerializeToString()
            del segment  # one copy of the weights less while onnxruntime loads its own
            tail = self._session(data, inputs, sha256, cut_id)
            del data
        except BaseException:
            self.budget.release(held)
            raise
        finally:
            trim()
        return self._keep(tail, held, cost, skel, sha256, cut_id)

    def _build_from_child(self, sha256: str, cut_id: str, builder: Builder) -> Tail:
        """The segment made by the builder's child (its memory reserved meanwhile), the session opened from
        its file (read without the GIL)."""
        import onnx

        entry = self.store.entry(sha256.partition("~")[0])
        what = f"tail session of model {sha256[:12]} at cut {cut_id!r}"
        held = self.budget.reserve(child_build_bytes(entry.bytes), f"{what} (segment)", build_for=current_client())
        try:
            made = builder.make(entry.path, self.store.root, sha256, cut_id, self.store.max_nodes)
        finally:
            self.budget.release(held)
        try:
            cost = session_bytes(made.weights_bytes)
            held = self.budget.reserve(session_peak_bytes(made.weights_bytes), what, build_for=current_client())
            try:
                tail = self._session(str(made.path), made.inputs, sha256, cut_id)
            except BaseException:
                self.budget.release(held)
                raise
            finally:
                trim()
        finally:
            made.path.unlink(missing_ok=True)
        tail.static_peak, tail.sizing = made.static_peak, made.sizing
        return self._keep(tail, held, cost, onnx.ModelProto.FromString(made.skeleton), sha256, cut_id)

    def _keep(self, tail: Tail, held: int, cost: int, skel: Any, sha256: str, cut_id: str) -> Tail:
        self.budget.release(max(0, held - cost))  # keep what the session holds
        tail.bytes = min(cost, held)
        tail.skeleton = skel
        log_event("tail_built", model=sha256[:12], cut=cut_id, inputs=len(tail.inputs), mb=round(cost / 2**20, 1))
        return tail

    def _session(self, data: bytes | str, inputs: list[Any], sha256: str, cut_id: str) -> Tail:
        """The session of a segment's bytes or file (``str``); an upload's opened on the ``niced`` threads,
        whose priority its intra-op threads inherit."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = self.intra_op_threads
        arena_options(opts)
        extra = bounded_folding(opts)
        untrusted = is_upload_name(self.store.entry(sha256.partition("~")[0]).path)
        try:
            with onnxruntime_errors(f"tail of model {sha256[:12]} at cut {cut_id!r}", stage="build"):
                cpu = ["CPUExecutionProvider"]
                opened = functools.partial(ort.InferenceSession, data, opts, providers=cpu, **extra)
                session = self.niced.call(opened) if untrusted and self.niced is not None else opened()
        except ModelError as exc:  # onnxruntime's, mapped: the model is at fault, not the server
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, self.store.scrub(str(exc))[:600]) from exc
        outputs = [o.name for o in session.get_outputs()]
        return Tail(session=session, inputs=inputs, outputs=outputs, untrusted=untrusted)

    def touch(self, keys: list[tuple[str, str]]) -> None:
        """Make the cached ones of ``keys`` the most recently used, the first the most recent; no hit counted."""
        with self._lock:
            for key in reversed(keys):
                if key in self._cache:
                    self._cache.move_to_end(key)

    def snapshot(self) -> list[tuple[str, str, int]]:
        with self._lock:
            return [(k[0], k[1], t.hits) for k, t in self._cache.items()]

    def held_bytes(self) -> int:
        with self._lock:
            return sum(t.bytes for t in self._cache.values())


def bounded_folding(opts: Any) -> dict[str, Any]:
    """Bound onnxruntime's constant folding (allocated at build, beyond the budget's estimate): >= 1.27 gets
    ``ORT_FOLD_MAX_BYTES`` in ``opts``, older ones fold nothing; returns the session's extra kwargs."""
    import onnxruntime as ort

    if _version(ort.__version__) >= (1, 27):
        opts.add_session_config_entry(_ORT_FOLD_LIMIT_KEY, str(ORT_FOLD_MAX_BYTES))
        return {}
    return {"disabled_optimizers": ["ConstantFolding"]}


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string; (0, 0) if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)
