"""The three-tier rig (root): a device, an edge and a cloud namespace over two shaped links.

Topology::

    {prefix}-h0 device         {prefix}-h1 edge                             {prefix}-h2 cloud
    worker ─ eth0 ══ hop 1 ══ eth0 ┬ relay rtt1/2 ─ serve --next ─┐
    (cgroup -dev)                  │ (cgroup -edge: its quota)    │ eth1 ══ hop 2 ══ eth0 ─ relay rtt2/2 ─ serve
                                   └ relay rtt1/2 (direct path) ──┘

- Hop 1 (device <-> edge: the access link) and hop 2 (edge <-> cloud: the backhaul) are two veth pairs
  on two subnets, each shaped both ways with htb (``shaper.KernelShaper``, the 1 s queue of ``rig.link``)
  and each following its own bandwidth trace (``TracePlayer`` per hop).
- netem is absent from this kernel, so each hop's round trip comes from a delay relay: in the edge's
  namespace in front of the edge server (hop 1) and in the cloud's in front of the cloud server (hop 2).
- The device reaches the cloud only through the edge's network, as a device behind a base station
  does: a second relay in the edge's namespace (hop 1's delay) forwards to the cloud's relay (hop 2's),
  so the direct path crosses both shaped links and both delays. The two-tier strategies use it.
- CPU: the device's cgroup is calibrated to the board as in ``rig.harness`` (``rig.calibration``); the
  edge server sits in its own cgroup with a fixed quota (``edge_cpus``); the cloud is not throttled
  (its cgroup only weights it, so the host's other jobs do not make it slower than the edge).

``TierRig`` is a ``Rig`` (calibration, workers, cleanup on exit / Ctrl-C / SIGTERM, leftovers removed by
the next run or ``splitrt rig cleanup``) whose start builds this topology; kernel link only.

- ``TierRig(TierRigConfig(board, edge_cpus=1.0, edge_workers, models, quota_cpus, ...))`` is a ``Rig``
  (calibration, workers, cleanup) over ``make_chain(prefix)``: ``{prefix}-h0`` device, ``-h1`` edge, ``-h2``
  cloud; hop 1 = veth h0.eth0 <-> h1.eth0, hop 2 = h1.eth1 <-> h2.eth0 (two subnets), each ``KernelShaper`` both
  ways (``.shaper``, ``.shaper2``, ``.set_rates(h1, h2)``); delay relays in front of the edge server (hop 1) and
  the cloud server (hop 2); ``.cloud_address`` is a second hop-1 relay in the edge namespace forwarding to the
  cloud's relay (the device's direct path crosses both hops); cgroups ``-dev`` (calibrated), ``-edge`` (quota
  ``edge_cpus``), ``-cloud`` (weight only). Kernel link only (``ConfigError`` / ``RigError`` otherwise).
  ``.edge_address``, ``.set_rtts(h1_ms, h2_ms)``, ``.start_tier_worker(spec)``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitrt.errors import ConfigError, RigError
from splitrt.rig import link, netns, quota
from splitrt.rig.cloudserver import CLOUD_PORT, CloudProcess
from splitrt.rig.harness import Rig, RigConfig
from splitrt.rig.processes import JsonWorker

EDGE_PORT = 50052  # the edge server's port inside the edge namespace
EDGE_SHARES = 8  # x the default weight, as the device's: its quota holds on a busy host
# The cloud is not throttled, but weighted: on a host shared with other jobs it would otherwise get less
# CPU than the edge, which a cloud is not.
CLOUD_SHARES = 8


@dataclass(frozen=True, kw_only=True)
class TierRigConfig(RigConfig):
    edge_cpus: float = 1.0  # the edge server's CPU quota (CPUs)
    edge_workers: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.edge_cpus > 0:
            raise ConfigError(f"edge_cpus: expected > 0, got {self.edge_cpus!r}")
        if self.link == "userspace":
            raise ConfigError(
                "the three-tier rig needs the kernel link (root): expected link auto or kernel, got 'userspace'"
            )


class EdgeProcess(CloudProcess):
    """``splitrt serve --next`` in the edge's namespace."""

    log_name = "edge.log"

    def __init__(self, *args: Any, next_address: str = "", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.next_address = next_address

    def argv(self, host: str, port: int) -> list[str]:
        return [*super().argv(host, port), "--next", self.next_address]


def _subnets(prefix: str) -> tuple[str, str]:
    """Two different ``10.213.k`` subnets for hop 1 and hop 2."""
    a = netns.subnet_for(prefix)
    b = netns.subnet_for(prefix + "-b")
    if a == b:
        b = netns.subnet_for(prefix + "-c")
    return a, b


def _iface(host: netns.Host, cidr: str) -> None:
    netns.no_gso(host.ns, host.dev)
    host.ip_cmd("addr", "add", cidr, "dev", host.dev)
    host.ip_cmd("link", "set", host.dev, "up")


def make_chain(prefix: str) -> tuple[netns.Lan, netns.Host]:
    """Namespaces ``{prefix}-h0`` (device), ``-h1`` (edge), ``-h2`` (cloud); veth h0.eth0 <-> h1.eth0 on one
    subnet (hop 1), h1.eth1 <-> h2.eth0 on another (hop 2). Returns the Lan (hosts: device, the edge's
    eth0, cloud) and the edge's eth1 as a Host of the same namespace."""
    netns.check_prefix(prefix)
    if not netns.is_root():
        raise RigError("the three-tier rig needs root (euid 0) for namespaces and shaping")
    sa, sb = _subnets(prefix)
    device = netns.Host(ns=f"{prefix}-h0", ip=f"{sa}.1")
    edge = netns.Host(ns=f"{prefix}-h1", ip=f"{sa}.2")
    edge_up = netns.Host(ns=edge.ns, ip=f"{sb}.1", dev="eth1")
    cloud = netns.Host(ns=f"{prefix}-h2", ip=f"{sb}.2")
    lan = netns.Lan(prefix=prefix, hosts=[device, edge, cloud], switch_ns=None, subnet=sa)
    try:
        for h in (device, edge, cloud):
            netns.add_netns(h.ns)
        netns.run_cmd(
            ["ip", "-n", device.ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", edge.ns]
        )
        netns.run_cmd(
            ["ip", "-n", edge.ns, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", cloud.ns]
        )
        for h in (device, edge, edge_up, cloud):
            _iface(h, f"{h.ip}/24")
    except BaseException:
        with contextlib.suppress(RigError):
            lan.destroy()
        raise
    return lan, edge_up


class TierRig(Rig):
    """The three-tier topology (module doc). ``edge_address``: the edge as the device reaches it;
    ``cloud_address``: the cloud over the direct path; ``shaper`` / ``shaper2``: hop 1 / hop 2."""

    def __init__(self, config: TierRigConfig | None = None, **kw: Any) -> None:
        cfg = config or TierRigConfig()
        kind = link.link_kind(cfg.link)  # before the Rig makes its workdir
        if kind != "kernel":
            raise RigError(f"the three-tier rig needs the kernel link: root (euid 0) and tc/ip; got link {kind!r}")
        super().__init__(cfg, **kw)
        self.tier_config = cfg
        self.edge_up: netns.Host | None = None
        self._edge = EdgeProcess(self._children, self.models_dir, workers=cfg.edge_workers, progress=self.progress)
        self.edge_relay: Any = None
        self.direct_relay: Any = None
        self.shaper2: Any = None
        self.edge_throttle: Any = None
        self.cloud_weight: Any = None
        self.edge_address = ""

    def _start_kernel(self) -> None:
        from splitrt.rig import cgroup, shaper

        self.progress(f"rig {self.prefix}: device, edge and cloud namespaces, two shaped hops, two cgroups")
        self.lan, self.edge_up = make_chain(self.prefix)
        link.keep_windows_warm(self.lan)
        device, edge, cloud = self.lan.hosts
        self.cloud_weight = cgroup.CpuThrottle(f"{self.prefix}-cloud", None)
        self.cloud_weight.open()
        quota.set_shares(self.cloud_weight, CLOUD_SHARES)
        self._start_cloud()
        self.relay = link.delay_relay(cloud, CLOUD_PORT)  # hop 2's round trip
        self._edge.next_address = f"{cloud.ip}:{self.relay.port}"
        self.edge_throttle = cgroup.CpuThrottle(f"{self.prefix}-edge", None)
        self.edge_throttle.open()
        quota.set_shares(self.edge_throttle, EDGE_SHARES)
        quota.set_quota(self.edge_throttle, self.tier_config.edge_cpus, self.config.cfs_period_us)
        self._start_edge()
        self.edge_relay = shaper.UserspaceLink(
            (edge.ip, 0), ("127.0.0.1", EDGE_PORT), rate_mbps=None, delay_ms=0.0, netns_name=edge.ns
        )
        self.edge_address = f"{edge.ip}:{self.edge_relay.port}"
        self.direct_relay = shaper.UserspaceLink(
            (edge.ip, 0), (cloud.ip, self.relay.port), rate_mbps=None, delay_ms=0.0, netns_name=edge.ns
        )
        self.cloud_address = f"{edge.ip}:{self.direct_relay.port}"
        self.shaper = shaper.KernelShaper(
            points=[(device.ns, device.dev), (edge.ns, edge.dev)], queue_ms=link.KERNEL_QUEUE_MS
        )
        assert self.edge_up is not None
        self.shaper2 = shaper.KernelShaper(
            points=[(self.edge_up.ns, self.edge_up.dev), (cloud.ns, cloud.dev)], queue_ms=link.KERNEL_QUEUE_MS
        )
        self.throttle = cgroup.CpuThrottle(f"{self.prefix}-dev", None)
        self.throttle.open()
        quota.set_shares(self.throttle, quota.DEVICE_SHARES)

    def _start_cloud(self) -> None:
        self._cloud.start(self.cloud_host, CLOUD_PORT)
        assert self._cloud.proc is not None
        self.cloud_weight.add_pid(self._cloud.proc.pid)

    def _start_edge(self) -> None:
        assert self.lan is not None
        self._edge.start(self.lan.hosts[1], EDGE_PORT)
        assert self._edge.proc is not None
        self.edge_throttle.add_pid(self._edge.proc.pid)

    def _start_userspace(self) -> None:  # pragma: no cover - refused in __init__
        raise RigError("the three-tier rig has no userspace link")

    def close(self) -> None:
        if self._closed:
            return
        errors: list[str] = []
        self._children.terminate_all()  # the servers leave their cgroups before those go
        for name, part in (
            ("edge relay", self.edge_relay),
            ("direct relay", self.direct_relay),
            ("hop 2 shaper", self.shaper2),
            ("edge cgroup", self.edge_throttle),
            ("cloud cgroup", self.cloud_weight),
        ):
            try:
                if part is not None:
                    part.close()
            except Exception as exc:  # keep tearing down the rest
                errors.append(f"{name}: {exc}")
        try:
            super().close()
        except RigError as exc:
            errors.append(str(exc))
        if errors:
            raise RigError("three-tier rig teardown: " + "; ".join(errors))

    # -- where things are --------------------------------------------------------------------------
    @property
    def cloud_host(self) -> netns.Host | None:
        return self.lan.hosts[2] if self.lan is not None else None

    @property
    def edge_host(self) -> netns.Host | None:
        return self.lan.hosts[1] if self.lan is not None else None

    @property
    def edge_proc(self) -> subprocess.Popen[Any] | None:
        return self._edge.proc

    def set_rtts(self, hop1_ms: float, hop2_ms: float) -> None:
        """Each hop's added round trip (half each way); the direct path gets both."""
        self.edge_relay.set_delay(hop1_ms / 2)
        self.direct_relay.set_delay(hop1_ms / 2)
        self.relay.set_delay(hop2_ms / 2)

    def set_rates(self, hop1_mbps: float | None, hop2_mbps: float | None) -> None:
        self.shaper.set_rate(hop1_mbps)
        self.shaper2.set_rate(hop2_mbps)

    def install_model(self, path: Path) -> Path:
        """Serve the model on the edge and the cloud (both read the rig's models directory); a new model
        restarts both (a server lists only the models it found at start)."""
        if self._cloud.copy_model(path) is not None and self._cloud.proc is not None:
            self.progress(f"cloud and edge: restarting to serve {path.name}")
            for proc in (self._edge.proc, self._cloud.proc):
                if proc is not None:
                    proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(10)
            self._start_cloud()
            self._start_edge()
        return self.models_dir / path.name

    def start_tier_worker(self, spec: dict[str, Any], name: str = "device") -> JsonWorker:
        """The device process of the three-tier bench (``rig.tierworker``) in the device's namespace."""
        import json

        argv = [sys.executable, "-m", "splitrt.rig.tierworker", json.dumps(spec)]
        proc = self._children.popen(argv, f"{name}.log", host=self.device_host, pipes=True)
        w = JsonWorker(proc, name)
        w.reply(180)  # {"event": "loaded"}
        return w
