"""Tail sessions: the cloud's part of a model at a cut, built on first use and kept in an LRU."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.cloud.store import ModelStore
from splitrt.errors import ConfigError, CutError
from splitrt.transport import wire


@dataclass
class Tail:
    """A ready tail session and what it expects."""

    session: Any
    inputs: list[tuple[str, str, tuple[int | str | None, ...]]]
    outputs: list[str]
    hits: int = 0


class TailCache:
    """LRU cache of tail sessions keyed by (model sha256, cut id); builds each key once."""

    def __init__(self, store: ModelStore, capacity: int, intra_op_threads: int) -> None:
        if capacity < 1:
            raise ConfigError(f"segment_cache_size: expected >= 1, got {capacity}")
        self.store = store
        self.capacity = capacity
        self.intra_op_threads = intra_op_threads
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Tail] = OrderedDict()
        self._building: dict[tuple[str, str], threading.Lock] = {}
        # Lookups answered from the cache / that built a session (the server's metrics).
        self.cache_hits = 0
        self.cache_misses = 0

    def get(self, sha256: str, cut_id: str) -> Tail:
        key = (sha256, cut_id)
        with self._lock:
            tail = self._cache.get(key)
            if tail is not None:
                self._cache.move_to_end(key)
                tail.hits += 1
                self.cache_hits += 1
                return tail
            build_lock = self._building.setdefault(key, threading.Lock())
        with build_lock:
            try:
                with self._lock:
                    tail = self._cache.get(key)
                built = tail is None
                if tail is None:
                    tail = self._build(sha256, cut_id)
                with self._lock:
                    self.cache_misses += int(built)
                    self.cache_hits += int(not built)
                    self._cache[key] = tail
                    self._cache.move_to_end(key)
                    tail.hits += 1
                    while len(self._cache) > self.capacity:
                        self._cache.popitem(last=False)
                return tail
            finally:
                # Also when the build failed: requests naming endless unknown cuts must not grow this dict.
                with self._lock:
                    self._building.pop(key, None)

    def _build(self, sha256: str, cut_id: str) -> Tail:
        import onnxruntime as ort

        from splitrt.graph import partition

        graph = self.store.graph(sha256)
        try:
            # "A>B": an edge's middle segment (three tiers: ``splitrt.cloud.edge``), else the tail of the cut.
            first, _, second = cut_id.partition(">")
            segment = (partition.split(graph, [first, second])[1] if second
                       else partition.split(graph, [cut_id])[-1])
        except CutError as exc:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND,
                             f"cut {cut_id!r} of model {sha256[:12]}: {exc}") from exc
        except Exception as exc:  # a model that loads but does not split (a bad upload): not the server's fault
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION,
                             f"model {sha256[:12]} cannot be split at cut {cut_id!r}: {exc}") from exc
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = self.intra_op_threads
        try:
            session = ort.InferenceSession(segment.model.SerializeToString(), opts,
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types; the model is at fault
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION,
                             f"tail of model {sha256[:12]} at cut {cut_id!r} does not load in onnxruntime: "
                             f"{str(exc)[:500]}") from exc
        inputs: list[tuple[str, str, tuple[int | str | None, ...]]] = [
            (i.name, wire.ort_dtype(i.type), tuple(d if isinstance(d, int) else None for d in i.shape))
            for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        log_event("tail_built", model=sha256[:12], cut=cut_id, inputs=len(inputs))
        return Tail(session=session, inputs=inputs, outputs=outputs)

    def snapshot(self) -> list[tuple[str, str, int]]:
        with self._lock:
            return [(k[0], k[1], t.hits) for k, t in self._cache.items()]
