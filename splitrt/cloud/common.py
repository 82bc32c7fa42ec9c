"""What every part of the cloud server shares: the internal ``RpcFailure``, the JSON-line event log and
the client of a peer; below every other module of ``cloud``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import sys
import time
from typing import Any

import grpc

log = logging.getLogger("splitrt.cloud")
# The longest any wait is given (``threading`` raises on gRPC's ~9.2e18 s left of a call with no deadline).
MAX_WAIT_S = 86_400.0
# One encoder for every line: ``json.dumps(..., default=str)`` builds a new one per call.
_encode = json.JSONEncoder(default=str).encode


class RpcFailure(Exception):
    """Internal: a request fails with a gRPC status (mapped to abort or to a stream frame's error)."""

    def __init__(self, code: grpc.StatusCode, message: str, *, retry_after_ms: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # Set when the queue was full: trailing ``retry-after-ms`` or a frame's ``Error.retry_after_ms``.
        self.retry_after_ms = retry_after_ms


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One JSON line on the ``splitrt.cloud`` logger."""
    if log.isEnabledFor(level):
        record = {"ts": round(time.time(), 6), "event": event, **fields}
        # ``log.log`` minus ``findCaller``'s walk up the stack (per request): the caller would be this line.
        log.handle(
            log.makeRecord(log.name, level, __file__, sys._getframe().f_lineno, _encode(record), (), None, "log_event")
        )


def disk_failure(exc: OSError, what: str) -> RpcFailure:
    """A server-side file error for a client, naming neither file nor errno: RESOURCE_EXHAUSTED when the
    disk is full, UNAVAILABLE otherwise."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what}: the server's disk is full (no space left for its files); nothing was kept, retry later",
        )
    return RpcFailure(
        grpc.StatusCode.UNAVAILABLE,
        f"{what}: the server cannot write its files now ({exc.strerror or type(exc).__name__}); retry later",
    )


def redact(text: str, roots: list[str]) -> str:
    """``text`` for a client: a path under any of ``roots`` (give each as configured and resolved) becomes
    ``<server path>``."""
    import re

    for root in sorted({r.rstrip("/") for r in roots if r and r.rstrip("/")}, key=len, reverse=True):
        text = re.sub(re.escape(root) + r"(?:/[^\s'\":,;()\[\]]*)?", "<server path>", text)
    return text


@functools.lru_cache(maxsize=4096)  # twice per call (lanes, fair queuing), for a connection's few peers
def peer_address(peer: str) -> str:
    """The address part of a gRPC peer string (``ipv4:10.0.0.5:51234`` -> ``10.0.0.5``,
    ``ipv6:[::1]:5`` -> ``::1``); anything else whole."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] or rest
        return host.strip("[]")
    return peer


def client_key(peer: str) -> str:
    """The fair-queuing client of a gRPC peer: its IPv4 address, or its IPv6 /64 (one host's share)."""
    return _client_of(peer_address(peer))


@functools.lru_cache(maxsize=4096)  # per call: ipaddress parses in Python
def _client_of(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
