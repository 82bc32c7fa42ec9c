"""The rig's child processes (``python -m splitrt.rig.worker worker|busy SPEC``), speaking JSON lines.

- ``worker`` with ``mode: calibrate``: times the whole model under the quota the rig sets (calibration).
- ``worker`` with ``mode: device``: the device. It holds one ``AdaptiveDevice`` per strategy of the
  benchmark (``prepare``) and runs one strategy's turn at a time (``run``); see ``rigbench``.
- ``busy``: other devices queueing on the cloud (load ``cloud-busy``).

- ``rig.worker._Strategy.describe(outcome) -> record`` (default ``worker.describe``) is how a runtime's outcome
  becomes a request record; ``rig.cloudserver.CloudProcess.log_name`` names a server's log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from splitrt.plan.netmon import LoadEstimator
from splitrt.rig.models import cost_table_for


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

    from splitrt.graph import zoo

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
        _emit(
            {"event": "bench", "wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus), "all_ms": walls}
        )


class RigLoad(LoadEstimator):
    """The rig's device-load signal: the emulated board's run queue (``RunQueueProbe``), in place of psutil.

    The runtime's own signal (psutil: CPU used by other processes) cannot see an emulated board: it sees
    the whole host (the cloud, the relay, other jobs), not the cgroup the device lives in; so the
    prober's psutil samples are ignored here. The device's speed is learned as on a board: the runtime
    feeds every head's measured time (``LoadEstimator.add_head``).
    """

    def add_device(
        self, now_s: float, *, other_util: float, freq_mhz: float | None = None, profiled_freq_mhz: float | None = None
    ) -> float:
        return 1.0

    def add_runqueue(self, now_s: float, factor: float) -> float:
        """``factor``: how many times longer a head takes now (1 + runnable others)."""
        util = 1.0 - 1.0 / max(1.0, factor)
        return LoadEstimator.add_device(self, now_s, other_util=min(util, 0.99))


class RunQueueProbe:
    """Sample the emulated board's run queue during a turn: how many threads of the OTHER processes
    sharing the device's CPU (listed by the rig in ``tasks_file``) are runnable. One compute thread
    competing with ``n`` runnable tasks gets ``1 / (1 + n)`` of the CPU, so a head would now take
    ``1 + n`` times as long: the figure a real board's psutil gives the runtime's prober, every 0.25 s
    (the prober's interval), whether or not a head is running (a head timed at the end of a 0.9 s request is late
    news: a burst was seen 2-3 s after it began and for 1.6 s after it ended). Timing a small piece of
    work instead does not work under a CFS quota: a job shorter than the quota runs at full speed or
    waits a whole period."""

    def __init__(
        self,
        load: RigLoad,
        tasks_file: str | None,
        *,
        sample_s: float = 0.05,
        report_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.load = load
        self.clock = clock
        self.tasks_file = tasks_file
        self.sample_s = sample_s
        self.report_s = report_s
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
        next_report = self.clock() + self.report_s
        while not self._stop.wait(self.sample_s):
            now = self.clock()
            if not self.active.is_set():
                samples.clear()
                next_report = now + self.report_s
                continue
            samples.append(self.runnable_others())
            if now >= next_report:
                self.load.add_runqueue(now, 1.0 + statistics.fmean(samples))
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


WARMUP_S = 2.0  # uncounted requests per strategy before its first turn


class TurnClock:
    """A strategy's own clock: it stands still while the other strategies take their turns, so its
    estimators and timers see one continuous run."""

    def __init__(self) -> None:
        self._offset_s = 0.0
        self._paused_at: float | None = None

    def __call__(self) -> float:
        now = self._paused_at if self._paused_at is not None else time.monotonic()
        return now - self._offset_s

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._offset_s += time.monotonic() - self._paused_at
            self._paused_at = None


class TurnProber:
    """The runtime's prober (``AdaptiveDevice.probe_once`` every ``interval_s``), run only during its
    strategy's turns: a parked strategy's probes would share the link and the CPU with the one measured."""

    def __init__(self, dev: Any, interval_s: float) -> None:
        self.dev = dev
        self.interval_s = interval_s
        self.active = threading.Event()
        self._busy = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="rig-prober", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.active.is_set():
                continue
            with self._busy, contextlib.suppress(Exception):  # the prober never dies: next round retries
                self.dev.probe_once()

    def park(self) -> None:
        """Stop probing; a probe under way finishes first (its transfer is part of this turn)."""
        self.active.clear()
        with self._busy:
            pass

    def stop(self) -> None:
        self.park()
        self._stop.set()
        self.thread.join(5)


def describe(out: Any) -> dict[str, Any]:
    """The request record of an ``AdaptiveDevice`` outcome."""
    r, d = out.result, out.decision
    return dict(
        latency_ms=out.latency_ms,
        plan=out.plan,
        fallback=out.fallback,
        where=r.where,
        head_ms=r.head_ms,
        encode_ms=r.encode_ms,
        rpc_ms=r.rpc_ms,
        decode_ms=r.decode_ms,
        tail_ms=r.tail_ms,
        queue_ms=r.queue_ms,
        bytes_up=r.bytes_up,
        bytes_down=r.bytes_down,
        bw_est_mbps=d.bandwidth_mbps,
        rtt_est_ms=d.rtt_ms,
        device_load=d.device_load,
        cloud_load=d.cloud_load,
        predicted_ms=d.predicted_ms,
        best=d.best,
        reason=d.reason,
    )


@dataclass
class _Strategy:
    """One strategy in the worker: its runtime, clock, probes, and where its request schedule is."""

    dev: Any
    clock: TurnClock
    prober: TurnProber
    runqueue: RunQueueProbe
    jitter: random.Random
    next_k: int = 0
    next_u: float | None = None
    describe: Callable[[Any], dict[str, Any]] = describe  # outcome -> request record (rig.tierworker: chains)

    def close(self) -> None:
        self.runqueue.stop()
        self.prober.stop()
        self.dev.close()


def _device_worker(spec: dict[str, Any], stdin: IO[str]) -> None:
    import numpy as np  # noqa: F401  (loaded before the timed part)

    from splitrt.device.client import Device, DeviceConfig
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.graph import model as graph
    from splitrt.plan.controller import ControllerConfig
    from splitrt.profile import boards

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
    strategies: dict[str, _Strategy] = {}
    for line in stdin:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        try:
            if cmd == "quit":
                break
            if cmd == "cloud-calibrate":
                probe_dev = Device(mg, spec["cloud"], config=dcfg)
                tails = [
                    probe_dev.run_detailed(inputs, cut="cloud", timeout_s=60).tail_ms
                    for _ in range(int(msg.get("runs", 5)))
                ]
                probe_dev.close()
                _emit({"event": "cloud", "tail_ms": statistics.median(tails[1:] or tails)})
            elif cmd == "device-calibrate":
                # the whole model on this (throttled) device, as the local plan runs it
                feeds = local.check_inputs(inputs)
                local.run_head(feeds, "device")  # unmeasured: the quota settles
                heads = [local.run_head(feeds, "device").head_ms for _ in range(int(msg.get("runs", 3)))]
                _emit({"event": "device", "head_ms": statistics.median(heads)})
            elif cmd == "prepare":
                name = str(msg["name"])
                table = cost_table_for(
                    Path(spec["profile_path"]),
                    mg.sha256,
                    float(msg.get("speed_factor", spec["speed_factor"])),
                    float(msg.get("cloud_factor", 1.0)),
                )
                if name in strategies:
                    strategies.pop(name).close()
                # Sessions are built here, on the main thread, for every cut the plans may use: the
                # prober's own warming would build them on a thread the rig does not throttle.
                rc = RuntimeConfig(
                    policy=msg["policy"],
                    deadline_ms=float(spec["deadline_ms"]),
                    warm_sessions=False,
                    controller=ControllerConfig(
                        codecs=tuple(codecs) if codecs else None,
                        cuts=tuple(spec["cuts"]) if spec.get("cuts") else None,
                    ),
                )
                clock = TurnClock()
                dev = AdaptiveDevice(
                    mg,
                    table,
                    [spec["cloud"]] if msg.get("with_cloud") else [],
                    config=rc,
                    device_config=dcfg,
                    power=board.power,
                    clock=clock,
                    start_prober=False,
                )
                dev.local = local  # sessions built once, outside the cgroup
                dev.load = RigLoad()
                # a monitor (like psutil on a real board) on a spare core: not throttled with the compute
                st = _Strategy(
                    dev=dev,
                    clock=clock,
                    prober=TurnProber(dev, rc.prober_interval_s),
                    runqueue=RunQueueProbe(dev.load, None, clock=clock),
                    jitter=random.Random(int(spec.get("seed", 0))),
                )
                st.runqueue.start()
                strategies[name] = st
                # Warm-up (uncounted): the channel, the cloud's tail sessions, and the estimators, which
                # in a deployed daemon have seen the link long before any measured request (2 requests
                # were not enough: a link estimate still 35 % low kept adaptive on the device for 3 s).
                # It starts as a daemon does, with a probe (RTT first): transfers timed before any RTT
                # sample are netted of the 20 ms prior instead of the link's 80 ms and read ~40 % low
                # (6.6 for 11.5 Mbit/s), for the 5 s they stay in the window. Requests are paced at the
                # bench's rate so the prober finds the idle link it waits for.
                with contextlib.suppress(Exception):
                    dev.probe_once()
                st.prober.active.set()
                rate_hz = float(msg.get("rate_hz", 4.0))
                t_warm = time.monotonic()
                n_warm = 0
                while n_warm < 2 or time.monotonic() - t_warm < float(msg.get("warmup_s", WARMUP_S)):
                    time.sleep(max(0.0, t_warm + n_warm / rate_hz - time.monotonic()))
                    dev.infer(inputs)
                    n_warm += 1
                time.sleep(0.6)  # a few prober rounds
                st.prober.park()
                clock.pause()
                _emit({"event": "prepared"})
            elif cmd == "roles":
                _emit({"event": "roles", **_thread_roles(strategies.values())})
            elif cmd == "run":
                st = strategies[str(msg["name"])]
                end_s = _run_turn(
                    st,
                    inputs,
                    t0=float(msg["t0"]),
                    from_s=float(msg["from_s"]),
                    until_s=float(msg["until_s"]),
                    rate_hz=float(msg["rate_hz"]),
                    log_path=Path(msg["log_path"]),
                    tasks_file=msg.get("tasks_file"),
                )
                _emit({"event": "done", "stats": dict(st.dev.stats), "end_s": end_s})
            else:
                _emit({"event": "error", "message": f"unknown command {cmd!r}"})
        except Exception as exc:  # report, keep serving (the rig decides)
            _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
    for st in strategies.values():
        st.close()


def _thread_roles(strategies: Iterable[_Strategy]) -> dict[str, list[int]]:
    """Compute threads (main, onnxruntime's pools: named ``python``) vs the control plane (the probers,
    the run-queue monitors, gRPC's named threads)."""
    control: set[int | None] = set()
    for st in strategies:
        control.add(st.prober.thread.native_id)
        control.add(st.runqueue._thread.native_id if st.runqueue._thread is not None else None)
    compute: list[int] = []
    other: list[int] = []
    for tid_s in os.listdir("/proc/self/task"):
        tid = int(tid_s)
        try:
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        is_python = comm == Path(sys.executable).name[:15] or comm.startswith("python")
        (compute if is_python and tid not in control else other).append(tid)
    return {"compute_tids": compute, "other_tids": other}


def _run_turn(
    st: _Strategy,
    inputs: Any,
    *,
    t0: float,
    from_s: float,
    until_s: float,
    rate_hz: float,
    log_path: Path,
    tasks_file: str | None,
) -> float:
    """One turn: window position ``from_s`` is played at monotonic ``t0``; the strategy's requests
    that start before ``until_s`` run (a late one still ends), then it idles, probing, until ``until_s``
    as in a continuous run. Returns the position at which it parked."""
    st.runqueue.tasks_file = tasks_file
    while time.monotonic() < t0:
        time.sleep(0.002)
    st.clock.resume()
    st.prober.active.set()
    st.runqueue.active.set()
    try:
        with open(log_path, "a") as log:
            _loop_requests(st, inputs, t0, from_s, until_s, rate_hz, log)
        time.sleep(max(0.0, t0 + until_s - from_s - time.monotonic()))
    finally:
        end_s = from_s + time.monotonic() - t0
        # Clock first: a probe still under way ends while parked, and its sample is stamped at the
        # turn's end. Its transfer would have overlapped the next requests in one continuous run; here
        # it must not delay this strategy's timeline.
        st.clock.pause()
        st.runqueue.active.clear()
        st.prober.park()
    return end_s


def _loop_requests(
    st: _Strategy, inputs: Any, t0: float, from_s: float, until_s: float, rate_hz: float, log: IO[str]
) -> None:
    """Paced closed loop: request k is due at window position (k + u_k) / rate (u_k uniform in [0, 1),
    the same for every strategy) and starts then, or when request k-1 ends if later; none starts at or
    after ``until_s`` (a backlog carries over to the next turn, as it would in one continuous run)."""
    # The jitter spreads request starts over the CFS period of the board's throttle (20 ms): strictly
    # periodic starts at 4 Hz meet it at only two phases, fixed per run by t0, and a throttled head's
    # latency comes in steps of one period (463, 480, 501 ms...), so two runs of the same plan differed
    # by 2-4 % in mean.
    dev = st.dev
    while True:
        if st.next_u is None:
            st.next_u = st.jitter.random()
        due = (st.next_k + st.next_u) / rate_hz
        start_s = max(due, from_s + time.monotonic() - t0)  # window position it starts at
        if start_s >= until_s:  # the next turn starts it (at once, if it is already late)
            return
        time.sleep(max(0.0, t0 + start_s - from_s - time.monotonic()))
        t_s = from_s + time.monotonic() - t0
        rec: dict[str, Any] = {"i": st.next_k, "t_s": t_s}
        try:
            out = dev.infer(inputs)
        except Exception as exc:  # infer never raises for the cloud: count it as failed
            rec.update(
                error=f"{type(exc).__name__}: {exc}", latency_ms=(from_s + time.monotonic() - t0 - t_s) * 1e3, plan="?"
            )
        else:
            rec.update(st.describe(out))
        log.write(json.dumps(rec) + "\n")
        log.flush()
        _emit({"event": "progress", "t_s": t_s, "plan": rec["plan"], "latency_ms": rec["latency_ms"]})
        st.next_u = None
        st.next_k += 1


def _busy_worker(spec: dict[str, Any]) -> None:
    """Other devices queueing on the cloud: ``clients`` threads sending requests back to back."""
    from splitrt.device.client import Device
    from splitrt.plan.solver import parse_plan

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
    p = argparse.ArgumentParser(prog="python -m splitrt.rig.worker", description="rig child processes (internal)")
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
