"""The model's onnxruntime sessions on a device: the whole model, and head/tail per cut (an LRU), built on
first use; and the checks of a request's inputs against the model's declarations.

``run_session`` runs one; onnxruntime's own errors become splitrt's (``graph.ort_errors``): a session
that does not build is a ``ModelError``, inputs the declarations let through that a node refuses (e.g. an
image too small for its pooling) an ``InputError`` naming what failed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from cachetools import LRUCache

from splitrt.errors import InputError
from splitrt.graph import partition
from splitrt.graph.ort_errors import onnxruntime_errors
from splitrt.transport import wire


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


def check_inputs(graph: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``inputs`` as arrays, or ``InputError`` naming the expected and actual name/dtype/shape."""
    expected = {t.name: t for t in graph.inputs}
    if set(inputs) != set(expected):
        raise InputError(f"model {graph.path.name}: expected inputs {sorted(expected)}, got {sorted(inputs)}")
    out: dict[str, np.ndarray] = {}
    for name, info in expected.items():
        arr = np.asarray(inputs[name])
        if arr.dtype.name != info.dtype:
            raise InputError(f"input {name!r}: expected dtype {info.dtype}, got {arr.dtype.name}")
        # The shape the model declares (a free dim takes any size), not the one a bound graph was sized
        # at: the binding is where costs were computed, not the only shape served.
        shape = graph.generic_shape(name) if hasattr(graph, "generic_shape") else info.shape
        if shape is not None and not wire.shape_matches(tuple(shape), tuple(arr.shape)):
            raise InputError(
                f"input {name!r}: expected shape {wire.describe_shape(tuple(shape))}, got {list(arr.shape)}"
            )
        out[name] = arr
    return out


def random_inputs(graph: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right dtype and shape for ``graph``: its bound shapes, or free dims as 1 if unbound."""
    rng = np.random.default_rng(seed)
    result: dict[str, np.ndarray] = {}
    for t in graph.inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (t.shape or ()))
        dt = np.dtype(t.dtype)
        if dt.kind == "f":
            result[t.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            result[t.name] = rng.integers(0, 2, shape).astype(dt)
        else:
            result[t.name] = rng.integers(0, 10, shape).astype(dt)
    return result


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
