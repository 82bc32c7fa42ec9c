"""Shedding idle connections before the connection cap (and the file descriptors behind it) runs out.

gRPC core refuses connections beyond ``grpc.max_allowed_incoming_connections`` and closes a connection
idle for ``connection_idle_s``, but nothing in between: ~1000 connections that never make a call hold
the cap for minutes, and a device that connects now is refused. gRPC exposes no connection to Python,
so the ``Shedder`` finds them in the kernel's tables (Linux ``/proc/net/tcp{,6}``: the server port's
established connections and their socket inodes; ``/proc/self/fd``: which descriptor holds each) and,
above ``high_fraction`` of the cap, shuts down the oldest idle ones (no call in flight; the connection
that never made a call first, then the longest quiet) until ``low_fraction`` remain. ``shutdown(2)``
only: gRPC sees the connection end and closes its own descriptor (this module never closes one).
Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from splitrt.cloud.common import log, log_event

__all__ = ["Shedder", "peer_key", "server_connections"]

_ESTABLISHED = "01"


def _hex_ip(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # /proc prints IPv6 as four little-endian 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)


def peer_key(peer: str) -> tuple[str, int] | None:
    """(address, port) of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::ffff:1.2.3.4]:5``), IPv4-mapped
    IPv6 addresses as IPv4; None for anything else."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr), int(port) if port.isdigit() else -1


def server_connections(port: int, proc: Path = Path("/proc/net")) -> dict[tuple[str, int], int]:
    """The established TCP connections to local ``port``: (remote address, remote port) -> socket inode."""
    out: dict[tuple[str, int], int] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != _ESTABLISHED:
                continue
            local_port = int(f[1].rpartition(":")[2], 16)
            if local_port != port:
                continue
            rip, _, rport = f[2].rpartition(":")
            out[(_hex_ip(rip), int(rport, 16))] = int(f[9])
    return out


def _socket_fds() -> dict[int, int]:
    """Socket inode -> descriptor of this process."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc/self/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(entry.name)
    return out


def _shutdown(fd: int, inode: int) -> bool:
    """``shutdown(2)`` the socket on ``fd`` if it still is the one with ``inode`` (never closes it)."""
    try:
        if os.fstat(fd).st_ino != inode:
            return False
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()  # the descriptor stays gRPC's


class Shedder:
    """Called periodically (the watchdog's tick); ``busy()`` gives the peers with a call in flight and
    ``last_seen()`` when each peer last started or finished one (monotonic seconds)."""

    def __init__(
        self,
        *,
        port: int,
        max_connections: int,
        busy: Callable[[], set[tuple[str, int]]],
        last_seen: Callable[[], dict[tuple[str, int], float]],
        every_s: float = 1.0,
        high_fraction: float = 0.9,
        low_fraction: float = 0.8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port, self.max_connections = port, max_connections
        self.busy, self.last_seen = busy, last_seen
        self.every_s, self.high, self.low = every_s, high_fraction, low_fraction
        self.clock = clock
        self._next = 0.0
        self.shed = 0  # connections shut down so far
        self.victims: deque[tuple[str, int]] = deque(maxlen=64)  # the last ones (address, port)
        self.enabled = Path("/proc/net/tcp").exists() and Path("/proc/self/fd").is_dir()

    def tick(self) -> None:
        now = self.clock()
        if not self.enabled or now < self._next:
            return
        self._next = now + self.every_s
        try:
            self.step()
        except Exception:  # a kernel table we cannot read must not stop the watchdog
            log.debug("shedder step failed", exc_info=True)

    def step(self) -> int:
        conns = server_connections(self.port)
        if len(conns) < self.high * self.max_connections:
            return 0
        busy = self.busy()
        seen = self.last_seen()
        idle = sorted((p for p in conns if p not in busy), key=lambda p: seen.get(p, float("-inf")))
        want = len(conns) - int(self.low * self.max_connections)
        fds = _socket_fds()
        done = 0
        for peer in idle[:want]:
            fd = fds.get(conns[peer])
            if fd is not None and _shutdown(fd, conns[peer]):
                done += 1
                self.victims.append(peer)
        self.shed += done
        log_event("shed_idle_connections", connections=len(conns), cap=self.max_connections, idle=len(idle), shed=done)
        return done
