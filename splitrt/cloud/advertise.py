"""``splitrt serve --advertise``: announce a running ``CloudServer`` over zeroconf (``DiscoveryError`` for
a loopback-only server without ``addresses``) and keep its TXT record fresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from splitrt.errors import DiscoveryError

log = logging.getLogger(__name__)


def local_addresses() -> list[str]:
    """This host's (namespace's) non-loopback IPv4 addresses: what to advertise for a 0.0.0.0 server."""
    import socket

    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                out.append(a.address)
    return sorted(set(out))


class ServerAdvertiser:
    """Every ``every_s``, re-announce when the models changed, the load factor moved by more than 10 % or
    ``refresh_s`` passed; ``close()`` says goodbye: call it before draining the server."""

    def __init__(
        self,
        server: Any,
        *,
        name: str,
        addresses: Sequence[str] | None = None,
        interfaces: Sequence[str] | None = None,
        ttl_s: int = 120,
        every_s: float = 2.0,
        refresh_s: float = 30.0,
    ) -> None:
        from splitrt.cloud.guard.security import is_loopback
        from splitrt.transport.discovery import Advertiser

        self.server = server
        host = server.config.host
        if not addresses and is_loopback(host):
            raise DiscoveryError(
                f"advertise: expected a server devices can reach (--host IP or 0.0.0.0, or "
                f"--advertise-address for a relay in front of it), got --host {host}: "
                "only this machine can connect"
            )
        addrs = list(addresses or ([] if host in ("", "0.0.0.0", "::", "[::]") else [host]) or local_addresses())
        if not addrs:
            raise DiscoveryError(
                "advertise: expected a non-loopback address to advertise, got none (pass --advertise-address)"
            )
        # secure=1 only with TLS and a token: a loopback server behind a relay is as open as the relay.
        self.secure = bool(server.secure)
        self._models = server.model_hashes()
        self._load = server.load_factor()
        self._sent_s = time.monotonic()
        self.refresh_s = refresh_s
        self.advertiser = Advertiser(
            name,
            server.port,
            addrs,
            models=self._models,
            load=self._load,
            interfaces=interfaces,
            ttl_s=ttl_s,
            secure=self.secure,
        )
        self.addresses = addrs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), name="splitrt-advertise", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self.advertiser.name

    def refresh(self, *, force: bool = False) -> bool:
        """Re-announce if something changed enough; True when it did."""
        models = self.server.model_hashes()
        load = self.server.load_factor()
        stale = time.monotonic() - self._sent_s >= self.refresh_s
        if not force and models == self._models and abs(load - self._load) <= 0.1 * self._load and not stale:
            return False
        self.advertiser.update(load=load, models=models)
        self._models, self._load, self._sent_s = models, load, time.monotonic()
        return True

    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.refresh()
            except Exception:  # a failed announcement is retried next round
                log.exception("advertise: update failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.advertiser.close()
