"""Network namespaces: topology, reachability, multicast, running code inside, cleanup after a crash."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from splitrt.errors import RigError
from splitrt.rig import cgroup, netns
from tests.loopback import reap

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces")
PID = os.getpid()


def test_prefix_rules() -> None:
    assert netns.check_prefix("spl-abc1") == "spl-abc1"
    for bad in ["abc", "spl-", "spl-UPPER", "spl-" + "x" * 30, "spl-a b", "spl-ok-"]:
        with pytest.raises(RigError):
            netns.check_prefix(bad)
    with pytest.raises(RigError):
        netns.cleanup_leftovers("tmp-")


def test_subnet_depends_on_prefix() -> None:
    nets = {netns.subnet_for(f"spl-t{i}") for i in range(40)}
    assert len(nets) > 30  # crc32-derived: few collisions
    assert all(n.startswith("10.213.") and 1 <= int(n.split(".")[2]) <= 254 for n in nets)


def test_run_cmd_error_names_command_and_stderr() -> None:
    with pytest.raises(RigError, match=r"ip link show spl-no-such-dev.*exit code"):
        netns.run_cmd(["ip", "link", "show", "spl-no-such-dev"])


def _probe_tcp(ip: str) -> str:
    """Connect to a closed port: 'refused' proves the peer answered (reachable)."""
    try:
        socket.create_connection((ip, 9), timeout=2).close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"error {exc.errno}"


@root
@pytest.mark.root
def test_lan_reachability_multicast_and_destroy() -> None:
    prefix = f"spl-tn{PID}"
    with netns.make_lan(prefix, 3) as lan:
        assert [h.ns for h in lan.hosts] == [f"{prefix}-h0", f"{prefix}-h1", f"{prefix}-h2"]
        assert lan.switch_ns == f"{prefix}-sw"
        assert set(netns.list_netns(prefix)) == set(lan.namespaces)
        h0, h1, h2 = lan.hosts
        assert h2.ip == f"{lan.subnet}.3"
        # Each host sees its own address on eth0.
        assert f"{h1.ip}/24" in h1.ip_cmd("-o", "addr", "show", "dev", "eth0").stdout
        # Unicast across the switch, from a subprocess and from a thread.
        assert h0.call(_probe_tcp, h2.ip) == "refused"
        out = h2.run(
            [
                sys.executable,
                "-c",
                f"import socket;s=socket.socket();s.settimeout(2)\nprint(s.connect_ex(({h1.ip!r}, 9)))",
            ]
        ).stdout.strip()
        assert out == str(111)  # ECONNREFUSED
        # The host namespace cannot reach the LAN (isolated).
        assert _probe_tcp(h0.ip) != "refused"
        # mDNS-style multicast from h0 reaches both h1 and h2.
        got: dict[str, bytes] = {}
        ready = threading.Barrier(3)

        def listen(name: str) -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", 5353))
            s.setsockopt(
                socket.IPPROTO_IP,
                socket.IP_ADD_MEMBERSHIP,
                socket.inet_aton("224.0.0.251") + socket.inet_aton("0.0.0.0"),
            )
            s.settimeout(5)
            ready.wait()
            got[name] = s.recvfrom(100)[0]
            s.close()

        ths = [threading.Thread(target=h.call, args=(listen, h.ns)) for h in (h1, h2)]
        for th in ths:
            th.start()
        ready.wait()

        def send() -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"hello-mdns", ("224.0.0.251", 5353))
            s.close()

        h0.call(send)
        for th in ths:
            th.join(10)
        assert got == {h1.ns: b"hello-mdns", h2.ns: b"hello-mdns"}
        # popen'd processes are stopped by destroy.
        sleeper = h1.popen(["sleep", "60"])
        # `ip netns exec` enters the namespace after fork: on a loaded host the pid shows up a little later.
        for _ in range(100):
            if sleeper.pid in netns.netns_pids(h1.ns):
                break
            time.sleep(0.05)
        assert sleeper.pid in netns.netns_pids(h1.ns)
    assert netns.list_netns(prefix) == []
    assert sleeper.poll() is not None


@root
@pytest.mark.root
def test_call_propagates_errors_and_bad_namespace() -> None:
    prefix = f"spl-te{PID}"
    with netns.make_lan(prefix, 1) as lan, pytest.raises(ZeroDivisionError):
        lan.hosts[0].call(lambda: 1 / 0)
    with pytest.raises(RigError, match="does not exist"):
        netns.netns_call(f"{prefix}-h0", lambda: None)


@root
@pytest.mark.root
def test_live_owner_is_not_cleaned_but_killed_owner_is(tmp_path: Path) -> None:
    """A process sets up a LAN, a shaped link and a cgroup, gets SIGKILLed; cleanup removes all."""
    prefix = f"spl-tk{PID}"
    script = textwrap.dedent(f"""
        import sys, time
        from splitrt.rig import cgroup, netns
        lan = netns.make_lan({prefix!r}, 2)
        lan.hosts[0].run(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "1mbit",
                         "burst", "10kb", "latency", "50ms"])
        cg = cgroup.CpuThrottle({prefix + "-cg"!r}, 0.5)
        cg.open()
        child = lan.hosts[1].popen(["sleep", "600"])
        cg.add_pid(child.pid)
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"setup child failed (exit {proc.poll()})"
        child_pid = int(line)
        cg_dir = cgroup.detect().root / f"{prefix}-cg"
        assert cg_dir.is_dir()
        assert len(netns.list_netns(prefix)) == 3
        # The owner is alive: a default cleanup (e.g. by a parallel test) leaves it alone.
        assert netns.cleanup_leftovers(prefix) == []
        assert len(netns.list_netns(prefix)) == 3
    finally:
        reap(proc)  # SIGKILL, then its pipe closed
    removed = netns.cleanup_leftovers(prefix)
    assert sorted(removed) == sorted(
        [f"netns:{prefix}-h0", f"netns:{prefix}-h1", f"netns:{prefix}-sw", f"cgroup:{cg_dir}"]
    )
    assert netns.list_netns(prefix) == []
    assert not cg_dir.exists()
    assert prefix not in netns.run_cmd(["ip", "netns", "list"]).stdout
    assert prefix not in netns.run_cmd(["ip", "-o", "link", "show"]).stdout
    assert not any(p.name.startswith(prefix) for p in netns.OWNERS_DIR.iterdir())
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
    assert netns.cleanup_leftovers(prefix) == []  # idempotent
