"""The rig's link between device and cloud, kernel or userspace (see ``harness``'s module doc).

Kernel: htb on the veth both ways (``shaper.KernelShaper``) for the rate, and a delay relay
(``shaper.UserspaceLink`` with rate None) in the cloud namespace in front of the server for the RTT,
netem being absent from this kernel. Userspace: one relay on 127.0.0.1 does both.
Each piece is made by its own call so the rig holds it (and closes it) as soon as it exists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from splitrt.errors import RigError
from splitrt.rig import netns

if TYPE_CHECKING:
    from splitrt.rig.shaper import KernelShaper, UserspaceLink

# 1 s of queue: cellular base stations buffer seconds of traffic (bufferbloat); a 200 ms queue
# tail-drops a 150 KB request at 2 Mbit/s and TCP then waits out a 200+ ms RTO.
KERNEL_QUEUE_MS = 1000.0


def link_kind(want: str) -> str:
    """``kernel`` or ``userspace`` for the configured ``auto | kernel | userspace``."""
    if want == "kernel" and not netns.is_root():
        raise RigError(f"link 'kernel' needs root (euid 0), running as euid {os.geteuid()}")
    return (
        "kernel" if want == "kernel" or (want == "auto" and netns.is_root() and netns.tc_available()) else "userspace"
    )


def keep_windows_warm(lan: netns.Lan) -> None:
    """Strategies take turns (``rig.bench``): a connection parked for the others' turns would restart
    from a cold congestion window at every turn, a cost one continuous run does not pay. The setting
    is each namespace's own and goes with it."""
    for h in lan.hosts:
        h.call(Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle").write_text, "0")


def delay_relay(cloud_host: netns.Host, server_port: int) -> UserspaceLink:
    """The RTT of the kernel link: a relay on the cloud's ``eth0`` to the server, no rate limit."""
    from splitrt.rig import shaper

    return shaper.UserspaceLink(
        (cloud_host.ip, 0), ("127.0.0.1", server_port), rate_mbps=None, delay_ms=0.0, netns_name=cloud_host.ns
    )


def kernel_shaper(lan: netns.Lan) -> KernelShaper:
    """The rate of the kernel link: the device's uplink and downlink (host 0's veth, both ends)."""
    from splitrt.rig import shaper

    return shaper.KernelShaper.for_host(lan, 0, rate_mbps=None, queue_ms=KERNEL_QUEUE_MS)


def userspace_link(server_port: int) -> UserspaceLink:
    """Rate and delay in one relay on 127.0.0.1 in front of the server."""
    from splitrt.rig import shaper

    return shaper.UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", server_port), rate_mbps=None, delay_ms=0.0)
