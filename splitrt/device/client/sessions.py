"""The model's onnxruntime sessions on a device: the whole model, and head/tail per cut (an LRU), built on
first use; ``SessionCache.run_full``/``run_head``/``run_tail`` run them and time the run.

``run_session`` runs one; onnxruntime's own errors become splitrt's (``graph.ort_errors``): a session
that does not build is a ``ModelError``, inputs the declarations let through that a node refuses (e.g. an
image too small for its pooling) an ``InputError`` naming what failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from splitrt.graph import partition
from splitrt.graph.ort_errors import onnxruntime_errors


@dataclass
class CutSessions:
    """One cut's segments on this device and their sessions (``None`` until first used)."""

    cut_id: str
    head_inputs: tuple[str, ...]
    head_outputs: tuple[str, ...]
    tail_inputs: tuple[str, ...]
    tail_outputs: tuple[str, ...]
    kept: tuple[str, ...]  # graph outputs on the device after the head
    head_model: Any
    tail_model: Any
    head: Any = None
    tail: Any = None


def build_session(model: Any, threads: int, what: str = "the model") -> Any:
    """An onnxruntime session for ``model`` (``ModelError`` when onnxruntime cannot build it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    with onnxruntime_errors(what, stage="build", where=" on this device"):
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_session(session: Any, outputs: list[str], feeds: Mapping[str, Any], what: str) -> list[Any]:
    """``session.run``; onnxruntime's own errors (inputs the declarations let through that a node
    refuses, e.g. an image too small for its pooling) become ``InputError`` naming ``what`` failed
    (``graph.ort_errors``)."""
    with onnxruntime_errors(what, stage="run", feeds=feeds, where=" on this device"):
        values = session.run(outputs, dict(feeds))
    return partition.pass_through(outputs, feeds, values)


class SessionCache:
    """The model's onnxruntime sessions on this device: the whole model, and head/tail per cut (LRU of
    ``session_cache_size`` cuts). Sessions are built on first use."""

    def __init__(self, graph: Any, *, threads: int, size: int) -> None:
        self.graph = graph
        self.threads = threads
        self.size = size
        self._lock = threading.Lock()
        self._cuts: LRUCache[str, CutSessions] | None = LRUCache(maxsize=size) if size > 0 else None
        self._full: Any = None

    def cut(self, cut_id: str) -> CutSessions:
        with self._lock:
            cs = self._cuts.get(cut_id) if self._cuts is not None else None  # a hit is the most recent again
            if cs is not None:
                return cs

        head, tail = partition.split(self.graph, [cut_id])
        cs = CutSessions(
            cut_id=cut_id,
            head_inputs=tuple(head.inputs),
            head_outputs=tuple(head.outputs),
            tail_inputs=tuple(tail.inputs),
            tail_outputs=tuple(tail.outputs),
            kept=self.graph.cut(cut_id).kept,
            head_model=head.model,
            tail_model=tail.model,
        )
        if self._cuts is not None:  # (size 0: nothing kept)
            with self._lock:
                cs = self._cuts.setdefault(cut_id, cs)  # a racing build of the same cut: the first wins
        return cs

    def full(self) -> Any:
        if self._full is None:
            # A specialised graph (``graph.specialise``) is right only for requests that take its branches;
            # the whole model here is the original, right for every request.
            spec = getattr(self.graph, "specialisation", None)
            self._full = build_session(
                spec.original if spec is not None else self.graph.model, self.threads, "the whole model"
            )
        return self._full

    def head(self, cs: CutSessions) -> Any:
        if cs.head is None:
            cs.head = build_session(cs.head_model, self.threads, f"the head of cut {cs.cut_id!r}")
        return cs.head

    def tail(self, cs: CutSessions) -> Any:
        if cs.tail is None:
            cs.tail = build_session(cs.tail_model, self.threads, f"the tail of cut {cs.cut_id!r}")
        return cs.tail

    def run_full(self, feeds: Mapping[str, Any], outputs: list[str]) -> tuple[list[Any], float]:
        """The whole model on ``feeds``: ``outputs``' values and the ms the run took."""
        t0 = time.perf_counter()  # the session's first build included, as for a head
        values = run_session(self.full(), outputs, feeds, "the whole model")
        return values, (time.perf_counter() - t0) * 1e3

    def run_head(self, cut_id: str, feeds: Mapping[str, Any]) -> tuple[CutSessions, dict[str, Any], float]:
        """The head of ``cut_id`` on ``feeds``: the cut's sessions, every tensor known after it (the feeds and
        what the head made) and the ms it took (its session's first build included, as the first request
        pays it; the cut's segments', made before, not)."""
        cs = self.cut(cut_id)
        t0 = time.perf_counter()
        env: dict[str, Any] = dict(feeds)
        if cs.head_outputs:
            head = {n: feeds[n] for n in cs.head_inputs}
            values = run_session(self.head(cs), list(cs.head_outputs), head, f"the head of cut {cut_id!r}")
            env.update(zip(cs.head_outputs, values, strict=True))
        return cs, env, (time.perf_counter() - t0) * 1e3

    def run_tail(self, cut_id: str, crossing: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
        """The tail of ``cut_id`` on the tensors crossing it: its outputs by name and the ms it took."""
        cs = self.cut(cut_id)
        t0 = time.perf_counter()
        values = run_session(self.tail(cs), list(cs.tail_outputs), crossing, f"the tail of cut {cut_id!r}")
        return dict(zip(cs.tail_outputs, values, strict=True)), (time.perf_counter() - t0) * 1e3
