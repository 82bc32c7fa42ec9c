"""The fleet rig's network (root): N device namespaces and M server namespaces on one switch, every
device's link shaped on its own, both directions, from the switch namespace.

::

    {prefix}-h0 .. h{N-1} (devices)  ── p{i} ──┐                 ┌── p{N+j} ── {prefix}-h{N+j} (servers)
                                              br0 in {prefix}-sw
    uplink of device i:   ingress of p{i} redirected to ifb{i}, htb + bfifo on ifb{i}
    downlink of device i: htb + bfifo on the egress of p{i}

All 2N shaping points live in the switch namespace, so one ``tc -batch`` per tick re-rates the whole
fleet: 24 devices re-rated every second one point at a time would spawn ~50 ``ip netns exec tc`` a
second (~0.2 CPU of this 2-vCPU host, stolen from the devices it emulates). No RTT is added (netem is
absent from this kernel and a userspace delay relay carrying every device's traffic costs more CPU than
the fleet can spare): the link is its rate and a 1 s bottleneck queue, as ``rig.link``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from splitrt.errors import RigError
from splitrt.rig import netns, shaper
from splitrt.rig.link import KERNEL_QUEUE_MS
from splitrt.rig.traces import Trace

RATE_CHANGE_FRACTION = 0.02  # a smaller change is not worth a tc call


class FleetNet:
    """The LAN (``make_lan``) plus the per-device shapers; ``close`` deletes the namespaces."""

    def __init__(self, prefix: str, n_devices: int, n_servers: int, *, queue_ms: float = KERNEL_QUEUE_MS) -> None:
        if n_devices < 1 or n_servers < 1:
            raise RigError(f"fleet: expected >= 1 device and >= 1 server, got {n_devices} and {n_servers}")
        self.n_devices = n_devices
        self.lan = netns.make_lan(prefix, n_devices + n_servers)
        assert self.lan.switch_ns is not None
        self.switch_ns = self.lan.switch_ns
        # One KernelShaper per device only for its tc text (htb class + bfifo leaf, goodput rates).
        self._shapers = [shaper.KernelShaper(points=[], queue_ms=queue_ms) for _ in range(n_devices)]
        self._installed = False
        self._rates: list[float | None] = [None] * n_devices
        self._lock = threading.Lock()
        try:
            for i in range(n_devices):
                self._redirect_ingress(i)
        except BaseException:
            self.close()
            raise

    @property
    def devices(self) -> list[netns.Host]:
        return self.lan.hosts[: self.n_devices]

    @property
    def servers(self) -> list[netns.Host]:
        return self.lan.hosts[self.n_devices :]

    def _redirect_ingress(self, i: int) -> None:
        sw = self.switch_ns
        netns.run_cmd(["ip", "-n", sw, "link", "add", f"ifb{i}", "type", "ifb"])
        netns.run_cmd(["ip", "-n", sw, "link", "set", f"ifb{i}", "up"])
        netns.run_cmd(
            ["ip", "netns", "exec", sw, "tc", "-batch", "-"],
            input_text=(
                f"qdisc add dev p{i} handle ffff: ingress\n"
                f"filter add dev p{i} parent ffff: protocol all u32 match u32 0 0 "
                f"action mirred egress redirect dev ifb{i}\n"
            ),
        )

    def set_rates(self, rates_mbps: Sequence[float]) -> int:
        """Rate (goodput, both directions) of every device; returns how many changed. One tc call."""
        if len(rates_mbps) != self.n_devices:
            raise RigError(f"set_rates: expected {self.n_devices} rates, got {len(rates_mbps)}")
        with self._lock:
            first = not self._installed
            lines = []
            for i, mbps in enumerate(rates_mbps):
                mbps = max(float(mbps), shaper.MIN_RATE_MBPS)
                old = self._rates[i]
                if not first and old is not None and abs(mbps - old) <= RATE_CHANGE_FRACTION * old:
                    continue
                s = self._shapers[i]
                lines += [s._batch(mbps, first, f"p{i}"), s._batch(mbps, first, f"ifb{i}")]
                self._rates[i] = mbps
            if lines:
                netns.run_cmd(["ip", "netns", "exec", self.switch_ns, "tc", "-batch", "-"], input_text="".join(lines))
            self._installed = True
            return len(lines) // 2

    def rates(self) -> list[float | None]:
        with self._lock:
            return list(self._rates)

    def close(self) -> None:
        self.lan.destroy()


class FleetPlayer:
    """A thread playing every device's trace on ``net`` from window position ``from_s`` (played at
    monotonic ``t0``), re-rating the fleet every ``step_s``; ``log`` = [(position, [rates])]."""

    def __init__(
        self, net: FleetNet, traces_by_device: Sequence[Trace], *, from_s: float, t0: float, step_s: float = 1.0
    ) -> None:
        self.net = net
        self.traces = list(traces_by_device)
        self.from_s = from_s
        self.t0 = t0
        self.step_s = step_s
        self.log: list[tuple[float, list[float]]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="splitrt-fleet-player", daemon=True)

    def rates_at(self, pos_s: float) -> list[float]:
        return [max(t.rate_at(pos_s), shaper.MIN_RATE_MBPS) for t in self.traces]

    def start(self) -> FleetPlayer:
        self.apply(self.from_s)  # in force before the segment starts
        self._thread.start()
        return self

    def apply(self, pos_s: float) -> None:
        rates = self.rates_at(pos_s)
        self.net.set_rates(rates)
        self.log.append((round(pos_s, 3), [round(r, 3) for r in rates]))

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
        if self._thread.is_alive():
            self._thread.join(10)
        if self.error is not None:
            raise RigError(f"fleet trace player failed: {self.error}") from self.error
