"""One runner for every topology: calibrate, choose, warm up, then play every strategy in turns.

Calibration, per model: the servers' whole-model times now (hops unshaped) rescale the host profile's
tail times per server tier, and each device's whole-model time under its quota rescales its head times,
as an operator re-profiling would; every strategy plans with those tables (a device with its own speed).
Static choices are made once, at the links' median bandwidths, with the devices' median speed.

Turns: the strategies take turns on the same ``turn_s`` slices of the trace windows (every hop replays
each slice for each; round r starts with strategy r mod n, so a drift of the shared host cancels instead
of favouring whichever strategy ran in a fast minute). Every device runs the turn at once. A strategy's
clock stands still and its prober is parked while the others take their turns. A fault (``kill_at``)
SIGKILLs the last tier's last server at that fraction of every turn; it is restarted after the turn, so
every strategy meets the same failure.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from splitrt.errors import ConfigError, RigError
from splitrt.plan.costmodel import CLOUD_CUT, DEVICE_CUT
from splitrt.rig import calibration, loads, strategies
from splitrt.rig import protocol as P
from splitrt.rig.harness import Rig
from splitrt.rig.models import cost_table_for, cost_tables, guarded_profile, model_path_for, profile_for
from splitrt.rig.traces import Trace
from splitrt.rig.tracespec import load_trace, typical_rtt_ms


@dataclass(frozen=True, kw_only=True)
class HopPlay:
    """What one hop plays: a trace window per lower host (cycled), its RTT, the whole traces' median."""

    traces: tuple[str, ...]
    played: tuple[Trace, ...]
    rtt_ms: float
    median_mbps: float
    offset_s: float = 0.0
    scale: float = 1.0


def hop_play(
    specs: Sequence[str],
    hosts: int,
    *,
    offset_s: float,
    step_s: float,
    scale: float,
    span_s: float,
    rtt_ms: float | None,
) -> HopPlay:
    """Host i plays ``specs[i % k]`` from ``offset_s + (i // k) * step_s``, x ``scale``; RTT None: typical
    of the first trace's family."""
    full = [load_trace(t).scaled(scale) for t in specs]
    k = len(full)
    windows = tuple(full[i % k].window(offset_s + (i // k) * step_s, span_s) for i in range(hosts))
    rtt = rtt_ms if rtt_ms is not None else typical_rtt_ms(full[0])
    median = statistics.median(w.median_mbps() for w in windows) if hosts > 1 else full[0].median_mbps()
    return HopPlay(traces=tuple(specs), played=windows, rtt_ms=rtt, median_mbps=median, offset_s=offset_s, scale=scale)


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    model: str
    hops: tuple[HopPlay, ...]
    strategies: tuple[str, ...]
    fixed_mbps: float = math.nan  # static-fixed's bandwidth (the trace family's median)
    objective: str = "latency"
    codecs: tuple[str, ...] | None = None
    cuts: tuple[str, ...] | None = None  # the cuts the runtime's plans may use (constraints); None: all
    periodic_s: float = 5.0
    rate_hz: float = 4.0  # per device; 0: closed loop
    duration_s: float = 30.0  # the window every strategy plays
    turn_s: float = 1.0
    warmup_s: float = 2.0
    deadline_ms: float = 5000.0
    profile_path: str | None = None  # a host profile of the model (`splitrt profile`); None: shipped, else measured
    load: str = "none"
    # the accuracy guard measures every cut (lossy codecs then allowed at any cut that keeps the output);
    # else accuracy.DEFAULT_CUTS spread ones: once per model, then cached
    guard_every_cut: bool = False
    kill_at: float | None = None  # fraction of every turn
    player_step_s: float = 0.25
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One strategy's turn: every device's records, what the host and the fault did meanwhile."""

    name: str
    from_s: float
    until_s: float
    devices: tuple[tuple[P.Record, ...], ...]
    load_intervals: tuple[tuple[float, float], ...] = ()
    server_cpu_s: dict[str, float] = field(default_factory=dict)
    killed: str | None = None
    kill_at_s: float | None = None
    load_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    refused: int = 0
    end_s: float = 0.0  # where the latest device parked (a request past the slice carries over)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    spec: RunSpec
    choices: dict[str, strategies.Choice]
    turns: tuple[Turn, ...]
    tables: tuple[Any, ...]  # device (median speed), then one per server tier
    speeds: tuple[float, ...]  # per device
    times_ms: dict[str, Any]  # what the calibration measured
    servers: tuple[str, ...]  # the last tier's, as the devices reach them
    server_cpus: float
    load_start: tuple[float, ...]
    load_end: tuple[float, ...]
    startup_s: float = 0.0  # the device processes' load
    rss_mb: tuple[float, ...] = ()  # each device process's, after the turns
    power: Any = None  # the model's ``energy.PowerFigures`` on the board (what the strategies planned with)


def turn_plan(names: Sequence[str], duration_s: float, turn_s: float) -> list[tuple[str, float]]:
    """(strategy, end of its slice) in play order. Round r starts with strategy r mod n: over n rounds
    every strategy takes every place once (a linear drift of the host cancels exactly), and no strategy
    takes two turns in a row (with 3 or more)."""
    rounds = max(1, math.ceil(duration_s / turn_s - 1e-9))
    n = len(names)
    return [(names[(r + i) % n], min(duration_s, (r + 1) * turn_s)) for r in range(rounds) for i in range(n)]


class Player:
    """A thread re-rating every hop from window position ``from_s`` (played at monotonic ``t0``) every
    ``step_s``; the rates are in force before ``start`` returns."""

    def __init__(self, rig: Any, hops: Sequence[HopPlay], from_s: float, t0: float, step_s: float) -> None:
        self.rig, self.hops, self.from_s, self.t0, self.step_s = rig, hops, from_s, t0, step_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rig-player", daemon=True)

    def apply(self, pos_s: float) -> None:
        for k, hop in enumerate(self.hops):
            self.rig.set_rates(k, [w.rate_at(pos_s) for w in hop.played])

    def start(self) -> Player:
        self.apply(self.from_s)
        self._thread.start()
        return self

    def _run(self) -> None:
        k = 1
        try:
            while not self._stop.wait(max(0.0, self.t0 + k * self.step_s - time.monotonic())):
                self.apply(self.from_s + k * self.step_s)
                k += 1
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise RigError(f"trace player failed: {self.error}") from self.error


def run(
    spec: RunSpec, rig: Rig, *, progress: Callable[[str], None] | None = None, live: Callable[[str], None] | None = None
) -> Outcome:
    """Every strategy of ``spec`` on ``rig``'s topology, on the same trace windows (module doc)."""
    from splitrt.graph import model as graph
    from splitrt.plan.costmodel import Link
    from splitrt.profile import profiler
    from splitrt.profile.energy import plan_power

    say = progress or (lambda s: None)
    load_start = os.getloadavg()
    n_tiers, n_dev = len(rig.config.tiers), rig.config.tiers[0].count
    if len(spec.hops) != n_tiers - 1:
        raise ConfigError(f"hops: expected {n_tiers - 1} for {n_tiers} tiers, got {len(spec.hops)}")
    model_file = model_path_for(spec.model)
    mg = graph.load(model_file)
    rig.install_model(model_file)
    if rig.calibration is None:  # once per rig: the devices take on resnet50 what the board takes
        rig.calibration = calibration.calibrate(rig)
    cal = rig.calibration
    prof = Path(spec.profile_path) if spec.profile_path else profile_for(spec.model, model_file, rig.workdir, say)
    prof = guarded_profile(prof, model_file, say, inner_cuts=len(mg.cuts()) if spec.guard_every_cut else None)
    host = cost_table_for(prof, mg.sha256, 1.0)
    host_device_ms, host_cloud_ms = float(host.head_ms[host.index("device")]), float(host.tail_ms[host.index("cloud")])
    figures = plan_power(profiler.load_profile(prof, sha256=mg.sha256), rig.board)
    power = figures.power
    kw: dict[str, Any] = {"objective": spec.objective, "power": power, "codecs": spec.codecs}
    slow = 1 / min(rig.config.tiers[0].cpus) if rig.config.tiers[0].cpus else rig.board.cpu_speed_factor
    base = cost_tables(prof, mg.sha256, [slow] + [1.0] * (n_tiers - 1))
    cuts, pairs = strategies.likely_plans(base, [h.rtt_ms for h in spec.hops], **kw)
    servers = rig.addresses
    specs = [
        P.Spec(
            model_path=str(model_file),
            profile_path=str(prof),
            board=rig.board.name,
            servers=tuple(tuple(tier[(i + j) % len(tier)] for j in range(len(tier))) for tier in servers),
            codecs=spec.codecs,
            cuts=spec.cuts,
            objective=spec.objective,
            deadline_ms=spec.deadline_ms,
            seed=spec.seed + (i if n_dev > 1 else 0),
            pad_factor=cal.pad_factor,
            warm_cuts=tuple(cuts),
        )
        for i in range(n_dev)
    ]
    say(f"starting {n_dev} device process(es)")
    t_start = time.monotonic()
    workers = rig.start_workers(specs)
    startup_s = time.monotonic() - t_start
    for k, h in enumerate(spec.hops if rig.config.delays else ()):
        rig.set_rtt(k, h.rtt_ms)
    try:
        dev_ms, server_ms = _calibrate(rig, workers, servers)
        codec_factor = _codec_factor(rig, workers[0], host, 1.0 / spec.rate_hz if spec.rate_hz > 0 else 0.0)
        say(
            f"whole model now: device {min(dev_ms):.0f}-{max(dev_ms):.0f} ms, servers "
            f"{', '.join(f'{x:.0f}' for x in server_ms)} ms "
            f"(host profile {host_device_ms:.0f} / {host_cloud_ms:.0f} ms)"
        )
        speeds = [d / host_device_ms for d in dev_ms]
        factors = [statistics.median(speeds), *(x / host_cloud_ms if host_cloud_ms > 0 else 1.0 for x in server_ms)]
        tables = cost_tables(prof, mg.sha256, factors, codec_factor)
        if codec_factor is not None:
            say(f"device encode: {codec_factor:.2f} x the profile's (compute {factors[0]:.2f} x)")
        medians = [Link(bandwidth_mbps=h.median_mbps, rtt_ms=h.rtt_ms) for h in spec.hops]
        names = [n for n in spec.strategies if n not in strategies.ORACLE_REFS]
        choices = (
            strategies.choose(names, tables, medians, fixed_mbps=spec.fixed_mbps, periodic_s=spec.periodic_s, **kw)
            if names
            else {}
        )
        if n_tiers == 3:
            warm = [c.plan for c in choices.values() if c.tiers == 3 and c.plan and ">" in c.plan]
            (got,) = P.ask(workers[:1], [P.Warm(plans=tuple(dict.fromkeys([*warm, *pairs]))[:12])], P.Ack, 600)
            say(f"edge and cloud: {got.count} chain plans warmed")
        else:  # the servers build each likely cut's tail now: a split's first request no longer pays it
            t = base[0]  # each with its fewest bytes: the link may already be slow
            inner = [c for c in cuts if c not in (DEVICE_CUT, CLOUD_CUT)]
            tails = tuple(f"{c}@{t.codecs[int(t.sent_bytes[t.index(c)].argmin())]}" for c in inner)
            (got,) = P.ask(workers[:1], [P.Warm(plans=tails)], P.Ack, 600)
            say(f"cloud: {got.count} tails of {len(tails)} likely cuts warmed")
        for i, w in enumerate(workers):
            rig.throttle(i, w.proc.pid)
        for c in choices.values():
            say(f"[{c.name}] {c.tiers} tiers, policy {c.policy}: preparing")
            Player(rig, spec.hops, 0.0, time.monotonic(), spec.player_step_s).apply(0.0)
            msgs = [
                P.Prepare(
                    name=c.name,
                    policy=c.policy,
                    tiers=c.tiers,
                    factors=(s, *factors[1:]),
                    rate_hz=spec.rate_hz,
                    warmup_s=spec.warmup_s,
                    codec_factor=codec_factor,
                )
                for s in speeds
            ]
            P.ask(workers, msgs, P.Ack, 900)
        roles = P.ask(workers, [P.Roles()] * n_dev, P.Ack, 30)
        for i, (w, r) in enumerate(zip(workers, roles, strict=True)):
            # a device calibrated to a board: its compute threads (the control plane stands for its spare
            # cores); a device with a quota of its own (a fleet's): all of it, gRPC and encoding included
            rig.unthrottle(i, w.proc.pid)
            rig.throttle(i, w.proc.pid, None if rig.config.tiers[0].cpus else (r.compute_tids, r.other_tids))
        if loads.busy_at_start(spec.load) and spec.warmup_s > 0:
            with loads.at_start(rig, spec.load, model_file):
                for c in choices.values():
                    say(f"[{c.name}] settling under {spec.load}")
                    tasks = str(rig.board_tasks)
                    msg = P.Settle(name=c.name, seconds=spec.warmup_s, rate_hz=spec.rate_hz, tasks_file=tasks)
                    P.ask(workers, [msg] * n_dev, P.Ack, 900)
        turns = _play(spec, rig, workers, model_file, choices, say, live)
        rss = tuple(psutil.Process(w.proc.pid).memory_info().rss / 2**20 for w in workers)
    finally:
        for i, w in enumerate(workers):  # all told to quit first: they close their runtimes side by side
            rig.unthrottle(i, w.proc.pid)
            with contextlib.suppress(Exception):
                w.send(P.encode(P.Quit()))
        for w in workers:
            with contextlib.suppress(Exception):
                w.close()
    return Outcome(
        spec=spec,
        choices=choices,
        turns=tuple(turns),
        tables=tuple(tables),
        speeds=tuple(speeds),
        times_ms={"device_ms": dev_ms, "server_ms": server_ms}
        | {"host_device_ms": host_device_ms, "host_cloud_ms": host_cloud_ms},
        servers=tuple(servers[-1]),
        server_cpus=rig.config.tiers[-1].cpus[0] if rig.config.tiers[-1].cpus else math.nan,
        load_start=tuple(load_start),
        load_end=tuple(os.getloadavg()),
        startup_s=startup_s,
        rss_mb=rss,
        power=figures,
    )


#: Codecs the device's encode factor is timed with (those the profile times at the input, >= MIN_ENCODE_MS).
FACTOR_CODECS = ("jpeg75", "jpeg50", "int8+zstd", "fp16")
MIN_ENCODE_MS = 0.2


def _codec_factor(rig: Rig, worker: Any, host: Any, gap_s: float) -> float | None:
    """What the device pays to encode its input under its quota over what the profile prices (median over
    ``FACTOR_CODECS``; None: the profile times none). Not its speed factor: a CPU quota lets a short
    encode run at the host's speed when the period's quota is unspent (a request's, at the bench's rate),
    while a model's run spans periods; and a board's one-threaded encode slows otherwise than its model."""
    i = host.index("cloud")
    codecs = [c for c in FACTOR_CODECS if c in host.codecs and host.encode_ms[i, host.codec_index(c)] >= MIN_ENCODE_MS]
    if not codecs:
        return None
    rig.throttle(0, worker.proc.pid)
    try:
        msgs = [P.Time(runs=5, codec=c, gap_s=min(gap_s, 0.25)) for c in codecs]
        got = P.ask([worker] * len(codecs), msgs, P.Ack, 120)
    finally:
        rig.unthrottle(0, worker.proc.pid)
    priced = [float(host.encode_ms[i, host.codec_index(c)]) for c in codecs]
    return statistics.median(a.wall_ms / p for a, p in zip(got, priced, strict=True))


def _calibrate(rig: Rig, workers: Sequence[Any], servers: Sequence[Sequence[str]]) -> tuple[list[float], list[float]]:
    """Each device's whole-model time under its quota, and each server tier's now (unshaped)."""
    for k, _ in enumerate(rig.hops or [None]):
        rig.set_rates(k, [None] * rig.config.tiers[k].count)
    last = len(servers) - 1
    times = [
        P.Time(runs=5, address=tier[0], next_cut=None if k == last else "device") for k, tier in enumerate(servers)
    ]
    ms = [P.ask(workers[:1], [t], P.Ack, 300)[0].wall_ms for t in times]
    for i, w in enumerate(workers):
        rig.throttle(i, w.proc.pid)
    try:
        dev = [a.wall_ms for a in P.ask(workers, [P.Time(runs=3)] * len(workers), P.Ack, 600)]
    finally:
        for i, w in enumerate(workers):
            rig.unthrottle(i, w.proc.pid)
    return dev, ms


def _play(
    spec: RunSpec,
    rig: Rig,
    workers: Sequence[Any],
    model_file: Any,
    choices: dict[str, strategies.Choice],
    say: Callable[[str], None],
    live: Callable[[str], None] | None,
) -> list[Turn]:
    names = list(choices)
    pos = dict.fromkeys(names, 0.0)  # where each strategy is in the window
    count = dict.fromkeys(names, 0)
    show = live or (lambda s: None)
    cloud_plan = (choices["cloud-only"].plan if "cloud-only" in choices else None) or "cloud@fp32"
    turns = []
    for name, until in turn_plan(names, spec.duration_s, spec.turn_s):
        from_s = pos[name]
        if from_s >= until:  # its last request of the previous turn ran past this slice
            continue

        def on_event(ev: dict[str, Any], name: str = name) -> None:
            count[name] += 1
            rates = "/".join(f"{h.played[0].rate_at(float(ev['t_s'])):.2f}" for h in spec.hops)
            show(
                f"[{name}] {float(ev['t_s']):5.1f}/{spec.duration_s:g} s  req {count[name]:4d}  "
                f"link {rates} Mbit/s  plan {ev['plan']:<16} {ev['latency_ms']:7.0f} ms"
            )

        workers[0].on_event = on_event
        turn = _turn(spec, rig, workers, name, from_s, until, model_file, cloud_plan)
        workers[0].on_event = None
        turns.append(turn)
        pos[name] = max(until, turn.end_s) if spec.rate_hz > 0 else until
    show("")
    for name in names:
        lat = [r.latency_ms for t in turns if t.name == name for d in t.devices for r in d]
        say(f"[{name}] {len(lat)} requests, mean {statistics.fmean(lat) if lat else math.nan:.0f} ms")
    return turns


def _turn(
    spec: RunSpec,
    rig: Rig,
    workers: Sequence[Any],
    name: str,
    from_s: float,
    until: float,
    model_file: Any,
    cloud_plan: str,
) -> Turn:
    """One strategy's turn on every device, the hops replaying the slice, the load and the fault applied."""
    t0 = time.monotonic() + 0.1
    kill_s = spec.kill_at * (until - from_s) if spec.kill_at is not None else None
    last = len(rig.servers)
    n_srv = len(rig.servers[-1])
    cpu0 = [rig.server_cpu(last, j) for j in range(n_srv)]
    at_kill: dict[int, float] = {}

    def kill() -> None:
        assert kill_s is not None
        time.sleep(max(0.0, t0 + kill_s - time.monotonic()))
        at_kill[n_srv - 1] = rig.kill_server(last, n_srv - 1)

    killer = threading.Thread(target=kill, name="rig-fault", daemon=True) if kill_s is not None else None
    player = Player(rig, spec.hops, from_s, t0, spec.player_step_s).start()
    try:
        with loads.during(rig, spec.load, spec.duration_s, t0, model_file, cloud_plan, from_s=from_s) as applied:
            if killer is not None:
                killer.start()
            msg = P.Run(
                name=name, t0=t0, from_s=from_s, until_s=until, rate_hz=spec.rate_hz, tasks_file=str(rig.board_tasks)
            )
            done = P.ask(workers, [msg] * len(workers), P.Done, until - from_s + spec.deadline_ms / 1e3 + 120)
            if killer is not None:
                killer.join()
    finally:
        player.stop()
    cpu1 = [at_kill.get(j, rig.server_cpu(last, j)) for j in range(n_srv)]
    if kill_s is not None:
        rig.restart_server(last, n_srv - 1)
    addrs = rig.addresses[-1]
    return Turn(
        name=name,
        from_s=from_s,
        until_s=until,
        devices=tuple(d.records for d in done),
        load_intervals=tuple(applied),
        server_cpu_s={a: max(0.0, cpu1[j] - cpu0[j]) for j, a in enumerate(addrs)},
        killed=addrs[-1] if kill_s is not None else None,
        kill_at_s=from_s + kill_s if kill_s is not None else None,
        load_avg=os.getloadavg(),
        refused=sum(int(d.stats.get("refused", 0)) for d in done),
        end_s=max(d.end_s for d in done),
    )
