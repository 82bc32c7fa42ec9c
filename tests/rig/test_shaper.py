"""Link shaping: the userspace relay (any user), the kernel port shaper (root), measured with a bulk flow."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from splitrt.errors import RigError
from splitrt.rig import netns, shaper, traces

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates namespaces and qdiscs")
PID = os.getpid()
BOUND_PCT = 25.0  # bench/bench_link.py measures the real accuracy (within a few %); this is loose.


class _Echo:
    """Echo server on 127.0.0.1 that half-closes after the peer does."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.addr = self.srv.getsockname()[:2]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.srv.close()


def _roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:

        def send() -> None:
            c.sendall(payload)
            c.shutdown(socket.SHUT_WR)

        th = threading.Thread(target=send)
        th.start()
        chunks = []
        while data := c.recv(65536):
            chunks.append(data)
        th.join()
    return b"".join(chunks)


def test_relay_carries_bytes_intact_and_half_close() -> None:
    echo = _Echo()
    payload = os.urandom(3_000_000)
    with shaper.UserspaceLink(("127.0.0.1", 0), echo.addr, rate_mbps=None, delay_ms=5) as link:
        assert _roundtrip(link.port, payload) == payload
        assert _roundtrip(link.port, b"") == b""  # EOF crosses both ways
        assert link.connections == 2
        assert link.delivered_bytes == 2 * len(payload)
    echo.close()


def test_relay_adds_one_way_delay_each_way() -> None:
    echo = _Echo()
    with (
        shaper.UserspaceLink(("127.0.0.1", 0), echo.addr, delay_ms=30) as link,
        socket.create_connection(("127.0.0.1", link.port)) as c,
    ):
        rtts = []
        for _ in range(3):
            t0 = time.perf_counter()
            c.sendall(b"ping")
            got = b""
            while len(got) < 4:
                got += c.recv(16)
            rtts.append(time.perf_counter() - t0)
        assert got == b"ping"
        assert min(rtts) >= 0.060  # lower bound only: the relay may not deliver before 2 x 30 ms
    echo.close()


def test_relay_thread_is_realtime_as_root_and_counts_its_lateness() -> None:
    """A relay stands for a kernel link: as root its thread is SCHED_FIFO, so the host's other load does not
    delay its chunks (it did, by up to 200 ms); without root it stays a normal thread and says so."""
    echo = _Echo()
    with shaper.UserspaceLink(("127.0.0.1", 0), echo.addr, delay_ms=5) as link:
        assert _roundtrip(link.port, b"x" * 1000) == b"x" * 1000
        tid = link._thread.native_id
        assert tid is not None
        policy = os.sched_getscheduler(tid)
        assert link.realtime == (os.geteuid() == 0)
        assert (policy == os.SCHED_FIFO) == link.realtime, policy
        assert link.late_max_ms >= 0.0
    echo.close()


def test_relay_unreachable_target_closes_client() -> None:
    dead = socket.create_server(("127.0.0.1", 0))
    addr = dead.getsockname()[:2]
    dead.close()
    with (
        shaper.UserspaceLink(("127.0.0.1", 0), addr) as link,
        socket.create_connection(("127.0.0.1", link.port), timeout=10) as c,
    ):
        assert c.recv(10) == b""


def test_relay_rejects_bad_values_and_bad_listen() -> None:
    echo = _Echo()
    with pytest.raises(RigError, match="rate"):
        shaper.UserspaceLink(("127.0.0.1", 0), echo.addr, rate_mbps=0)
    with pytest.raises(RigError, match="delay_ms"):
        shaper.UserspaceLink(("127.0.0.1", 0), echo.addr, delay_ms=-1)
    with shaper.UserspaceLink(("127.0.0.1", 0), echo.addr) as link:
        with pytest.raises(RigError, match="cannot listen"):
            shaper.UserspaceLink(("127.0.0.1", link.port), echo.addr)
        with pytest.raises(RigError):
            link.set_rate(-3)
    echo.close()


@pytest.mark.serial
def test_userspace_link_follows_step_trace() -> None:
    # Modest rates: the relay is Python, and a loaded 2-core CI box must still pace it (bench_link
    # measures the accurate figures).
    tr = traces.step([3.0, 1.0, 2.0], 1.5)
    rx = shaper.BulkReceiver("127.0.0.1", 0)
    try:
        with shaper.UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", rx.port), delay_ms=10) as link:
            steps = shaper.measure_steps(link, tr, rx, ("127.0.0.1", link.port))
    finally:
        rx.close()
    assert [s.target_mbps for s in steps] == [3.0, 1.0, 2.0]
    for s in steps:
        assert abs(s.error_pct) < BOUND_PCT, steps


@root
@pytest.mark.root
def test_port_shaper_installs_changes_and_removes_htb_both_ways() -> None:
    with netns.make_lan(f"spl-ts{PID}", 2) as lan:
        ks = shaper.PortShaper(lan.switch_ns, 1)

        def classes(dev: str, what: str = "class") -> str:
            return netns.run_cmd(["ip", "netns", "exec", lan.switch_ns, "tc", what, "show", "dev", dev]).stdout

        assert ks.set_rates([4.0]) == 1
        for dev in ("p0", "ifb0"):  # the downlink, and the uplink redirected from the port's ingress
            assert f"rate {int(4.0 * shaper.GOODPUT_OVERHEAD * 1000)}Kbit" in classes(dev), classes(dev)
        assert ks.set_rates([4.05]) == 0  # under 2 %: no tc call
        with pytest.raises(RigError, match=r"one rate per port \(1\), got 2"):
            ks.set_rates([1.0, 2.0])
        ks.set_rate(1.0)
        assert f"rate {int(1.0 * shaper.GOODPUT_OVERHEAD * 1000)}Kbit" in classes("p0")
        assert "htb" not in classes("p1")  # host 1's port is not shaped
        ks.close()
        for dev in ("p0", "ifb0"):
            assert (
                "htb"
                not in netns.run_cmd(["ip", "netns", "exec", lan.switch_ns, "tc", "qdisc", "show", "dev", dev]).stdout
            )
        with pytest.raises(RigError, match="rate"):
            ks.set_rate(1e6)


@root
@pytest.mark.root
@pytest.mark.parametrize("direction", ["up", "down"])
def test_kernel_link_follows_step_trace(direction: str) -> None:
    """Both directions of host 0's port, as the rig shapes a device's link."""
    tr = traces.step([6.0, 1.5, 4.0], 1.5)
    with netns.make_lan(f"spl-tb{PID}{direction}", 2) as lan:
        a, b = lan.hosts
        src, dst = (a, b) if direction == "up" else (b, a)
        ks = shaper.PortShaper(lan.switch_ns, 1)
        rx = shaper.BulkReceiver(dst.ip, 0, dst.ns)
        try:
            steps = shaper.measure_steps(ks, tr, rx, (dst.ip, rx.port), send_netns=src.ns)
        finally:
            rx.close()
    assert [s.target_mbps for s in steps] == [6.0, 1.5, 4.0]
    for s in steps:
        assert abs(s.error_pct) < BOUND_PCT, steps


def _timed_exchange(client: socket.socket, up: int, down: int) -> float:
    """Seconds for ``up`` bytes to the server and ``down`` bytes back (the server's ``_answer``)."""
    t0 = time.perf_counter()
    client.sendall(up.to_bytes(4, "big") + down.to_bytes(4, "big") + b"x" * up)
    got = 0
    while got < down:
        got += len(client.recv(65536))
    return time.perf_counter() - t0


def _answer(srv: socket.socket) -> None:
    """Per request: read its 8-byte header and ``up`` bytes, send ``down`` bytes back; until EOF."""
    conn, _ = srv.accept()
    with conn, srv:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while len(head := conn.recv(8, socket.MSG_WAITALL)) == 8:
            up, down = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
            while up > 0:
                up -= len(conn.recv(min(up, 65536)))
            conn.sendall(b"y" * down)


@root
@pytest.mark.root
@pytest.mark.parametrize("direction", ["up", "down"])
def test_kernel_link_gives_an_idle_request_no_free_burst(direction: str) -> None:
    """A request after an idle gap crosses at the trace's rate: the bucket passes at most about one packet
    at once (a bucket of 2 MTU passed 4.5 KB: a 4 KB reply took 0.2 ms on a 2 Mbit/s link). A lower bound
    only: load can slow a transfer, never speed it up."""
    nbytes, mbps = 8000, 1.0
    ideal_s = nbytes * 8 / (mbps * 1e6)  # 64 ms
    with netns.make_lan(f"spl-tq{PID}{direction}", 2) as lan:
        a, b = lan.hosts
        shaper.PortShaper(lan.switch_ns, 1).set_rates([mbps])
        srv = netns.netns_call(b.ns, socket.create_server, (b.ip, 0))
        th = threading.Thread(target=_answer, args=(srv,), daemon=True)
        th.start()
        with netns.netns_call(a.ns, socket.create_connection, (b.ip, srv.getsockname()[1]), timeout=20) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _timed_exchange(c, 100, 100)  # the connection's first exchange is not timed
            took = []
            for _ in range(4):
                time.sleep(0.3)  # idle: the bucket refills
                took.append(_timed_exchange(c, *((nbytes, 1) if direction == "up" else (1, nbytes))))
        th.join(timeout=10)
    assert min(took) >= 0.75 * ideal_s, took
