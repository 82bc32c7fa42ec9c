"""Shape a link's bandwidth in real time, following a trace; add one-way delay.

Two implementations of the ``LinkShaper`` protocol (``set_rate(mbps)``, ``close()``, ``.kind``):

``KernelShaper`` (``kind == "kernel"``, root): an ``htb`` qdisc (one class, a ``bfifo`` leaf) on the
egress of each given ``(namespace, device)``; ``set_rate`` is a ``tc class change`` (one ``tc -batch``
per point). ``KernelShaper.for_host(lan, i)`` shapes
both directions of host ``i``: its ``eth0`` egress (uplink) and the egress facing it on the other side
(the switch port, or the peer's ``eth0`` for ``netns.make_link``), so no ``ifb`` is needed. Rates are
application GOODPUT, as the traces were measured: the tbf rate is raised by the header overhead of
full-size TCP segments (1514 wire bytes per 1448 payload bytes). ``burst`` is at least 2 MTU (a burst
below the MTU stalls TCP) and the leaf queue holds ``queue_ms`` of traffic at the current rate. htb, not
tbf: changing a tbf's rate replaces its queue and drops what it held, which stalls TCP (RTO) at every
step of a trace; an htb class change keeps the queue.

``UserspaceLink`` (``kind == "userspace"``, no privileges): a TCP relay (asyncio, in its own thread)
listening on ``listen`` and forwarding each connection to ``target``. Each direction has a token-bucket
pacer (the bottleneck, ``queue_bytes`` of buffer, back-pressure to the sender through TCP flow control)
followed by a delay line that releases each chunk ``delay_ms`` after it left the pacer. With
``rate_mbps=None`` it only delays: combine it with a ``KernelShaper`` to get delay on the kernel path
(netem is absent from this kernel). The relay terminates TCP: delay is added per direction to the data,
not per packet, so an RPC sees ``RTT + 2 * delay_ms``; it is also the non-root fallback link.

``TracePlayer(shaper, trace)`` is a thread that applies ``trace.rate_at(t)`` at every change of the trace
(looping), clamped to ``min_mbps`` (a shaper cannot apply 0), and keeps a log of what it applied.

- ``LinkShaper`` protocol: ``.kind`` in {"kernel", "userspace"}, ``.set_rate(mbps | None)``, ``.close()``. Rates
  are application goodput (kernel rates add TCP/IP/Ethernet header overhead).
- ``KernelShaper(points=[(ns, dev), ...], rate_mbps=None, queue_ms=200)``: htb + bfifo leaf on each egress;
  ``KernelShaper.for_host(lan, i, rate_mbps)`` shapes host i's uplink and downlink. Accurate when the shaped
  egress is local to the sender (direct veth pair: both directions).
- ``UserspaceLink(listen, target, rate_mbps=None, delay_ms=0, netns_name=None)``: TCP relay with a token-bucket
  bottleneck and a one-way delay line per direction (``.port``, ``.set_delay(ms)``); the only way to add delay
  (no netem) and the non-root link.
- ``TracePlayer(shaper, trace, scale=1, min_mbps=0.05, duration_s=None, on_change=None)``: ``.start()`` /
  ``.stop()`` / context manager; ``.log`` = [(t_s, mbps applied)]; ``.start_time`` (monotonic).
- Measurement: ``BulkReceiver``, ``BulkSender``, ``measure_steps(...) -> list[StepResult]``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from splitrt.errors import RigError
from splitrt.rig import netns
from splitrt.rig.traces import Trace

MTU_WIRE_BYTES = 1514
TCP_PAYLOAD_BYTES = 1448
GOODPUT_OVERHEAD = MTU_WIRE_BYTES / TCP_PAYLOAD_BYTES
MIN_RATE_MBPS = 0.01


@runtime_checkable
class LinkShaper(Protocol):
    """What the rig and the trace player need from a link."""

    kind: str  # "kernel" | "userspace"

    def set_rate(self, mbps: float | None) -> None: ...

    def close(self) -> None: ...


def _check_rate(mbps: float | None) -> None:
    if mbps is not None and not (MIN_RATE_MBPS <= mbps <= 100_000):
        raise RigError(f"link rate must be in [{MIN_RATE_MBPS}, 100000] Mbit/s or None, got {mbps}")


# ------------------------------------------------------------------------------------------ kernel


@dataclass
class KernelShaper:
    """tbf on the egress of each ``(namespace, device)`` in ``points`` (see module doc)."""

    points: Sequence[tuple[str, str]]
    rate_mbps: float | None = None
    queue_ms: float = 200.0
    goodput: bool = True
    kind: str = field(default="kernel", init=False)
    _installed: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def for_host(
        cls, lan: netns.Lan, i: int, rate_mbps: float | None = None, *, queue_ms: float = 200.0, goodput: bool = True
    ) -> KernelShaper:
        """Shape both directions of ``lan.hosts[i]``: its uplink and the egress facing it."""
        host = lan.hosts[i]
        return cls(
            points=[(host.ns, host.dev), lan.switch_port(i)], rate_mbps=rate_mbps, queue_ms=queue_ms, goodput=goodput
        )

    def __post_init__(self) -> None:
        _check_rate(self.rate_mbps)
        if self.rate_mbps is not None:
            self.set_rate(self.rate_mbps)

    def _params(self, mbps: float) -> tuple[int, int, int]:
        """(rate bit/s, burst bytes, queue limit bytes) on the wire for a goodput of ``mbps``."""
        bits = int(mbps * 1e6 * (GOODPUT_OVERHEAD if self.goodput else 1.0))
        bytes_per_s = bits / 8
        burst = max(2 * MTU_WIRE_BYTES, int(bytes_per_s * 0.002))
        limit = max(burst + 4 * MTU_WIRE_BYTES, int(bytes_per_s * self.queue_ms / 1000))
        return bits, burst, limit

    def _batch(self, mbps: float, first: bool, dev: str) -> str:
        bits, burst, limit = self._params(mbps)
        cls = (
            f"class {'add' if first else 'change'} dev {dev} parent 1: classid 1:1 htb "
            f"rate {bits}bit ceil {bits}bit burst {burst} cburst {burst} quantum {2 * MTU_WIRE_BYTES}\n"
        )
        leaf = f"qdisc {'add' if first else 'change'} dev {dev} parent 1:1 handle 10: bfifo limit {limit}\n"
        if first:
            return f"qdisc replace dev {dev} root handle 1: htb default 1\n" + cls + leaf
        return cls + leaf

    def set_rate(self, mbps: float | None) -> None:
        """Apply ``mbps`` (goodput) to every point; ``None`` removes the shaping.

        An htb class change keeps the packets queued in the leaf (a tbf change would flush them, and
        the losses stall TCP at every step of the trace).
        """
        _check_rate(mbps)
        with self._lock:
            for ns, dev in self.points:
                if mbps is None:
                    if (ns, dev) in self._installed:
                        _tc(ns, "qdisc", "del", "dev", dev, "root")
                        self._installed.remove((ns, dev))
                    continue
                first = (ns, dev) not in self._installed
                netns.run_cmd(
                    ["ip", "netns", "exec", ns, "tc", "-batch", "-"], input_text=self._batch(mbps, first, dev)
                )
                if first:
                    self._installed.append((ns, dev))
            self.rate_mbps = mbps

    def close(self) -> None:
        """Remove the qdiscs (a namespace already gone is fine: its qdiscs went with it)."""
        with self._lock:
            for ns, dev in self._installed:
                if (netns.NETNS_DIR / ns).exists():
                    _tc(ns, "qdisc", "del", "dev", dev, "root", check=False)
            self._installed.clear()

    def qdiscs(self) -> list[str]:
        """``tc qdisc show`` of every point (for tests and diagnostics)."""
        return [_tc(ns, "qdisc", "show", "dev", dev).stdout.strip() for ns, dev in self.points]

    def __enter__(self) -> KernelShaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tc(ns: str, *args: str, check: bool = True) -> netns.subprocess.CompletedProcess[str]:
    return netns.run_cmd(["ip", "netns", "exec", ns, "tc", *args], check=check)


# ---------------------------------------------------------------------------------------- userspace


class _Pipe:
    """One direction of a relayed connection: reader -> pacer (bottleneck) -> delay line -> writer."""

    CHUNK = 16384

    def __init__(self, link: UserspaceLink, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.link = link
        self.reader = reader
        self.writer = writer
        self.queue: collections.deque[bytes] = collections.deque()  # bottleneck buffer
        self.queued = 0
        self.line: collections.deque[tuple[float, bytes]] = collections.deque()  # delay line
        self.line_bytes = 0
        self.changed = asyncio.Event()
        self.eof = False

    def _poke(self) -> None:
        self.changed.set()

    async def _wait(self) -> None:
        await self.changed.wait()
        self.changed.clear()

    async def read_side(self) -> None:
        try:
            while True:
                while self.queued >= self.link.queue_bytes:
                    await self._wait()
                data = await self.reader.read(self.CHUNK)
                if not data:
                    break
                self.queue.append(data)
                self.queued += len(data)
                self._poke()
        except (ConnectionError, OSError):
            pass
        finally:
            self.eof = True
            self._poke()

    async def pace_side(self) -> None:
        loop = asyncio.get_running_loop()
        next_free = loop.time()
        while True:
            while not self.queue or self.line_bytes >= self.link.line_bytes_max:
                if self.eof and not self.queue:
                    self.line.append((loop.time() + self.link.delay_s, b""))  # EOF marker
                    self._poke()
                    return
                await self._wait()
            rate = self.link.rate_mbps
            data = self.queue.popleft()
            if rate is not None:
                piece = max(TCP_PAYLOAD_BYTES, int(rate * 1e6 / 8 * 0.005))
                if len(data) > piece:
                    self.queue.appendleft(data[piece:])
                    data = data[:piece]
                now = loop.time()
                next_free = max(next_free, now - 0.002)  # at most 2 ms of credit: a small bucket
                next_free += len(data) * 8 / (rate * 1e6)
                if next_free > now:
                    await asyncio.sleep(next_free - now)
            self.queued -= len(data)
            self.line.append((loop.time() + self.link.delay_s, data))
            self.line_bytes += len(data)
            self._poke()

    async def write_side(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.line:
                    await self._wait()
                release, data = self.line[0]
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.line.popleft()
                if not data:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    await self.writer.drain()
                    return
                self.line_bytes -= len(data)
                self._poke()
                self.writer.write(data)
                await self.writer.drain()
                self.link.delivered_bytes += len(data)
        except (ConnectionError, OSError):
            self.eof = True


class UserspaceLink:
    """TCP relay ``listen -> target`` with rate limit and one-way delay (see module doc).

    ``listen=(host, 0)`` picks a free port: read ``.port`` (and ``.address``) after construction.
    ``netns`` runs the relay (both its listening and its outgoing sockets) inside that namespace.
    """

    kind = "userspace"

    def __init__(
        self,
        listen: tuple[str, int],
        target: tuple[str, int],
        *,
        rate_mbps: float | None = None,
        delay_ms: float = 0.0,
        queue_ms: float = 200.0,
        netns_name: str | None = None,
    ) -> None:
        _check_rate(rate_mbps)
        if delay_ms < 0:
            raise RigError(f"delay_ms must be >= 0, got {delay_ms}")
        self.target = target
        self.rate_mbps = rate_mbps
        self.delay_s = delay_ms / 1000
        self.queue_ms = queue_ms
        self.delivered_bytes = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(listen, netns_name), name="splitrt-relay", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise RigError(f"relay cannot listen on {listen[0]}:{listen[1]}: {self._error}") from self._error
        if self._server is None:
            raise RigError(f"relay on {listen[0]}:{listen[1]} did not start within 10 s")
        sock = self._server.sockets[0]
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self.port = self.address[1]

    @property
    def queue_bytes(self) -> int:
        rate = self.rate_mbps if self.rate_mbps is not None else 1000.0
        return max(64 * 1024, int(rate * 1e6 / 8 * self.queue_ms / 1000))

    @property
    def line_bytes_max(self) -> int:
        rate = self.rate_mbps if self.rate_mbps is not None else 1000.0
        return max(256 * 1024, int(rate * 1e6 / 8 * (self.delay_s + 0.05) * 2))

    def _run(self, listen: tuple[str, int], ns: str | None) -> None:
        try:
            if ns is not None:
                netns.enter_netns(ns)
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, listen[0], listen[1], reuse_address=True)
            )
        except BaseException as exc:
            self._error = exc
            self._loop.close()  # its self-pipe sockets too: nothing will run on it
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        # Shut down: cancel connection tasks, close the loop.
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(BaseException):
            self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        self._loop.close()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            try:
                ureader, uwriter = await asyncio.open_connection(*self.target)
            except OSError:
                cwriter.close()
                return
            for w in (cwriter, uwriter):
                s = w.get_extra_info("socket")
                if s is not None:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Pipe(self, creader, uwriter)
            down = _Pipe(self, ureader, cwriter)
            await asyncio.gather(
                up.read_side(), up.pace_side(), up.write_side(), down.read_side(), down.pace_side(), down.write_side()
            )
        except asyncio.CancelledError:
            pass
        finally:
            for w in (cwriter, *([uwriter] if "uwriter" in locals() else [])):
                with contextlib.suppress(Exception):
                    w.close()
            self._tasks.discard(task)

    def set_rate(self, mbps: float | None) -> None:
        """New goodput limit (``None``: unlimited), effective for the next chunk paced."""
        _check_rate(mbps)
        self.rate_mbps = mbps

    def set_delay(self, delay_ms: float) -> None:
        if delay_ms < 0:
            raise RigError(f"delay_ms must be >= 0, got {delay_ms}")
        self.delay_s = delay_ms / 1000

    def close(self) -> None:
        if not self._loop.is_closed() and self._thread.is_alive():

            def stop() -> None:
                if self._server is not None:
                    self._server.close()
                self._loop.stop()

            self._loop.call_soon_threadsafe(stop)
            self._thread.join(10)
        if not self._thread.is_alive() and not self._loop.is_closed():  # the thread ended without closing it
            self._loop.close()

    def __enter__(self) -> UserspaceLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ player


class TracePlayer:
    """Thread applying ``trace.rate_at(t) * scale`` to ``shaper`` at every change of the trace."""

    def __init__(
        self,
        shaper: LinkShaper,
        trace: Trace,
        *,
        scale: float = 1.0,
        min_mbps: float = 0.05,
        duration_s: float | None = None,
        on_change: Callable[[float, float], None] | None = None,
    ) -> None:
        self.shaper = shaper
        self.trace = trace.scaled(scale) if scale != 1.0 else trace
        self.min_mbps = max(min_mbps, MIN_RATE_MBPS)
        self.duration_s = duration_s
        self.on_change = on_change
        self.log: list[tuple[float, float]] = []  # (seconds since start, Mbit/s applied)
        self.start_time: float | None = None  # time.monotonic() of t = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="splitrt-trace-player", daemon=True)

    def rate_at(self, t_s: float) -> float:
        return max(self.trace.rate_at(t_s), self.min_mbps)

    def start(self) -> TracePlayer:
        self.start_time = time.monotonic()
        self.shaper.set_rate(self.rate_at(0.0))  # in force before start() returns
        self.log.append((0.0, self.rate_at(0.0)))
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self.start_time is not None
        base = 0.0
        try:
            while not self._stop.is_set():
                for i, t in enumerate(self.trace.times_s):
                    when = base + t
                    if when == 0.0:
                        continue
                    if self.duration_s is not None and when >= self.duration_s:
                        return
                    if self._stop.wait(max(0.0, self.start_time + when - time.monotonic())):
                        return
                    mbps = max(self.trace.rates_mbps[i], self.min_mbps)  # not rate_at: float wrap
                    self.shaper.set_rate(mbps)
                    self.log.append((when, mbps))
                    if self.on_change is not None:
                        self.on_change(when, mbps)
                base += self.trace.duration_s
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self.error is not None:
            raise RigError(f"trace player failed: {self.error}") from self.error

    def __enter__(self) -> TracePlayer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class StepResult:
    """Delivered goodput over one constant-rate step of a played trace."""

    start_s: float
    end_s: float
    target_mbps: float
    measured_mbps: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.measured_mbps - self.target_mbps) / self.target_mbps


class BulkReceiver:
    """Accepts TCP connections on ``(host, port)`` (in ``netns_name`` if given) and counts bytes.

    ``samples`` is a list of ``(time.monotonic(), cumulative bytes)``, one per ``recv``.
    """

    def __init__(self, host: str, port: int = 0, netns_name: str | None = None) -> None:
        self.samples: list[tuple[float, int]] = []
        self.total = 0
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._err: BaseException | None = None
        self.port = 0
        target = self._run
        self._thread = (
            netns.netns_thread(netns_name, target, host, port)
            if netns_name
            else threading.Thread(target=target, args=(host, port), daemon=True)
        )
        if not netns_name:
            self._thread.start()
        self._ready.wait(10)
        if self._err is not None:
            raise RigError(f"bulk receiver cannot listen on {host}:{port}: {self._err}") from self._err

    def _run(self, host: str, port: int) -> None:
        try:
            srv = socket.create_server((host, port))
        except OSError as exc:
            self._err = exc
            self._ready.set()
            return
        self.port = srv.getsockname()[1]
        srv.settimeout(0.2)
        self._ready.set()
        conns: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                conns.append(conn)
                threading.Thread(target=self._drain, args=(conn,), daemon=True).start()
        finally:
            srv.close()
            for c in conns:
                with contextlib.suppress(OSError):
                    c.close()

    def _drain(self, conn: socket.socket) -> None:
        conn.settimeout(0.5)
        while not self._stop.is_set():
            try:
                data = conn.recv(262144)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self.total += len(data)
            self.samples.append((time.monotonic(), self.total))

    def bytes_between(self, t0: float, t1: float) -> int:
        """Bytes received in ``[t0, t1]`` (monotonic), from the recv samples."""

        def at(t: float) -> int:
            lo, hi = 0, len(self.samples)
            while lo < hi:
                mid = (lo + hi) // 2
                if self.samples[mid][0] <= t:
                    lo = mid + 1
                else:
                    hi = mid
            return self.samples[lo - 1][1] if lo else 0

        return at(t1) - at(t0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class BulkSender:
    """Sends zeros to ``addr`` as fast as TCP lets it, in a thread (in ``netns_name`` if given)."""

    def __init__(self, addr: tuple[str, int], netns_name: str | None = None) -> None:
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = (
            netns.netns_thread(netns_name, self._run, addr)
            if netns_name
            else threading.Thread(target=self._run, args=(addr,), daemon=True)
        )
        if not netns_name:
            self._thread.start()
        self._connected.wait(10)
        if self.error is not None:
            raise RigError(f"bulk sender cannot connect to {addr[0]}:{addr[1]}: {self.error}") from self.error

    def _run(self, addr: tuple[str, int]) -> None:
        buf = bytes(65536)
        try:
            s = socket.create_connection(addr, timeout=5)
        except OSError as exc:
            self.error = exc
            self._connected.set()
            return
        self._connected.set()
        s.settimeout(0.5)
        try:
            while not self._stop.is_set():
                try:
                    self.sent += s.send(buf)
                except TimeoutError:
                    continue
        except OSError as exc:
            if not self._stop.is_set():
                self.error = exc
        finally:
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def measure_steps(
    shaper: LinkShaper,
    trace: Trace,
    receiver: BulkReceiver,
    connect: tuple[str, int],
    *,
    send_netns: str | None = None,
    skip_s: float = 0.4,
) -> list[StepResult]:
    """Play ``trace`` on ``shaper`` while a bulk TCP flow runs to ``receiver`` (via ``connect``); return
    the delivered goodput of each trace step, skipping its first ``skip_s`` (the queue of the previous
    rate drains, TCP ramps up)."""
    player = TracePlayer(shaper, trace, min_mbps=MIN_RATE_MBPS, duration_s=trace.duration_s)
    sender = BulkSender(connect, send_netns)
    try:
        time.sleep(0.3)  # let the connection reach steady state at the first rate
        shaper.set_rate(player.rate_at(0.0))
        player.start()
        time.sleep(trace.duration_s)
        player.stop()
    finally:
        sender.close()
    if sender.error is not None:
        raise RigError(f"bulk sender failed: {sender.error}")
    assert player.start_time is not None
    out = []
    for a, b, mbps in trace.segments():
        t0, t1 = player.start_time + a + skip_s, player.start_time + b
        if t1 - t0 < 0.2:
            continue
        got = receiver.bytes_between(t0, t1) * 8 / 1e6 / (t1 - t0)
        out.append(StepResult(start_s=a, end_s=b, target_mbps=max(mbps, MIN_RATE_MBPS), measured_mbps=got))
    return out
