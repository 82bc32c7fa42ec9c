"""Hardware-in-the-loop rig: a real device process and a real cloud process over a shaped link.

Topology (root, ``link == "kernel"``)::

    ns {prefix}-h0 (device)                          ns {prefix}-h1 (cloud)
    device worker ── eth0 ══ veth, htb both ways ══ eth0 ── delay relay ── splitrt serve (127.0.0.1)
    (cgroup {prefix}-dev: CPU quota = the board)           (userspace, +rtt/2 each way)

- The link's rate follows a bandwidth trace in real time (``shaper.KernelShaper`` + ``TracePlayer``);
  netem is absent from this kernel, so the one-way delay comes from a ``shaper.UserspaceLink`` relay
  (rate ``None``) in the cloud namespace in front of the server: an RPC sees ``rtt_ms`` more.
- The device worker (``python -m splitrt.rig.worker worker``) is throttled by a cgroup whose quota is
  calibrated so that the zoo resnet50 takes on the device what the board takes (``calibrate``): measure
  its CPU time unthrottled, set quota = CPU time / target, re-measure, correct, re-measure. The worker
  prepares (loads, builds sessions) *outside* the cgroup and is moved in for the timed part only.
- Without root (or ``link == "userspace"``): the cloud runs on 127.0.0.1, the link is a rate + delay
  relay (``UserspaceLink``) following the trace, and the board is emulated by padding the device's
  compute (head and local tail) with sleep up to ``pad_factor`` x its measured time, ``pad_factor``
  calibrated on resnet50 the same way. Results say which ran (``"link": "kernel"|"userspace"``).

Cleanup: every namespace, qdisc and cgroup is removed on exit, on Ctrl-C / SIGTERM and on errors;
children get ``PR_SET_PDEATHSIG`` so they die with the rig; a run killed with SIGKILL leaves
namespaces and cgroups whose owner is dead, removed by the next run (``netns.cleanup_leftovers`` at
start) or by ``splitrt rig cleanup``.

The benchmark that runs in the rig is ``rig.bench``; the rig's child processes are ``rig.worker``; the
benchmark's arithmetic (statistics, oracle) is ``rig.stats``. ``Rig`` holds the pieces together and
delegates: child processes (``rig.processes``), the cloud server (``rig.cloudserver``), the link
(``rig.link``), the device cgroup (``rig.quota``), calibration (``rig.calibration``), load scenarios
(``rig.loads``); models and profiles (``rig.models``) and trace specs (``rig.tracespec``) for the runs.

``splitrt.rig.harness`` (root for the kernel link; ``splitrt bench``, ``splitrt rig cleanup``, ``splitrt demo``;
helpers in ``rig.processes``, ``rig.cloudserver``, ``rig.link``, ``rig.quota``, ``rig.calibration``,
``rig.loads``, ``rig.models``, ``rig.tracespec``)

- ``Rig(RigConfig(board, link="auto"|"kernel"|"userspace", models=..., quota_cpus=None, pad_factor=None))``
  context manager: namespaces ``{prefix}-h0`` (device) / ``-h1`` (cloud) over one veth (``netns.make_link``),
  ``KernelShaper.for_host(lan, 0, queue_ms=1000)`` both ways, a delay relay (``UserspaceLink``, rate None, rtt/2
  each way) in front of ``splitrt serve`` in the cloud namespace, cgroup ``{prefix}-dev`` (20 ms CFS period,
  shares x8). Userspace: cloud on 127.0.0.1 behind a rate + delay relay, compute padded by sleep. ``.kind`` says
  which; ``.calibrate() -> Calibration`` (resnet50: measure, set quota, re-measure). Cleanup on exit / Ctrl-C /
  SIGTERM; children get PR_SET_PDEATHSIG; SIGKILLed runs are removed by the next ``Rig``
  (``netns.cleanup_leftovers``) or ``splitrt rig cleanup``.
- The rig's namespaces run with ``net.ipv4.tcp_slow_start_after_idle = 0`` (per namespace): strategies take
  turns, and a connection parked for the others' turns must not restart from a cold window.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from splitrt import paths
from splitrt.errors import ConfigError, RigError
from splitrt.rig import calibration, link, netns, quota, traces
from splitrt.rig.calibration import CALIBRATION_MODEL, Calibration
from splitrt.rig.cloudserver import CLOUD_PORT, CloudProcess
from splitrt.rig.loads import BUSY_CLIENTS, HOG_PROCS, BoardTasks, LoadDriver
from splitrt.rig.models import cost_table_for, model_path_for, profile_for, profiles_dir, shipped_profile
from splitrt.rig.processes import Children, JsonWorker, free_port
from splitrt.rig.stats import burst_intervals
from splitrt.rig.tracespec import DEFAULT_RTT_MS, FAMILY_RTT_MS, family_median_mbps, load_trace, trace_family

# What moved out of this module keeps importing from it.
__all__ = [
    "BUSY_CLIENTS",
    "CALIBRATION_MODEL",
    "CLOUD_PORT",
    "DEFAULT_RTT_MS",
    "FAMILY_RTT_MS",
    "HOG_PROCS",
    "Calibration",
    "Rig",
    "RigConfig",
    "burst_intervals",
    "cost_table_for",
    "family_median_mbps",
    "load_trace",
    "model_path_for",
    "netns",
    "paths",
    "profile_for",
    "profiles_dir",
    "shipped_profile",
    "trace_family",
    "traces",
]


@dataclass(frozen=True, kw_only=True)
class RigConfig:
    board: str = "rpi4"
    link: str = "auto"  # auto | kernel | userspace
    prefix: str | None = None
    workdir: Path | None = None
    cloud_workers: int = 2
    device_threads: int = 1  # one compute thread throttles smoothly (2 threads: +-7 % run to run)
    calibrate: bool = True
    calibration_runs: int = 3
    keep_workdir: bool = False
    models: tuple[str, ...] = ()  # served from the start (a model added later restarts the cloud)
    cfs_period_us: int = 20_000  # short periods: throttling spread evenly, not 100 ms stalls
    # Skip the calibration with a fixed emulation (tests): the cgroup quota (kernel) or the compute
    # padding factor (userspace).
    quota_cpus: float | None = None
    pad_factor: float | None = None

    def __post_init__(self) -> None:
        if self.link not in ("auto", "kernel", "userspace"):
            raise ConfigError(f"link: expected auto, kernel or userspace, got {self.link!r}")


class Rig:
    """Namespaces + cloud + shaped link + device cgroup (see module doc). A context manager."""

    def __init__(self, config: RigConfig | None = None, *, progress: Callable[[str], None] | None = None) -> None:
        from splitrt.profile import boards

        self.config = config or RigConfig()
        self.board = boards.load_board(self.config.board)
        self.kind = link.link_kind(self.config.link)
        self.prefix = netns.check_prefix(self.config.prefix or f"spl-rig{os.getpid() % 100000}")
        self.progress = progress or (lambda s: None)
        self.lan: netns.Lan | None = None
        self.shaper: Any = None  # KernelShaper | UserspaceLink
        self.relay: Any = None
        self.throttle: Any = None  # cgroup.CpuThrottle
        self.cloud_address = ""
        self.calibration: Calibration | None = None
        self._own_workdir = self.config.workdir is None
        self.workdir = Path(self.config.workdir or tempfile.mkdtemp(prefix="splitrt-rig-"))
        self.models_dir = self.workdir / "models"
        self._children = Children(self.workdir)
        self._cloud = CloudProcess(
            self._children, self.models_dir, workers=self.config.cloud_workers, progress=self.progress
        )
        self._board_tasks = BoardTasks(self.workdir)
        self._old_sigterm: Any = None
        self.removed_leftovers: list[str] = []
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> Rig:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        for m in self.config.models:
            self._cloud.copy_model(model_path_for(m))
        if netns.is_root():
            self.removed_leftovers = netns.cleanup_leftovers()
            if self.removed_leftovers:
                self.progress(f"removed leftovers of earlier runs: {', '.join(self.removed_leftovers)}")
        if self.kind == "kernel":
            self._start_kernel()
        else:
            self._start_userspace()

    def _start_kernel(self) -> None:
        from splitrt.rig import cgroup

        self.progress(f"rig {self.prefix}: namespaces, veth, htb shaping, cgroup (kernel link)")
        # Each piece goes on self as soon as it exists: close() tears down whatever was made.
        self.lan = netns.make_link(self.prefix)
        cloud_host = self.lan.hosts[1]
        link.keep_windows_warm(self.lan)
        self._cloud.start(cloud_host, CLOUD_PORT)
        self.relay = link.delay_relay(cloud_host, CLOUD_PORT)
        self.cloud_address = f"{cloud_host.ip}:{self.relay.port}"
        self.shaper = link.kernel_shaper(self.lan)
        self.throttle = cgroup.CpuThrottle(f"{self.prefix}-dev", None)
        self.throttle.open()
        quota.set_shares(self.throttle, quota.DEVICE_SHARES)

    def _start_userspace(self) -> None:
        self.progress("rig: cloud on 127.0.0.1, rate + delay relay (userspace link), no CPU throttle")
        port = free_port()
        self._cloud.start(None, port)
        self.shaper = link.userspace_link(port)
        self.relay = self.shaper
        self.cloud_address = f"127.0.0.1:{self.shaper.port}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        self._children.terminate_all()
        for name, fn in (
            ("relay", lambda: self.relay.close() if self.relay else None),
            ("shaper", lambda: self.shaper.close() if self.shaper else None),
            ("cgroup", lambda: self.throttle.close() if self.throttle else None),
            ("namespaces", lambda: self.lan.destroy() if self.lan else None),
        ):
            try:
                fn()
            except Exception as exc:  # keep tearing down the rest
                errors.append(f"{name}: {exc}")
        if self._own_workdir and not self.config.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_sigterm)
        if errors:
            raise RigError("rig teardown: " + "; ".join(errors))

    # -- where things are --------------------------------------------------------------------------
    @property
    def cloud_proc(self) -> subprocess.Popen[Any] | None:
        return self._cloud.proc

    @cloud_proc.setter
    def cloud_proc(self, proc: subprocess.Popen[Any] | None) -> None:
        self._cloud.proc = proc

    @property
    def cloud_direct(self) -> str:
        """The server itself, bypassing the link (for the cloud-busy clients next to it)."""
        return f"127.0.0.1:{CLOUD_PORT}" if self.kind == "kernel" else f"127.0.0.1:{self._cloud.port}"

    @property
    def device_host(self) -> netns.Host | None:
        return self.lan.hosts[0] if self.lan is not None else None

    @property
    def cloud_host(self) -> netns.Host | None:
        return self.lan.hosts[1] if self.lan is not None else None

    def set_rtt(self, rtt_ms: float) -> None:
        self.relay.set_delay(rtt_ms / 2)

    def install_model(self, path: Path) -> Path:
        """Put the model where the cloud serves it from; restarts the cloud if it is new (the server
        lists only the models it found at start in its Status, which devices check first)."""
        return self._cloud.install_model(path)

    # -- device ------------------------------------------------------------------------------------
    def start_worker(self, spec: dict[str, Any], name: str = "device") -> JsonWorker:
        argv = [sys.executable, "-m", "splitrt.rig.worker", "worker", json.dumps(spec)]
        proc = self._children.popen(argv, f"{name}.log", host=self.device_host, pipes=True)
        w = JsonWorker(proc, name)
        w.reply(180)  # {"event": "loaded"}
        return w

    def set_quota(self, cpus: float) -> None:
        """The device cgroup's CPU quota with ``cfs_period_us`` periods (CpuThrottle uses 100 ms)."""
        quota.set_quota(self.throttle, cpus, self.config.cfs_period_us)

    def throttle_in(self, pid: int) -> None:
        if self.throttle is not None:
            self.throttle.add_pid(pid)

    def throttle_threads(self, pid: int, compute: Sequence[int], other: Sequence[int]) -> None:
        """Only the device's compute threads on cgroup v1 (see ``quota.add_threads``)."""
        if self.throttle is not None:
            quota.add_threads(self.throttle, pid, compute, other)

    def throttle_out(self, pid: int) -> None:
        if self.throttle is not None:
            quota.remove_pid(self.throttle, pid)

    def board_tasks_file(self) -> str:
        """Where the device's run-queue probe finds the other processes sharing its CPU (``loads.BoardTasks``)."""
        return self._board_tasks.file()

    def calibrate(self) -> Calibration:
        """Make the device take on resnet50 what the board takes (see ``rig.calibration``); once."""
        if self.calibration is None:
            self.calibration = calibration.calibrate(self)
        return self.calibration

    # -- loads -------------------------------------------------------------------------------------
    def load_driver(
        self, load: str, duration_s: float, t0: float, model_path: Path, cloud_plan: str, *, from_s: float = 0.0
    ) -> contextlib.AbstractContextManager[list[tuple[float, float]]]:
        """Apply the load scenario during (a turn of) a run whose window position ``from_s`` is played at
        monotonic time ``t0``; yields the (start, end) window positions it applied, filled in on exit."""
        driver = LoadDriver(
            self._children,
            self._board_tasks,
            device_host=self.device_host,
            cloud_host=self.cloud_host,
            cloud_direct=self.cloud_direct,
            throttle_in=self.throttle_in,
        )
        return driver.during(load, duration_s, t0, model_path, cloud_plan, from_s=from_s)
