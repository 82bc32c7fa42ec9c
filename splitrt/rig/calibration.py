"""Make the rig's device as slow as the board: the zoo resnet50 must take on the device what the board
takes (its shipped host profile x the board's ``cpu_speed_factor``).

Kernel link: measure its CPU time unthrottled, set the device cgroup's quota = CPU time / target,
re-measure and correct (damped) up to three times. Userspace link: pad the compute with sleep up to
target / unthrottled time, and re-measure. A fixed ``quota_cpus`` / ``pad_factor`` skips the measuring.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from splitrt import paths
from splitrt.errors import RigError
from splitrt.rig.models import shipped_profile

CALIBRATION_MODEL = "resnet50"
TOLERANCE = 0.08  # the run-to-run noise of this shared host is about that large
QUOTA_ROUNDS = 3
RUNS = 3  # timed runs per measurement (after one unmeasured)
REPLY_TIMEOUT_S = 120.0


class Rig(Protocol):
    """What calibration drives of a ``rig.harness.Rig`` (which holds the ``Calibration`` it gets)."""

    kind: str  # kernel | userspace
    config: Any  # ``RigConfig``: quota_cpus, pad_factor, tiers
    board: Any  # ``profile.boards.Board``
    progress: Callable[[str], None]

    def start_workers(self, specs: Sequence[Any]) -> list[Any]: ...
    def set_quota(self, cpus: float) -> None: ...
    def throttle(self, i: int, pid: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Calibration:
    model: str
    quota_cpus: float | None  # kernel: the cgroup quota; userspace: None
    pad_factor: float  # userspace: sleep-padding factor; kernel: 1
    target_ms: float = math.nan  # what the board takes (profile x board factor); nan: not calibrated
    host_ms: float = math.nan  # measured unthrottled
    host_cpu_ms: float = math.nan  # CPU time per inference, all threads
    measured_ms: float = math.nan  # re-measured on the emulated board after calibration
    rounds: list[dict[str, float]] = field(default_factory=list)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.measured_ms - self.target_ms) / self.target_ms


def calibrate(rig: Rig) -> Calibration:
    """Calibrate ``rig``'s devices (see module doc); sets their cgroups' quota on the kernel link. Devices
    with a quota of their own (``Tier.cpus``) are not calibrated."""
    from splitrt.graph import zoo
    from splitrt.rig import protocol as P

    kernel = rig.kind == "kernel"
    fixed = rig.config.quota_cpus if kernel else rig.config.pad_factor
    if rig.config.tiers[0].cpus or fixed is not None:
        if kernel and fixed is not None:
            rig.set_quota(fixed)
        pad = 1.0 if kernel or fixed is None else fixed
        return Calibration(model="(not calibrated)", quota_cpus=fixed if kernel else None, pad_factor=pad)
    target = target_ms(rig.board.cpu_speed_factor)
    (w,) = rig.start_workers([P.Spec(model_path=str(zoo.get(CALIBRATION_MODEL)))])

    def measure(pad: float = 1.0) -> P.Ack:
        return P.ask([w], [P.Time(runs=RUNS, pad_factor=pad)], P.Ack, REPLY_TIMEOUT_S)[0]

    try:
        r0 = measure()
        host_ms, cpu_ms = r0.wall_ms, r0.cpu_ms
        rig.progress(
            f"calibration: resnet50 unthrottled {host_ms:.0f} ms ({cpu_ms:.0f} ms CPU), "
            f"target {target:.0f} ms ({rig.board.name})"
        )
        rounds = [{"quota_cpus": 0.0, "ms": host_ms}]
        if kernel:
            cpus = float(os.cpu_count() or 1)
            quota = min(cpus, max(0.02, cpu_ms / target))
            rig.set_quota(quota)
            rig.throttle(0, w.proc.pid)
            for k in range(QUOTA_ROUNDS):
                measured = measure().wall_ms
                rounds.append({"quota_cpus": quota, "ms": measured})
                rig.progress(f"calibration: quota {quota:.3f} CPU -> {measured:.0f} ms")
                if abs(measured / target - 1) <= TOLERANCE or k == QUOTA_ROUNDS - 1:
                    break
                quota = min(cpus, max(0.02, quota * (measured / target) ** 0.7))  # damped: the host is shared
                rig.set_quota(quota)
            pad, got_quota = 1.0, quota
        else:
            pad, got_quota = max(1.0, target / host_ms), None
            measured = measure(pad).wall_ms
            rounds.append({"pad_factor": pad, "ms": measured})
    finally:
        w.close()
    cal = Calibration(
        model=CALIBRATION_MODEL,
        target_ms=target,
        host_ms=host_ms,
        host_cpu_ms=cpu_ms,
        quota_cpus=got_quota,
        pad_factor=pad,
        measured_ms=measured,
        rounds=rounds,
    )
    rig.progress(
        f"calibration: resnet50 on the emulated {rig.board.name}: {cal.measured_ms:.0f} ms "
        f"(target {cal.target_ms:.0f} ms, {cal.error_pct:+.1f}%)"
    )
    return cal


def target_ms(cpu_speed_factor: float) -> float:
    """What the board takes on the calibration model: the shipped host profile x its speed factor."""
    from splitrt.profile import profiler

    prof_path = shipped_profile(CALIBRATION_MODEL)
    if prof_path is None:
        raise RigError(f"no shipped profile of {CALIBRATION_MODEL} in {paths.profiles_dir()} to calibrate against")
    return next(c.head_ms for c in profiler.load_profile(prof_path).cuts if c.cut == "device") * cpu_speed_factor
