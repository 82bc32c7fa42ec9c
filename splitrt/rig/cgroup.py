"""Throttle a process tree's CPU with a cgroup (root only).

cgroup v1 (``/sys/fs/cgroup/cpu/<name>/cpu.cfs_quota_us`` + ``cpu.cfs_period_us``) is used when the v1
``cpu`` controller is mounted (as on this project's CI kernel); otherwise cgroup v2 (``cpu.max`` under
the unified hierarchy, with ``+cpu`` enabled in the parent's ``cgroup.subtree_control``).

``CpuThrottle(name, cpu_fraction)`` creates ``spl-<name>`` (``name`` may already carry the prefix),
``add_pid(pid)`` moves a process into it (children it forks later follow it); on exit the remaining
processes move back to the root cgroup and the directory is removed. The owner is recorded like the
namespaces' (``splitrt.rig.owners``) so ``netns.cleanup_leftovers`` removes cgroups of crashed runs.
A ``cpu_fraction`` of 2.0 means two full CPUs. The rig's devices also use short CFS periods, a high
weight, single threads moved in and out (cgroup v1), and one CPU (``pin_cpu``): a board's core is one
runqueue. Spread over the host's runqueues, a quota below a CPU is drawn in per-CPU slices (5 ms, more than
the 3.4 ms a period has): the CPU whose tasks ask first takes it all, and a woken thread on the other waits
periods. Measured (0.17 CPU / 20 ms, beside 3 busy-loops, a 1 ms job every 250 ms): 36-48 ms median, p90
81-121 ms, spread; 1.0 ms median, p90 39-40 ms, on one CPU (a board's scheduler runs a woken thread at once).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from splitrt.errors import RigError
from splitrt.rig import owners

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
MIN_FRACTION = 0.01
MIN_QUOTA_US = 1000


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    root: Path  # the directory our cgroups are created in


def detect() -> Hierarchy:
    """The cgroup hierarchy holding the cpu controller (v1 preferred when mounted)."""
    v1 = CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return Hierarchy(1, v1)
    for cand in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        ctl = cand / "cgroup.controllers"
        if ctl.exists() and "cpu" in ctl.read_text().split():
            return Hierarchy(2, cand)
    raise RigError(
        f"no cgroup cpu controller found: expected {v1}/cpu.cfs_quota_us or 'cpu' in {CGROUP_ROOT}/cgroup.controllers"
    )


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise RigError(f"cannot write {value.strip()!r} to {path}: {exc}") from exc


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _tids(pid: int) -> list[int]:
    """The threads of ``pid`` (just ``pid`` if it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def _remove_dir(h: Hierarchy, d: Path) -> None:
    """Move the processes left in ``d`` to the root cgroup and remove ``d`` (retrying briefly)."""
    last: OSError | None = None
    for _ in range(50):
        for pid in _procs(d):
            with contextlib.suppress(OSError):
                (h.root / "cgroup.procs").write_text(str(pid))
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # EBUSY while a task is leaving
            last = exc
            time.sleep(0.02)
    raise RigError(f"cannot remove cgroup {d}: {last}")


def cgroup_name(name: str) -> str:
    full = name if name.startswith(owners.PREFIX) else f"{owners.PREFIX}{name}"
    if "/" in full or len(full) > 60:
        raise RigError(f"cgroup name must be one path component of at most 60 chars, got {full!r}")
    return full


def cgroup_exists(name: str) -> bool:
    try:
        return (detect().root / name).is_dir()
    except RigError:
        return False


class CpuThrottle:
    """Context manager: a ``spl-`` cgroup limited to ``cpu_fraction`` CPUs (``None`` = unlimited)."""

    def __init__(self, name: str, cpu_fraction: float | None, *, period_us: int = PERIOD_US) -> None:
        self.name = cgroup_name(name)
        self.cpu_fraction = cpu_fraction
        self.period_us = period_us  # short periods spread the throttling evenly instead of 100 ms stalls
        self.pin_cpu: int | None = None  # what enters runs on this CPU while the quota is at most one
        self.hierarchy: Hierarchy | None = None
        self.path: Path | None = None

    def __enter__(self) -> CpuThrottle:
        self.open()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        if os.geteuid() != 0:
            raise RigError(f"CPU throttling needs root (euid 0), running as euid {os.geteuid()}")
        h = detect()
        self.hierarchy = h
        if h.version == 2:
            sc = h.root / "cgroup.subtree_control"
            if "cpu" not in sc.read_text().split():
                _write(sc, "+cpu")
        owners.record_owner(self.name)
        self.path = h.root / self.name
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            raise RigError(f"cannot create cgroup {self.path}: {exc}") from exc
        self.set_fraction(self.cpu_fraction)

    def set_fraction(self, cpu_fraction: float | None) -> None:
        """Change the limit on the fly (e.g. a load burst lowers the quota)."""
        if cpu_fraction is not None and not MIN_FRACTION <= cpu_fraction <= 1024:
            raise RigError(f"cpu_fraction must be in [{MIN_FRACTION}, 1024] or None, got {cpu_fraction}")
        h, d = self._opened()
        self.cpu_fraction = cpu_fraction
        quota = -1 if cpu_fraction is None else max(MIN_QUOTA_US, round(cpu_fraction * self.period_us))
        if h.version == 1:  # the quota first too: a quota above a shortened period's old one is refused
            _write(d / "cpu.cfs_quota_us", str(quota))
            _write(d / "cpu.cfs_period_us", str(self.period_us))
            _write(d / "cpu.cfs_quota_us", str(quota))
        else:
            _write(d / "cpu.max", f"{'max' if quota < 0 else quota} {self.period_us}")

    def set_weight(self, mult: int) -> None:
        """``mult`` x the default CPU weight: the cgroup gets its quota even on a busy host."""
        h, d = self._opened()
        name, value = ("cpu.shares", str(1024 * mult)) if h.version == 1 else ("cpu.weight", str(100 * mult))
        with contextlib.suppress(OSError):
            (d / name).write_text(value)

    def add_pid(self, pid: int) -> None:
        _, d = self._opened()
        _write(d / "cgroup.procs", str(pid))
        self._pin(_tids(pid))

    def _pin(self, tids: Sequence[int], cpus: set[int] | None = None) -> None:
        """``tids`` onto ``pin_cpu`` (``cpus``: onto those instead) while the quota is at most one CPU."""
        if cpus is None and (self.pin_cpu is None or self.cpu_fraction is None or self.cpu_fraction > 1):
            return
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(tid, cpus or {self.pin_cpu or 0})

    def add_threads(self, pid: int, compute: Sequence[int], other: Sequence[int]) -> None:
        """Only ``compute`` threads in (cgroup v1 places threads one by one; ``other`` go to the root): a
        device's control plane (prober, gRPC I/O) stands for the board's spare cores and is not stalled
        by CFS throttling. On cgroup v2 (or with no compute threads named) the whole process goes in."""
        h, d = self._opened()
        if h.version != 1 or not compute:
            self.add_pid(pid)
            return
        for tids, where in ((compute, d), (other, h.root)):
            for tid in tids:
                with contextlib.suppress(OSError):  # a thread that just ended
                    (where / "tasks").write_text(str(tid))
        self._pin(other, os.sched_getaffinity(0))
        self._pin(compute)

    def remove_pid(self, pid: int) -> None:
        """Back to the root cgroup (unthrottled); a process that is gone is no error."""
        if self.hierarchy is not None:
            with contextlib.suppress(OSError):
                (self.hierarchy.root / "cgroup.procs").write_text(str(pid))
            if self.pin_cpu is not None:
                self._pin(_tids(pid), os.sched_getaffinity(0))

    def pids(self) -> list[int]:
        _, d = self._opened()
        return _procs(d)

    def close(self) -> None:
        if self.path is not None and self.hierarchy is not None:
            _remove_dir(self.hierarchy, self.path)
            owners.forget_owner(self.name)
            self.path = None

    def _opened(self) -> tuple[Hierarchy, Path]:
        if self.hierarchy is None or self.path is None:
            raise RigError(f"cgroup {self.name} is not open (use it as a context manager)")
        return self.hierarchy, self.path


@contextlib.contextmanager
def share_with(board: CpuThrottle, aside: CpuThrottle, pids: Sequence[int]) -> Iterator[None]:
    """Other work (``pids``) holding a board: the board's quota shrinks to ``1 / (1 + len(pids))`` of what it
    was, and ``pids`` wait in ``aside`` (its minimum quota), runnable, where a run-queue probe sees them; on
    exit the quota is restored (the pids stay in ``aside``). Not busy-loops under the board's quota: the
    period's quota went to them first, so every thread of the device that woke waited for the next period, a
    wait a board's scheduler does not make (+19-39 ms per remote call: ``bench/bench_board_emulation.py``).
    A board without a quota has no share to shrink: ``pids`` join it and take their share by competing."""
    base, period_us = board.cpu_fraction, board.period_us
    for pid in pids:
        (aside if base is not None else board).add_pid(pid)
    if base is not None:
        share = max(MIN_FRACTION, base / (1 + len(pids)))
        board.period_us = max(period_us, math.ceil(MIN_QUOTA_US / share))  # the kernel's least quota: 1 ms
        board.set_fraction(share)
    try:
        yield
    finally:
        if base is not None:
            board.period_us = period_us
            board.set_fraction(base)


def cleanup_cgroups(prefix: str = owners.PREFIX, *, include_live: bool = False) -> list[str]:
    """Remove ``prefix*`` cgroups whose owner is dead; returns ``cgroup:PATH`` for each one removed."""
    try:
        h = detect()
    except RigError:
        return []
    removed = []
    for d in sorted(h.root.glob(f"{prefix}*")):
        if d.is_dir() and (include_live or not owners.owner_alive(d.name)):
            _remove_dir(h, d)
            owners.forget_owner(d.name)
            removed.append(f"cgroup:{d}")
    return removed
