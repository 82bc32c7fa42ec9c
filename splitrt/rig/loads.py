"""The load scenarios a rig run applies next to the device or the cloud (``rig.stats.burst_intervals``):

- ``cloud-busy``: other devices queueing on the cloud (``python -m splitrt.rig.worker busy``), for the
  whole turn, next to the server (bypassing the link).
- ``device-burst``: busy processes in the device's cgroup during the scenario's bursts, listed in the
  board's tasks file so the device's run-queue probe sees them.
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

from splitrt.errors import RigError
from splitrt.rig.stats import burst_intervals

if TYPE_CHECKING:
    from splitrt.rig.harness import Rig

HOG_PROCS = 1  # one busy process next to the device's one compute thread: ~2x slower
BUSY_CLIENTS = 2
HOG_ARGV = (sys.executable, "-c", "while True: pass")


class BoardTasks:
    """Where the device's run-queue probe finds the other processes sharing its CPU (the load processes
    the rig started). Not the cgroup's ``tasks``: ``ip netns exec`` remounts /sys, so the device cannot
    read the cgroup tree."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "board-tasks"

    def file(self) -> str:
        if not self.path.exists():
            self.path.write_text("")
        return str(self.path)

    def note(self, pids: list[int]) -> None:
        self.path.write_text("".join(f"{p}\n" for p in pids))


@contextlib.contextmanager
def during(
    rig: Rig, load: str, duration_s: float, t0: float, model_path: Path, cloud_plan: str, *, from_s: float = 0.0
) -> Iterator[list[tuple[float, float]]]:
    """Apply ``load`` to device 0 and the last tier's server 0 during (a turn of) a run whose window
    position ``from_s`` is played at monotonic time ``t0``; yields the (start, end) window positions it
    applied, filled in on exit."""
    applied: list[tuple[float, float]] = []
    stop = threading.Event()
    procs: list[subprocess.Popen[Any]] = []
    th: threading.Thread | None = None
    if load == "cloud-busy":  # next to the server, bypassing the link
        last = rig.servers[-1][0]
        spec = {"model_path": str(model_path), "cloud": f"127.0.0.1:{last.port}", "clients": BUSY_CLIENTS}
        argv = [sys.executable, "-m", "splitrt.rig.worker", "busy", json.dumps({**spec, "plan": cloud_plan})]
        procs.append(rig.children.popen(argv, "busy.log", host=last.host))
    elif load == "device-burst":
        args = (rig, load, duration_s, t0, from_s, stop, applied)
        th = threading.Thread(target=_bursts, args=args, name="rig-load", daemon=True)
        th.start()
    try:
        yield applied
    finally:
        stop.set()
        if th is not None:
            th.join(10)
        for p in procs:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
            if p.poll() is None:
                p.kill()
        if load == "cloud-busy":
            applied.append((from_s, from_s + max(0.0, time.monotonic() - t0)))


def _bursts(
    rig: Rig,
    load: str,
    duration_s: float,
    t0: float,
    from_s: float,
    stop: threading.Event,
    applied: list[tuple[float, float]],
) -> None:
    """The thread that starts the hogs in device 0's cgroup and kills them at the scenario's bursts (those
    after ``from_s``)."""
    for a, b in burst_intervals(load, duration_s):
        if b <= from_s:
            continue
        if stop.wait(max(0.0, t0 + max(a, from_s) - from_s - time.monotonic())):
            return
        hogs = []
        for _ in range(HOG_PROCS):
            p = rig.children.popen(list(HOG_ARGV), "hog.log", host=rig.hops[0].lower[0] if rig.hops else None)
            with contextlib.suppress(RigError):
                rig.throttle(0, p.pid)
            hogs.append(p)
        rig.board_tasks.note([p.pid for p in hogs])
        started = from_s + time.monotonic() - t0
        stop.wait(max(0.0, t0 + b - from_s - time.monotonic()))
        rig.board_tasks.note([])
        for p in hogs:
            p.kill()
            p.wait(5)
        applied.append((started, from_s + time.monotonic() - t0))
        if stop.is_set():
            return
