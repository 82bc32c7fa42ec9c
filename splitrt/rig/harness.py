"""The rig: one network builder for every topology, a path of tiers in network namespaces (root).

A topology is a path of tiers (``Tier``: the devices, then one or more server tiers), each with a host
count and CPU limits; hop k joins tier k and tier k+1 through its own switch namespace::

    {prefix}-t0h0 .. t0h{N-1} (devices)  ── eth0 ── br0 in {prefix}-s0 ── eth0 ── {prefix}-t1h0 .. (servers)
                                                                                   eth1 ── br0 in {prefix}-s1 ── ...

- Shaping: every lower host's port of a hop, both ways, in the switch's namespace (``shaper.PortShaper``):
  one ``tc -batch`` a tick re-rates every device of a hop, each following its own trace. netem is absent from this
  kernel: a hop's round trip is a userspace delay relay in front of each server (``delays``); without
  it (a fleet of devices, whose relay would eat the CPU they emulate) servers listen on their address.
- The devices reach the last tier directly through a relay in the first server tier's host (both hops'
  delays, both shaped links), as a device behind a base station does: the two-tier strategies use it.
- Servers run ``splitrt serve`` (a middle tier with ``--next``: it runs its segment and forwards), each
  in its own cgroup: a quota where its tier has ``cpus``, else only weighted. Each device has a cgroup
  whose quota is its tier's ``cpus`` (cycled: a mixed fleet) or calibrated to the board (``calibrate``).
- Without root (or ``link == "userspace"``, two tiers, one device, one server): the server runs on
  127.0.0.1 behind a rate + delay relay, and the board is emulated by padding the device's compute.

Cleanup: every namespace, qdisc and cgroup goes on exit, on Ctrl-C / SIGTERM and on errors; children get
``PR_SET_PDEATHSIG``; what a SIGKILLed run left is removed by the next run or ``splitrt rig cleanup``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import psutil

from splitrt.errors import ConfigError, RigError
from splitrt.rig import netns
from splitrt.rig.calibration import Calibration
from splitrt.rig.cloudserver import CLOUD_PORT, CloudProcess
from splitrt.rig.models import model_path_for
from splitrt.rig.processes import Children, JsonWorker, free_port
from splitrt.rig.shaper import MIN_RATE_MBPS, PortShaper, UserspaceLink

DEVICE_SHARES = 8  # x the default CPU weight


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One tier of the path: ``count`` hosts; ``cpus`` their CPU quotas, cycled (empty: a device is
    calibrated to the board, a server only weighted); servers run ``workers`` tails at once with
    ``threads`` onnxruntime threads (None: its default); every host's cgroup is weighted ``weight`` x."""

    name: str
    count: int = 1
    cpus: tuple[float, ...] = ()
    workers: int = 2
    threads: int | None = None
    weight: int = DEVICE_SHARES  # x the default CPU weight: its quota (or its share) on a busy host


TWO_TIERS = (Tier(name="device"), Tier(name="cloud"))


def three_tiers(edge_cpus: float = 1.0) -> tuple[Tier, ...]:
    return (Tier(name="device"), Tier(name="edge", cpus=(edge_cpus,)), Tier(name="cloud"))


@dataclass(frozen=True, kw_only=True)
class RigConfig:
    board: str = "rpi4"
    link: str = "auto"  # auto | kernel | userspace
    tiers: tuple[Tier, ...] = TWO_TIERS
    delays: bool = True  # a delay relay per server (the hops' RTTs); False: none (a fleet)
    prefix: str | None = None
    workdir: Path | None = None
    keep_workdir: bool = False
    models: tuple[str, ...] = ()  # served from the start (a model added later restarts the servers)
    cfs_period_us: int = 20_000  # short periods: throttling spread evenly, not 100 ms stalls
    quota_cpus: float | None = None  # skip the calibration: this quota (kernel) ...
    pad_factor: float | None = None  # ... or this compute padding (userspace)

    def __post_init__(self) -> None:
        if self.link not in ("auto", "kernel", "userspace"):
            raise ConfigError(f"link: expected auto, kernel or userspace, got {self.link!r}")
        if len(self.tiers) < 2 or any(t.count < 1 for t in self.tiers):
            raise ConfigError(f"tiers: expected a device tier and >= 1 server tier, >= 1 host each, got {self.tiers}")
        if not self.delays and len(self.tiers) != 2:
            raise ConfigError("delays=False (servers on their own address) needs two tiers")
        if not all(0.01 <= c <= 64 for t in self.tiers for c in t.cpus):
            raise ConfigError(f"cpus: expected quotas in [0.01, 64], got {[t.cpus for t in self.tiers]}")


def link_kind(cfg: RigConfig) -> str:
    """``kernel`` or ``userspace`` for the configured ``auto | kernel | userspace``."""
    root = netns.is_root() and netns.tc_available()
    simple = len(cfg.tiers) == 2 and cfg.tiers[0].count == cfg.tiers[1].count == 1 and cfg.delays
    if cfg.link == "kernel" and not netns.is_root():
        raise RigError(f"link 'kernel' needs root (euid 0), running as euid {os.geteuid()}")
    kind = "kernel" if cfg.link == "kernel" or (cfg.link == "auto" and root) else "userspace"
    if kind == "userspace" and not simple:
        raise RigError(
            f"this topology ({len(cfg.tiers)} tiers, {[t.count for t in cfg.tiers]} hosts) needs the kernel "
            "link: root (euid 0) and tc/ip; the userspace link has one device and one server"
        )
    return kind


@dataclass
class Hop:
    """One hop's switch: the lower tier's hosts (shaped ports ``p{j}``) and the upper tier's."""

    switch: str
    lower: list[netns.Host]
    upper: list[netns.Host]
    shaper: PortShaper
    relays: list[Any] = field(default_factory=list)  # UserspaceLink per upper host (its delay)
    directs: list[Any] = field(default_factory=list)  # relays in the upper hosts towards the next hop

    def direct(self, address: str) -> str:
        """A relay in the first upper host, on this hop, forwarding to ``address`` (a later tier)."""
        host = self.upper[0]
        ip, to = address.rsplit(":", 1)
        relay = UserspaceLink((host.ip, 0), (ip, int(to)), rate_mbps=None, delay_ms=0.0, netns_name=host.ns)
        self.directs.append(relay)
        return f"{host.ip}:{relay.port}"


def make_hop(prefix: str, k: int, lower: Sequence[str], upper: Sequence[str], made: list[str]) -> Hop:
    """Switch ``{prefix}-s{k}`` (its namespace appended to ``made``) with every host of both tiers on its
    bridge; the lower hosts' ports shaped both ways."""
    sw = f"{prefix}-s{k}"
    netns.add_netns(sw)
    made.append(sw)
    taken = {netns.subnet_for(f"{prefix}-s{j}") for j in range(k)}
    subnet = next(s for s in (netns.subnet_for(f"{sw}-{n}") for n in range(64)) if s not in taken)
    hosts = [netns.Host(ns=ns, ip=f"{subnet}.{j + 1}", dev=f"eth{k}") for j, ns in enumerate([*lower, *upper])]
    netns.add_bridge(sw, hosts)
    for h in hosts:  # strategies take turns: a connection parked for the others' keeps its congestion window
        h.call(Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").write_text, "0")
    n = len(lower)
    return Hop(switch=sw, lower=hosts[:n], upper=hosts[n:], shaper=PortShaper(sw, n))


class Rig:
    """The topology's namespaces, switches, shapers, relays, servers, cgroups and device workers (module
    doc). A context manager; ``addresses[k]``: tier k+1's servers as the devices reach them."""

    def __init__(self, config: RigConfig | None = None, *, progress: Callable[[str], None] | None = None) -> None:
        from splitrt.profile import boards

        self.config = cfg = config or RigConfig()
        self.board = boards.load_board(cfg.board)
        self.kind = link_kind(cfg)
        self.prefix = netns.check_prefix(cfg.prefix or f"spl-rig{os.getpid() % 100000}")
        self.progress = progress or (lambda s: None)
        self.workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="splitrt-rig-"))
        self.models_dir = self.workdir / "models"
        self.children = Children(self.workdir)
        self.hops: list[Hop] = []
        self.namespaces: list[str] = []
        self.servers: list[list[CloudProcess]] = []
        self.server_groups: list[list[Any]] = []
        self.device_groups: list[Any] = []
        self.aside_group: Any = None  # where the other work of a busy board waits (``cgroup.share_with``)
        self.addresses: list[list[str]] = []
        self.userspace: Any = None  # the rate + delay relay of the userspace link
        self.calibration: Calibration | None = None
        self.board_tasks = self.workdir / "board-tasks"  # the load's pids next to device 0 (``rig.loads``)
        self._old_sigterm: Any = None
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
        self.board_tasks.write_text("")
        for m in self.config.models:
            CloudProcess.copy_into(self.models_dir, model_path_for(m))
        if netns.is_root() and (removed := netns.cleanup_leftovers()):
            self.progress(f"removed leftovers of earlier runs: {', '.join(removed)}")
        tiers = self.config.tiers
        if self.kind == "userspace":
            self.progress("rig: cloud on 127.0.0.1, rate + delay relay (userspace link), no CPU throttle")
            self._servers(1, None)
            self.addresses = [[f"127.0.0.1:{self.userspace.port}"]]
            return
        self.progress(
            f"rig {self.prefix}: {' -> '.join(f'{t.count} {t.name}' for t in tiers)}, "
            f"{len(tiers) - 1} shaped hop(s), {'delay relays' if self.config.delays else 'no added RTT'}"
        )
        hosts = [[f"{self.prefix}-t{k}h{i}" for i in range(t.count)] for k, t in enumerate(tiers)]
        for ns in [n for tier in hosts for n in tier]:
            netns.add_netns(ns)
            self.namespaces.append(ns)
        for k in range(len(tiers) - 1):
            self.hops.append(make_hop(self.prefix, k, hosts[k], hosts[k + 1], self.namespaces))
        for k in range(len(tiers) - 1, 0, -1):  # the last tier first: a middle tier forwards to it
            self._servers(k, self.hops[k - 1])
        for srv in (s for tier in self.servers for s in tier):
            srv.wait()
        self.addresses = [
            [f"{h.ip}:{r.port}" for h, r in zip(hop.upper, hop.relays, strict=True)]
            if self.config.delays
            else [f"{h.ip}:{CLOUD_PORT}" for h in hop.upper]
            for hop in self.hops
        ]
        for k in range(2, len(tiers)):  # the direct path: devices -> tier k through the first server's host
            self.addresses[k - 1] = [self.hops[0].direct(a) for a in self.addresses[k - 1]]
        for i in range(tiers[0].count):
            cpus = tiers[0].cpus[i % len(tiers[0].cpus)] if tiers[0].cpus else None
            self.device_groups.append(self._cgroup(f"d{i}", cpus))
            self.device_groups[-1].pin_cpu = i % (os.cpu_count() or 1)  # a board's core (``cgroup``)
        if self.device_groups:
            from splitrt.rig.cgroup import MIN_FRACTION

            self.aside_group = self._cgroup("aside", MIN_FRACTION, 1)

    def _servers(self, k: int, hop: Hop | None) -> None:
        """Tier k's servers (127.0.0.1 behind a relay, or their own address), each in its cgroup."""
        tier = self.config.tiers[k]
        procs, groups = [], []
        for j in range(tier.count):
            d = self.workdir / f"t{k}s{j}"
            d.mkdir(exist_ok=True)
            srv = CloudProcess(Children(d), self.models_dir, workers=tier.workers)
            srv.extra = ["--intra-op-threads", str(tier.threads)] if tier.threads else []
            if k < len(self.config.tiers) - 1:
                nxt = self.hops[k]
                srv.extra += ["--next", f"{nxt.upper[j % len(nxt.upper)].ip}:{nxt.relays[j % len(nxt.relays)].port}"]
            if hop is None:  # userspace
                port = free_port()
                srv.start(None, port)
                self.userspace = UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", port), rate_mbps=None, delay_ms=0)
            else:
                host = hop.upper[j]
                srv.listen = "127.0.0.1" if self.config.delays else "0.0.0.0"
                groups.append(
                    self._cgroup(f"t{k}s{j}", tier.cpus[j % len(tier.cpus)] if tier.cpus else None, tier.weight)
                )
                srv.start(host, CLOUD_PORT, wait=False)  # all of them side by side: see ``start``
                assert srv.proc is not None
                groups[-1].add_pid(srv.proc.pid)
                if self.config.delays:
                    hop.relays.append(
                        UserspaceLink(
                            (host.ip, 0), ("127.0.0.1", CLOUD_PORT), rate_mbps=None, delay_ms=0.0, netns_name=host.ns
                        )
                    )
            procs.append(srv)
        self.servers.insert(0, procs)
        self.server_groups.insert(0, groups)

    def _cgroup(self, name: str, cpus: float | None, weight: int = DEVICE_SHARES) -> Any:
        from splitrt.rig import cgroup

        g = cgroup.CpuThrottle(f"{self.prefix}-{name}", cpus, period_us=self.config.cfs_period_us)
        g.open()
        g.set_weight(weight)
        return g

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        self.children.terminate_all()
        for srv in [s for tier in self.servers for s in tier]:
            srv.children.terminate_all()
        relays = [r for hop in self.hops for r in (*hop.relays, *hop.directs)] + [self.userspace]
        groups = [*self.device_groups, self.aside_group, *(g for tier in self.server_groups for g in tier)]
        for part in [*relays, *groups]:
            try:
                if part is not None:
                    part.close()
            except Exception as exc:  # keep tearing down the rest
                errors.append(str(exc))
        errors += netns.delete_each(self.namespaces[::-1])
        if self.config.workdir is None and not self.config.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._old_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._old_sigterm)
        if errors:
            raise RigError("rig teardown: " + "; ".join(errors))

    # -- links -------------------------------------------------------------------------------------
    def set_rates(self, k: int, rates_mbps: Sequence[float | None]) -> int:
        """Hop ``k``'s rate (goodput, both ways) per lower host, None: unshaped; one tc call. Returns how
        many changed (a change under 2 % is skipped)."""
        if self.userspace is not None:
            self.userspace.set_rate(None if rates_mbps[0] is None else max(rates_mbps[0], MIN_RATE_MBPS))
            return 1
        return self.hops[k].shaper.set_rates(rates_mbps)

    def set_rtt(self, k: int, rtt_ms: float) -> None:
        """Hop ``k``'s added round trip (half each way), the direct path's relays on it included."""
        for r in [self.userspace] if self.userspace is not None else [*self.hops[k].relays, *self.hops[k].directs]:
            r.set_delay(rtt_ms / 2)

    # -- servers -----------------------------------------------------------------------------------
    def install_model(self, path: Path) -> None:
        """Serve the model everywhere; a new one restarts every server (a server lists only the models it
        found at start in its Status, which devices check first)."""
        if CloudProcess.copy_into(self.models_dir, path) is not None:
            self.progress(f"servers: restarting to serve {path.name}")
            for k in range(len(self.servers), 0, -1):
                for j in range(len(self.servers[k - 1])):
                    self.kill_server(k, j)
                    self.restart_server(k, j, wait=False)
            for srv in (s for tier in self.servers for s in tier):
                srv.wait()

    def kill_server(self, k: int, j: int) -> float:
        """SIGKILL tier k's server j; returns its CPU seconds just before (0 when gone)."""
        cpu, proc = self.server_cpu(k, j), self.servers[k - 1][j].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        return cpu

    def restart_server(self, k: int, j: int, *, wait: bool = True) -> None:
        srv = self.servers[k - 1][j]
        srv.start(srv.host, srv.port, wait=wait)
        if self.server_groups[k - 1] and srv.proc is not None:
            self.server_groups[k - 1][j].add_pid(srv.proc.pid)

    def server_cpu(self, k: int, j: int) -> float:
        """CPU seconds of tier k's server j so far (0 when it is gone)."""
        proc = self.servers[k - 1][j].proc
        with contextlib.suppress(psutil.Error):  # it exited meanwhile
            if proc is not None and proc.poll() is None:
                t = psutil.Process(proc.pid).cpu_times()
                return float(t.user + t.system)
        return 0.0

    # -- devices -----------------------------------------------------------------------------------
    def start_workers(self, specs: Sequence[Any]) -> list[JsonWorker]:
        """One worker per device (``rig.worker``, a ``protocol.Spec`` each) in its namespace."""
        from splitrt.rig.protocol import encode

        out = []
        for i, spec in enumerate(specs):
            argv = [sys.executable, "-m", "splitrt.rig.worker", "worker", encode(spec)]
            host = self.hops[0].lower[i] if self.hops else None
            out.append(JsonWorker(self.children.popen(argv, f"device{i}.log", host=host, pipes=True), f"device{i}"))
        for w in out:
            w.reply(900)  # {"event": "loaded"}
        return out

    def set_quota(self, cpus: float) -> None:
        """Every calibrated device's CPU quota, in ``cfs_period_us`` periods."""
        for g in self.device_groups if not self.config.tiers[0].cpus else []:
            g.set_fraction(cpus)

    def throttle(self, i: int, pid: int, threads: tuple[Sequence[int], Sequence[int]] | None = None) -> None:
        """Device i's process into its cgroup (on cgroup v1 only its compute ``threads``, if given)."""
        if self.device_groups:
            self.device_groups[i].add_threads(pid, *(threads or ((), ())))

    def board_share(self, i: int, pids: Sequence[int]) -> contextlib.AbstractContextManager[None]:
        """Other work (``pids``) holds device i's board while the block runs (``cgroup.share_with``); with
        no cgroups (the userspace rig) the pids run where they are."""
        if not self.device_groups:
            return contextlib.nullcontext()
        from splitrt.rig import cgroup

        return cgroup.share_with(self.device_groups[i], self.aside_group, pids)

    def unthrottle(self, i: int, pid: int) -> None:
        if self.device_groups:
            self.device_groups[i].remove_pid(pid)
