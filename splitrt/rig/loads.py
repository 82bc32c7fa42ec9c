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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt.errors import RigError
from splitrt.rig.stats import burst_intervals

if TYPE_CHECKING:
    from splitrt.rig import netns
    from splitrt.rig.processes import Children

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


class LoadDriver:
    """Starts and stops a scenario's processes; ``throttle_in`` puts a hog in the device's cgroup."""

    def __init__(
        self,
        children: Children,
        board: BoardTasks,
        *,
        device_host: netns.Host | None,
        cloud_host: netns.Host | None,
        cloud_direct: str,
        throttle_in: Callable[[int], None],
    ) -> None:
        self.children = children
        self.board = board
        self.device_host = device_host
        self.cloud_host = cloud_host
        self.cloud_direct = cloud_direct
        self.throttle_in = throttle_in

    @contextlib.contextmanager
    def during(
        self, load: str, duration_s: float, t0: float, model_path: Path, cloud_plan: str, *, from_s: float = 0.0
    ) -> Iterator[list[tuple[float, float]]]:
        """Apply ``load`` during (a turn of) a run whose window position ``from_s`` is played at monotonic
        time ``t0``; yields the (start, end) window positions it applied, filled in on exit."""
        applied: list[tuple[float, float]] = []
        stop = threading.Event()
        procs: list[subprocess.Popen[Any]] = []
        th: threading.Thread | None = None
        if load == "cloud-busy":
            procs.append(self._busy_cloud(model_path, cloud_plan))
        elif load == "device-burst":
            th = threading.Thread(
                target=self._bursts, args=(load, duration_s, t0, from_s, stop, applied), name="rig-load", daemon=True
            )
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

    def _busy_cloud(self, model_path: Path, cloud_plan: str) -> subprocess.Popen[Any]:
        argv = [
            sys.executable,
            "-m",
            "splitrt.rig.worker",
            "busy",
            json.dumps(
                {"model_path": str(model_path), "cloud": self.cloud_direct, "clients": BUSY_CLIENTS, "plan": cloud_plan}
            ),
        ]
        return self.children.popen(argv, "busy.log", host=self.cloud_host)

    def _bursts(
        self,
        load: str,
        duration_s: float,
        t0: float,
        from_s: float,
        stop: threading.Event,
        applied: list[tuple[float, float]],
    ) -> None:
        """The thread that starts and kills the hogs at the scenario's bursts (those after ``from_s``)."""
        for a, b in burst_intervals(load, duration_s):
            if b <= from_s:
                continue
            if stop.wait(max(0.0, t0 + max(a, from_s) - from_s - time.monotonic())):
                return
            hogs = []
            for _ in range(HOG_PROCS):
                p = self.children.popen(list(HOG_ARGV), "hog.log", host=self.device_host)
                with contextlib.suppress(RigError):
                    self.throttle_in(p.pid)
                hogs.append(p)
            self.board.note([p.pid for p in hogs])
            started = from_s + time.monotonic() - t0
            stop.wait(max(0.0, t0 + b - from_s - time.monotonic()))
            self.board.note([])
            for p in hogs:
                p.kill()
                p.wait(5)
            applied.append((started, from_s + time.monotonic() - t0))
            if stop.is_set():
                return
