"""Who owns a rig resource (namespace, cgroup): one record per name under ``/run/splitrt/owners``
holding the owner's pid and start time, so a cleanup removes only what a dead process left behind
and never a parallel run's resources."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PREFIX = "spl-"
OWNERS_DIR = Path("/run/splitrt/owners")


def _proc_start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime); the command name (field 2) may hold spaces, so split after its ')'.
    rest = stat.rsplit(")", 1)[1].split()
    return int(rest[19])


def record_owner(name: str) -> None:
    """Record that this process owns resource ``name`` (a namespace or cgroup name)."""
    OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    (OWNERS_DIR / name).write_text(f"{os.getpid()} {_proc_start_ticks(os.getpid())}\n")


def forget_owner(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (OWNERS_DIR / name).unlink()


def owner_alive(name: str) -> bool:
    """True when ``name`` has an owner record whose process still runs (same pid AND start time)."""
    try:
        pid_s, ticks_s = (OWNERS_DIR / name).read_text().split()
    except (OSError, ValueError):
        return False
    return str(_proc_start_ticks(int(pid_s))) == ticks_s
