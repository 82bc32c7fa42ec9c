"""The load scenarios a rig run applies next to the device or the cloud (``rig.stats.burst_intervals``):

- ``cloud-busy``: other devices queueing on the cloud (``python -m splitrt.rig.worker busy``), for the
  whole turn, next to the server (bypassing the link).
- ``device-burst``: other work holding the board during the scenario's bursts: one busy process beside the
  device's one compute thread (~2x slower). The board's quota shrinks to its share and the busy process
  waits aside, runnable (``cgroup.share_with``): busy-loops under the board's own quota made every woken
  device thread wait for the next CFS period, 19-39 ms per remote call that a board's scheduler does not
  make it wait. The pids are listed in the rig's ``board_tasks`` file so the device's run-queue probe sees
  them (not the cgroup's ``tasks``: ``ip netns exec`` remounts /sys, so the device cannot read the tree).
- ``device-busy``: three such processes for the whole run (~4x slower: a board other work holds at 3/4,
  where a split can beat both running the model here and sending the input), and during the strategies'
  settle (``at_start``, ``P.Settle``): a board busy for the whole run was busy when its estimators learnt
  its speed.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt.rig.processes import end
from splitrt.rig.stats import DEVICE_HOGS, burst_intervals

if TYPE_CHECKING:
    from splitrt.rig.harness import Rig

BUSY_CLIENTS = 2
HOG_ARGV = (sys.executable, "-c", "while True: pass")
#: The longest a settle under a run's starting load may last (it ends when the settle does).
SETTLE_MAX_S = 3600.0


def busy_at_start(load: str) -> bool:
    """Whether ``load`` holds the device as a run starts (device-busy), so its settle runs under it too."""
    return load in DEVICE_HOGS and any(a <= 0.0 for a, _ in burst_intervals(load, SETTLE_MAX_S))


@contextlib.contextmanager
def at_start(rig: Rig, load: str, model_path: Path) -> Iterator[None]:
    """The device load a run starts with (``busy_at_start``), applied from now until the block ends."""
    with during(rig, load, SETTLE_MAX_S, time.monotonic(), model_path, ""):
        yield


@contextlib.contextmanager
def during(
    rig: Rig, load: str, duration_s: float, t0: float, model_path: Path, cloud_plan: str, *, from_s: float = 0.0
) -> Iterator[list[tuple[float, float]]]:
    """Apply ``load`` to device 0 and the last tier's server 0 during (a turn of) a run whose window
    position ``from_s`` is played at monotonic time ``t0``; yields the (start, end) window positions it
    applied, filled in on exit."""
    applied: list[tuple[float, float]] = []
    stop = threading.Event()

    def pos() -> float:  # the window position now
        return from_s + time.monotonic() - t0

    def bursts() -> None:  # hogs in device 0's cgroup during the scenario's bursts after ``from_s``
        for a, b in burst_intervals(load, duration_s):
            if b <= from_s:
                continue
            if stop.wait(max(0.0, max(a, from_s) - pos())):
                return
            host = rig.hops[0].lower[0] if rig.hops else None
            hogs = [rig.children.popen(list(HOG_ARGV), "hog.log", host=host) for _ in range(DEVICE_HOGS[load])]
            with rig.board_share(0, [hog.pid for hog in hogs]):
                rig.board_tasks.write_text("".join(f"{hog.pid}\n" for hog in hogs))
                started = pos()
                stop.wait(max(0.0, b - pos()))
                rig.board_tasks.write_text("")
            for hog in hogs:
                hog.kill()
                hog.wait(5)
            applied.append((started, pos()))
            if stop.is_set():
                return

    busy: subprocess.Popen[Any] | None = None
    th = threading.Thread(target=bursts, name="rig-load", daemon=True)
    if load == "cloud-busy":  # next to the server, bypassing the link
        last = rig.servers[-1][0]
        spec = {"model_path": str(model_path), "cloud": f"127.0.0.1:{last.port}", "clients": BUSY_CLIENTS}
        argv = [sys.executable, "-m", "splitrt.rig.worker", "busy", json.dumps({**spec, "plan": cloud_plan})]
        busy = rig.children.popen(argv, "busy.log", host=last.host)
    elif load in DEVICE_HOGS:
        th.start()
    try:
        yield applied
    finally:
        stop.set()
        if th.ident is not None:
            th.join(10)
        if busy is not None:
            end(busy, 5.0)
            applied.append((from_s, max(from_s, pos())))
