"""A deliberately bad gRPC client over a raw socket: HTTP/2 framed by hand, so a test or benchmark can do
what no gRPC library will: send a call's headers and only part of its message, then hold the stream.

``RawConnection(host, port)`` speaks the client preface; ``.start_call(path, metadata, body_prefix_bytes,
declared_bytes)`` opens a stream whose gRPC message announces ``declared_bytes`` but carries only
``body_prefix_bytes`` of them; ``.call(path, message, metadata)`` sends a whole message (with
``window_bytes=0`` its reply never comes: a slow reader); ``.ended(stream_id)`` says whether the server
has finished that stream (trailers or RST_STREAM) or closed the connection. HPACK is written with
literal fields only (no Huffman, no table), which every decoder must accept;
the server's frames are parsed, never its HPACK.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import Iterable

__all__ = ["RawConnection"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK "literal header field without indexing, new name", lengths below 127."""
    n, v = name.encode(), value.encode()
    if len(n) > 126 or len(v) > 126:
        raise ValueError(f"header {name}: expected a name and value below 127 bytes, got {len(n)} and {len(v)}")
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


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
        settings = b"" if window_bytes is None else struct.pack(">HI", 0x4, window_bytes)
        self.sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, settings) + _frame(SETTINGS, ACK, 0, b""))
        self._next_id = 1
        self._buf = b""
        self.finished: set[int] = set()
        self.reset: dict[int, int] = {}  # stream id -> RST_STREAM error code
        self.settings: dict[int, int] = {}  # the server's SETTINGS (id -> value)
        self.closed = False

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
        block = b"".join(
            _literal(k, v)
            for k, v in [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *metadata,
            ]
        )
        out = _frame(HEADERS, END_HEADERS, sid, block)
        if body_prefix_bytes > 0:
            body = b"\x00" + struct.pack(">I", declared_bytes) + bytes(body_prefix_bytes)
            out += _frame(DATA, 0, sid, body)
        self.sock.sendall(out)
        return sid

    def call(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]] = ()) -> int:
        """Open a stream for ``path`` and send one whole gRPC message (END_STREAM). Returns the stream id."""
        sid = self.start_call(path, metadata)
        body = b"\x00" + struct.pack(">I", len(message)) + message
        self.sock.sendall(_frame(DATA, END_STREAM, sid, body))
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
        self._parse()

    def _parse(self) -> None:
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                return
            kind, flags = self._buf[3], self._buf[4]
            sid = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            payload, self._buf = self._buf[9 : 9 + length], self._buf[9 + length :]
            if (kind == HEADERS and flags & END_STREAM) or kind == RST_STREAM:
                self.finished.add(sid)
            if kind == RST_STREAM:
                self.reset[sid] = int.from_bytes(payload[:4], "big")
            elif kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack(">HI", payload[i : i + 6])
                    self.settings[key] = value
            # GOAWAY: streams already running may still finish

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
