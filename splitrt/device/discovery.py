"""Discovery wiring on the device: follow the clouds discovery finds and keep an ``AdaptiveDevice``'s
cloud list up to date (``CloudFinder``; the cloud's side is ``splitrt.cloud.advertise``).

``CloudFinder(devices, static=[...])`` runs a ``discovery.Browser``; after every change it keeps the
servers that advertise each device's model (sha256), ranks them with ``discovery.rank`` (probed RTT
from the device's own cloud list, load from the TXT record) and calls ``AdaptiveDevice.set_clouds``
with the static addresses first (a configured ``--cloud`` is the user's choice), then the discovered
ones best first. It also re-ranks every ``rerank_s`` since RTTs change without any mDNS traffic.

A discovered server whose TXT record says ``secure=0`` (no TLS and bearer token: requests travel
unencrypted, anyone may use it) or says nothing (a server from before the ``secure`` key) is still used,
but the finder logs a warning naming it before it enters any device's list, once per address
(``CloudFinder.warnings`` keeps them). Static clouds are the user's choice: no warning.

Discovery only says where servers are; liveness comes from the runtime's probes and failover, so a
server that vanishes from mDNS is dropped from the list but a server still listed and dead costs
at most one failed RPC (then the next cloud, or the local tail).

- ``plan_clouds(servers, model_sha256, rtt_ms_by_address, static=(), *, tail_ms=10) -> list[str]`` (pure):
  static first, then the servers that serve the model, ``discovery.rank``ed; no duplicates.
- ``CloudFinder(devices, *, static=(), interfaces=None, browse=True, rerank_s=2)``: owns the devices' cloud
  lists (``AdaptiveDevice.set_clouds``) from a ``Browser``; ``.update(snapshot)`` feeds it by hand
  (``browse=False``), ``.wait_for_cloud(timeout_s) -> bool``, ``.close()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from splitrt.transport.discovery import ServerInfo, rank

log = logging.getLogger(__name__)


class _Target(Protocol):
    """What the finder needs of an ``AdaptiveDevice``."""

    @property
    def graph(self) -> Any: ...

    def set_clouds(self, addresses: Sequence[str]) -> None: ...

    def clouds(self) -> list[dict[str, object]]: ...


def plan_clouds(
    servers: Mapping[str, ServerInfo],
    model_sha256: str,
    rtt_ms_by_address: Mapping[str, float],
    static: Sequence[str] = (),
    *,
    tail_ms: float = 10.0,
) -> list[str]:
    """The cloud list for one model (pure): ``static`` first, then the discovered servers that serve
    ``model_sha256``, ranked by probed RTT + ``tail_ms`` x load (unprobed ones last), no duplicates."""
    rtts = {s.name: rtt_ms_by_address[s.address] for s in servers.values() if s.address in rtt_ms_by_address}
    ranked = rank(servers, rtts, tail_ms=tail_ms, model_sha256=model_sha256)
    out: list[str] = []
    for address in [*static, *(s.address for s in ranked)]:
        if address not in out:
            out.append(address)
    return out


class CloudFinder:
    """Keeps the cloud lists of ``devices`` in step with what discovery sees. Context manager.

    ``browse=False`` starts no Browser (tests, or a caller that feeds ``update`` itself); otherwise a
    ``discovery.Browser`` is made with ``interfaces`` (IPs to bind mDNS to; default all).
    ``on_update(address_lists)`` is called after each change of any list (for logs and metrics).
    """

    def __init__(
        self,
        devices: Sequence[_Target] | _Target,
        *,
        static: Sequence[str] = (),
        interfaces: Sequence[str] | None = None,
        browse: bool = True,
        rerank_s: float = 2.0,
        tail_ms: float = 10.0,
        recheck_s: float = 5.0,
        resolve_timeout_s: float = 3.0,
        on_update: Callable[[dict[str, list[str]]], None] | None = None,
    ) -> None:
        self.devices: list[_Target] = list(devices) if isinstance(devices, Sequence) else [devices]
        self.static = tuple(static)
        self.tail_ms = tail_ms
        self.on_update = on_update
        self._lock = threading.Lock()
        self._servers: dict[str, ServerInfo] = {}
        # The finder owns the lists from now on; start from what the devices have (no spurious update).
        self._lists: dict[int, list[str]] = {
            i: [str(c["address"]) for c in d.clouds()] for i, d in enumerate(self.devices)
        }
        self._stop = threading.Event()
        # address -> the warning logged for an insecure discovered server (once each)
        self.warnings: dict[str, str] = {}
        self.browser: Any = None
        self.update({})  # static clouds at once, before anything is found
        if browse:
            from splitrt.transport.discovery import Browser

            self.browser = Browser(
                self.update, interfaces=interfaces, recheck_s=recheck_s, resolve_timeout_s=resolve_timeout_s
            )
        self._thread: threading.Thread | None = None
        if rerank_s > 0:
            self._thread = threading.Thread(
                target=self._rerank_loop, args=(rerank_s,), name="splitrt-finder", daemon=True
            )
            self._thread.start()

    def servers(self) -> dict[str, ServerInfo]:
        with self._lock:
            return dict(self._servers)

    def update(self, servers: Mapping[str, ServerInfo]) -> None:
        """A new snapshot of the advertised servers (the Browser's ``on_change``)."""
        with self._lock:
            self._servers = dict(servers)
        self._apply()

    def _apply(self) -> None:
        with self._lock:
            servers = dict(self._servers)
            changed: dict[str, list[str]] = {}
            for i, dev in enumerate(self.devices):
                rtts = {
                    str(c["address"]): float(c["rtt_ms"])  # type: ignore[arg-type]
                    for c in dev.clouds()
                    if c.get("rtt_ms") is not None and c.get("up")
                }
                wanted = plan_clouds(servers, dev.graph.sha256, rtts, self.static, tail_ms=self.tail_ms)
                if wanted != self._lists.get(i):
                    self._warn_insecure(servers, wanted)  # before the device may send anything there
                    self._lists[i] = wanted
                    dev.set_clouds(wanted)
                    changed[dev.graph.path.name] = wanted
        if changed:
            log.info("finder: clouds now %s", changed)
            if self.on_update is not None:
                try:
                    self.on_update(changed)
                except Exception:
                    log.exception("finder: on_update failed")

    def _warn_insecure(self, servers: Mapping[str, ServerInfo], addresses: Sequence[str]) -> None:
        by_address = {s.address: s for s in servers.values()}
        for address in addresses:
            s = by_address.get(address)
            if s is None or s.secure is True or address in self.static or address in self.warnings:
                continue
            said = (
                "advertises secure=0 (no TLS and bearer token)"
                if s.secure is False
                else "does not advertise whether it is secure (a server from before the 'secure' key)"
            )
            msg = (
                f"finder: cloud {s.name!r} at {address} {said}: requests sent to it may travel unencrypted "
                "and anyone on the network may use or impersonate it"
            )
            self.warnings[address] = msg
            log.warning("%s", msg)

    def wait_for_cloud(self, timeout_s: float) -> bool:
        """Block until every device has at least one cloud (static or found); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if all(self._lists.get(i) for i in range(len(self.devices))):
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.wait(min(0.05, left)):
                return False

    def _rerank_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self._apply()
            except Exception:  # never let the thread die: the next round tries again
                log.exception("finder: re-rank failed")

    def close(self) -> None:
        self._stop.set()
        if self.browser is not None:
            self.browser.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def __enter__(self) -> CloudFinder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
