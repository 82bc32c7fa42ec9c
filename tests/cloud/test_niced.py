"""Runs at a lower OS priority (``cloud.capacity.niced.NicePool``): the thread a run executes on has the pool's
nice value while the caller's is untouched; results and exceptions come back; a closed or disabled pool
runs inline; bad values are a ConfigError."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from splitrt.cloud.capacity.niced import NicePool
from splitrt.errors import ConfigError


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_a_call_runs_on_a_thread_at_the_pool_nice_value() -> None:
    base = _nice()
    pool = NicePool(2, nice=7)  # steps below the caller's priority
    try:
        assert pool.enabled
        ran = pool.call(lambda: (threading.get_native_id(), _nice()))
        assert ran[0] != threading.get_native_id() and ran[1] == min(19, base + 7)
        assert _nice() == base  # the caller keeps its priority
        with pytest.raises(ValueError, match="boom"):
            pool.call(lambda: (_ for _ in ()).throw(ValueError("boom")))
        assert pool.call(lambda x, *, y: x + y, 2, y=3) == 5
    finally:
        pool.close()
    assert not pool.enabled and pool.call(threading.get_native_id) == threading.get_native_id()


def test_nice_zero_runs_inline_and_bad_values_are_refused() -> None:
    pool = NicePool(1, nice=0)
    assert not pool.enabled and pool.call(threading.get_native_id) == threading.get_native_id()
    with pytest.raises(ConfigError, match="0 <= nice <= 19"):
        NicePool(1, nice=20)
    with pytest.raises(ConfigError, match="threads >= 1"):
        NicePool(0)
