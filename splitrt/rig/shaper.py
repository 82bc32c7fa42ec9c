"""Shape a link's bandwidth in real time; add one-way delay. Rates are application GOODPUT, as the traces
were measured: kernel rates add the header overhead of full-size TCP segments (1514 wire bytes per 1448
payload bytes).

``PortShaper`` (the kernel link, root): both directions of ports ``p{j}`` of a bridge, in the switch's
namespace: the downlink on the port's egress, the uplink on an ``ifb`` the port's ingress is redirected
to; each an ``htb`` class with a ``bfifo`` leaf holding ``queue_ms`` of traffic at the current rate, and
one ``tc -batch`` re-rates every port. The bucket holds 2 ms at the rate, at least ``MIN_BURST_BYTES``: htb
sends a packet whenever its tokens are not negative, so what an idle link passes at once is the bucket
plus one packet (tbf, not htb, stalls TCP below the MTU). A bucket of 2 MTU let a request of 4 KB each
way cross a 2 Mbit/s link in 0.2 ms, not 16: small requests saw a link several times faster than the trace.
htb, not tbf: changing a tbf's rate replaces its queue and drops what it held, which stalls TCP (RTO) at
every step of a trace; an htb class change keeps the queue.

``UserspaceLink`` (the userspace link, no privileges): a TCP relay (asyncio, in its own thread)
listening on ``listen`` and forwarding each connection to ``target``. Each direction has a token-bucket
pacer (the bottleneck, ``queue_bytes`` of buffer, back-pressure to the sender through TCP flow control)
followed by a delay line that releases each chunk ``delay_ms`` after it left the pacer. With
``rate_mbps=None`` it only delays: combine it with a ``PortShaper`` to get delay on the kernel path
(netem is absent from this kernel). The relay terminates TCP: delay is added per direction to the data,
not per packet, so an RPC sees ``RTT + 2 * delay_ms``; it is also the non-root fallback link. Its thread
runs at a realtime priority where it may (root: ``SCHED_FIFO``, ``realtime`` True), as a kernel qdisc
would: at the host's load of 10-20 a normal thread released 1 chunk in 70 more than 30 ms late (up to
200 ms: requests of 0.4-1 s on a 0.2 s link); ``late_max_ms`` is the worst lateness seen.

Measurement (tests, ``bench/bench_link.py``): ``measure_steps`` plays a trace on a link while a bulk TCP
flow (its own sender thread -> ``BulkReceiver``) runs through it, and returns each step's delivered goodput.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from splitrt.errors import RigError
from splitrt.rig import netns
from splitrt.rig.traces import Trace

MTU_WIRE_BYTES = 1514
TCP_PAYLOAD_BYTES = 1448
GOODPUT_OVERHEAD = MTU_WIRE_BYTES / TCP_PAYLOAD_BYTES
MIN_RATE_MBPS = 0.01
# The least token bucket: a 4 KB reply at 2 Mbit/s took 12 ms of its 16 with 200 bytes (6 with 1 MTU,
# 0.2 with 2 MTU); bulk rates at 20-50 Mbit/s stay within a few % (bench/bench_link.py).
MIN_BURST_BYTES = 256
# 1 s of queue: cellular base stations buffer seconds of traffic (bufferbloat); a 200 ms queue
# tail-drops a 150 KB request at 2 Mbit/s and TCP then waits out a 200+ ms RTO.
KERNEL_QUEUE_MS = 1000.0
RATE_CHANGE_FRACTION = 0.02  # a smaller change is not worth a tc call
RELAY_PRIORITY = 10  # SCHED_FIFO priority of a relay's thread: above every normal thread, low among realtime


def _check_rate(mbps: float | None) -> None:
    if mbps is not None and not (MIN_RATE_MBPS <= mbps <= 100_000):
        raise RigError(f"link rate must be in [{MIN_RATE_MBPS}, 100000] Mbit/s or None, got {mbps}")


# ------------------------------------------------------------------------------------------ kernel


def htb_batch(dev: str, mbps: float, first: bool, queue_ms: float = KERNEL_QUEUE_MS) -> str:
    """``tc -batch`` lines giving ``dev`` a goodput of ``mbps``: installing (``first``) or changing."""
    bits = int(mbps * 1e6 * GOODPUT_OVERHEAD)
    burst = max(MIN_BURST_BYTES, int(bits / 8 * 0.002))
    limit = max(burst + 4 * MTU_WIRE_BYTES, int(bits / 8 * queue_ms / 1000))
    verb = "add" if first else "change"
    root = f"qdisc replace dev {dev} root handle 1: htb default 1\n" if first else ""
    return (
        f"{root}class {verb} dev {dev} parent 1: classid 1:1 htb rate {bits}bit ceil {bits}bit "
        f"burst {burst} cburst {burst} quantum {2 * MTU_WIRE_BYTES}\n"
        f"qdisc {verb} dev {dev} parent 1:1 handle 10: bfifo limit {limit}\n"
    )


class PortShaper:
    """Both directions of ports ``p0 .. p{ports-1}`` of the bridge in namespace ``switch`` (module doc);
    ``rates[j]``: port j's goodput now (None: unshaped)."""

    def __init__(self, switch: str, ports: int, *, queue_ms: float = KERNEL_QUEUE_MS) -> None:
        self.switch, self.queue_ms = switch, queue_ms
        self.rates: list[float | None] = [None] * ports
        for j in range(ports):
            netns.run_cmd(["ip", "-n", switch, "link", "add", f"ifb{j}", "type", "ifb"])
            netns.run_cmd(["ip", "-n", switch, "link", "set", f"ifb{j}", "up"])
            tc = f"qdisc add dev p{j} handle ffff: ingress\nfilter add dev p{j} parent ffff: protocol all u32 "
            self._tc(f"{tc}match u32 0 0 action mirred egress redirect dev ifb{j}\n")

    def _tc(self, batch: str) -> None:
        netns.run_cmd(["ip", "netns", "exec", self.switch, "tc", "-batch", "-"], input_text=batch)

    def set_rates(self, rates_mbps: Sequence[float | None]) -> int:
        """Each port's goodput (None: unshaped) in one ``tc -batch``; returns how many changed (a change
        under ``RATE_CHANGE_FRACTION`` is skipped)."""
        if len(rates_mbps) != len(self.rates):
            raise RigError(f"set_rates: expected one rate per port ({len(self.rates)}), got {len(rates_mbps)}")
        news = [None if mbps is None else max(mbps, MIN_RATE_MBPS) for mbps in rates_mbps]
        for new in news:
            _check_rate(new)
        lines, changed = [], 0
        for j, (old, new) in enumerate(zip(self.rates, news, strict=True)):
            if new is None or old is None or abs(new - old) > RATE_CHANGE_FRACTION * old:
                changed += 1
                for port in (f"p{j}", f"ifb{j}"):
                    if new is None and old is not None:
                        lines.append(f"qdisc del dev {port} root\n")
                    elif new is not None:
                        lines.append(htb_batch(port, new, old is None, self.queue_ms))
                self.rates[j] = new
        if lines:
            self._tc("".join(lines))
        return changed

    def set_rate(self, mbps: float | None) -> None:
        self.set_rates([mbps] * len(self.rates))

    def close(self) -> None:
        """Unshaped again (deleting the switch's namespace removes the qdiscs and ifbs too)."""
        self.set_rate(None)


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
                self.changed.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self.eof = True
            self.changed.set()

    async def pace_side(self) -> None:
        loop = asyncio.get_running_loop()
        next_free = loop.time()
        while True:
            while not self.queue or self.line_bytes >= self.link.line_bytes_max:
                if self.eof and not self.queue:
                    self.line.append((loop.time() + self.link.delay_s, b""))  # EOF marker
                    self.changed.set()
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
            self.changed.set()

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
                self.link.late_max_ms = max(self.link.late_max_ms, (loop.time() - release) * 1e3)
                self.line.popleft()
                if not data:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    await self.writer.drain()
                    return
                self.line_bytes -= len(data)
                self.changed.set()
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
        self.set_rate(rate_mbps)
        self.set_delay(delay_ms)
        self.target, self.queue_ms = target, queue_ms
        self.delivered_bytes = 0
        self.connections = 0
        self.late_max_ms = 0.0  # the most a chunk left its delay line after its time
        self.realtime = False
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
        self.port: int = self.address[1]

    @property
    def queue_bytes(self) -> int:
        return max(64 * 1024, int((self.rate_mbps or 1000.0) * 1e6 / 8 * self.queue_ms / 1000))

    @property
    def line_bytes_max(self) -> int:
        return max(256 * 1024, int((self.rate_mbps or 1000.0) * 1e6 / 8 * (self.delay_s + 0.05) * 2))

    def _run(self, listen: tuple[str, int], ns: str | None) -> None:
        with contextlib.suppress(OSError):  # not root (or no realtime budget): a normal thread
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RELAY_PRIORITY))  # 0: this thread
            self.realtime = True
        try:
            if ns is not None:
                netns.enter_netns(ns)
            asyncio.set_event_loop(self._loop)
            self._server = server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, listen[0], listen[1], reuse_address=True)
            )
        except BaseException as exc:
            self._error = exc
            self._loop.close()  # its self-pipe sockets too: nothing will run on it
            return
        finally:
            self._started.set()
        self._loop.run_forever()
        # Shut down (``close`` stopped the loop): stop listening, cancel connection tasks, close the loop.
        server.close()
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
        writers = [cwriter]
        try:
            ureader, uwriter = await asyncio.open_connection(*self.target)
            writers.append(uwriter)
            for w in writers:
                s = w.get_extra_info("socket")
                if s is not None:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Pipe(self, creader, uwriter)
            down = _Pipe(self, ureader, cwriter)
            await asyncio.gather(
                up.read_side(), up.pace_side(), up.write_side(), down.read_side(), down.pace_side(), down.write_side()
            )
        except (OSError, asyncio.CancelledError):  # the target is unreachable, or the relay closes
            pass
        finally:
            for w in writers:
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
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive() and not self._loop.is_closed():  # the thread ended without closing it
            self._loop.close()

    def __enter__(self) -> UserspaceLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    """Accepts TCP connections on ``(host, port)`` (in ``netns_name`` if given), one at a time, and counts
    their bytes: ``samples`` is a list of ``(time.monotonic(), cumulative bytes)``, one per ``recv``."""

    def __init__(self, host: str, port: int = 0, netns_name: str | None = None) -> None:
        self.samples: list[tuple[float, int]] = []
        self.total = 0
        self._stop = threading.Event()
        try:  # a socket stays in the namespace it was made in
            self._srv = netns.netns_call(netns_name, socket.create_server, (host, port))
        except OSError as exc:
            raise RigError(f"bulk receiver cannot listen on {host}:{port}: {exc}") from exc
        self.port = int(self._srv.getsockname()[1])
        self._srv.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, name="splitrt-bulk-rx", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._srv:
            while not self._stop.is_set():
                try:
                    conn, _ = self._srv.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(0.5)
                    while not self._stop.is_set():
                        try:
                            data = conn.recv(262144)
                        except TimeoutError:
                            continue
                        except OSError:
                            break
                        if not data:
                            break
                        self.total += len(data)
                        self.samples.append((time.monotonic(), self.total))

    def bytes_between(self, t0: float, t1: float) -> int:
        """Bytes received in ``[t0, t1]`` (monotonic), from the recv samples."""

        def at(t: float) -> int:
            i = bisect.bisect_right(self.samples, (t, math.inf))
            return self.samples[i - 1][1] if i else 0

        return at(t1) - at(t0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def measure_steps(
    link: PortShaper | UserspaceLink,
    trace: Trace,
    receiver: BulkReceiver,
    connect: tuple[str, int],
    *,
    send_netns: str | None = None,
    skip_s: float = 0.4,
) -> list[StepResult]:
    """Play ``trace`` on ``link`` (each step's rate at its time, clamped to ``MIN_RATE_MBPS``) while a bulk
    TCP flow runs to ``receiver`` (via ``connect``); the delivered goodput of each step, skipping its first
    ``skip_s`` (the queue of the previous rate drains, TCP ramps up)."""
    link.set_rate(max(trace.rates_mbps[0], MIN_RATE_MBPS))
    try:  # the socket is made in the namespace; the thread sending on it runs anywhere
        sock = netns.netns_call(send_netns, socket.create_connection, connect, 5)
    except OSError as exc:
        raise RigError(f"bulk sender cannot connect to {connect[0]}:{connect[1]}: {exc}") from exc
    stop, errors, zeros = threading.Event(), list[OSError](), bytes(65536)

    def send() -> None:  # as fast as TCP lets it
        with sock:
            while not stop.is_set():
                try:
                    sock.send(zeros)
                except TimeoutError:
                    continue
                except OSError as exc:
                    if not stop.is_set():
                        errors.append(exc)
                    return

    sock.settimeout(0.5)
    sender = threading.Thread(target=send, name="splitrt-bulk-tx", daemon=True)
    sender.start()
    try:
        time.sleep(0.3)  # let the connection reach steady state at the first rate
        t0 = time.monotonic()
        for a, _, mbps in trace.segments():
            time.sleep(max(0.0, t0 + a - time.monotonic()))
            link.set_rate(max(mbps, MIN_RATE_MBPS))
        time.sleep(max(0.0, t0 + trace.duration_s - time.monotonic()))
    finally:
        stop.set()
        sender.join(5)
    if errors:
        raise RigError(f"bulk sender failed: {errors[0]}")
    out = []
    for a, b, mbps in trace.segments():
        if b - a - skip_s < 0.2:
            continue
        got = receiver.bytes_between(t0 + a + skip_s, t0 + b) * 8 / 1e6 / (b - a - skip_s)
        out.append(StepResult(start_s=a, end_s=b, target_mbps=max(mbps, MIN_RATE_MBPS), measured_mbps=got))
    return out
