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

The benchmark that runs in the rig is ``rigbench``; the rig's child processes are ``rigworker``; the
benchmark's arithmetic (statistics, oracle) is ``rigstats``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from splitrt import paths
from splitrt.errors import ConfigError, RigError
from splitrt.rig import netns, traces
from splitrt.rig.stats import burst_intervals

# One-way delay = rtt/2 on each direction of the relay. The traces carry no latency, so these are
# representative values, not measurements: 3G/HSPA round trips of several tens of ms up to ~100 ms
# (measurement studies of 3G vs LTE, e.g. Huang et al., MobiSys 2012, report 3G RTTs above LTE's);
# we take 80 ms. FCC: fixed broadband, tens of ms (FCC Measuring Broadband America); we take 30 ms.
# Override with ``--rtt-ms``.
FAMILY_RTT_MS = {"hsdpa": 80.0, "fcc": 30.0}
DEFAULT_RTT_MS = 50.0
CLOUD_PORT = 50051
HOG_PROCS = 1  # one busy process next to the device's one compute thread: ~2x slower
BUSY_CLIENTS = 2
CALIBRATION_MODEL = "resnet50"


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def profiles_dir() -> Path:
    return paths.profiles_dir()


def shipped_profile(model_name: str) -> Path | None:
    """The shipped host profile of a zoo model (``profiles/<hostclass>__<model>.json``), if any."""
    from splitrt.profile import profiler

    d = profiles_dir()
    own = d / f"{profiler.host_class()}__{model_name}.json"
    if own.is_file():
        return own
    found = sorted(d.glob(f"*__{model_name}.json"))
    return found[0] if found else None


# ----------------------------------------------------------------------------------------- traces

def load_trace(spec: str) -> traces.Trace:
    """A shipped trace (``hsdpa/bus``), a file, or synthetic ``step:1,8,2[/5]`` (levels Mbit/s, step s),
    ``square:LOW,HIGH[,PERIOD]``, ``constant:MBPS``."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "step" and arg:
            levels, _, step_s = arg.partition("/")
            return traces.step([float(x) for x in levels.split(",")], float(step_s or 5.0))
        if kind == "square" and arg:
            parts = [float(x) for x in arg.split(",")]
            return traces.square(parts[0], parts[1], parts[2] if len(parts) > 2 else 20.0)
        if kind == "constant" and arg:
            return traces.constant(float(arg))
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"trace {spec!r}: expected step:L1,L2[/S], square:LOW,HIGH[,P] or constant:X") from exc
    if spec in traces.shipped():
        return traces.load_shipped(spec)
    if Path(spec).is_file():
        return traces.load(spec)
    raise ConfigError(f"trace {spec!r}: expected a shipped trace ({', '.join(traces.shipped())}), a file, "
                      "or step:/square:/constant:")


def trace_family(trace: traces.Trace) -> str | None:
    fam = trace.name.split("/", 1)[0]
    return fam if fam in FAMILY_RTT_MS else None


def family_median_mbps(family: str | None) -> float:
    """Time-weighted median bandwidth over the shipped traces of ``family`` (all shipped if None)."""
    names = [n for n in traces.shipped() if family is None or n.startswith(family + "/")]
    segs: list[tuple[float, float]] = []
    for n in names:
        segs += [(b - a, r) for a, b, r in traces.load_shipped(n).segments()]
    segs.sort(key=lambda s: s[1])
    total = sum(d for d, _ in segs)
    acc = 0.0
    for d, r in segs:
        acc += d
        if acc >= total / 2:
            return r
    raise ConfigError(f"no shipped traces of family {family!r}")



# ----------------------------------------------------------------------------------------- config

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



# ----------------------------------------------------------------------------------------- the rig

class _Worker:
    """A child speaking JSON lines on stdin/stdout; stdout events go to ``on_event``."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc = proc
        self.name = name
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        self._replies: list[dict[str, Any]] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"rig-{name}-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == "progress":
                if self.on_event is not None:
                    self.on_event(msg)
                continue
            with self._cv:
                self._replies.append(msg)
                self._cv.notify_all()
        with self._cv:
            self._replies.append({"event": "eof"})
            self._cv.notify_all()

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise RigError(f"{self.name} worker is gone (exit code {self.proc.poll()})") from exc

    def reply(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RigError(f"{self.name} worker did not answer within {timeout_s:.0f} s")
                self._cv.wait(left)
            msg = self._replies.pop(0)
        if msg.get("event") == "eof":
            raise RigError(f"{self.name} worker exited (code {self.proc.wait(5)}); see its log")
        if msg.get("event") == "error":
            raise RigError(f"{self.name} worker failed: {msg.get('message')}")
        return msg

    def call(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.send(msg)
        return self.reply(timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RigError):
                self.send({"cmd": "quit"})
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Rig:
    """Namespaces + cloud + shaped link + device cgroup (see module doc). A context manager."""

    def __init__(self, config: RigConfig | None = None, *,
                 progress: Callable[[str], None] | None = None) -> None:
        from splitrt.profile import boards

        self.config = config or RigConfig()
        self.board = boards.load_board(self.config.board)
        want = self.config.link
        if want == "kernel" and not netns.is_root():
            raise RigError(f"link 'kernel' needs root (euid 0), running as euid {os.geteuid()}")
        self.kind = "kernel" if want == "kernel" or (want == "auto" and netns.is_root()
                                                      and netns.tc_available()) else "userspace"
        self.prefix = netns.check_prefix(self.config.prefix or f"spl-rig{os.getpid() % 100000}")
        self.progress = progress or (lambda s: None)
        self.lan: netns.Lan | None = None
        self.shaper: Any = None  # KernelShaper | UserspaceLink
        self.relay: Any = None
        self.throttle: Any = None  # cgroup.CpuThrottle
        self.cloud_proc: subprocess.Popen[Any] | None = None
        self.cloud_address = ""
        self.calibration: Calibration | None = None
        self._own_workdir = self.config.workdir is None
        self.workdir = Path(self.config.workdir or tempfile.mkdtemp(prefix="splitrt-rig-"))
        self.models_dir = self.workdir / "models"
        self._children: list[subprocess.Popen[Any]] = []
        self._port = 0
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

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self.models_dir.mkdir(parents=True, exist_ok=True)
        for m in self.config.models:
            self._copy_model(model_path_for(m))
        if netns.is_root():
            self.removed_leftovers = netns.cleanup_leftovers()
            if self.removed_leftovers:
                self.progress(f"removed leftovers of earlier runs: {', '.join(self.removed_leftovers)}")
        if self.kind == "kernel":
            self._start_kernel()
        else:
            self._start_userspace()

    def _popen(self, argv: list[str], log_name: str, host: netns.Host | None = None,
               pipes: bool = False) -> subprocess.Popen[Any]:
        log = open(self.workdir / log_name, "ab")  # noqa: SIM115 - owned by the child
        kw: dict[str, Any] = {"stderr": log, "preexec_fn": _pdeathsig, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}}
        if pipes:
            kw.update(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        else:
            kw.update(stdout=log, stdin=subprocess.DEVNULL)
        try:
            proc: subprocess.Popen[Any] = (host.popen(argv, **kw) if host is not None
                                           else subprocess.Popen(argv, **kw))
        except OSError as exc:
            raise RigError(f"cannot start {' '.join(argv)}: {exc}") from exc
        finally:
            log.close()
        self._children.append(proc)
        return proc

    def _serve_argv(self, host: str, port: int) -> list[str]:
        return [sys.executable, "-m", "splitrt.cli", "serve", "--models", str(self.models_dir), "--host", host,
                "--port", str(port), "--workers", str(self.config.cloud_workers), "--log-level", "WARNING"]

    def _start_kernel(self) -> None:
        from splitrt.rig import cgroup, shaper

        self.progress(f"rig {self.prefix}: namespaces, veth, htb shaping, cgroup (kernel link)")
        self.lan = netns.make_link(self.prefix)
        cloud_host = self.lan.hosts[1]
        # Strategies take turns (rigbench): a connection parked for the others' turns would restart
        # from a cold congestion window at every turn, a cost one continuous run does not pay. The
        # setting is the namespace's own and goes with it.
        for h in self.lan.hosts:
            h.call(Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").write_text, "0")
        self._start_cloud()
        self.relay = shaper.UserspaceLink((cloud_host.ip, 0), ("127.0.0.1", CLOUD_PORT), rate_mbps=None,
                                          delay_ms=0.0, netns_name=cloud_host.ns)
        self.cloud_address = f"{cloud_host.ip}:{self.relay.port}"
        # 1 s of queue: cellular base stations buffer seconds of traffic (bufferbloat); a 200 ms
        # queue tail-drops a 150 KB request at 2 Mbit/s and TCP then waits out a 200+ ms RTO.
        self.shaper = shaper.KernelShaper.for_host(self.lan, 0, rate_mbps=None, queue_ms=1000.0)
        self.throttle = cgroup.CpuThrottle(f"{self.prefix}-dev", None)
        self.throttle.open()
        self._set_shares(self.throttle, 8)

    def _start_userspace(self) -> None:
        from splitrt.rig import shaper

        self.progress("rig: cloud on 127.0.0.1, rate + delay relay (userspace link), no CPU throttle")
        self._port = _free_port()
        self._start_cloud()
        self.shaper = shaper.UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", self._port), rate_mbps=None,
                                           delay_ms=0.0)
        self.relay = self.shaper
        self.cloud_address = f"127.0.0.1:{self.shaper.port}"

    @staticmethod
    def _set_shares(throttle: Any, mult: int) -> None:
        """Weight the device cgroup so it gets its quota even on a busy host (the quota still caps it)."""
        h = throttle.hierarchy
        name, value = ("cpu.shares", str(1024 * mult)) if h.version == 1 else ("cpu.weight", str(100 * mult))
        with contextlib.suppress(OSError):
            (throttle.path / name).write_text(value)

    def _wait_cloud(self, host: netns.Host | None, port: int = CLOUD_PORT, timeout_s: float = 60.0) -> None:
        import socket

        def probe() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
            return False

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.cloud_proc is not None
            if self.cloud_proc.poll() is not None:
                raise RigError(f"cloud server exited with code {self.cloud_proc.returncode}: "
                               f"{(self.workdir / 'cloud.log').read_text()[-2000:]}")
            ok = host.call(probe) if host is not None else probe()
            if ok:
                return
            time.sleep(0.2)
        raise RigError(f"cloud server did not listen on port {port} within {timeout_s:.0f} s")

    @property
    def cloud_direct(self) -> str:
        """The server itself, bypassing the link (for the cloud-busy clients next to it)."""
        return f"127.0.0.1:{CLOUD_PORT}" if self.kind == "kernel" else f"127.0.0.1:{self._port}"

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
        dst = self._copy_model(path)
        if dst is not None and self.cloud_proc is not None:
            self.progress(f"cloud: restarting to serve {path.name}")
            self.cloud_proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.cloud_proc.wait(10)
            self._start_cloud()
        return self.models_dir / path.name

    def _copy_model(self, path: Path) -> Path | None:
        dst = self.models_dir / path.name
        if dst.exists():
            return None
        try:
            os.link(path, dst)
        except OSError:
            shutil.copyfile(path, dst)
        return dst

    def _start_cloud(self) -> None:
        if self.kind == "kernel":
            self.cloud_proc = self._popen(self._serve_argv("127.0.0.1", CLOUD_PORT), "cloud.log", host=self.cloud_host)
            self._wait_cloud(self.cloud_host)
        else:
            self.cloud_proc = self._popen(self._serve_argv("127.0.0.1", self._port), "cloud.log")
            self._wait_cloud(None, self._port)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for p in reversed(self._children):
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.terminate()
                try:
                    p.wait(3)
                except subprocess.TimeoutExpired:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(3)
        for name, fn in (("relay", lambda: self.relay.close() if self.relay else None),
                         ("shaper", lambda: self.shaper.close() if self.shaper else None),
                         ("cgroup", lambda: self.throttle.close() if self.throttle else None),
                         ("namespaces", lambda: self.lan.destroy() if self.lan else None)):
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

    # -- workers -----------------------------------------------------------------------------------
    def start_worker(self, spec: dict[str, Any], name: str = "device") -> _Worker:
        argv = [sys.executable, "-m", "splitrt.rig.worker", "worker", json.dumps(spec)]
        proc = self._popen(argv, f"{name}.log", host=self.device_host, pipes=True)
        w = _Worker(proc, name)
        w.reply(180)  # {"event": "loaded"}
        return w

    def set_quota(self, cpus: float) -> None:
        """The device cgroup's CPU quota with ``cfs_period_us`` periods (CpuThrottle uses 100 ms)."""
        self.throttle.set_fraction(cpus)
        period = self.config.cfs_period_us
        quota = max(1000, round(cpus * period))
        h, d = self.throttle.hierarchy, self.throttle.path
        try:
            if h.version == 1:
                (d / "cpu.cfs_quota_us").write_text(str(quota))  # lower the quota first: quota <= old period ok
                (d / "cpu.cfs_period_us").write_text(str(period))
                (d / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (d / "cpu.max").write_text(f"{quota} {period}")
        except OSError as exc:
            raise RigError(f"cannot set CPU quota {quota}/{period} us on {d}: {exc}") from exc

    def throttle_in(self, pid: int) -> None:
        if self.throttle is not None:
            self.throttle.add_pid(pid)

    def throttle_threads(self, pid: int, compute: Sequence[int], other: Sequence[int]) -> None:
        """Throttle only the device's compute threads (cgroup v1 places threads one by one): the
        control plane (prober, gRPC I/O threads) stands for the board's spare cores and is not
        stalled by CFS throttling. On cgroup v2 the whole process goes in."""
        if self.throttle is None:
            return
        h, d = self.throttle.hierarchy, self.throttle.path
        if h.version != 1 or not compute:
            self.throttle_in(pid)
            return
        for tids, where in ((compute, d), (other, h.root)):
            for tid in tids:
                with contextlib.suppress(OSError):  # a thread that just ended
                    (where / "tasks").write_text(str(tid))

    def board_tasks_file(self) -> str:
        """Where the device's run-queue probe finds the other processes sharing its CPU (the load
        processes the rig started). Not the cgroup's ``tasks``: ``ip netns exec`` remounts /sys, so the
        device cannot read the cgroup tree."""
        path = self.workdir / "board-tasks"
        if not path.exists():
            path.write_text("")
        return str(path)

    def _note_board_pids(self, pids: Sequence[int]) -> None:
        (self.workdir / "board-tasks").write_text("".join(f"{p}\n" for p in pids))

    def throttle_out(self, pid: int) -> None:
        if self.throttle is not None and self.throttle.hierarchy is not None:
            with contextlib.suppress(OSError):
                (self.throttle.hierarchy.root / "cgroup.procs").write_text(str(pid))

    def calibrate(self) -> Calibration:
        """Make the device take on resnet50 what the board takes (see module doc)."""
        from splitrt.graph import zoo

        if self.calibration is not None:
            return self.calibration
        fixed = self.config.quota_cpus if self.kind == "kernel" else self.config.pad_factor
        if fixed is not None:
            if self.kind == "kernel":
                self.set_quota(fixed)
            self.calibration = Calibration(
                model="(not calibrated)", target_ms=math.nan, host_ms=math.nan, host_cpu_ms=math.nan,
                quota_cpus=fixed if self.kind == "kernel" else None,
                pad_factor=1.0 if self.kind == "kernel" else fixed, measured_ms=math.nan)
            return self.calibration
        prof_path = shipped_profile(CALIBRATION_MODEL)
        if prof_path is None:
            raise RigError(f"no shipped profile of {CALIBRATION_MODEL} in {profiles_dir()} to calibrate against")
        prof = json.loads(prof_path.read_text())
        host_prof_ms = float(next(c["head_ms"] for c in prof["cuts"] if c["cut"] == "device"))
        target = host_prof_ms * self.board.cpu_speed_factor
        n = self.config.calibration_runs
        w = self.start_worker({"mode": "calibrate", "model_path": str(zoo.get(CALIBRATION_MODEL)),
                               "threads": self.config.device_threads}, name="calibrate")
        rounds: list[dict[str, float]] = []
        try:
            r0 = w.call({"cmd": "bench", "runs": n}, 120)
            host_ms, cpu_ms = float(r0["wall_ms"]), float(r0["cpu_ms"])
            rounds.append({"quota_cpus": 0.0, "ms": host_ms})
            self.progress(f"calibration: resnet50 unthrottled {host_ms:.0f} ms ({cpu_ms:.0f} ms CPU), "
                          f"target {target:.0f} ms ({self.board.name})")
            if self.kind == "kernel" and self.config.calibrate:
                quota = min(float(os.cpu_count() or 1), max(0.02, cpu_ms / target))
                self.set_quota(quota)
                self.throttle_in(w.proc.pid)
                measured = host_ms
                for k in range(3):
                    measured = float(w.call({"cmd": "bench", "runs": n}, 120)["wall_ms"])
                    rounds.append({"quota_cpus": quota, "ms": measured})
                    self.progress(f"calibration: quota {quota:.3f} CPU -> {measured:.0f} ms")
                    # within 8 %: the run-to-run noise of this shared host is about that large
                    if abs(measured / target - 1) <= 0.08 or k == 2:
                        break
                    # damped: the host is shared, single measurements are noisy
                    quota = min(float(os.cpu_count() or 1), max(0.02, quota * (measured / target) ** 0.7))
                    self.set_quota(quota)
                self.throttle_out(w.proc.pid)
                cal = Calibration(model=CALIBRATION_MODEL, target_ms=target, host_ms=host_ms, host_cpu_ms=cpu_ms,
                                  quota_cpus=self.throttle.cpu_fraction, pad_factor=1.0, measured_ms=measured,
                                  rounds=rounds)
            else:
                pad = max(1.0, target / host_ms)
                r1 = w.call({"cmd": "bench", "runs": n, "pad_factor": pad}, 120)
                measured = float(r1["wall_ms"])
                rounds.append({"pad_factor": pad, "ms": measured})
                cal = Calibration(model=CALIBRATION_MODEL, target_ms=target, host_ms=host_ms, host_cpu_ms=cpu_ms,
                                  quota_cpus=None, pad_factor=pad, measured_ms=measured, rounds=rounds)
        finally:
            w.close()
        self.progress(f"calibration: resnet50 on the emulated {self.board.name}: {cal.measured_ms:.0f} ms "
                      f"(target {cal.target_ms:.0f} ms, {cal.error_pct:+.1f}%)")
        self.calibration = cal
        return cal

    # -- loads -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def load_driver(self, load: str, duration_s: float, t0: float, model_path: Path, cloud_plan: str, *,
                    from_s: float = 0.0) -> Iterator[list[tuple[float, float]]]:
        """Apply the load scenario during (a turn of) a run whose window position ``from_s`` is played at
        monotonic time ``t0``; yields the (start, end) window positions it applied, filled in on exit."""
        applied: list[tuple[float, float]] = []
        stop = threading.Event()
        procs: list[subprocess.Popen[Any]] = []
        th: threading.Thread | None = None
        if load == "cloud-busy":
            argv = [sys.executable, "-m", "splitrt.rig.worker", "busy", json.dumps(
                {"model_path": str(model_path), "cloud": self.cloud_direct, "clients": BUSY_CLIENTS,
                 "plan": cloud_plan})]
            procs.append(self._popen(argv, "busy.log", host=self.cloud_host))
        elif load == "device-burst":
            hog_argv = [sys.executable, "-c", "while True: pass"]

            def drive() -> None:
                for a, b in burst_intervals(load, duration_s):
                    if b <= from_s:
                        continue
                    if stop.wait(max(0.0, t0 + max(a, from_s) - from_s - time.monotonic())):
                        return
                    hogs = []
                    for _ in range(HOG_PROCS):
                        p = self._popen(hog_argv, "hog.log", host=self.device_host)
                        with contextlib.suppress(RigError):
                            self.throttle_in(p.pid)
                        hogs.append(p)
                    self._note_board_pids([p.pid for p in hogs])
                    started = from_s + time.monotonic() - t0
                    stop.wait(max(0.0, t0 + b - from_s - time.monotonic()))
                    self._note_board_pids([])
                    for p in hogs:
                        p.kill()
                        p.wait(5)
                    applied.append((started, from_s + time.monotonic() - t0))
                    if stop.is_set():
                        return

            th = threading.Thread(target=drive, name="rig-load", daemon=True)
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_path_for(model: str) -> Path:
    from splitrt.graph import zoo

    p = Path(model)
    if p.suffix == ".onnx" and p.is_file():
        return p
    if model in zoo.names():
        return zoo.get(model)
    raise ConfigError(f"model {model!r}: expected a zoo name ({', '.join(zoo.names())}) or an .onnx file")


def profile_for(model: str, model_file: Path, workdir: Path, progress: Callable[[str], None]) -> Path:
    """The shipped host profile of the model, or one measured now (cached in the workdir)."""
    from splitrt.graph import model as graph
    from splitrt.profile import profiler

    sha = graph.load(model_file).sha256
    shipped = shipped_profile(Path(model).stem)
    if shipped is not None:
        with contextlib.suppress(Exception):
            profiler.load_profile(shipped, sha256=sha)
            return shipped
    out = workdir / f"profile-{sha[:12]}.json"
    if not out.exists():
        progress(f"no shipped profile for {model}: profiling it on this host")
        profiler.save_profile(profiler.measure(model_file, runs=5, warmup=1), out)
    return out


def cost_table_for(profile_path: Path, sha: str, speed_factor: float, cloud_factor: float = 1.0) -> Any:
    from splitrt.profile import profiler

    prof = profiler.load_profile(profile_path, sha256=sha)
    return profiler.cost_table(prof, prof, device_speed_factor=speed_factor, cloud_speed_factor=cloud_factor)


