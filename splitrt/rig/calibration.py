"""Make the rig's device as slow as the board: the zoo resnet50 must take on the device what the board
takes (its shipped host profile x the board's ``cpu_speed_factor``).

Kernel link: measure its CPU time unthrottled, set the device cgroup's quota = CPU time / target,
re-measure and correct (damped) up to three times. Userspace link: pad the compute with sleep up to
target / unthrottled time, and re-measure. A fixed ``quota_cpus`` / ``pad_factor`` skips the measuring.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from splitrt.errors import RigError
from splitrt.rig.models import profiles_dir, shipped_profile

if TYPE_CHECKING:
    from splitrt.rig.harness import Rig
    from splitrt.rig.processes import JsonWorker

CALIBRATION_MODEL = "resnet50"
TOLERANCE = 0.08  # the run-to-run noise of this shared host is about that large
QUOTA_ROUNDS = 3
REPLY_TIMEOUT_S = 120.0


@dataclass(frozen=True, kw_only=True)
class Calibration:
    model: str
    target_ms: float  # what the board takes (profile x board factor)
    host_ms: float  # measured unthrottled
    host_cpu_ms: float  # CPU time per inference, all threads
    quota_cpus: float | None  # kernel: the cgroup quota; userspace: None
    pad_factor: float  # userspace: sleep-padding factor; kernel: 1
    measured_ms: float  # re-measured on the emulated board after calibration
    rounds: list[dict[str, float]] = field(default_factory=list)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.measured_ms - self.target_ms) / self.target_ms


def calibrate(rig: Rig) -> Calibration:
    """Calibrate ``rig``'s device (see module doc); sets the cgroup's quota on the kernel link."""
    from splitrt.graph import zoo

    fixed = rig.config.quota_cpus if rig.kind == "kernel" else rig.config.pad_factor
    if fixed is not None:
        return _fixed(rig, fixed)
    target = target_ms(rig.board.cpu_speed_factor)
    w = rig.start_worker(
        {"mode": "calibrate", "model_path": str(zoo.get(CALIBRATION_MODEL)), "threads": rig.config.device_threads},
        name="calibrate",
    )
    try:
        r0 = w.call({"cmd": "bench", "runs": rig.config.calibration_runs}, REPLY_TIMEOUT_S)
        host_ms, cpu_ms = float(r0["wall_ms"]), float(r0["cpu_ms"])
        rig.progress(
            f"calibration: resnet50 unthrottled {host_ms:.0f} ms ({cpu_ms:.0f} ms CPU), "
            f"target {target:.0f} ms ({rig.board.name})"
        )
        base = Calibration(
            model=CALIBRATION_MODEL,
            target_ms=target,
            host_ms=host_ms,
            host_cpu_ms=cpu_ms,
            quota_cpus=None,
            pad_factor=1.0,
            measured_ms=host_ms,
            rounds=[{"quota_cpus": 0.0, "ms": host_ms}],
        )
        cal = _by_quota(rig, w, base) if rig.kind == "kernel" and rig.config.calibrate else _by_padding(rig, w, base)
    finally:
        w.close()
    rig.progress(
        f"calibration: resnet50 on the emulated {rig.board.name}: {cal.measured_ms:.0f} ms "
        f"(target {cal.target_ms:.0f} ms, {cal.error_pct:+.1f}%)"
    )
    return cal


def target_ms(cpu_speed_factor: float) -> float:
    """What the board takes on the calibration model: the shipped host profile x its speed factor."""
    prof_path = shipped_profile(CALIBRATION_MODEL)
    if prof_path is None:
        raise RigError(f"no shipped profile of {CALIBRATION_MODEL} in {profiles_dir()} to calibrate against")
    prof = json.loads(prof_path.read_text())
    host_prof_ms = float(next(c["head_ms"] for c in prof["cuts"] if c["cut"] == "device"))
    return host_prof_ms * cpu_speed_factor


def _fixed(rig: Rig, value: float) -> Calibration:
    """The configured emulation as is: quota ``value`` (kernel) or padding ``value`` (userspace)."""
    if rig.kind == "kernel":
        rig.set_quota(value)
    return Calibration(
        model="(not calibrated)",
        target_ms=math.nan,
        host_ms=math.nan,
        host_cpu_ms=math.nan,
        quota_cpus=value if rig.kind == "kernel" else None,
        pad_factor=1.0 if rig.kind == "kernel" else value,
        measured_ms=math.nan,
    )


def _by_quota(rig: Rig, w: JsonWorker, base: Calibration) -> Calibration:
    target, cpus = base.target_ms, float(os.cpu_count() or 1)
    rounds = list(base.rounds)
    quota = min(cpus, max(0.02, base.host_cpu_ms / target))
    rig.set_quota(quota)
    rig.throttle_in(w.proc.pid)
    measured = base.host_ms
    for k in range(QUOTA_ROUNDS):
        measured = float(w.call({"cmd": "bench", "runs": rig.config.calibration_runs}, REPLY_TIMEOUT_S)["wall_ms"])
        rounds.append({"quota_cpus": quota, "ms": measured})
        rig.progress(f"calibration: quota {quota:.3f} CPU -> {measured:.0f} ms")
        if abs(measured / target - 1) <= TOLERANCE or k == QUOTA_ROUNDS - 1:
            break
        # damped: the host is shared, single measurements are noisy
        quota = min(cpus, max(0.02, quota * (measured / target) ** 0.7))
        rig.set_quota(quota)
    rig.throttle_out(w.proc.pid)
    return Calibration(
        model=base.model,
        target_ms=target,
        host_ms=base.host_ms,
        host_cpu_ms=base.host_cpu_ms,
        quota_cpus=rig.throttle.cpu_fraction,
        pad_factor=1.0,
        measured_ms=measured,
        rounds=rounds,
    )


def _by_padding(rig: Rig, w: JsonWorker, base: Calibration) -> Calibration:
    pad = max(1.0, base.target_ms / base.host_ms)
    r1 = w.call({"cmd": "bench", "runs": rig.config.calibration_runs, "pad_factor": pad}, REPLY_TIMEOUT_S)
    measured = float(r1["wall_ms"])
    return Calibration(
        model=base.model,
        target_ms=base.target_ms,
        host_ms=base.host_ms,
        host_cpu_ms=base.host_cpu_ms,
        quota_cpus=None,
        pad_factor=pad,
        measured_ms=measured,
        rounds=[*base.rounds, {"pad_factor": pad, "ms": measured}],
    )
