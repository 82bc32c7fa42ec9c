"""Bearer-token authentication on a call's metadata alone, and the per-peer throttle of failures.
``Tokens.check(metadata)`` compares ``authorization: Bearer T`` with every token in constant time.
``AuthThrottle`` (pure: ``now_s``) makes an address that failed ``free_failures`` times wait ``base_s``,
doubling up to ``max_s``, its calls refused unchecked except on a connection that already
authenticated. Tokens are never logged nor in a repr.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cachetools import FIFOCache

from splitrt.cloud.common import peer_address

__all__ = ["AuthThrottle", "ThrottleConfig", "Tokens", "Verdict", "forwarded_peer", "peer_address", "token_matches"]


class Verdict(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no bearer token at all
    WRONG = "wrong"  # a token that is not one of ours


def token_matches(given: bytes, tokens: tuple[bytes, ...]) -> bool:
    """True when ``given`` is one of ``tokens``, in constant time: every token compared, by
    ``hmac.compare_digest`` on sha256 digests (not even a length shows)."""
    digest = hashlib.sha256(given).digest()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(digest, hashlib.sha256(t).digest())
    return ok and bool(given)


class Tokens:
    """The accepted bearer tokens (never in a repr)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)

    def __repr__(self) -> str:
        return f"Tokens({len(self._tokens)} tokens)"

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def check(self, metadata: Iterable[tuple[str, Any]] | None) -> Verdict:
        auth = ""
        for key, value in metadata or ():
            if key == "authorization":
                auth = value if isinstance(value, str) else value.decode("utf-8", "replace")
        if not auth:
            return Verdict.MISSING
        given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
        return Verdict.OK if token_matches(given, self._tokens) else Verdict.WRONG


@dataclass(frozen=True, kw_only=True)
class ThrottleConfig:
    # Failures an address may make before it has to wait.
    free_failures: int = 10
    # The first wait; each further failure doubles it, up to ``max_s``.
    base_s: float = 1.0
    max_s: float = 60.0
    # An address with no failure for this long starts afresh.
    forget_s: float = 600.0
    # Addresses and authenticated connections remembered (oldest forgotten first).
    max_peers: int = 4096


@dataclass
class _Record:
    failures: int = 0
    until_s: float = 0.0  # refused before this time
    last_s: float = 0.0


class AuthThrottle:
    """Failed authentications per peer address, with exponential backoff (not thread-safe: the front
    door calls it under its lock)."""

    def __init__(self, config: ThrottleConfig | None = None) -> None:
        self.config = config or ThrottleConfig()
        # Both forget the least recently written first (a FIFO where a write moves the key last; a lookup
        # does not count: a peer that only asks must not stay remembered by asking).
        size = max(1, self.config.max_peers)  # (a cachetools cache holds at least one)
        self._peers: FIFOCache[str, _Record] = FIFOCache(maxsize=size)
        # connections (full peer strings) that authenticated
        self._trusted: FIFOCache[str, None] = FIFOCache(maxsize=size)

    def wait_s(self, peer: str, now_s: float) -> float:
        """Seconds the peer's address must still wait (0: its token is checked). A connection that has
        authenticated before never waits."""
        if peer in self._trusted:
            return 0.0
        rec = self._peers.get(peer_address(peer))
        if rec is None:
            return 0.0
        if now_s - rec.last_s > self.config.forget_s:
            del self._peers[peer_address(peer)]
            return 0.0
        return max(0.0, rec.until_s - now_s)

    def failed(self, peer: str, now_s: float) -> float:
        """Record a failure; returns the wait it starts (0: still free)."""
        addr = peer_address(peer)
        rec = self._peers.get(addr) or _Record()
        if now_s - rec.last_s > self.config.forget_s:
            rec = _Record()
        rec.failures += 1
        rec.last_s = now_s
        over = rec.failures - self.config.free_failures
        wait = 0.0 if over <= 0 else min(self.config.max_s, self.config.base_s * 2.0 ** (over - 1))
        rec.until_s = now_s + wait
        self._peers[addr] = rec  # last written: forgotten last
        return wait

    def succeeded(self, peer: str) -> None:
        """The connection authenticated: it never waits, and its address starts afresh."""
        self._peers.pop(peer_address(peer), None)
        self._trusted[peer] = None  # moved last when already there

    def waiting(self, now_s: float) -> int:
        """Addresses that wait now (a gauge for metrics)."""
        return sum(1 for r in self._peers.values() if r.until_s > now_s)


def forwarded_peer(metadata: Any) -> str | None:
    """The client a proxy names as a gRPC peer string (``ipv4:A:P``, ``ipv6:[A]:P``): A the last
    ``x-forwarded-for``, P ``x-forwarded-client-port`` or 0; None without an address."""
    found: dict[str, str] = {}
    for key, v in metadata or ():
        if key in ("x-forwarded-for", "x-forwarded-client-port"):
            found[key] = v.decode("ascii", "replace") if isinstance(v, bytes) else str(v)
    try:
        ip = ipaddress.ip_address(found.get("x-forwarded-for", "").rpartition(",")[2].strip())
    except ValueError:
        return None
    port = found.get("x-forwarded-client-port", "0").strip()
    port = port if port.isdigit() and len(port) <= 5 else "0"
    return f"ipv4:{ip}:{port}" if ip.version == 4 else f"ipv6:[{ip}]:{port}"
