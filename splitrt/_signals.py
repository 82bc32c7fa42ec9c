"""How a long-running command learns it should stop: ``stop_on_signals()`` returns an event that SIGTERM,
SIGINT and SIGHUP set (a closed terminal or ``kill -HUP`` drains like SIGTERM; nothing dies mid-request).

Call it from the main thread before listening, so a signal that comes while starting still stops cleanly.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["stop_on_signals"]


def stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return stop
