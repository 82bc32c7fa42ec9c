"""Network namespaces for tests and the hardware-in-the-loop rig (root only).

Topology
--------
``make_lan(prefix, n)`` builds ``n`` host namespaces ``{prefix}-h0 .. {prefix}-h{n-1}`` and one switch
namespace ``{prefix}-sw`` holding a bridge ``br0`` (``add_bridge``, the rig's builder too). Host ``i`` has
one interface ``eth0`` (a veth whose peer is port ``p{i}`` of the bridge) with address
``10.213.<k>.{i+1}/24``; ``k`` is derived from the prefix so two LANs never share a subnet (they are
isolated anyway). GSO is off on every veth.

Every interface is created directly inside its namespace (``ip link add ... netns ...``): nothing is
ever added to the host's own namespace, so deleting the namespaces deletes every veth, bridge, ifb and
qdisc with them. Multicast works between hosts (bridge multicast snooping off, a ``224.0.0.0/4`` route
on ``eth0``), so zeroconf can run between the host namespaces.

Ownership and cleanup
---------------------
Before a namespace is created its owner (pid + process start time) is recorded under
``/run/splitrt/owners/``. ``cleanup_leftovers(prefix)`` removes every ``spl-`` namespace (killing the
processes still inside it) and every ``spl-`` cgroup whose owner is dead, or has no record. Resources
of a live owner (e.g. another test running in parallel) are left alone unless ``include_live=True``.

Running code in a namespace
---------------------------
``Host.popen``/``Host.run`` use ``ip netns exec`` (the pid of the ``Popen`` is the command itself: ``ip``
execs it). ``Host.call(fn)`` (``netns_call``) runs a Python callable in a new thread that switched
its network namespace with ``setns(2)`` through ctypes (``os.setns`` exists only on Python >= 3.12):
the network namespace is per thread on Linux, so sockets that thread (and threads it starts) creates
live in the namespace, while the rest of the process stays where it was. Only sockets are affected:
``/sys/class/net`` and ``/etc/netns`` are not remounted as ``ip netns exec`` would. Every failure is
``RigError`` naming the command and its stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from splitrt.errors import RigError
from splitrt.rig import cgroup
from splitrt.rig.owners import OWNERS_DIR, PREFIX, forget_owner, owner_alive, record_owner

NETNS_DIR = Path("/run/netns")
_NAME_RE = re.compile(r"^spl-[a-z0-9][a-z0-9-]{0,30}$")
_CLONE_NEWNET = 0x40000000
SUBNET_BASE = "10.213"

T = TypeVar("T")


def is_root() -> bool:
    return os.geteuid() == 0


def run_cmd(
    argv: Sequence[str], *, check: bool = True, timeout_s: float = 30.0, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command; with ``check`` a failure raises ``RigError`` naming the command and its stderr."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, input=input_text, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RigError(f"command {' '.join(argv)!r} could not run: {exc}") from exc
    if check and proc.returncode != 0:
        raise RigError(
            f"command {' '.join(argv)!r} failed with exit code {proc.returncode}: "
            f"{proc.stderr.strip() or proc.stdout.strip() or '(no output)'}"
        )
    return proc


def check_prefix(prefix: str) -> str:
    """A prefix must start with ``spl-`` and be short: names must fit ``/run/netns`` and stay readable."""
    if not _NAME_RE.match(prefix) or prefix.endswith("-") or len(prefix) > 24:
        raise RigError(f"rig prefix must match 'spl-[a-z0-9-]', at most 24 chars, not end in '-'; got {prefix!r}")
    return prefix


def subnet_for(prefix: str) -> str:
    """``10.213.<k>`` with ``k`` in 1..254 derived from the prefix (stable across runs)."""
    k = zlib.crc32(prefix.encode()) % 254 + 1
    return f"{SUBNET_BASE}.{k}"


# ---------------------------------------------------------------------------------------------- setns


def enter_netns(ns: str) -> None:
    """Move the CALLING THREAD into network namespace ``ns`` (use in a thread of your own)."""
    try:
        fd = os.open(str(NETNS_DIR / ns), os.O_RDONLY)
    except OSError as exc:
        raise RigError(f"network namespace {ns!r} does not exist: {exc}") from exc
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise RigError(f"setns(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def netns_call(ns: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a thread inside ``ns`` (None: here, in this thread); return its
    result or raise its error."""
    if ns is None:
        return fn(*args, **kwargs)

    def inside() -> T:
        enter_netns(ns)
        return fn(*args, **kwargs)

    with ThreadPoolExecutor(1, thread_name_prefix=f"netns-{ns}") as pool:
        return pool.submit(inside).result()


# ---------------------------------------------------------------------------------------------- model


@dataclass
class Host:
    """One network namespace with one interface ``dev`` holding address ``ip`` (no mask)."""

    ns: str
    ip: str
    dev: str = "eth0"
    procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False, compare=False)

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace (``Popen.pid`` is the command's own pid)."""
        try:
            proc: subprocess.Popen[Any] = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **kw)
        except OSError as exc:
            raise RigError(f"cannot start {' '.join(argv)!r} in namespace {self.ns!r}: {exc}") from exc
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], check: bool = True, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return run_cmd(["ip", "netns", "exec", self.ns, *argv], check=check, timeout_s=timeout_s)

    def ip_cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ip -n <ns> args...``"""
        return run_cmd(["ip", "-n", self.ns, *args], check=check)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return netns_call(self.ns, fn, *args, **kwargs)


@dataclass
class Lan:
    """Host namespaces joined by a bridge in ``switch_ns`` (port ``p{i}`` faces host ``i``)."""

    prefix: str
    hosts: list[Host]
    switch_ns: str
    subnet: str  # "10.213.k"

    @property
    def namespaces(self) -> list[str]:
        return [h.ns for h in self.hosts] + [self.switch_ns]

    def destroy(self) -> None:
        """Stop processes started in the namespaces, delete the namespaces (and so every link/qdisc)."""
        for h in self.hosts:
            for p in h.procs:
                if p.poll() is None:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=5)
        if errors := delete_each(self.namespaces):
            raise RigError("; ".join(errors))

    def __enter__(self) -> Lan:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.destroy()


def list_netns(prefix: str = PREFIX) -> list[str]:
    out = run_cmd(["ip", "netns", "list"]).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def netns_pids(ns: str) -> list[int]:
    out = run_cmd(["ip", "netns", "pids", ns], check=False).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def add_netns(ns: str) -> None:
    record_owner(ns)
    run_cmd(["ip", "netns", "add", ns])
    run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"])


def delete_netns(ns: str) -> None:
    """Kill what still runs in ``ns``, then delete it (its interfaces and qdiscs go with it)."""
    if not (NETNS_DIR / ns).exists():
        forget_owner(ns)
        return
    for _ in range(3):
        pids = [p for p in netns_pids(ns) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    run_cmd(["ip", "netns", "delete", ns])
    forget_owner(ns)


def delete_each(names: Sequence[str]) -> list[str]:
    """``delete_netns`` each of ``names``, the rest still when one fails; the failures' messages."""
    errors = []
    for ns in names:
        try:
            delete_netns(ns)
        except RigError as exc:
            errors.append(str(exc))
    return errors


def add_bridge(switch: str, hosts: Sequence[Host]) -> None:
    """Bridge ``br0`` in namespace ``switch`` with port ``p{i}`` joined to host ``i``'s ``dev`` (each an
    existing namespace), which gets its address (/24); GSO off on both ends of every veth."""
    bridge = ["type", "bridge", "mcast_snooping", "0", "stp_state", "0", "forward_delay", "0"]
    run_cmd(["ip", "-n", switch, "link", "add", "br0", *bridge])
    run_cmd(["ip", "-n", switch, "link", "set", "br0", "up"])
    for i, h in enumerate(hosts):
        run_cmd(["ip", "-n", switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", h.dev, "netns", h.ns])
        for cmd in (["master", "br0"], ["up"]):
            run_cmd(["ip", "-n", switch, "link", "set", f"p{i}", *cmd])
        for ns, dev in ((switch, f"p{i}"), (h.ns, h.dev)):  # one segment per skb: qdiscs see wire-size packets
            run_cmd(["ip", "-n", ns, "link", "set", dev, "gso_max_size", "1514", "gso_max_segs", "1"])
        h.ip_cmd("addr", "add", f"{h.ip}/24", "dev", h.dev)
        h.ip_cmd("link", "set", h.dev, "up")


def make_lan(prefix: str, n_hosts: int) -> Lan:
    """Namespaces ``{prefix}-h0..h{n-1}`` + switch ``{prefix}-sw`` (bridge ``br0``); see module doc."""
    if not is_root():
        raise RigError(f"make_lan needs root (euid 0), running as euid {os.geteuid()}")
    check_prefix(prefix)
    if not 1 <= n_hosts <= 200:
        raise RigError(f"n_hosts must be in 1..200, got {n_hosts}")
    subnet = subnet_for(prefix)
    hosts = [Host(ns=f"{prefix}-h{i}", ip=f"{subnet}.{i + 1}") for i in range(n_hosts)]
    lan = Lan(prefix=prefix, hosts=hosts, switch_ns=f"{prefix}-sw", subnet=subnet)
    try:
        for ns in lan.namespaces:
            add_netns(ns)
        add_bridge(lan.switch_ns, hosts)
        for h in hosts:
            h.ip_cmd("route", "add", "224.0.0.0/4", "dev", h.dev)
    except BaseException:
        with contextlib.suppress(RigError):
            lan.destroy()
        raise
    return lan


def cleanup_leftovers(prefix: str = PREFIX, *, include_live: bool = False) -> list[str]:
    """Remove ``prefix*`` namespaces (with their veths, bridges, ifbs, qdiscs and processes) and
    ``prefix*`` cgroups left by dead owners; returns what was removed (``netns:NAME``, ``cgroup:PATH``).

    With ``include_live`` also removes resources of owners that still run (careful: parallel users).
    """
    if not prefix.startswith(PREFIX):
        raise RigError(f"cleanup prefix must start with {PREFIX!r}, got {prefix!r}")
    if not is_root():
        return []
    doomed = [ns for ns in list_netns(prefix) if include_live or not owner_alive(ns)]
    errors = delete_each(doomed)
    removed = [f"netns:{ns}" for ns in doomed if not (NETNS_DIR / ns).exists()]
    removed += cgroup.cleanup_cgroups(prefix, include_live=include_live)
    for rec in OWNERS_DIR.glob(f"{prefix}*"):  # owner records whose resource is gone already
        if not owner_alive(rec.name) and not (NETNS_DIR / rec.name).exists() and not cgroup.cgroup_exists(rec.name):
            forget_owner(rec.name)
    if errors:
        raise RigError("cleanup_leftovers: " + "; ".join(errors))
    return removed


def tc_available() -> bool:
    return shutil.which("tc") is not None and shutil.which("ip") is not None
