"""The fleet rig (``splitrt rig fleet``, root): N emulated devices against M real ``splitrt serve``
processes, one server killed in the middle of every strategy's run.

- Network: ``rig.fleetnet``: a namespace per device and per server on one switch; every device's link
  follows its own real trace (the shipped traces in turn, each later device at a further offset),
  scaled by ``bandwidth_scale``, re-rated every second in one ``tc -batch``.
- CPU: every device process in its own cgroup (quota ``device_cpus``, cycled over the fleet: a mixed
  fleet), every server in its own (quota ``server_cpus``, ``server_workers`` tails at once, one
  onnxruntime thread each). Devices run one process each (``rig.fleetworker``; why: its module doc).
- Strategies: ``adaptive``, ``device-only``, ``cloud-only`` and ``static`` (ONE plan for the whole
  fleet, chosen from the profile at the fleet's median device speed and median link rate) take turns
  on the same trace window (segments; round r plays window r and starts with strategy r mod n). Every
  device knows every server, each device preferring a different one first (balanced).
- The kill: at ``kill_at_fraction`` of every segment the last server gets SIGKILL (its CPU time read
  just before); it is restarted between segments, so every strategy meets the same failure.

Reported per strategy (``rig.fleetstats``): throughput, latency percentiles, local completions, requests
per server, server utilisation (CPU seconds / (segment x quota)), failures, what the kill moved; the
host's load average beside every segment.

- ``run_fleet(FleetConfig(devices, servers, model, traces, bandwidth_scale, device_cpus, server_cpus,
  server_workers, segment_s, rounds, kill_at_fraction, rate_hz, strategies, codecs, ...), workdir) -> dict``:
  ``FleetNet`` = ``make_lan(prefix, N + M)``, every device's uplink (switch ingress -> ``ifb{i}``) and downlink
  (``p{i}`` egress) shaped in the switch namespace, the whole fleet re-rated by ONE ``tc -batch`` per tick
  (``FleetPlayer``); one ``python -m splitrt.rig.fleetworker`` process per device namespace, each in its own
  cgroup (``device_cpus`` cycled); M ``splitrt serve --host 0.0.0.0 --insecure`` in their own namespaces and
  cgroups; every device lists every server, device i preferring server i mod M. Strategies (``adaptive``,
  ``device-only``, ``cloud-only``, ``static``: one plan for the fleet at the median device speed and link rate)
  take turns in segments (round r starts with strategy r mod n), closed loop; the last server is SIGKILLed at
  ``kill_at_fraction`` of every segment and restarted between segments.
- Result keys: ``strategies.{NAME}.{throughput_rps, mean_ms, p50_ms, p95_ms, p99_ms, requests, completed,
  failed, local, fallbacks, by_server, server_util, moved, after_kill_on_killed, accounted, plans, by_plan,
  load_avg}``, ``vs_adaptive.{NAME}.{throughput, mean, p95}.{ci, call}`` (bootstrap over (segment, device)
  groups), ``verdict.{pass, reasons, failed}``, ``calibration``, ``devices_model``, ``segments``,
  ``load_before/after``.
- Records (``fleetworker.RECORD_FIELDS``): ``[t_s, latency_ms, plan, server | None, fallback, error | None,
  predicted_ms, head_ms, encode_ms, rpc_ms, queue_ms, tail_ms]``; ``fleetstats`` reads the first six.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from splitrt.errors import ConfigError, RigError
from splitrt.rig import fleetstats, netns, quota
from splitrt.rig.cloudserver import CLOUD_PORT, CloudProcess
from splitrt.rig.fleetnet import FleetNet, FleetPlayer
from splitrt.rig.models import cost_table_for, model_path_for, profile_for
from splitrt.rig.processes import Children, JsonWorker

STRATEGIES = ("adaptive", "device-only", "cloud-only", "static")
DEFAULT_TRACES = (
    "hsdpa/bus",
    "hsdpa/car",
    "hsdpa/metro",
    "hsdpa/train",
    "hsdpa/ferry",
    "hsdpa/tram",
    "hsdpa/bus-0929",
    "hsdpa/car-elverum",
)


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    devices: int = 24
    servers: int = 2
    model: str = "squeezenet"
    traces: tuple[str, ...] = DEFAULT_TRACES
    trace_offset_step_s: float = 60.0  # device i plays traces[i % k] from (i // k) x this
    bandwidth_scale: float = 4.0
    # Cycled over the devices (a mixed fleet). With 2 x 0.4 for the servers the fleet is budgeted at ~1.5
    # of this host's 2 vCPUs: 0.04/0.08 (+ 2 x 0.5) asked for ~2.4, more than the host has, and then no
    # quota holds (load average ~20, every device slower than calibrated, by how busy the host is).
    device_cpus: tuple[float, ...] = (0.02, 0.04)
    cfs_period_us: int = 50_000  # 0.02 CPU in 20 ms periods would be under the kernel's 1 ms minimum
    server_cpus: float = 0.4
    server_workers: int = 2
    segment_s: float = 15.0
    rounds: int = 2  # rotating order: a drift of the (shared, busy) host cancels instead of hitting one strategy
    kill_at_fraction: float | None = 0.5  # None: no kill
    rate_hz: float = 0.0  # per device; 0: closed loop, back to back
    strategies: tuple[str, ...] = STRATEGIES
    codecs: tuple[str, ...] | None = ("fp32", "fp16", "int8")
    warmup_s: float = 3.0
    deadline_ms: float = 5000.0
    board: str = "rpi4"  # power figures only: the CPU is the cgroup quota
    player_step_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.devices < 1 or self.servers < 1:
            raise ConfigError(f"devices, servers: expected >= 1, got {self.devices}, {self.servers}")
        if self.kill_at_fraction is not None and self.servers < 2:
            raise ConfigError(f"kill_at_fraction needs >= 2 servers (one survives), got {self.servers}")
        if self.kill_at_fraction is not None and not 0 < self.kill_at_fraction < 1:
            raise ConfigError(f"kill_at_fraction: expected in (0, 1) or None, got {self.kill_at_fraction}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise ConfigError(f"strategies: expected names in {', '.join(STRATEGIES)}, got {list(self.strategies)}")
        if not self.segment_s > 0 or self.rounds < 1 or not self.bandwidth_scale > 0 or not self.traces:
            raise ConfigError(
                f"segment_s > 0, rounds >= 1, bandwidth_scale > 0 and a trace expected, got "
                f"{self.segment_s}, {self.rounds}, {self.bandwidth_scale}, {list(self.traces)}"
            )
        if not all(0.01 <= c <= 64 for c in (*self.device_cpus, self.server_cpus)) or not self.device_cpus:
            raise ConfigError(
                f"device_cpus, server_cpus: expected in [0.01, 64], got {list(self.device_cpus)}, {self.server_cpus}"
            )


def segment_plan(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, strategy) in play order: round r starts with strategy r mod n."""
    n = len(names)
    return [(r, names[(r + i) % n]) for r in range(rounds) for i in range(n)]


def device_traces(cfg: FleetConfig) -> list[Any]:
    """Device i's trace: ``traces[i % k]`` from ``(i // k) * trace_offset_step_s``, scaled."""
    from splitrt.rig.tracespec import load_trace

    loaded = [load_trace(t) for t in cfg.traces]
    k = len(loaded)
    span = cfg.segment_s * cfg.rounds + 60.0
    out = []
    for i in range(cfg.devices):
        w = loaded[i % k].window((i // k) * cfg.trace_offset_step_s, span)
        out.append(w.scaled(cfg.bandwidth_scale) if cfg.bandwidth_scale != 1 else w)
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class FleetServer(CloudProcess):
    """``splitrt serve`` on every address of its namespace (the namespace is the fleet's alone)."""

    def argv(self, host: str, port: int) -> list[str]:
        return [*super().argv("0.0.0.0", port), "--insecure", "--intra-op-threads", "1"]


class Fleet:
    """Namespaces, shapers, servers, device workers and their cgroups (see module doc). Context manager."""

    def __init__(self, cfg: FleetConfig, workdir: Path, *, progress: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.progress = progress
        self.prefix = netns.check_prefix(f"spl-fl{os.getpid() % 100000}")
        self.models_dir = workdir / "models"
        self.children = Children(workdir)
        self.net: FleetNet | None = None
        self.servers: list[FleetServer] = []
        self.server_groups: list[Any] = []
        self.device_groups: list[Any] = []
        self.workers: list[JsonWorker] = []
        self.started_s = 0.0
        self._old_sigterm: Any = None

    def __enter__(self) -> Fleet:
        if threading.current_thread() is threading.main_thread():  # SIGTERM tears down like Ctrl-C
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def addresses(self) -> list[str]:
        assert self.net is not None
        return [f"{h.ip}:{CLOUD_PORT}" for h in self.net.servers]

    def _cgroup(self, name: str, cpus: float) -> Any:
        from splitrt.rig import cgroup

        g = cgroup.CpuThrottle(f"{self.prefix}-{name}", None)
        g.open()
        quota.set_quota(g, cpus, self.cfg.cfs_period_us)
        quota.set_shares(g, quota.DEVICE_SHARES)  # the quota, even on a host busy with other work
        return g

    def start(self) -> None:
        if not netns.is_root():
            raise RigError(f"the fleet rig needs root (namespaces, tc, cgroups), running as euid {os.geteuid()}")
        removed = netns.cleanup_leftovers()
        if removed:
            self.progress(f"removed leftovers of earlier runs: {', '.join(removed)}")
        cfg = self.cfg
        self.progress(
            f"fleet {self.prefix}: {cfg.devices} device + {cfg.servers} server namespaces, "
            f"switch, per-device htb both ways"
        )
        self.net = FleetNet(self.prefix, cfg.devices, cfg.servers)
        for h in self.net.lan.hosts:  # strategies take turns: parked connections keep their window
            h.call(Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").write_text, "0")
        self.models_dir.mkdir(parents=True, exist_ok=True)
        for j in range(len(self.net.servers)):
            d = self.workdir / f"server{j}"
            d.mkdir(exist_ok=True)
            srv = FleetServer(Children(d), self.models_dir, workers=cfg.server_workers, progress=self.progress)
            self.servers.append(srv)
            self.server_groups.append(self._cgroup(f"s{j}", cfg.server_cpus))
        for i in range(cfg.devices):
            self.device_groups.append(self._cgroup(f"d{i}", cfg.device_cpus[i % len(cfg.device_cpus)]))

    def start_servers(self, model_file: Path) -> None:
        for srv in self.servers:
            srv.copy_model(model_file)
        for j in range(len(self.servers)):
            self.start_server(j)

    def start_server(self, j: int) -> None:
        assert self.net is not None
        srv = self.servers[j]
        srv.start(self.net.servers[j], CLOUD_PORT)
        assert srv.proc is not None
        self.server_groups[j].add_pid(srv.proc.pid)

    def kill_server(self, j: int) -> float:
        """SIGKILL server ``j``; returns its CPU seconds just before."""
        proc = self.servers[j].proc
        if proc is None or proc.poll() is not None:
            return 0.0
        cpu = cpu_seconds(proc.pid)
        proc.kill()
        proc.wait(10)
        return cpu

    def server_cpu(self, j: int) -> float:
        proc = self.servers[j].proc
        return cpu_seconds(proc.pid) if proc is not None and proc.poll() is None else 0.0

    def start_workers(self, specs: Sequence[dict[str, Any]]) -> None:
        """One worker per device (in its namespace, unthrottled while it loads), then into its cgroup."""
        assert self.net is not None
        t = time.monotonic()
        for i, spec in enumerate(specs):
            argv = [sys.executable, "-m", "splitrt.rig.fleetworker", json.dumps(spec)]
            proc = self.children.popen(argv, f"device{i}.log", host=self.net.devices[i], pipes=True)
            self.workers.append(JsonWorker(proc, f"device{i}"))
        for w in self.workers:
            w.reply(900)  # {"event": "loaded"}
        self.started_s = time.monotonic() - t
        for w, g in zip(self.workers, self.device_groups, strict=True):
            g.add_pid(w.proc.pid)

    def call_all(self, msgs: Sequence[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """Send each worker its message at once, then collect every reply."""
        for w, m in zip(self.workers, msgs, strict=True):
            w.send(m)
        return [w.reply(timeout_s) for w in self.workers]

    def close(self) -> None:
        errors = []
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.close()
        self.children.terminate_all()
        for srv in self.servers:
            srv.children.terminate_all()
        for g in [*self.device_groups, *self.server_groups]:
            try:
                g.close()
            except Exception as exc:  # keep tearing down the rest
                errors.append(str(exc))
        if self.net is not None:
            try:
                self.net.close()
            except Exception as exc:
                errors.append(str(exc))
            self.net = None
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        if errors:
            raise RigError("fleet teardown: " + "; ".join(errors))


def policies_for(cfg: FleetConfig, table: Any, median_mbps: float) -> dict[str, str]:
    """Policy per strategy; ``static`` is the profile's best plan at the fleet's median link rate."""
    from splitrt.plan import costmodel, solver

    codecs = list(cfg.codecs) if cfg.codecs else None
    cond = costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=median_mbps, rtt_ms=1.0))
    cloud = solver.solve(table, cond, cuts=["cloud"], codecs=codecs)
    static = solver.solve(table, cond, codecs=codecs)
    return {
        "adaptive": "adaptive",
        "device-only": "fixed:device",
        "cloud-only": f"fixed:{cloud.key}",
        "static": f"fixed:{static.key}",
    }


def run_fleet(cfg: FleetConfig, workdir: Path, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build the fleet, calibrate, run every strategy's segments; the result dict (see ``assemble``)."""
    from splitrt.graph import model as graph
    from splitrt.rig.bench import likely_cuts

    say = progress or (lambda s: None)
    load_before = os.getloadavg()
    model_file = model_path_for(cfg.model)
    mg = graph.load(model_file)
    prof = profile_for(cfg.model, model_file, workdir, say)
    table1 = cost_table_for(prof, mg.sha256, 1.0)
    profiled_ms = float(table1.head_ms[table1.index("device")])
    dev_traces = device_traces(cfg)
    median_mbps = statistics.median(t.median_mbps() for t in dev_traces)
    warm = likely_cuts(cost_table_for(prof, mg.sha256, 1 / min(cfg.device_cpus)), 1.0, cfg.codecs)
    with Fleet(cfg, workdir, progress=say) as fleet:
        fleet.start_servers(model_file)
        base = {
            "model_path": str(model_file),
            "profile_path": str(prof),
            "codecs": list(cfg.codecs or []) or None,
            "deadline_ms": cfg.deadline_ms,
            "board": cfg.board,
            "threads": 1,
            "warm_cuts": warm,
        }
        n, m = cfg.devices, cfg.servers
        addrs = fleet.addresses
        specs = [{**base, "seed": cfg.seed + i, "clouds": [addrs[(i + k) % m] for k in range(m)]} for i in range(n)]
        say(f"starting {n} device processes (one per namespace)")
        fleet.start_workers(specs)
        assert fleet.net is not None
        fleet.net.set_rates([t.rate_at(0.0) for t in dev_traces])
        say(f"devices loaded in {fleet.started_s:.0f} s; calibrating device speeds and the servers")
        heads = [float(r["head_ms"]) for r in fleet.call_all([{"cmd": "device-calibrate", "runs": 3}] * n, 600)]
        speeds = [h / profiled_ms for h in heads]
        fleet.net.set_rates([1000.0] * n)
        cloud_ms = float(fleet.workers[0].call({"cmd": "cloud-calibrate", "runs": 5}, 300)["tail_ms"])
        cloud_factor = cloud_ms / profiled_ms if profiled_ms > 0 else 1.0
        table = cost_table_for(prof, mg.sha256, statistics.median(speeds), cloud_factor)
        policies = {k: v for k, v in policies_for(cfg, table, median_mbps).items() if k in cfg.strategies}
        say(f"device whole model {min(heads):.0f}-{max(heads):.0f} ms, server {cloud_ms:.0f} ms; policies {policies}")
        fleet.net.set_rates([t.rate_at(0.0) for t in dev_traces])
        fleet.call_all(
            [
                {
                    "cmd": "prepare",
                    "policies": policies,
                    "speed_factor": s,
                    "cloud_factor": cloud_factor,
                    "warmup_s": cfg.warmup_s,
                }
                for s in speeds
            ],
            900,
        )
        segments = [
            run_segment(cfg, fleet, dev_traces, r, name, say) for r, name in segment_plan(list(policies), cfg.rounds)
        ]
        rss = [rss_mb(w.proc.pid) for w in fleet.workers]
        started_s = fleet.started_s
    result = assemble(cfg, segments, addrs, policies)
    result.update(
        calibration={
            "device_head_ms": heads,
            "profiled_device_ms": profiled_ms,
            "server_ms": cloud_ms,
            "cloud_factor": cloud_factor,
            "median_link_mbps": median_mbps,
        },
        devices_model={
            "kind": "process per device",
            "startup_s": started_s,
            "rss_mb_each": statistics.fmean(rss) if rss else 0.0,
            "rss_mb_total": sum(rss),
        },
        load_before=list(load_before),
        load_after=list(os.getloadavg()),
    )
    return result


def run_segment(
    cfg: FleetConfig, fleet: Fleet, dev_traces: Sequence[Any], rnd: int, name: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every device runs ``name`` for one segment (window position ``rnd * segment_s``); the last server
    is killed at ``kill_at_fraction`` and restarted afterwards."""
    assert fleet.net is not None
    m = cfg.servers
    addrs = fleet.addresses
    killed = m - 1 if cfg.kill_at_fraction is not None else None
    kill_at = cfg.kill_at_fraction * cfg.segment_s if cfg.kill_at_fraction is not None else None
    t0 = time.monotonic() + 0.5
    player = FleetPlayer(fleet.net, dev_traces, from_s=rnd * cfg.segment_s, t0=t0, step_s=cfg.player_step_s)
    player.start()
    cpu0 = [fleet.server_cpu(j) for j in range(m)]
    cpu_at_kill: dict[int, float] = {}

    def kill() -> None:
        assert killed is not None and kill_at is not None
        time.sleep(max(0.0, t0 + kill_at - time.monotonic()))
        cpu_at_kill[killed] = fleet.kill_server(killed)

    killer = threading.Thread(target=kill, name="fleet-killer", daemon=True) if killed is not None else None
    say(
        f"[{name}] round {rnd}: {cfg.devices} devices x {cfg.segment_s:g} s"
        + (f", server {addrs[killed]} killed at {kill_at:g} s" if killed is not None else "")
    )
    try:
        if killer is not None:
            killer.start()
        replies = fleet.call_all(
            [{"cmd": "run", "name": name, "t0": t0, "duration_s": cfg.segment_s, "rate_hz": cfg.rate_hz}] * cfg.devices,
            cfg.segment_s + cfg.deadline_ms / 1e3 + 120,
        )
        if killer is not None:
            killer.join()
    finally:
        player.stop()
    cpu1 = [cpu_at_kill.get(j, fleet.server_cpu(j)) for j in range(m)]
    load = os.getloadavg()
    if killed is not None:
        fleet.start_server(killed)
    seg = {
        "strategy": name,
        "round": rnd,
        "duration_s": cfg.segment_s,
        "kill_at_s": kill_at,
        "killed": addrs[killed] if killed is not None else None,
        "devices": [r["records"] for r in replies],
        "server_cpu_s": {a: max(0.0, cpu1[j] - cpu0[j]) for j, a in enumerate(addrs)},
        "server_cpus": cfg.server_cpus,
        "load_avg": list(load),
        "refused": sum(int(r.get("stats", {}).get("refused", 0)) for r in replies),
    }
    s = fleetstats.summarize([seg], addrs)
    say(
        f"[{name}] {s['completed']} done ({s['throughput_rps']:.1f} req/s), {s['failed']} failed, "
        f"p95 {s['p95_ms']:.0f} ms, local {s['local']}, per server {list(s['by_server'].values())}, "
        f"load average {load[0]:.2f}"
    )
    return seg


def assemble(
    cfg: FleetConfig, segments: Sequence[dict[str, Any]], addrs: Sequence[str], policies: dict[str, str]
) -> dict[str, Any]:
    by_name = {n: [s for s in segments if s["strategy"] == n] for n in policies}
    strategies = {
        n: {
            **fleetstats.summarize(segs, addrs),
            "policy": policies[n],
            "load_avg": [s["load_avg"] for s in segs],
            "refused": sum(s["refused"] for s in segs),
        }
        for n, segs in by_name.items()
    }
    comparisons = (
        {
            n: fleetstats.compare(by_name["adaptive"], segs, seed=cfg.seed)
            for n, segs in by_name.items()
            if n != "adaptive"
        }
        if "adaptive" in by_name
        else {}
    )
    cfg_d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    return {
        "config": cfg_d,
        "servers": list(addrs),
        "strategies": strategies,
        "vs_adaptive": comparisons,
        "verdict": fleetstats.verdict(strategies, comparisons),
        "segments": [{k: v for k, v in s.items() if k != "devices"} | fleetstats.kill_account(s) for s in segments],
    }
