"""Time and count limits on what a client can hold (``ServerConfig.limits``; each field with its ``splitrt
serve`` flag), applied per call by ``guard.door``, and the gRPC core options of the per-stream ones (a
fixed receive window). Connections are the edge proxy's: docs/operator/proxy.md.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from splitrt.errors import ConfigError

__all__ = ["Limits", "flag", "grpc_options"]


def flag(default: Any, name: str, help: str, *, metavar: str | None = None, scale: int = 1) -> Any:
    """A field with its ``splitrt serve`` flag: the CLI's flags and their help are read from the dataclass
    (``cli.serve``), not copied. ``scale``: the flag's unit in the field's (KiB -> bytes; 0 -> None)."""
    return field(default=default, metadata={"flag": name, "help": help, "metavar": metavar, "scale": scale})


@dataclass(frozen=True, kw_only=True)
class Limits:
    read_timeout_s: float = flag(
        30.0,
        "--read-timeout-s",
        "a request message, upload chunk or reply the client must take: within this (default 30)",
    )
    # A health Check's request (tiny; needs no token): a shorter wait.
    health_read_timeout_s: float = 5.0
    stream_idle_s: float = flag(
        120.0, "--stream-idle-s", "InferStream: the next frame within this or the stream ends (default 120)"
    )
    max_calls: int = flag(
        256,
        "--max-calls",
        "inference calls at once, working or waiting on their client (default 256; at least workers + max-queue + 8)",
    )
    calls_per_peer: int = flag(
        64, "--calls-per-peer", "inference calls one peer address may hold at once (default 64; other lanes: half)"
    )
    status_calls: int = flag(8, "--status-lane", "Status calls at once, apart from inference (default 8)")
    probe_calls: int = flag(
        8,
        "--probe-lane",
        "Probe calls at once, apart from inference (default 8; their bytes are reserved before the body is read)",
    )
    # Receiving, hashing and checking models is work for one client: a burst of uploads waits on its client.
    upload_calls: int = flag(
        4, "--upload-lane", "uploads (PutModel) at once, apart from inference (default 4; one address: half)"
    )
    health_calls: int = flag(16, "--health-lane", "health Check calls at once, apart from the rest (default 16)")
    watch_streams: int = flag(8, "--max-watch-streams", "health Watch streams at once (default 8)")
    # A call from any other peer is its own client, whatever x-forwarded-for it sends.
    trusted_proxies: tuple[str, ...] = flag(
        (),
        "--trusted-proxy",
        (
            "a proxy in front (repeatable; e.g. 127.0.0.1 for deploy/proxy/haproxy.cfg as a sidecar): its "
            "x-forwarded-for names the client for per-client limits and fair queuing"
        ),
        metavar="IP",
    )
    saturated_s: float = flag(
        10.0,
        "--saturated-s",
        "health says NOT_SERVING while every worker and queue place has been held this long (default 10)",
    )
    max_run_s: float | None = flag(
        None,
        "--max-run-s",
        (
            "terminate a tail run after this (default: derived per segment from its measured time and the "
            "model's size, at least 2 s)"
        ),
    )
    watch_max_age_s: float = flag(
        300.0, "--watch-max-age-s", "a health Watch stream ends after this (UNAVAILABLE: watch again; default 300)"
    )
    connection_age_s: float | None = flag(
        None,
        "--max-connection-age-s",
        "tell a connection to go away after this (default: never; streams longer than it and its grace are cut)",
    )
    connection_age_grace_s: float = flag(
        60.0, "--max-connection-age-grace-s", "calls in flight on an aged connection get this long (default 60)"
    )
    # Bytes of a message a client may send before the server reads it (HTTP/2 initial stream window; the
    # rest follows once it is read); None: gRPC's default, sized by BDP probing (unbounded). A message about
    # as large as the window costs more than one well inside it: 2 MiB keeps 1 MB tensors inside.
    stream_window_bytes: int | None = flag(
        2 << 20,
        "--stream-window-kb",
        (
            "bytes (KiB) of a message a client may send before the server reads it; a call refused on its "
            "headers pushes at most this much (default 2048; 0: gRPC's BDP-sized windows, unbounded)"
        ),
        scale=1024,
    )
    # Failed authentications a peer address may make before it waits ``auth_backoff_s``, doubling per
    # further failure up to ``auth_backoff_max_s`` (``auth.AuthThrottle``).
    auth_free_failures: int = flag(
        10, "--auth-free-failures", "failed authentications a peer address may make before it must wait (default 10)"
    )
    auth_backoff_s: float = 1.0
    auth_backoff_max_s: float = flag(
        60.0,
        "--auth-backoff-max-s",
        "longest wait of a peer address after failed authentications (doubling from 1 s; default 60)",
    )
    # Refusals, failures and served requests: at most a few lines per kind (a request's: per status code) per
    # interval, then one summary line; ``log_every_request`` logs a line per request (debugging).
    log_interval_s: float = 10.0
    log_every_request: bool = flag(
        False,
        "--log-every-request",
        (
            "log a line per served request (default: the first 5 per status code every 10 s, the rest counted "
            "in one summary line)"
        ),
    )

    def check(self) -> None:
        for name in (
            "read_timeout_s",
            "health_read_timeout_s",
            "stream_idle_s",
            "watch_max_age_s",
            "auth_backoff_s",
            "auth_backoff_max_s",
            "log_interval_s",
            "saturated_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"limits.{name}: expected > 0 seconds, got {getattr(self, name)}")
        for name in (
            "max_calls",
            "calls_per_peer",
            "status_calls",
            "probe_calls",
            "upload_calls",
            "health_calls",
            "watch_streams",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"limits.{name}: expected >= 1, got {getattr(self, name)}")
        if self.auth_free_failures < 0:
            raise ConfigError(f"limits.auth_free_failures: expected >= 0, got {self.auth_free_failures}")
        if self.stream_window_bytes is not None and not 65_535 <= self.stream_window_bytes < 2**31:
            raise ConfigError(
                f"limits.stream_window_bytes: expected 65535 to 2**31 - 1 or None, got {self.stream_window_bytes}"
            )
        for address in self.trusted_proxies:
            try:
                ipaddress.ip_address(address)
            except ValueError as exc:
                raise ConfigError(f"limits.trusted_proxies: expected IP addresses, got {address!r}") from exc
        if self.max_run_s is not None and not self.max_run_s > 0:
            raise ConfigError(f"limits.max_run_s: expected > 0 seconds or None, got {self.max_run_s}")
        if self.connection_age_s is not None and not self.connection_age_s > 0:
            raise ConfigError(f"limits.connection_age_s: expected > 0 seconds or None, got {self.connection_age_s}")


MAX_FRAME_BYTES = 2**24 - 1  # HTTP/2's largest SETTINGS_MAX_FRAME_SIZE (RFC 9113 6.5.2)


def _ms(seconds: float) -> int:
    return max(1, min(2**31 - 1, int(seconds * 1000)))


def grpc_options(limits: Limits) -> list[tuple[str, Any]]:
    """gRPC core channel arguments: the stream window and the connection age (names as in grpc's
    ``channel_arg_names.h``)."""
    opts: list[tuple[str, Any]] = []
    if limits.stream_window_bytes is not None:
        # BDP probing would grow the frame size the server accepts with the window; without it frames stay
        # at HTTP/2's 16 KiB, a cost per frame on large messages. A frame as large as the window is no
        # more than flow control lets a stream send anyway.
        window = limits.stream_window_bytes
        opts += [
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", window),
            ("grpc.http2.max_frame_size", min(window, MAX_FRAME_BYTES)),
        ]
    if limits.connection_age_s is not None:
        opts += [
            ("grpc.max_connection_age_ms", _ms(limits.connection_age_s)),
            ("grpc.max_connection_age_grace_ms", _ms(limits.connection_age_grace_s)),
        ]
    return opts
