"""Raw HTTP/2 for the tests and the attack suites (``attacks/``) that must do what no gRPC library will: send
a call's headers and only part of its message and hold the stream, reset streams as fast as they open, refer
to one dynamic-table entry thousands of times, never open a reply's window. Frames are built and parsed by
hyperframe and header blocks encoded by hpack (python-hyper's libraries, the ones h2 is made of); the h2
state machine itself would refuse to misbehave, which is the point here.

- Frames: ``headers_frame``, ``data_frame``, ``rst_stream_frame``, ``settings_frame``, ``ping_ack``;
  ``with_stream_id(frame, sid)`` rewrites a serialized frame's stream id (RFC 9113 4.1: bytes 5-8), so an
  attack sends one frame made by hyperframe for every stream at the rate it sent hand-made ones (a
  HEADERS + RST_STREAM pair: 23 us through hyperframe, 4 us rewritten); ``frames(buf)`` parses the
  complete frames at the start of ``buf`` and returns the rest.
- Header blocks: ``grpc_fields(path, authority, metadata)`` are a gRPC call's fields as never-indexed
  literals (the dynamic table holds only what a caller adds); ``hpack.Encoder().encode(fields,
  huffman=False)`` per connection.
- ``grpc_message(body, declared_bytes)``: gRPC's length prefix (uncompressed) before ``body``, announcing
  ``declared_bytes`` (default ``len(body)``).
- ``RawConnection(host, port)`` speaks the client preface; ``.start_call(path, metadata, body_prefix_bytes,
  declared_bytes)`` opens a stream whose gRPC message announces ``declared_bytes`` but carries only
  ``body_prefix_bytes`` of them; ``.call(path, message, metadata)`` sends a whole message (with
  ``window_bytes=0`` its reply never comes: a slow reader); ``.ended(stream_id)`` says whether the server
  has finished that stream (trailers or RST_STREAM) or closed the connection; ``.push(stream_id, body)``
  sends a message's DATA as far as the server's HTTP/2 windows let it (a client pushing all it may). The
  server's frames are parsed, never its HPACK.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Iterable, Mapping

from hpack import Encoder, HeaderTuple, NeverIndexedHeaderTuple
from hyperframe.exceptions import InvalidFrameError
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

__all__ = [
    "PREFACE",
    "RawConnection",
    "data_frame",
    "ended_streams",
    "frames",
    "grpc_fields",
    "grpc_message",
    "headers_frame",
    "ping_ack",
    "rst_stream_frame",
    "settings_frame",
    "with_stream_id",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # the client connection preface (RFC 9113 3.4)
CANCEL = 0x8  # RST_STREAM's error code
INITIAL_WINDOW_SIZE = SettingsFrame.INITIAL_WINDOW_SIZE


def headers_frame(stream_id: int, block: bytes, *, end_stream: bool = False) -> bytes:
    """One HEADERS frame (END_HEADERS) carrying the whole header ``block``."""
    flags = ["END_HEADERS", "END_STREAM"] if end_stream else ["END_HEADERS"]
    return HeadersFrame(stream_id, data=block, flags=flags).serialize()


def data_frame(stream_id: int, data: bytes, *, end_stream: bool = False) -> bytes:
    return DataFrame(stream_id, data=data, flags=["END_STREAM"] if end_stream else []).serialize()


def rst_stream_frame(stream_id: int, error_code: int = CANCEL) -> bytes:
    return RstStreamFrame(stream_id, error_code=error_code).serialize()


def settings_frame(values: Mapping[int, int] | None = None, *, ack: bool = False) -> bytes:
    return SettingsFrame(0, settings=dict(values or {}), flags=["ACK"] if ack else []).serialize()


def ping_ack(opaque: bytes) -> bytes:
    return PingFrame(0, opaque_data=opaque, flags=["ACK"]).serialize()


def with_stream_id(frame: bytes, stream_id: int) -> bytes:
    """``frame`` (serialized) on another stream: the 31-bit stream id is bytes 5-8 of the frame header."""
    return frame[:5] + (stream_id & 0x7FFFFFFF).to_bytes(4, "big") + frame[9:]


def frames(buf: bytes) -> tuple[list[Frame], bytes]:
    """The complete frames at the start of ``buf`` (parsed by hyperframe) and what follows them; a frame of
    a kind hyperframe does not know is skipped."""
    out: list[Frame] = []
    while len(buf) >= 9:
        try:
            frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
        except InvalidFrameError:
            break
        if len(buf) < 9 + length:
            break
        with contextlib.suppress(InvalidFrameError):
            frame.parse_body(memoryview(buf[9 : 9 + length]))
            out.append(frame)
        buf = buf[9 + length :]
    return out, buf


def grpc_fields(path: str, authority: str, metadata: Iterable[tuple[str, str]] = ()) -> list[HeaderTuple]:
    """A gRPC call's request fields (and ``metadata``) as never-indexed literals."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *metadata,
    ]
    return [NeverIndexedHeaderTuple(k, v) for k, v in fields]


def grpc_message(body: bytes, declared_bytes: int | None = None) -> bytes:
    """gRPC's message prefix (not compressed, the length announced) and ``body``."""
    return b"\x00" + struct.pack(">I", len(body) if declared_bytes is None else declared_bytes) + body


def ended_streams(parsed: Iterable[Frame]) -> tuple[set[int], bool]:
    """(streams the server finished: trailers or RST_STREAM, whether it sent GOAWAY)."""
    done: set[int] = set()
    goaway = False
    for f in parsed:
        if isinstance(f, RstStreamFrame) or (isinstance(f, HeadersFrame) and "END_STREAM" in f.flags):
            done.add(f.stream_id)
        goaway = goaway or isinstance(f, GoAwayFrame)
    return done, goaway


class RawConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 10.0,
        source: str | None = None,
        window_bytes: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        # ``source``: the local address to connect from (e.g. 127.0.0.2: another peer on loopback).
        # ``window_bytes``: the streams' initial receive window (SETTINGS_INITIAL_WINDOW_SIZE); 0 with no
        # WINDOW_UPDATE ever sent is a client that never takes a reply's data (a slow reader).
        # ``tls``: a context whose ALPN offers h2 (an edge proxy), the server named ``localhost``.
        self.sock = socket.create_connection(
            (host, port), timeout=timeout_s, source_address=(source, 0) if source else None
        )
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="localhost")
        self.authority = f"{host}:{port}"
        settings = {} if window_bytes is None else {INITIAL_WINDOW_SIZE: window_bytes}
        self.sock.sendall(PREFACE + settings_frame(settings) + settings_frame(ack=True))
        self.hpack = Encoder()
        self._next_id = 1
        self._buf = b""
        self.finished: set[int] = set()
        self.reset: dict[int, int] = {}  # stream id -> RST_STREAM error code
        self.settings: dict[int, int] = {}  # the server's SETTINGS (id -> value)
        self.closed = False
        # Flow control (RFC 9113 6.9): what the server's WINDOW_UPDATEs added, per stream (0: the
        # connection's), and the DATA bytes sent; SETTINGS and PINGs the server sent, to be acknowledged.
        self.window_added: dict[int, int] = {}
        self.sent_bytes: dict[int, int] = {}
        self._settings_unacked = -1  # the preface acknowledged the server's first SETTINGS ahead
        self._pings: list[bytes] = []

    def start_call(
        self,
        path: str,
        metadata: Iterable[tuple[str, str]] = (),
        *,
        body_prefix_bytes: int = 0,
        declared_bytes: int = 1024,
    ) -> int:
        """Open a stream for ``path`` and send ``body_prefix_bytes`` of a ``declared_bytes`` message
        (0 prefix: headers only, no DATA). Returns the stream id."""
        sid = self._next_id
        self._next_id += 2
        block = self.hpack.encode(grpc_fields(path, self.authority, metadata), huffman=False)
        out = headers_frame(sid, block)
        if body_prefix_bytes > 0:
            out += data_frame(sid, grpc_message(bytes(body_prefix_bytes), declared_bytes))
        self.sock.sendall(out)
        return sid

    def call(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]] = ()) -> int:
        """Open a stream for ``path`` and send one whole gRPC message (END_STREAM). Returns the stream id."""
        sid = self.start_call(path, metadata)
        self.sock.sendall(data_frame(sid, grpc_message(message), end_stream=True))
        return sid

    def pump(self, wait_s: float = 0.0) -> None:
        """Read what the server sent (waiting at most ``wait_s`` for the first bytes)."""
        self.sock.settimeout(wait_s if wait_s > 0 else 0.0001)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.closed = True
                    break
                self._buf += data
                self.sock.settimeout(0.0001)
        except (TimeoutError, BlockingIOError):
            pass
        except OSError:
            self.closed = True
        parsed, self._buf = frames(self._buf)
        self.finished |= ended_streams(parsed)[0]  # GOAWAY: streams already running may still finish
        for f in parsed:
            if isinstance(f, RstStreamFrame):
                self.reset[f.stream_id] = f.error_code
            elif isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                self.settings.update(f.settings)
                self._settings_unacked += 1
            elif isinstance(f, WindowUpdateFrame):
                self.window_added[f.stream_id] = self.window_added.get(f.stream_id, 0) + f.window_increment
            elif isinstance(f, PingFrame) and "ACK" not in f.flags:
                self._pings.append(f.opaque_data)

    def send_window(self, stream_id: int) -> int:
        """Bytes of DATA the server lets ``stream_id`` send now: the least of its stream window (the
        server's SETTINGS_INITIAL_WINDOW_SIZE plus its WINDOW_UPDATEs, less what was sent) and the
        connection's (65535 plus its WINDOW_UPDATEs, less all DATA sent)."""
        stream = self.settings.get(INITIAL_WINDOW_SIZE, 65_535) + self.window_added.get(stream_id, 0)
        conn = 65_535 + self.window_added.get(0, 0) - sum(self.sent_bytes.values())
        return min(stream - self.sent_bytes.get(stream_id, 0), conn)

    def push(self, stream_id: int, body: bytes, *, idle_s: float = 1.0) -> int:
        """Send ``body`` as a gRPC message (prefixed) on ``stream_id``, whose headers went
        without DATA, as fast as the server's windows allow (SETTINGS and PINGs acknowledged), until all
        of it is sent (END_STREAM), the stream ends or no window opens for ``idle_s``. Returns the DATA
        bytes sent on the stream: all the server let it push."""
        message = grpc_message(body)
        frame_max = self.settings.get(SettingsFrame.MAX_FRAME_SIZE, 16_384)
        idle_since = time.monotonic()
        while not self.closed and stream_id not in self.reset and time.monotonic() - idle_since < idle_s:
            self.sock.settimeout(10.0)  # pump leaves the socket almost non-blocking
            if self._settings_unacked > 0 or self._pings:
                acks = settings_frame(ack=True) * max(0, self._settings_unacked)
                self.sock.sendall(acks + b"".join(map(ping_ack, self._pings)))
                self._settings_unacked, self._pings = min(0, self._settings_unacked), []
            # All the windows allow at once, the frames in one write: the most a client can push before
            # it reads the server's answer.
            sent = self.sent_bytes.get(stream_id, 0)
            n = min(self.send_window(stream_id), len(message) - sent)
            if n > 0:
                last = sent + n == len(message)
                chunks = range(sent, sent + n, frame_max)
                self.sock.sendall(
                    b"".join(
                        data_frame(stream_id, message[i : min(i + frame_max, sent + n)], end_stream=last)
                        for i in chunks
                    )
                )
                self.sent_bytes[stream_id] = sent + n
                idle_since = time.monotonic()
                if last:
                    break
            self.pump(0.0 if n > 0 else 0.01)
        return self.sent_bytes.get(stream_id, 0)

    def ended(self, stream_id: int, wait_s: float = 0.0) -> bool:
        """True once the server finished the stream or the connection is gone."""
        self.pump(wait_s)
        return stream_id in self.finished or self.closed

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
