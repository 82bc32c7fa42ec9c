"""``splitrt._gc.freeze_startup``: what start-up left alive is out of every later collection, its garbage
is not."""

from __future__ import annotations

import gc
import weakref

from splitrt._gc import freeze_startup


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freeze_startup_collects_the_garbage_then_freezes_what_is_alive() -> None:
    gc.unfreeze()
    try:
        kept = [[i] for i in range(1000)]  # what a start-up built and keeps
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle nothing refers to: garbage only a collection frees
        dead = weakref.ref(a)
        del a, b
        frozen = freeze_startup()
        assert dead() is None  # collected first, not frozen
        assert frozen == gc.get_freeze_count() >= len(kept)
        walked = {id(o) for o in gc.get_objects()}  # what a collection walks: the frozen are not in it
        assert not any(id(x) in walked for x in kept)
        later = [0]
        assert id(later) in {id(o) for o in gc.get_objects()}  # what comes after is walked as before
    finally:
        gc.unfreeze()
