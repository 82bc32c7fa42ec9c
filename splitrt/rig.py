"""Hardware-in-the-loop rig: a real device process and a real cloud process over a shaped link.

Topology (root, ``link == "kernel"``)::

    ns {prefix}-h0 (device)                          ns {prefix}-h1 (cloud)
    device worker ── eth0 ══ veth, htb both ways ══ eth0 ── delay relay ── splitrt serve (127.0.0.1)
    (cgroup {prefix}-dev: CPU quota = the board)           (userspace, +rtt/2 each way)

- The link's rate follows a bandwidth trace in real time (``shaper.KernelShaper`` + ``TracePlayer``);
  netem is absent from this kernel, so the one-way delay comes from a ``shaper.UserspaceLink`` relay
  (rate ``None``) in the cloud namespace in front of the server: an RPC sees ``rtt_ms`` more.
- The device worker (``python -m splitrt.rig worker``) is throttled by a cgroup whose quota is
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

The benchmark (``run_bench``) drives one device worker through every strategy in turn on the same
trace window, then computes the oracle offline (``oracle``) from the measured per-cut costs and the
bandwidth each request met (the trace), and the statistics (``summarize``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from splitrt import netns, traces
from splitrt.errors import ConfigError, RigError
from splitrt.netmon import LoadEstimator

# One-way delay = rtt/2 on each direction of the relay. The traces carry no latency, so these are
# representative values, not measurements: 3G/HSPA round trips of several tens of ms up to ~100 ms
# (measurement studies of 3G vs LTE, e.g. Huang et al., MobiSys 2012, report 3G RTTs above LTE's);
# we take 80 ms. FCC: fixed broadband, tens of ms (FCC Measuring Broadband America); we take 30 ms.
# Override with ``--rtt-ms``.
FAMILY_RTT_MS = {"hsdpa": 80.0, "fcc": 30.0}
DEFAULT_RTT_MS = 50.0
STRATEGIES = ("device-only", "cloud-only", "static", "periodic", "adaptive", "oracle")
LOADS = ("none", "device-burst", "cloud-busy")
CLOUD_PORT = 50051
HOG_PROCS = 1  # one busy process next to the device's one compute thread: ~2x slower
BUSY_CLIENTS = 2
CALIBRATION_MODEL = "resnet50"


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def profiles_dir() -> Path:
    env = os.environ.get("SPLITRT_PROFILES_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "profiles"


def shipped_profile(model_name: str) -> Path | None:
    """The shipped host profile of a zoo model (``profiles/<hostclass>__<model>.json``), if any."""
    from splitrt import profiler

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


def transfer_ms(trace: traces.Trace, start_s: float, nbytes: float, min_mbps: float = 0.05) -> float:
    """Time to push ``nbytes`` through a link following ``trace`` from ``start_s`` (ideal: no RTT)."""
    if nbytes <= 0:
        return 0.0
    left_bits = nbytes * 8.0
    t = max(0.0, start_s)
    for _ in range(100_000):
        idx = trace.index_at(t)
        period = math.floor(t / trace.duration_s) * trace.duration_s
        end = period + (trace.times_s[idx + 1] if idx + 1 < len(trace.times_s) else trace.duration_s)
        rate = max(trace.rates_mbps[idx], min_mbps) * 1e6
        if end <= t:  # float edge: step past it
            end = t + 1e-9
        can = rate * (end - t)
        if can >= left_bits:
            return (t + left_bits / rate - start_s) * 1e3
        left_bits -= can
        t = end
    raise RigError("transfer_ms: trace too slow to deliver the bytes")


def mean_rate_during(trace: traces.Trace, start_s: float, dur_s: float) -> float:
    if dur_s <= 0:
        return trace.rate_at(max(0.0, start_s))
    n = 20
    return statistics.fmean(trace.rate_at(start_s + (i + 0.5) * dur_s / n) for i in range(n))


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


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    model: str = "resnet50"
    trace: str = "hsdpa/car"
    bandwidth_scale: float = 1.0
    load: str = "none"
    rate_hz: float = 4.0
    duration_s: float = 30.0  # per strategy
    trace_offset_s: float = 0.0
    rtt_ms: float | None = None  # None: typical of the trace's family
    codecs: tuple[str, ...] | None = None  # None: every codec of the cost table, for every strategy
    strategies: tuple[str, ...] = STRATEGIES
    deadline_ms: float = 5000.0
    periodic_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.load not in LOADS:
            raise ConfigError(f"load: expected one of {', '.join(LOADS)}, got {self.load!r}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"strategies: expected names in {', '.join(STRATEGIES)}, got {bad}")
        if not self.rate_hz > 0 or not self.duration_s > 0 or not self.bandwidth_scale > 0:
            raise ConfigError(f"rate_hz, duration_s, bandwidth_scale must be > 0, got {self.rate_hz}, "
                              f"{self.duration_s}, {self.bandwidth_scale}")


def burst_intervals(load: str, duration_s: float) -> list[tuple[float, float]]:
    """device-burst: 20 s on of every 60 s (from 20 s); a shorter run gets its middle third."""
    if load != "device-burst":
        return []
    if duration_s < 60:
        return [(duration_s / 3, 2 * duration_s / 3)]
    out = []
    t = 20.0
    while t < duration_s:
        out.append((t, min(t + 20.0, duration_s)))
        t += 60.0
    return out


def in_intervals(t: float, ivs: Sequence[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in ivs)


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
        from splitrt import boards

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
        from splitrt import cgroup, shaper

        self.progress(f"rig {self.prefix}: namespaces, veth, htb shaping, cgroup (kernel link)")
        self.lan = netns.make_link(self.prefix)
        cloud_host = self.lan.hosts[1]
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
        from splitrt import shaper

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
        argv = [sys.executable, "-m", "splitrt.rig", "worker", json.dumps(spec)]
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
        from splitrt import zoo

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
    def load_driver(self, load: str, duration_s: float, t0: float, model_path: Path,
                    cloud_plan: str) -> Iterator[list[tuple[float, float]]]:
        """Apply the load scenario during a run; yields the list of (start, end) intervals it applied."""
        applied: list[tuple[float, float]] = []
        stop = threading.Event()
        procs: list[subprocess.Popen[Any]] = []
        th: threading.Thread | None = None
        if load == "cloud-busy":
            argv = [sys.executable, "-m", "splitrt.rig", "busy", json.dumps(
                {"model_path": str(model_path), "cloud": self.cloud_direct, "clients": BUSY_CLIENTS,
                 "plan": cloud_plan})]
            procs.append(self._popen(argv, "busy.log", host=self.cloud_host))
            applied.append((0.0, duration_s))
        elif load == "device-burst":
            hog_argv = [sys.executable, "-c", "while True: pass"]

            def drive() -> None:
                for a, b in burst_intervals(load, duration_s):
                    if stop.wait(max(0.0, t0 + a - time.monotonic())):
                        return
                    hogs = []
                    for _ in range(HOG_PROCS):
                        p = self._popen(hog_argv, "hog.log", host=self.device_host)
                        with contextlib.suppress(RigError):
                            self.throttle_in(p.pid)
                        hogs.append(p)
                    self._note_board_pids([p.pid for p in hogs])
                    started = time.monotonic() - t0
                    stop.wait(max(0.0, t0 + b - time.monotonic()))
                    self._note_board_pids([])
                    for p in hogs:
                        p.kill()
                        p.wait(5)
                    applied.append((started, time.monotonic() - t0))
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------------- bench

def model_path_for(model: str) -> Path:
    from splitrt import zoo

    p = Path(model)
    if p.suffix == ".onnx" and p.is_file():
        return p
    if model in zoo.names():
        return zoo.get(model)
    raise ConfigError(f"model {model!r}: expected a zoo name ({', '.join(zoo.names())}) or an .onnx file")


def profile_for(model: str, model_file: Path, workdir: Path, progress: Callable[[str], None]) -> Path:
    """The shipped host profile of the model, or one measured now (cached in the workdir)."""
    from splitrt import graph, profiler

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
    from splitrt import profiler

    prof = profiler.load_profile(profile_path, sha256=sha)
    return profiler.cost_table(prof, prof, device_speed_factor=speed_factor, cloud_speed_factor=cloud_factor)


def strategy_policies(cfg: BenchConfig, table: Any, rtt_ms: float) -> dict[str, str]:
    """Policy string per measured strategy (the oracle is computed, not run)."""
    from splitrt import costmodel, solver

    cloud = solver.solve(table, costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=1.0, rtt_ms=rtt_ms)),
                         cuts=["cloud"], codecs=list(cfg.codecs) if cfg.codecs else None)
    median = family_median_mbps(trace_family(load_trace(cfg.trace))) * cfg.bandwidth_scale
    static = solver.solve(table, costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=median, rtt_ms=rtt_ms)),
                          codecs=list(cfg.codecs) if cfg.codecs else None)
    return {"device-only": "fixed:device", "cloud-only": f"fixed:{cloud.key}", "static": f"fixed:{static.key}",
            "periodic": f"periodic:{cfg.periodic_s:g}", "adaptive": "adaptive"}


def likely_cuts(table: Any, rtt_ms: float, codecs: Sequence[str] | None) -> list[str]:
    """Every cut the solver picks over 0.05-1000 Mbit/s and device/cloud loads 1-8 (warmed up front)."""
    from splitrt import costmodel, solver

    cuts = {"device", "cloud"}
    for i in range(41):
        bw = 0.05 * 10 ** (i / 8)
        for dl in (1.0, 2.0, 4.0, 8.0):
            for cl in (1.0, 3.0, 8.0):
                cond = costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=bw, rtt_ms=rtt_ms),
                                            device_load=dl, cloud_load=cl)
                cuts.add(solver.solve(table, cond, codecs=list(codecs) if codecs else None).cut)
    return sorted(cuts)


def run_bench(cfg: BenchConfig, rig: Rig, *, progress: Callable[[str], None] | None = None,
              live: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every strategy of ``cfg`` in ``rig`` on the same trace window; return the result dict."""
    from splitrt import graph, shaper

    say = progress or (lambda s: None)
    model_file = model_path_for(cfg.model)
    mg = graph.load(model_file)
    rig.install_model(model_file)
    cal = rig.calibrate()
    speed = rig.board.cpu_speed_factor
    prof_path = profile_for(cfg.model, model_file, rig.workdir, say)
    table = cost_table_for(prof_path, mg.sha256, speed)
    profiled_cloud_ms = float(table.tail_ms[table.index("cloud")])
    full = load_trace(cfg.trace)
    rtt = cfg.rtt_ms if cfg.rtt_ms is not None else FAMILY_RTT_MS.get(trace_family(full) or "", DEFAULT_RTT_MS)
    rig.set_rtt(rtt)
    window = full.window(cfg.trace_offset_s, cfg.duration_s)
    played = window.scaled(cfg.bandwidth_scale) if cfg.bandwidth_scale != 1 else window
    policies = strategy_policies(cfg, table, rtt)
    cloud_plan = policies["cloud-only"].split(":", 1)[1]
    spec = {"mode": "device", "model_path": str(model_file), "profile_path": str(prof_path),
            "speed_factor": speed, "pad_factor": cal.pad_factor, "cloud": rig.cloud_address,
            "codecs": list(cfg.codecs) if cfg.codecs else None, "deadline_ms": cfg.deadline_ms,
            "threads": rig.config.device_threads, "seed": cfg.seed, "board": rig.board.name,
            "warm_cuts": likely_cuts(table, rtt, cfg.codecs)}
    runs: dict[str, dict[str, Any]] = {}
    worker = rig.start_worker(spec, name="device")
    try:
        # Cloud calibration: the host profile may have been measured on a busier host; the cloud's
        # whole-model time now (server-side compute, unshaped link) rescales the profile's tail times,
        # as an operator would re-profile the server. Loads >= 1 cannot correct a too slow profile.
        rig.shaper.set_rate(None)
        cloud_ms = float(worker.call({"cmd": "cloud-calibrate", "runs": 5}, 300)["tail_ms"])
        cloud_factor = cloud_ms / profiled_cloud_ms if profiled_cloud_ms > 0 else 1.0
        table = cost_table_for(prof_path, mg.sha256, speed, cloud_factor)
        say(f"cloud: {cfg.model} whole model {cloud_ms:.0f} ms on the server now (profile "
            f"{profiled_cloud_ms:.0f} ms): tail times x{cloud_factor:.2f}")
        # Device calibration, per model: the board's speed factor was calibrated on resnet50 and leaves
        # other models (and resnet50 itself, by the calibration's tolerance) 4-6 % off; time this model
        # whole on the throttled device and rescale the head times, as an operator profiling the board
        # would. Every strategy plans with the same table.
        profiled_device_ms = float(table.head_ms[table.index("device")])
        rig.throttle_in(worker.proc.pid)
        try:
            device_ms = float(worker.call({"cmd": "device-calibrate", "runs": 3}, 300)["head_ms"])
        finally:
            rig.throttle_out(worker.proc.pid)
        if profiled_device_ms > 0 and device_ms > 0:
            speed = speed * device_ms / profiled_device_ms
        table = cost_table_for(prof_path, mg.sha256, speed, cloud_factor)
        say(f"device: {cfg.model} whole model {device_ms:.0f} ms on the emulated {rig.board.name} (table "
            f"{profiled_device_ms:.0f} ms): head times x{device_ms / max(profiled_device_ms, 1e-9):.2f}")
        policies = strategy_policies(cfg, table, rtt)
        cloud_plan = policies["cloud-only"].split(":", 1)[1]
        for name in cfg.strategies:
            if name == "oracle":
                continue
            policy = policies[name]
            say(f"[{name}] policy {policy}: preparing")
            rig.shaper.set_rate(max(played.rate_at(0.0), shaper.MIN_RATE_MBPS))
            prepared = worker.call({"cmd": "prepare", "policy": policy, "with_cloud": name != "device-only",
                                    "cloud_factor": cloud_factor, "speed_factor": speed}, 300)
            log_path = rig.workdir / f"requests-{name}.jsonl"
            state = {"n": 0}

            def on_event(ev: dict[str, Any], name: str = name, state: dict[str, int] = state) -> None:
                state["n"] += 1
                if live is not None:
                    t = float(ev["t_s"])
                    live(f"[{name}] {t:5.1f}/{cfg.duration_s:g} s  req {state['n']:3d}  "
                         f"link {played.rate_at(t):6.2f} Mbit/s  plan {ev['plan']:<14} "
                         f"{ev['latency_ms']:7.0f} ms")

            worker.on_event = on_event
            rig.throttle_threads(worker.proc.pid, prepared.get("compute_tids", []), prepared.get("other_tids", []))
            player = shaper.TracePlayer(rig.shaper, played, duration_s=cfg.duration_s)
            t0 = time.monotonic() + 0.05
            try:
                with rig.load_driver(cfg.load, cfg.duration_s, t0, model_file, cloud_plan) as applied:
                    worker.send({"cmd": "run", "t0": t0, "duration_s": cfg.duration_s, "rate_hz": cfg.rate_hz,
                                 "tasks_file": rig.board_tasks_file(),
                                 "log_path": str(log_path)})
                    while time.monotonic() < t0:
                        time.sleep(0.005)
                    player.start()
                    done = worker.reply(cfg.duration_s + cfg.deadline_ms / 1e3 + 120)
                    player.stop()
            finally:
                rig.throttle_out(worker.proc.pid)
                worker.on_event = None
            if live is not None:
                live("")
            recs = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
            runs[name] = {"policy": policy, "records": recs, "load_intervals": list(applied),
                          "rates": [[round(t, 3), r] for t, r in player.log], "stats": done.get("stats", {})}
            mean = statistics.fmean(r["latency_ms"] for r in recs) if recs else math.nan
            say(f"[{name}] {len(recs)} requests, mean {mean:.0f} ms")
    finally:
        worker.close()
    result = assemble(cfg, rig, table, played, rtt, runs, cal)
    result["cloud_calibration"] = {"model": cfg.model, "measured_ms": cloud_ms, "profile_ms": profiled_cloud_ms,
                                   "factor": cloud_factor}
    result["device_calibration"] = {"model": cfg.model, "measured_ms": device_ms, "table_ms": profiled_device_ms,
                                    "speed_factor": speed}
    result["policies"] = policies
    return result


# ----------------------------------------------------------------------------------------- analysis

def _percentile(xs: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")


def _cut(plan: str) -> str:
    return plan.split("@", 1)[0]


def energy_mj(rec: dict[str, Any], played: traces.Trace, power: Any) -> float:
    """Device energy of one request: active while computing, radio while sending, idle while waiting."""
    dev_ms = float(rec.get("head_ms", 0.0)) + (float(rec.get("tail_ms", 0.0)) if rec.get("where") == "local" else 0.0)
    send = 0.0
    if rec.get("where") == "cloud":
        send = min(float(rec.get("rpc_ms", 0.0)),
                   transfer_ms(played, float(rec["t_s"]) + dev_ms / 1e3, float(rec.get("bytes_up", 0))))
    wait = max(0.0, float(rec["latency_ms"]) - dev_ms - send)
    return float(power.active_w * dev_ms + power.radio_w * send + power.idle_w * wait)


def summarize(latencies: Sequence[float], plans: Sequence[str], failed: int,
              energies: Sequence[float], fallbacks: int = 0) -> dict[str, Any]:
    switches = sum(1 for a, b in itertools.pairwise(plans) if a != b)
    return {"mean_ms": statistics.fmean(latencies) if latencies else float("nan"),
            "p50_ms": _percentile(latencies, 50), "p95_ms": _percentile(latencies, 95),
            "p99_ms": _percentile(latencies, 99), "completed": len(latencies), "failed": failed,
            "switches": switches, "fallbacks": fallbacks,
            "energy_mj": statistics.fmean(energies) if energies else float("nan"),
            "plans": dict(sorted({p: plans.count(p) for p in set(plans)}.items()))}


@dataclass(frozen=True)
class MeasuredCosts:
    """What the oracle knows, all measured in this rig (medians over every strategy's requests)."""

    device_ratio_idle: float  # measured head time / cost-table head time, outside load bursts
    device_ratio_burst: float  # the same during device bursts
    cloud_ratio: float  # (cloud queue + tail) / cost-table tail
    net_overhead_ms: float  # rpc - tail - queue - ideal transfer (+ encode/decode): RTT, gRPC, TCP
    local_overhead_ms: float  # device plan: latency - head time

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def measured_costs(table: Any, runs: dict[str, dict[str, Any]], played: traces.Trace,
                   bursts: Sequence[tuple[float, float]], rtt_ms: float) -> MeasuredCosts:
    idle: list[float] = []
    burst: list[float] = []
    cloud: list[float] = []
    net: list[float] = []
    local: list[float] = []
    for run in runs.values():
        for r in run["records"]:
            if r.get("error"):
                continue
            cut = _cut(r["plan"])
            i = table.index(cut)
            th = float(table.head_ms[i])
            if th >= 20.0 and r.get("head_ms"):
                (burst if in_intervals(float(r["t_s"]), bursts) else idle).append(float(r["head_ms"]) / th)
            if r.get("where") == "cloud":
                tt = float(table.tail_ms[i])
                if tt >= 5.0:
                    cloud.append((float(r["tail_ms"]) + float(r["queue_ms"])) / tt)
                start = float(r["t_s"]) + float(r["head_ms"]) / 1e3
                ideal = transfer_ms(played, start, float(r["bytes_up"]) + float(r["bytes_down"]))
                net.append(float(r["rpc_ms"]) - float(r["tail_ms"]) - float(r["queue_ms"]) - ideal
                           + float(r.get("encode_ms", 0)) + float(r.get("decode_ms", 0)))
            elif cut == "device":
                local.append(float(r["latency_ms"]) - float(r["head_ms"]))
    med = statistics.fmean  # means: the oracle's mean must not drop the measured jitter's share
    return MeasuredCosts(
        device_ratio_idle=med(idle) if idle else 1.0,
        device_ratio_burst=med(burst) if burst else (med(idle) if idle else 1.0),
        cloud_ratio=med(cloud) if cloud else 1.0,
        net_overhead_ms=med(net) if net else rtt_ms,
        local_overhead_ms=med(local) if local else 0.0)


def oracle(table: Any, costs: MeasuredCosts, times_s: Sequence[float], played: traces.Trace,
           bursts: Sequence[tuple[float, float]], codecs: Sequence[str] | None,
           realized: Sequence[tuple[str, float] | None] | None = None) -> list[tuple[str, float]]:
    """Per request start time: the cheapest (plan, latency ms) in hindsight.

    Every (cut, codec) is costed from the measured per-cut costs (``MeasuredCosts``) and the bandwidth
    the request would have met (the trace, from the end of its head on). ``realized[i]`` is the plan
    the reference run actually used for request ``i`` and its measured latency: that plan's cost is the
    measured one, not the model's (noise included), so the oracle is never above the reference run on
    any request and the comparison measures the decisions, not the jitter of the host.
    """
    allowed = [k for k in table.codecs if codecs is None or k in codecs]
    reply = float(table.reply_bytes)
    out = []
    for n, t in enumerate(times_s):
        ratio = costs.device_ratio_burst if in_intervals(t, bursts) else costs.device_ratio_idle
        real = realized[n] if realized is not None else None
        best: tuple[str, float] | None = real
        real_key: tuple[str, float] | None = None
        if real is not None and real[0] != "device" and "@" in real[0]:
            rc, rk = real[0].split("@", 1)
            if rk in table.codecs:
                real_key = (rc, float(table.sent_bytes[table.index(rc), table.codec_index(rk)]))
        seen: dict[tuple[float, float], float] = {}
        for i, cut in enumerate(table.ids):
            h = float(table.head_ms[i]) * ratio
            if cut == "device":
                cands = [("device", h + costs.local_overhead_ms)]
            else:
                tail = float(table.tail_ms[i]) * costs.cloud_ratio
                cands = []
                for k in allowed:
                    nbytes = float(table.sent_bytes[i, table.codec_index(k)]) + reply
                    key = (h, nbytes)
                    if key not in seen:
                        seen[key] = transfer_ms(played, t + h / 1e3, nbytes)
                    cands.append((f"{cut}@{k}", h + seen[key] + costs.net_overhead_ms + tail))
            for plan, ms in cands:
                if real is not None and (plan == real[0] or (cut, _sent(table, plan)) == real_key):
                    continue  # the plan that ran (or one sending the same bytes): its measured cost stands
                if best is None or ms < best[1]:
                    best = (plan, ms)
        assert best is not None
        out.append(best)
    return out


def _sent(table: Any, plan: str) -> float:
    cut, _, codec = plan.partition("@")
    if not codec:
        return 0.0
    return float(table.sent_bytes[table.index(cut), table.codec_index(codec)])


def assemble(cfg: BenchConfig, rig: Rig, table: Any, played: traces.Trace, rtt_ms: float,
             runs: dict[str, dict[str, Any]], cal: Calibration) -> dict[str, Any]:
    power = rig.board.power
    bursts: list[tuple[float, float]] = []
    for run in runs.values():
        bursts += [(float(a), float(b)) for a, b in run["load_intervals"]] if cfg.load == "device-burst" else []
    if cfg.load == "device-burst" and not bursts:
        bursts = burst_intervals(cfg.load, cfg.duration_s)
    sched = burst_intervals(cfg.load, cfg.duration_s)
    strategies: dict[str, Any] = {}
    requests: dict[str, list[list[Any]]] = {}
    for name, run in runs.items():
        recs = run["records"]
        ok = [r for r in recs if not r.get("error")]
        strategies[name] = summarize([r["latency_ms"] for r in ok], [r["plan"] for r in ok],
                                     failed=len(recs) - len(ok),
                                     energies=[energy_mj(r, played, power) for r in ok],
                                     fallbacks=sum(1 for r in ok if r.get("fallback")))
        strategies[name]["policy"] = run["policy"]
        requests[name] = [[round(float(r["t_s"]), 3), round(float(r["latency_ms"]), 1), r["plan"]] for r in ok]
    costs = measured_costs(table, runs, played, sched, rtt_ms)
    if "oracle" in cfg.strategies and runs:
        ref = "adaptive" if "adaptive" in runs else next(iter(runs))
        times = [float(r["t_s"]) for r in runs[ref]["records"]]
        real = [None if r.get("error") else (str(r["plan"]), float(r["latency_ms"])) for r in runs[ref]["records"]]
        picks = oracle(table, costs, times, played, sched, cfg.codecs, real)
        energies = []
        for t, (plan, ms) in zip(times, picks, strict=True):
            cut = _cut(plan)
            i = table.index(cut)
            ratio = costs.device_ratio_burst if in_intervals(t, sched) else costs.device_ratio_idle
            h = float(table.head_ms[i]) * ratio
            rec = {"t_s": t, "latency_ms": ms, "head_ms": h, "where": "local" if cut == "device" else "cloud",
                   "rpc_ms": ms, "bytes_up": 0 if cut == "device" else float(
                       table.sent_bytes[i, table.codec_index(plan.split("@")[1])])}
            energies.append(energy_mj(rec, played, power))
        strategies["oracle"] = summarize([ms for _, ms in picks], [p for p, _ in picks], 0, energies)
        strategies["oracle"]["policy"] = f"hindsight over the {ref} run's request times"
        requests["oracle"] = [[round(t, 3), round(ms, 1), p] for t, (p, ms) in zip(times, picks, strict=True)]
    bw = [[round(t, 3), r] for t, r in zip(played.times_s, played.rates_mbps, strict=True)]
    return {
        "link": rig.kind, "model": cfg.model, "trace": cfg.trace, "trace_offset_s": cfg.trace_offset_s,
        "board": rig.board.name, "bandwidth_scale": cfg.bandwidth_scale, "load": cfg.load,
        "rate_hz": cfg.rate_hz, "duration_s": cfg.duration_s, "rtt_ms": rtt_ms,
        "codecs": list(cfg.codecs) if cfg.codecs else list(table.codecs),
        "calibration": {**{k: v for k, v in asdict(cal).items() if k != "rounds"}, "rounds": cal.rounds,
                        "error_pct": cal.error_pct},
        "measured_costs": costs.as_dict(),
        "strategies": strategies,
        "timeline": {"bandwidth_mbps": bw, "load_intervals": sched if cfg.load == "device-burst" else (
            [[0.0, cfg.duration_s]] if cfg.load == "cloud-busy" else []), "requests": requests},
    }


# ----------------------------------------------------------------------------------------- workers

def _emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg, default=float) + "\n")
    sys.stdout.flush()


def _slowed(dev: Any, factor: float) -> None:
    """Userspace emulation of a slower board: pad the device's compute with sleep up to ``factor`` x."""
    if factor <= 1.0:
        return
    run_head, finish = dev.run_head, dev.finish_locally

    def head(inputs: Any, cut: str) -> Any:
        h = run_head(inputs, cut)
        time.sleep(h.head_ms * (factor - 1) / 1e3)
        return replace(h, head_ms=h.head_ms * factor)

    def fin(h: Any) -> Any:
        r = finish(h)
        time.sleep(r.tail_ms * (factor - 1) / 1e3)
        return replace(r, tail_ms=r.tail_ms * factor, total_ms=r.head_ms + r.tail_ms * factor)

    dev.run_head, dev.finish_locally = head, fin


def _calibrate_worker(spec: dict[str, Any], stdin: IO[str]) -> None:
    import onnxruntime as ort

    from splitrt import zoo

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = int(spec.get("threads", 2))
    sess = ort.InferenceSession(spec["model_path"], so, providers=["CPUExecutionProvider"])
    feeds = zoo.random_inputs(spec["model_path"], seed=0)
    sess.run(None, feeds)
    _emit({"event": "loaded"})
    for line in stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "quit":
            return
        pad = float(msg.get("pad_factor", 1.0))
        walls, cpus = [], []
        sess.run(None, feeds)  # one unmeasured run: the new quota settles
        for _ in range(int(msg.get("runs", 3))):
            w0, c0 = time.perf_counter(), time.process_time()
            sess.run(None, feeds)
            w1, c1 = time.perf_counter(), time.process_time()
            if pad > 1:
                time.sleep((w1 - w0) * (pad - 1))
            walls.append((time.perf_counter() - w0) * 1e3)
            cpus.append((c1 - c0) * 1e3)
        _emit({"event": "bench", "wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus),
               "all_ms": walls})


class HeadLoad(LoadEstimator):
    """The rig's device-load signal: measured head time / cost-table head time, fed per request.

    The runtime's own signal (psutil: CPU used by other processes) cannot see an emulated board: it sees
    the whole host (the cloud, the relay, other jobs), not the cgroup the device lives in; so the
    prober's psutil samples are ignored here.
    """

    def add_device(self, now_s: float, *, other_util: float, freq_mhz: float | None = None,
                   profiled_freq_mhz: float | None = None) -> float:
        return 1.0

    last_head_s = -math.inf

    def add_head(self, now_s: float, ratio: float, *, probe: bool = False) -> float:
        if not probe:
            self.last_head_s = now_s
        util = 1.0 - 1.0 / max(1.0, ratio)
        return LoadEstimator.add_device(self, now_s, other_util=min(util, 0.99))


class RunQueueProbe:
    """While no head has been timed for a while (the plan sends the input), sample the emulated board's
    run queue: how many threads of the OTHER processes sharing the device's CPU (listed by the rig in
    ``tasks_file``) are runnable. One compute thread competing with ``n`` runnable
    tasks gets ``1 / (1 + n)`` of the CPU, so a head would now take ``1 + n`` times as long: the
    figure a real board's psutil gives the runtime. (Timing a small piece of work instead does not
    work under a CFS quota: a job shorter than the quota runs at full speed or waits a whole period.)"""

    def __init__(self, load: HeadLoad, tasks_file: str | None, *, sample_s: float = 0.05,
                 report_s: float = 0.5, stale_s: float = 1.0) -> None:
        self.load = load
        self.tasks_file = tasks_file
        self.sample_s = sample_s
        self.report_s = report_s
        self.stale_s = stale_s
        self._stop = threading.Event()
        self.active = threading.Event()
        self._thread: threading.Thread | None = None

    def runnable_others(self) -> int:
        if not self.tasks_file:
            return 0
        try:
            ids = [int(x) for x in Path(self.tasks_file).read_text().split()]
        except (OSError, ValueError):
            return 0
        own = {int(t) for t in os.listdir("/proc/self/task")}
        n = 0
        for pid in ids:
            if pid in own:
                continue
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids if len(tids) > 1 else [str(pid)]:
                try:
                    state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                n += state == "R"
        return n

    def _loop(self) -> None:
        samples: list[int] = []
        next_report = time.monotonic() + self.report_s
        while not self._stop.wait(self.sample_s):
            now = time.monotonic()
            if not self.active.is_set() or now - self.load.last_head_s < self.stale_s:
                samples.clear()  # heads are being timed: they are the measurement
                next_report = now + self.report_s
                continue
            samples.append(self.runnable_others())
            if now >= next_report:
                self.load.add_head(now, 1.0 + statistics.fmean(samples), probe=True)
                samples.clear()
                next_report = now + self.report_s

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rig-runqueue", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


WARMUP_S = 2.0  # uncounted requests per strategy before the measured run


def _device_worker(spec: dict[str, Any], stdin: IO[str]) -> None:
    import numpy as np  # noqa: F401  (loaded before the timed part)

    from splitrt import boards, graph
    from splitrt.controller import ControllerConfig
    from splitrt.device import Device, DeviceConfig
    from splitrt.runtime import AdaptiveDevice, RuntimeConfig

    mg = graph.load(spec["model_path"])
    table = cost_table_for(Path(spec["profile_path"]), mg.sha256, float(spec["speed_factor"]))
    board = boards.load_board(spec["board"])
    dcfg = DeviceConfig(intra_op_threads=int(spec.get("threads", 2)), timeout_s=30.0)
    local = Device(mg, None, config=dcfg)
    _slowed(local, float(spec.get("pad_factor", 1.0)))
    for cut in spec.get("warm_cuts", []):
        local.warm(cut)
    inputs = local.random_inputs(seed=int(spec.get("seed", 0)))
    codecs = spec.get("codecs")
    _emit({"event": "loaded"})
    dev: AdaptiveDevice | None = None
    rq: RunQueueProbe | None = None
    for line in stdin:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        try:
            if cmd == "quit":
                break
            if cmd == "cloud-calibrate":
                probe_dev = Device(mg, spec["cloud"], config=dcfg)
                tails = [probe_dev.run_detailed(inputs, cut="cloud", timeout_s=60).tail_ms
                         for _ in range(int(msg.get("runs", 5)))]
                probe_dev.close()
                _emit({"event": "cloud", "tail_ms": statistics.median(tails[1:] or tails)})
            elif cmd == "device-calibrate":
                # the whole model on this (throttled) device, as the local plan runs it
                feeds = local.check_inputs(inputs)
                local.run_head(feeds, "device")  # unmeasured: the quota settles
                heads = [local.run_head(feeds, "device").head_ms for _ in range(int(msg.get("runs", 3)))]
                _emit({"event": "device", "head_ms": statistics.median(heads)})
            elif cmd == "prepare":
                table = cost_table_for(Path(spec["profile_path"]), mg.sha256,
                                       float(msg.get("speed_factor", spec["speed_factor"])),
                                       float(msg.get("cloud_factor", 1.0)))
                if dev is not None:
                    dev.close()
                # Sessions are built here, on the main thread, for every cut the plans may use: the
                # prober's own warming would build them on a thread the rig does not throttle.
                rc = RuntimeConfig(policy=msg["policy"], deadline_ms=float(spec["deadline_ms"]), warm_sessions=False,
                                   controller=ControllerConfig(codecs=tuple(codecs) if codecs else None))
                dev = AdaptiveDevice(mg, table, [spec["cloud"]] if msg.get("with_cloud") else [], config=rc,
                                     device_config=dcfg, power=board.power)
                dev.local = local  # sessions built once, outside the cgroup
                dev.load = HeadLoad()
                if rq is not None:
                    rq.stop()
                # a monitor (like psutil on a real board) on a spare core: not throttled with the compute
                rq = RunQueueProbe(dev.load, None)
                rq.start()
                # Warm-up (uncounted): the channel, the cloud's tail sessions, and the estimators, which
                # in a deployed daemon have seen the link long before any measured request (2 requests
                # were not enough: a link estimate still 35 % low kept adaptive on the device for 3 s).
                t_warm = time.monotonic()
                n_warm = 0
                while n_warm < 2 or time.monotonic() - t_warm < float(msg.get("warmup_s", WARMUP_S)):
                    dev.infer(inputs)
                    n_warm += 1
                time.sleep(0.6)  # one prober round
                _emit({"event": "prepared", **_thread_roles(dev, rq)})
            elif cmd == "run":
                assert dev is not None
                assert rq is not None
                rq.tasks_file = msg.get("tasks_file")
                stats = _run_requests(dev, table, inputs, float(msg["t0"]), float(msg["duration_s"]),
                                      float(msg["rate_hz"]), Path(msg["log_path"]), rq,
                                      seed=int(spec.get("seed", 0)))
                _emit({"event": "done", "stats": stats})
            else:
                _emit({"event": "error", "message": f"unknown command {cmd!r}"})
        except Exception as exc:  # report, keep serving (the rig decides)
            _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
    if rq is not None:
        rq.stop()
    if dev is not None:
        dev.close()


def _thread_roles(dev: Any, rq: RunQueueProbe | None = None) -> dict[str, list[int]]:
    """Compute threads (main, onnxruntime's pools: named ``python``) vs the control plane (the prober,
    the run-queue monitor, gRPC's named threads)."""
    prober = dev._prober.native_id if dev._prober is not None else None
    monitor = rq._thread.native_id if rq is not None and rq._thread is not None else None
    compute: list[int] = []
    other: list[int] = []
    for tid_s in os.listdir("/proc/self/task"):
        tid = int(tid_s)
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        is_python = comm == Path(sys.executable).name[:15] or comm.startswith("python")
        (compute if is_python and tid not in (prober, monitor) else other).append(tid)
    return {"compute_tids": compute, "other_tids": other}


def _run_requests(dev: Any, table: Any, inputs: Any, t0: float, duration_s: float, rate_hz: float,
                  log_path: Path, probe: RunQueueProbe, *, seed: int = 0) -> dict[str, Any]:
    """Paced closed loop: request k starts at t0 + (k + u_k) / rate (u_k uniform in [0, 1), the same
    for every strategy), or when request k-1 ends if later."""
    while time.monotonic() < t0:
        time.sleep(0.002)
    probe.active.set()
    try:
        _loop_requests(dev, table, inputs, t0, duration_s, rate_hz, log_path, seed=seed)
    finally:
        probe.active.clear()
    return dict(dev.stats)


def _loop_requests(dev: Any, table: Any, inputs: Any, t0: float, duration_s: float, rate_hz: float,
                   log_path: Path, *, seed: int = 0) -> None:
    # The jitter spreads request starts over the CFS period of the board's throttle (20 ms): strictly
    # periodic starts at 4 Hz meet it at only two phases, fixed per run by t0, and a throttled head's
    # latency comes in steps of one period (463, 480, 501 ms...), so two runs of the same plan differed
    # by 2-4 % in mean.
    import random

    jitter = random.Random(seed)
    k = 0
    with open(log_path, "w") as log:
        while True:
            start = max(t0 + (k + jitter.random()) / rate_hz, time.monotonic())
            if start >= t0 + duration_s:
                break
            time.sleep(max(0.0, start - time.monotonic()))
            t_s = time.monotonic() - t0
            rec: dict[str, Any] = {"i": k, "t_s": t_s}
            try:
                out = dev.infer(inputs)
            except Exception as exc:  # infer never raises for the cloud: count it as failed
                rec.update(error=f"{type(exc).__name__}: {exc}", latency_ms=(time.monotonic() - t0 - t_s) * 1e3,
                           plan="?")
            else:
                r, d = out.result, out.decision
                rec.update(latency_ms=out.latency_ms, plan=out.plan, fallback=out.fallback, where=r.where,
                           head_ms=r.head_ms, encode_ms=r.encode_ms, rpc_ms=r.rpc_ms, decode_ms=r.decode_ms,
                           tail_ms=r.tail_ms, queue_ms=r.queue_ms, bytes_up=r.bytes_up, bytes_down=r.bytes_down,
                           bw_est_mbps=d.bandwidth_mbps, rtt_est_ms=d.rtt_ms, device_load=d.device_load,
                           cloud_load=d.cloud_load, predicted_ms=d.predicted_ms, best=d.best, reason=d.reason)
                th = float(table.head_ms[table.index(_cut(out.plan))])
                if th >= 20.0 and r.head_ms > 0:
                    dev.load.add_head(time.monotonic(), r.head_ms / th)
            log.write(json.dumps(rec) + "\n")
            _emit({"event": "progress", "t_s": t_s, "plan": rec["plan"], "latency_ms": rec["latency_ms"]})
            k += 1


def _busy_worker(spec: dict[str, Any]) -> None:
    """Other devices queueing on the cloud: ``clients`` threads sending requests back to back."""
    from splitrt.device import Device
    from splitrt.solver import parse_plan

    cut, codec = parse_plan(spec["plan"], "fp32")

    def loop() -> None:
        d = Device(spec["model_path"], spec["cloud"])
        inputs = d.random_inputs(1)
        head = d.run_head(inputs, cut)
        while True:
            with contextlib.suppress(Exception):
                d.send(head, codec_spec=codec, timeout_s=30)

    ths = [threading.Thread(target=loop, daemon=True) for _ in range(int(spec.get("clients", 2)))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m splitrt.rig", description="rig child processes (internal)")
    p.add_argument("role", choices=["worker", "busy"])
    p.add_argument("spec", help="JSON")
    a = p.parse_args(argv)
    spec = json.loads(a.spec)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rig stops us; Ctrl-C reaches the rig
    try:
        if a.role == "busy":
            _busy_worker(spec)
        elif spec.get("mode") == "calibrate":
            _calibrate_worker(spec, sys.stdin)
        else:
            _device_worker(spec, sys.stdin)
    except Exception as exc:
        _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
