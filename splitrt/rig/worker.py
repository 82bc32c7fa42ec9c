"""The rig's device process (``python -m splitrt.rig.worker worker SPEC``) for every topology, speaking
``rig.protocol`` (one JSON line per typed message), and the cloud-busy load (``... busy SPEC``).

It holds one runtime per strategy (``Prepare``), the one ``AdaptiveDevice``: over the direct path to the
last tier's servers (every server known, each device preferring its own first), or over the three tiers
through the first server tier's edge; sessions are built once, outside the cgroup, and shared. It runs one
strategy's turn at a time (``Run``): requests paced at ``rate_hz`` with a seeded jitter (the same
schedule for every strategy), or back to back (closed loop) at rate 0. A strategy's clock stands still
and its prober is parked between its turns, so each sees one continuous run.
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
from typing import Any

from splitrt._gc import freeze_startup
from splitrt.plan.netmon import LoadEstimator
from splitrt.rig import protocol as P
from splitrt.rig.models import cost_tables
from splitrt.rig.strategies import HOLD_ABLATION, NEWS_ABLATION, SLOW_ABLATION


def _emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg, default=float) + "\n")
    sys.stdout.flush()


def _slowed(dev: Any, factor: float) -> None:
    """Userspace emulation of a slower board: pad the device's compute with sleep up to ``factor`` x."""
    if factor <= 1.0:
        return
    run_head, finish = dev.run_head, dev.finish_locally

    def head(inputs: Any, cut: str, **kw: Any) -> Any:
        h = run_head(inputs, cut, **kw)
        time.sleep(h.head_ms * (factor - 1) / 1e3)
        return replace(h, head_ms=h.head_ms * factor)

    def fin(h: Any) -> Any:
        r = finish(h)
        time.sleep(r.tail_ms * (factor - 1) / 1e3)
        return replace(r, tail_ms=r.tail_ms * factor, total_ms=r.head_ms + r.tail_ms * factor)

    dev.run_head, dev.finish_locally = head, fin


#: A directory: every strategy's runtime writes its decision log there as ``<strategy>.jsonl`` (unset: none).
DECISION_LOGS_ENV = "SPLITRT_RIG_DECISION_LOGS"


class RigLoad(LoadEstimator):
    """The device-load signal of an emulated board: its run queue (``RunQueueProbe``), not psutil, which
    sees the whole host (the cloud, the relays, other jobs) rather than the device's cgroup. The device's
    speed is still learned from every head's measured time (``LoadEstimator.add_head``)."""

    def add_device(
        self, now_s: float, *, other_util: float, freq_mhz: float | None = None, profiled_freq_mhz: float | None = None
    ) -> float:
        return 1.0  # the runtime's psutil samples: ignored (``RunQueueProbe`` feeds the base class's)


class TurnThread:
    """``tick()`` every ``interval_s`` on a daemon thread, only during its strategy's turns (``active``): a
    parked strategy's probes would share the link and the CPU with the one measured."""

    def __init__(
        self, name: str, interval_s: float, tick: Callable[[], Any], on_kick: Callable[[], Any] | None = None
    ) -> None:
        self.interval_s, self.tick, self.on_kick = interval_s, tick, on_kick
        self.active = threading.Event()
        self._busy = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def kick(self) -> None:
        """Run ``on_kick`` now, between ticks (the runtime's prober: a reply came)."""
        self._wake.set()

    def _loop(self) -> None:
        due_s = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            kicked = self._wake.wait(max(0.0, due_s - time.monotonic()))
            self._wake.clear()
            full = not kicked or time.monotonic() >= due_s or self.on_kick is None
            if self.active.is_set() and not self._stop.is_set():
                with self._busy, contextlib.suppress(Exception):  # it never dies: the next round retries
                    (self.tick if full else self.on_kick or self.tick)()
            if full:
                due_s = time.monotonic() + self.interval_s

    def park(self) -> None:
        """Stop ticking; a tick under way finishes first (a probe's transfer is part of this turn)."""
        self.active.clear()
        with self._busy:
            pass

    def stop(self) -> None:
        self.park()
        self._stop.set()
        self._wake.set()
        self.thread.join(5)


class RunQueueProbe(TurnThread):
    """Every 50 ms, how many threads of the OTHER processes sharing the device's CPU (listed by the rig
    in ``tasks_file``) are runnable; every 0.25 s (the prober's interval) their mean feeds ``RigLoad``:
    one compute thread among ``n`` runnable tasks gets ``1 / (1 + n)`` of the CPU, the figure a board's
    psutil gives its prober whether or not a head runs. (Timing a small job does not work under a CFS
    quota: it runs at full speed or waits a whole period.)"""

    def __init__(self, load: RigLoad, clock: Callable[[], float]) -> None:
        self.load, self.clock = load, clock
        self.tasks_file: str | None = None
        self.samples: list[int] = []
        self.report_at: float | None = None  # None: the turn's first sample is still to come
        super().__init__("rig-runqueue", 0.05, self.sample)

    def runnable_others(self) -> int:
        try:
            ids = [int(x) for x in Path(self.tasks_file or "").read_text().split()]
        except (OSError, ValueError):
            return 0
        n = 0
        for pid in ids:
            with contextlib.suppress(OSError):
                tids = os.listdir(f"/proc/{pid}/task")
                for tid in tids if len(tids) > 1 else [str(pid)]:
                    with contextlib.suppress(OSError, IndexError):
                        n += Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
        return n

    def sample(self) -> None:
        if not self.tasks_file:
            return
        now = self.clock()
        self.report_at = now + 0.25 if self.report_at is None else self.report_at
        self.samples.append(self.runnable_others())
        if now >= self.report_at:  # a head takes (1 + runnable others) x longer: that share of the CPU is taken
            others = statistics.fmean(self.samples)
            LoadEstimator.add_device(self.load, now, other_util=min(1.0 - 1.0 / (1.0 + others), 0.99))
            self.samples.clear()
            self.report_at = now + 0.25

    def park(self) -> None:
        """Between turns the samples are dropped: the next turn starts its own."""
        super().park()
        self.samples.clear()
        self.report_at = None


class TurnClock:
    """A strategy's own clock: it stands still while the other strategies take their turns."""

    def __init__(self, source: Callable[[], float] = time.monotonic) -> None:
        self._source = source  # the wall clock it follows while running (a fake one in tests)
        self._offset_s = 0.0
        self._paused_at: float | None = None

    def __call__(self) -> float:
        now = self._paused_at if self._paused_at is not None else self._source()
        return now - self._offset_s

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = self._source()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._offset_s += self._source() - self._paused_at
            self._paused_at = None


@dataclass
class Strategy:
    """One strategy in the worker: its runtime, clock, probes, and where its request schedule is."""

    dev: Any
    clock: TurnClock
    prober: TurnThread
    runqueue: RunQueueProbe
    jitter: random.Random
    next_k: int = 0
    next_u: float | None = None

    def close(self) -> None:
        self.runqueue.stop()
        self.prober.stop()
        self.dev.close()
        if self.dev.log is not None:
            self.dev.log.close()


class Agent:
    """The device: its model, local sessions, inputs, reference outputs and strategies."""

    def __init__(self, spec: P.Spec) -> None:
        import numpy as np

        from splitrt.device.client import Device, DeviceConfig
        from splitrt.graph import model as graph
        from splitrt.graph import photos
        from splitrt.profile import boards

        self.spec = spec
        self.mg = graph.load(spec.model_path)
        self.power = boards.load_board(spec.board).power
        # one compute thread: it throttles smoothly (with 2, a device's times varied +-7 % run to run)
        self.dcfg = DeviceConfig(intra_op_threads=1, timeout_s=30.0)
        self.local = Device(self.mg, None, config=self.dcfg)
        _slowed(self.local, spec.pad_factor)
        for cut in spec.warm_cuts:
            self.local.warm(cut)
        # an image model sees a real photograph (codecs compress it as they would a camera's frame)
        self.inputs = photos.photo_inputs(self.mg.inputs) or self.local.random_inputs(seed=spec.seed)
        self.reference = {k: np.asarray(v) for k, v in self.local.run_local(self.inputs).items()}
        self.strategies: dict[str, Strategy] = {}

    def time(self, msg: P.Time) -> P.Ack:
        """Median whole-model time (the first run unmeasured: sessions and quotas settle)."""
        from splitrt.device.client import Device

        if msg.codec:
            return self.time_encode(msg)
        walls, cpus = [], []
        with Device(self.mg, msg.address, config=self.dcfg) if msg.address else contextlib.nullcontext() as remote:
            for _ in range(msg.runs + 1):
                w0, c0 = time.perf_counter(), time.process_time()
                if remote is None:
                    ms = self.local.run_head(self.local.check_inputs(self.inputs), "device").head_ms
                    time.sleep(ms * (msg.pad_factor - 1) / 1e3)
                    ms *= msg.pad_factor
                else:
                    head = remote.run_head(self.inputs, "cloud")
                    ms = remote.send(head, timeout_s=60, next_cut=msg.next_cut).tail_ms
                walls.append(ms)
                cpus.append((time.process_time() - c0) * 1e3 if remote is None else (time.perf_counter() - w0) * 1e3)
        return P.Ack(wall_ms=statistics.median(walls[1:]), cpu_ms=statistics.median(cpus[1:]))

    def time_encode(self, msg: P.Time) -> P.Ack:
        """Median time to encode the inputs with ``msg.codec`` as a request does (the first run unmeasured)."""
        from splitrt.transport import codec

        feeds = self.local.check_inputs(self.inputs)
        walls = []
        for _ in range(msg.runs + 1):
            time.sleep(msg.gap_s)
            w0 = time.perf_counter()
            for name, arr in feeds.items():
                codec.encode(name, arr, msg.codec, copy=False)
            walls.append((time.perf_counter() - w0) * 1e3)
        return P.Ack(wall_ms=statistics.median(walls[1:]))

    def warm(self, msg: P.Warm) -> P.Ack:
        """One request per plan, so the servers build its segments before the timed part, as a server
        that has long served them has: a chain plan (``c3@fp16>c12@int8``) through the edge, a one-hop plan
        (``c5@jpeg50``) to every server of the last tier."""
        from splitrt.device.client import Device
        from splitrt.plan.path import parse_path

        ok = 0
        for plan in msg.plans:
            chain = ">" in plan
            for address in [self.spec.servers[0][0]] if chain else self.spec.servers[-1]:
                (a, *b), (codec, *_) = parse_path(plan, hops=2 if chain else 1)
                with contextlib.suppress(Exception), Device(self.mg, address, config=self.dcfg) as d:
                    head = self.local.run_head(self.inputs, a)
                    d.send(head, codec_spec=codec, next_cut=b[0] if chain else None, timeout_s=60)
                    ok += 1
        return P.Ack(count=ok)

    def runtime(self, msg: P.Prepare, clock: TurnClock) -> Any:
        """One strategy's runtime: over the direct path (``tiers`` 2) or all three."""
        from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
        from splitrt.plan.controller import ControllerConfig

        s = self.spec
        tables = cost_tables(Path(s.profile_path), self.mg.sha256, msg.factors, msg.codec_factor)
        kw: dict[str, Any] = dict(device_config=self.dcfg, power=self.power, clock=clock, start_prober=False)
        ctl = ControllerConfig(objective=s.objective, codecs=s.codecs if msg.tiers == 2 else s.codecs or ("fp32",))
        # the deployment's constraints (``Spec.cuts``) shape the two-tier runtime's plans
        ctl = replace(ctl, cuts=s.cuts) if msg.tiers == 2 else ctl
        if msg.name == HOLD_ABLATION:  # the controller before held gains added up
            ctl = replace(ctl, hold_drift_fraction=0.0)
        rc = RuntimeConfig(policy=msg.policy, deadline_ms=s.deadline_ms, warm_sessions=False, controller=ctl)
        if msg.name == SLOW_ABLATION:  # the link estimate before a lone slow sample was dropped
            rc = replace(rc, link=replace(rc.link, forgive_slow_s=None))
        if msg.name == NEWS_ABLATION:  # the link estimate before a lone slow sample waited to be confirmed
            rc = replace(rc, link=replace(rc.link, confirm_slow=False))
        if msg.tiers == 2:  # the direct path to the last tier (every server known, this device's first)
            clouds = [] if msg.policy == "fixed:device" else list(s.servers[-1])
            return AdaptiveDevice(self.mg, tables[0], clouds, config=rc, **kw)
        path = [[s.servers[0][0]], [s.servers[-1][0]]]  # through the first server tier's edge
        return AdaptiveDevice(self.mg, tuple(tables), path=path, config=rc, **kw)

    def prepare(self, msg: P.Prepare) -> P.Ack:
        """Build one strategy's runtime and warm it up: channels, the servers' sessions and the
        estimators, which a deployed device has fed long before any measured request. It starts as a
        daemon does, with a probe (RTT first), and paces its requests so the prober finds idle links."""
        if msg.name in self.strategies:
            self.strategies.pop(msg.name).close()
        clock = TurnClock()
        dev = self.runtime(msg, clock)
        dev.local = self.local  # sessions built once, outside the cgroup
        logs = os.environ.get(DECISION_LOGS_ENV)
        if logs:  # each strategy's decision log, to replay or read what it decided and why
            dev.log = open(Path(logs) / f"{msg.name}.jsonl", "a")  # noqa: SIM115 (closed with the strategy)
        dev.load = RigLoad()
        st = Strategy(
            dev=dev,
            clock=clock,
            prober=TurnThread("rig-prober", dev.config.prober_interval_s, dev.probe_once, dev.prober.probe_after_reply),
            runqueue=RunQueueProbe(dev.load, clock),
            jitter=random.Random(self.spec.seed),
        )
        dev.on_reply = st.prober.kick  # a reply wakes the rig's prober thread, as the runtime's own
        self.strategies[msg.name] = st
        with contextlib.suppress(Exception):
            dev.probe_once()
        st.prober.active.set()
        n = self._uncounted(dev, msg.warmup_s, msg.rate_hz)
        time.sleep(0.6)  # a few prober rounds
        st.prober.park()
        clock.pause()
        freeze_startup()  # as the daemon once started: a full collection walks only what requests make
        return P.Ack(count=n)

    def _uncounted(self, dev: Any, seconds: float, rate_hz: float) -> int:
        """Requests for ``seconds`` (at least 2) at ``rate_hz`` (0: back to back), none recorded."""
        t_warm, n = time.monotonic(), 0
        while n < 2 or time.monotonic() - t_warm < seconds:
            if rate_hz > 0:
                time.sleep(max(0.0, t_warm + n / rate_hz - time.monotonic()))
            dev.infer(self.inputs)
            n += 1
        return n

    def settle(self, msg: P.Settle) -> P.Ack:
        """``P.Settle``: uncounted requests as in a turn (its clock, prober and run-queue probe on)."""
        st = self.strategies[msg.name]
        st.runqueue.tasks_file = msg.tasks_file
        st.clock.resume()
        st.prober.active.set()
        st.runqueue.active.set()
        try:
            n = self._uncounted(st.dev, msg.seconds, msg.rate_hz)
        finally:
            st.clock.pause()
            st.runqueue.park()
            st.prober.park()
        return P.Ack(count=n)

    def run(self, msg: P.Run) -> P.Done:
        """One turn; then it idles, probing, until ``until_s`` as in a continuous run. ``end_s``: the
        window position at which it parked (a request running past the slice carries over)."""
        st = self.strategies[msg.name]
        st.runqueue.tasks_file = msg.tasks_file
        records: list[P.Record] = []
        time.sleep(max(0.0, msg.t0 - time.monotonic()))
        st.clock.resume()
        st.prober.active.set()
        st.runqueue.active.set()
        try:
            self._requests(st, msg, records)
            if msg.rate_hz > 0:
                time.sleep(max(0.0, msg.t0 + msg.until_s - msg.from_s - time.monotonic()))
        finally:
            end_s = msg.from_s + time.monotonic() - msg.t0
            # Clock first: a probe still under way ends parked, its sample stamped at the turn's end.
            st.clock.pause()
            st.runqueue.park()
            st.prober.park()
        return P.Done(end_s=end_s, records=tuple(records), stats=dict(st.dev.stats))

    def _requests(self, st: Strategy, msg: P.Run, records: list[P.Record]) -> None:
        """Request k is due at window position (k + u_k) / rate (u_k uniform in [0, 1), the same for
        every strategy: spread over the throttle's CFS period, whose phases would otherwise step the
        latencies), or at once in a closed loop; it starts then or when k-1 ends; none at ``until_s``."""
        while True:
            if st.next_u is None:
                st.next_u = st.jitter.random()
            due = (st.next_k + st.next_u) / msg.rate_hz if msg.rate_hz > 0 else 0.0
            start_s = max(due, msg.from_s + time.monotonic() - msg.t0)
            if start_s >= msg.until_s:
                return
            time.sleep(max(0.0, msg.t0 + start_s - msg.from_s - time.monotonic()))
            t_s = msg.from_s + time.monotonic() - msg.t0
            try:
                rec = self.record(st.next_k, t_s, st.dev.infer(self.inputs))
            except Exception as exc:  # infer raises only for bad inputs: count it as failed
                ms = (msg.from_s + time.monotonic() - msg.t0 - t_s) * 1e3
                rec = P.Record(i=st.next_k, t_s=t_s, latency_ms=ms, plan="?", error=f"{type(exc).__name__}: {exc}")
            records.append(rec)
            _emit({"event": "progress", "t_s": t_s, "plan": rec.plan, "latency_ms": rec.latency_ms})
            st.next_u = None
            st.next_k += 1

    def record(self, i: int, t_s: float, out: Any) -> P.Record:
        """The request record of a runtime's ``Outcome`` (two tiers or three)."""
        import numpy as np

        r, ref = out.result, self.reference
        copied = {k: float(getattr(r, k)) for k in P.RESULT_FIELDS} | {k: getattr(out, k) for k in P.OUTCOME_FIELDS}
        match = set(out.outputs) == set(ref) and all(
            np.allclose(np.asarray(out.outputs[k]), ref[k], rtol=1e-4, atol=1e-5) for k in ref
        )
        predicted = float(out.decision.predicted_ms)
        by = P.predicted_terms(out.decision)
        return P.Record(i=i, t_s=t_s, where=r.where, predicted_ms=predicted, match=match, predicted_by=by, **copied)

    def roles(self) -> P.Ack:
        """Compute threads (main, onnxruntime's pools: named ``python``) vs the control plane (probers,
        run-queue monitors, gRPC's named threads): on cgroup v1 only the compute ones are throttled."""
        control = {t.native_id for st in self.strategies.values() for t in (st.prober.thread, st.runqueue.thread)}
        compute, other = list[int](), list[int]()
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                is_python = comm == Path(sys.executable).name[:15] or comm.startswith("python")
                (compute if is_python and tid not in control else other).append(tid)
        return P.Ack(compute_tids=tuple(compute), other_tids=tuple(other))

    def close(self) -> None:
        for st in self.strategies.values():
            st.close()


def serve(spec: P.Spec, lines: Iterable[str]) -> None:
    agent = Agent(spec)
    _emit({"event": "loaded"})
    handlers: dict[type, Callable[[Any], Any]] = {
        P.Time: agent.time,
        P.Warm: agent.warm,
        P.Prepare: agent.prepare,
        P.Settle: agent.settle,
        P.Roles: lambda m: agent.roles(),
        P.Run: agent.run,
    }
    try:
        for line in lines:
            try:
                msg = P.decode(line)
                if isinstance(msg, P.Quit):
                    break
                if type(msg) not in handlers:
                    raise TypeError(f"expected a command, got {type(msg).__name__}")
                print(P.encode(handlers[type(msg)](msg)), flush=True)
            except Exception as exc:  # report, keep serving (the rig decides)
                _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        agent.close()


def _busy_worker(spec: dict[str, Any]) -> None:
    """Other devices queueing on the cloud: ``clients`` threads sending requests back to back."""
    from splitrt.device.client import Device
    from splitrt.plan.solver import parse_plan

    cut, codec = parse_plan(spec["plan"], "fp32")

    def loop() -> None:
        d = Device(spec["model_path"], spec["cloud"])
        head = d.run_head(d.random_inputs(1), cut)
        while True:
            with contextlib.suppress(Exception):
                d.send(head, codec_spec=codec, timeout_s=30)

    for _ in range(int(spec.get("clients", 2)) - 1):
        threading.Thread(target=loop, daemon=True).start()
    loop()  # the last client, until the rig ends this process


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m splitrt.rig.worker", description="rig child processes (internal)")
    p.add_argument("role", choices=["worker", "busy"])
    p.add_argument("spec", help="JSON")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rig stops us; Ctrl-C reaches the rig
    try:
        if a.role == "busy":
            _busy_worker(json.loads(a.spec))
        else:
            serve(P.decode(a.spec), sys.stdin)
    except Exception as exc:
        _emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
