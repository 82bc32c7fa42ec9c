"""The CPU arena the tail sessions share (onnxruntime's environment allocator), and the part of the memory
budget it holds: a run's activations stay for the next (without it, a squeezenet tail cost ~0.2 ms more
CPU per request, 2026-12). ``Arena.begin(need_bytes) -> (ticket, shrink)`` before each run, ``end`` after
it: the budget holds ``GROWTH`` x the kept runs' activations, else (or beyond ``KEEP_MAX_BYTES``, or while
a shrink is pending) the run shrinks the arena. ``session_options`` makes a session use it.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from splitrt.cloud.capacity.memory import MemoryBudget
from splitrt.cloud.common import log_event

# A run estimated to need more than this gives its activations back when it ends.
KEEP_MAX_BYTES = 16 << 20
# What the arena may keep for a run's activations, as a multiple of them (its free chunks split and merge).
GROWTH = 2
SHRINK_OPTION = ("memory.enable_memory_arena_shrinkage", "cpu:0")


class Arena:
    """What the shared arena may keep, held in ``budget``; thread-safe."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.enabled = _share()  # else sessions have no arena: nothing to keep or shrink
        self.held_bytes = 0
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._flight: dict[int, int] = {}  # ticket -> the bytes it keeps (0: it shrinks)
        self._kept = 0
        self._pending: int | None = None  # the last ticket in flight when a shrink ran beside others

    def begin(self, need_bytes: int) -> tuple[int, bool]:
        """A run's ticket, and whether it shrinks the arena when it ends."""
        with self._lock:
            ticket = next(self._seq)
            if not self.enabled:
                self._flight[ticket] = 0
                return ticket, False
            shrink = need_bytes > KEEP_MAX_BYTES or self._pending is not None
            want = GROWTH * (self._kept + need_bytes)
            if not shrink and want > self.held_bytes:
                if self.budget.try_reserve(want - self.held_bytes):
                    self.held_bytes = want
                else:
                    shrink = True
            keep = 0 if shrink else need_bytes
            self._kept += keep
            self._flight[ticket] = keep
            return ticket, shrink

    def end(self, ticket: int, shrunk: bool) -> None:
        """After the run of ``ticket`` (``shrunk``: it shrank the arena)."""
        freed = 0
        with self._lock:
            self._kept -= self._flight.pop(ticket)
            if not shrunk:
                return
            if self._pending is not None and any(t <= self._pending for t in self._flight):
                return  # runs that overlapped the last shrink are still going: the next shrinks too
            if self._flight:
                self._pending = max(self._flight)
            else:
                self._pending = None
            keep = GROWTH * self._kept
            freed, self.held_bytes = max(0, self.held_bytes - keep), min(self.held_bytes, keep)
        self.budget.release(freed)


_share_lock = threading.Lock()
_shared: bool | None = None


def session_options(opts: Any) -> bool:
    """Make ``opts`` use the shared arena; False: none could be registered (runs must not shrink one)."""
    shared = _share()
    opts.enable_cpu_mem_arena = shared
    if shared:
        opts.add_session_config_entry("session.use_env_allocators", "1")
        opts.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    return shared


def _share() -> bool:
    global _shared
    with _share_lock:
        if _shared is None:
            _shared = _register()
        return _shared


def _register() -> bool:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))
    except Exception as exc:  # onnxruntime's: one is registered already (not by us), or none can be
        log_event("arena_unshared", error=str(exc)[:200])
        return False
    a, b = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in "ab")
    graph = helper.make_graph([helper.make_node("Neg", ["a"], ["b"])], "seed", [a], [b])
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.use_env_allocators", "1")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    seed = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    seed.run(None, {"a": np.ones(1, np.float32)})  # onnxruntime never shrinks the first region: 1 MB here
    return True
