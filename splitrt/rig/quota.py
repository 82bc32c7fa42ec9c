"""What the rig does with the device's cgroup beyond ``cgroup.CpuThrottle``: short CFS periods, a high
weight, and moving single threads (cgroup v1) or processes in and out of it."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from splitrt.errors import RigError

if TYPE_CHECKING:
    from splitrt.rig.cgroup import CpuThrottle, Hierarchy

DEVICE_SHARES = 8  # x the default weight


def _opened(throttle: CpuThrottle) -> tuple[Hierarchy, Path]:
    if throttle.hierarchy is None or throttle.path is None:
        raise RigError(f"cgroup {throttle.name} is not open")
    return throttle.hierarchy, throttle.path


def set_shares(throttle: CpuThrottle, mult: int) -> None:
    """Weight the device cgroup so it gets its quota even on a busy host (the quota still caps it)."""
    h, d = _opened(throttle)
    name, value = ("cpu.shares", str(1024 * mult)) if h.version == 1 else ("cpu.weight", str(100 * mult))
    with contextlib.suppress(OSError):
        (d / name).write_text(value)


def set_quota(throttle: CpuThrottle, cpus: float, period_us: int) -> None:
    """``cpus`` CPUs in ``period_us`` periods: short periods spread the throttling evenly instead of
    the 100 ms stalls of CpuThrottle's own period."""
    throttle.set_fraction(cpus)
    quota = max(1000, round(cpus * period_us))
    h, d = _opened(throttle)
    try:
        if h.version == 1:
            (d / "cpu.cfs_quota_us").write_text(str(quota))  # lower the quota first: quota <= old period ok
            (d / "cpu.cfs_period_us").write_text(str(period_us))
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (d / "cpu.max").write_text(f"{quota} {period_us}")
    except OSError as exc:
        raise RigError(f"cannot set CPU quota {quota}/{period_us} us on {d}: {exc}") from exc


def add_threads(throttle: CpuThrottle, pid: int, compute: Sequence[int], other: Sequence[int]) -> None:
    """Throttle only the device's compute threads (cgroup v1 places threads one by one): the control
    plane (prober, gRPC I/O threads) stands for the board's spare cores and is not stalled by CFS
    throttling. On cgroup v2 (or with no compute threads named) the whole process goes in."""
    h, d = _opened(throttle)
    if h.version != 1 or not compute:
        throttle.add_pid(pid)
        return
    for tids, where in ((compute, d), (other, h.root)):
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that just ended
                (where / "tasks").write_text(str(tid))


def remove_pid(throttle: CpuThrottle, pid: int) -> None:
    """Back to the root cgroup (unthrottled); a process that is gone is no error."""
    if throttle.hierarchy is not None:
        with contextlib.suppress(OSError):
            (throttle.hierarchy.root / "cgroup.procs").write_text(str(pid))
