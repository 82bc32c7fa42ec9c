"""The collector's permanent generation for what a long-running process built at start (``gc.freeze``).

A full collection walks every tracked object and holds the GIL while it does: every thread of the process
waits. In a device process that means every object its start-up made (modules, onnxruntime sessions, cost
tables, gRPC channels: ~50 000), about 10-15 ms of this host's CPU; on a throttled board, quota periods of
it. The rig's busy board (a quarter of an emulated Raspberry Pi 4) took one request in each of its cells
to 0.8-1.0 s where ~0.12 s was priced, always the same request of the process's life, whichever strategy's
turn it fell in. Frozen, those objects are never walked again; a collection walks what came since.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup"]


def freeze_startup() -> int:
    """Collect once, then move every object still alive to the permanent generation; returns how many are
    frozen in all. Call it when start-up is done (sessions built, warm-up served); again after more start-up
    (it freezes what came since)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
