"""Zeroconf (mDNS/DNS-SD) discovery of cloud servers: advertise, browse, rank.

- :class:`Advertiser` (cloud side): registers ``<name>._splitrt._tcp.local.`` with TXT records
  ``version``, ``models`` (comma-separated sha256 prefixes, spilling into ``models1``, ``models2``, ...
  since one TXT string holds at most 255 bytes) and ``load`` (the cloud's load factor, 1.0 = idle; the
  same meaning as ``LoadEstimate.cloud_factor``) and ``secure`` (``1``: the server needs TLS and a bearer
  token; ``0``: it does not, and devices warn before using it; absent: a server from before this key);
  ``update_load`` re-announces.
- :class:`Browser` (device side): keeps a live dict ``name -> ServerInfo`` as servers come, change
  their TXT and go; calls ``on_change(snapshot)`` from zeroconf's browser thread after every change.
- :func:`rank`: pure ordering of servers by probed RTT and load.

A server that unregisters (clean close) disappears from browsers at once (goodbye packets). A server
that dies without a goodbye is dropped once its records expire (the advertiser's ``ttl_s``) and a
re-resolve gets no answer (the browser's recheck, see ``Browser._recheck_loop``): minutes, not
milliseconds, so liveness must come from probes; discovery only says where servers are.

Zeroconf and OS errors are mapped to :class:`~splitrt.errors.DiscoveryError`. Never run this on the
host's real interfaces in tests: only inside network namespaces the test made.

Command-line entry points (``splitrt discover`` and the namespace tests' ``python -m
splitrt.cli.discover advertise|browse``) are in :mod:`splitrt.cli.discover`.

- ``SERVICE_TYPE = "_splitrt._tcp.local."``; TXT ``version``, ``models`` (16-hex sha256 prefixes, comma
  separated, spilling into ``models1``, ...), ``load`` (cloud load factor, 1.0 = idle), ``secure`` (``1``: TLS +
  bearer token, ``0``: not; absent on older servers; ``decode_secure(props) -> bool | None``).
- ``Advertiser(name, port, addresses, *, version, models, load, interfaces=None, ttl_s=120, secure=None)``:
  registers in the constructor (~1.7 s); ``.update_load(load)``, ``.update(load=, models=)``, ``.close()``
  (goodbye).
- ``Browser(on_change=None, *, interfaces=None, resolve_timeout_s=3, recheck_s=5)``: ``.servers() -> dict[name,
  ServerInfo]``, ``.wait_for(pred, timeout_s)``, ``.close()``; ``on_change(snapshot)`` runs on zeroconf's
  thread.
- ``ServerInfo(name, host, port, addresses, version, models, load, secure=None)``, ``.address`` ("host:port"),
  ``.serves(sha256)``. ``rank(servers, rtt_ms_by_server, load_by_server=None, *, tail_ms=10, model_sha256=None)
  -> list[ServerInfo]`` (pure; unprobed servers last). Errors: ``DiscoveryError``.
- A server killed without goodbye is dropped only after its ``ttl_s`` + a failed re-resolve (the browser's
  recheck; zeroconf alone keeps PTRs >= 1125 s): liveness comes from probes, not discovery.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitrt import __version__
from splitrt.errors import DiscoveryError

__all__ = [
    "SERVICE_TYPE",
    "Advertiser",
    "Browser",
    "ServerInfo",
    "decode_secure",
    "decode_txt",
    "encode_txt",
    "rank",
]

log = logging.getLogger(__name__)

SERVICE_TYPE = "_splitrt._tcp.local."
MODEL_PREFIX_HEX = 16  # 64 bits of a sha256: plenty to tell models apart, 4x shorter in TXT
_TXT_VALUE_MAX = 255 - len("models99=")


# -- pure: TXT records, server records, ranking ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ServerInfo:
    """One advertised cloud server, as a browser sees it."""

    name: str  # instance name, without the service type
    host: str  # the address to connect to (first advertised address)
    port: int
    addresses: tuple[str, ...]
    version: str
    models: tuple[str, ...]  # sha256 hex prefixes (MODEL_PREFIX_HEX long, or full)
    load: float
    # TXT ``secure``: True = TLS + bearer token, False = the server says it is insecure, None = not said.
    secure: bool | None = None

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 in brackets), the form ``--cloud`` takes."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def serves(self, sha256: str) -> bool:
        """True when the server advertises the model with this sha256 (full hash or prefix)."""
        s = sha256.lower()
        return any(s.startswith(m) or m.startswith(s) for m in self.models)


def encode_txt(*, version: str, models: Iterable[str], load: float, secure: bool | None = None) -> dict[str, str]:
    """TXT properties for an advertisement; every key=value fits one 255-byte TXT string. ``secure``
    (None: key left out) says whether the server needs TLS and a bearer token."""
    if not (math.isfinite(load) and load >= 0):
        raise DiscoveryError(f"load: expected a finite number >= 0, got {load!r}")
    prefixes = []
    for m in models:
        if not re.fullmatch(r"[0-9a-fA-F]{8,64}", m):
            raise DiscoveryError(f"model hash: expected 8-64 hex digits (a sha256), got {m!r}")
        prefixes.append(m.lower()[:MODEL_PREFIX_HEX])
    txt = {"version": version, "load": f"{load:.4g}"}
    if secure is not None:
        txt["secure"] = "1" if secure else "0"
    chunks: list[str] = []
    for p in prefixes:
        if chunks and len(chunks[-1]) + 1 + len(p) <= _TXT_VALUE_MAX:
            chunks[-1] += "," + p
        else:
            chunks.append(p)
    for i, chunk in enumerate(chunks or [""]):
        txt["models" if i == 0 else f"models{i}"] = chunk
    return txt


def decode_txt(props: Mapping[str | bytes, str | bytes | None]) -> tuple[str, tuple[str, ...], float]:
    """``(version, models, load)`` from TXT properties; tolerant of missing or garbage fields (a
    server of another version must not break browsing): unknown load reads as ``inf``."""
    d: dict[str, str] = {}
    for k, v in props.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else k
        val = v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")
        d[key] = val
    models: list[str] = []
    keys = ["models"] + [f"models{i}" for i in range(1, 100)]
    for key in keys:
        if key not in d:
            break
        models += [m for m in d[key].split(",") if re.fullmatch(r"[0-9a-f]{8,64}", m)]
    try:
        load = float(d.get("load", "inf"))
    except ValueError:
        load = math.inf
    if not math.isfinite(load) or load < 0:
        load = math.inf
    return d.get("version", ""), tuple(models), load


def decode_secure(props: Mapping[str | bytes, str | bytes | None]) -> bool | None:
    """TXT ``secure``: True for ``1``, False for anything else that is present, None when absent."""
    for k, v in props.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else k
        if key == "secure":
            val = v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")
            return val.strip() == "1"
    return None


def rank(
    servers: Mapping[str, ServerInfo] | Iterable[ServerInfo],
    rtt_ms_by_server: Mapping[str, float],
    load_by_server: Mapping[str, float] | None = None,
    *,
    tail_ms: float = 10.0,
    model_sha256: str | None = None,
) -> list[ServerInfo]:
    """Servers best first. Pure.

    Score = ``rtt_ms + tail_ms * load``: the RTT the request pays plus a nominal tail compute time
    scaled by the server's load factor (``load_by_server``, e.g. from its Status, else the TXT load).
    Servers with no probed RTT (not yet reachable) come after every probed one, ordered by load.
    Ties break by name, so the order is deterministic. ``model_sha256`` keeps only servers that
    advertise that model. Keys of the mappings are server names.
    """
    items = list(servers.values()) if isinstance(servers, Mapping) else list(servers)
    loads = load_by_server or {}
    if model_sha256 is not None:
        items = [s for s in items if s.serves(model_sha256)]

    def key(s: ServerInfo) -> tuple[int, float, str]:
        load = loads.get(s.name, s.load)
        load = load if math.isfinite(load) else 1e6
        rtt = rtt_ms_by_server.get(s.name)
        if rtt is None or not math.isfinite(rtt):
            return (1, load, s.name)
        return (0, rtt + tail_ms * load, s.name)

    return sorted(items, key=key)


# -- zeroconf shell -------------------------------------------------------------------------------


def _zeroconf(interfaces: Sequence[str] | None, ipv6: bool) -> Any:
    from zeroconf import Error as ZeroconfError
    from zeroconf import InterfaceChoice, IPVersion, Zeroconf

    chosen: Any = list(interfaces) if interfaces else InterfaceChoice.All
    try:
        return Zeroconf(interfaces=chosen, ip_version=IPVersion.All if ipv6 else IPVersion.V4Only)
    except (ZeroconfError, OSError) as exc:
        raise DiscoveryError(
            f"zeroconf: expected to open mDNS sockets on {interfaces or 'all interfaces'}, got {exc!r}"
        ) from exc


def _instance(full_name: str) -> str:
    suffix = "." + SERVICE_TYPE
    return full_name[: -len(suffix)] if full_name.endswith(suffix) else full_name


class Advertiser:
    """Advertise one cloud server. Registering takes ~1.5 s (mDNS probing); ``close`` says goodbye.

    ``addresses``: the IPs clients should connect to; ``interfaces``: the IPs to bind mDNS to (default
    all). ``ttl_s`` bounds how long a crashed server lingers in browsers (zeroconf default 75 min for
    the PTR record; we use 120 s). ``secure`` goes into the TXT record (``secure=1``/``0``; None leaves
    it out). Usable as a context manager.
    """

    def __init__(
        self,
        name: str,
        port: int,
        addresses: Sequence[str],
        *,
        version: str = __version__,
        models: Iterable[str] = (),
        load: float = 1.0,
        interfaces: Sequence[str] | None = None,
        ttl_s: int = 120,
        allow_name_change: bool = False,
        secure: bool | None = None,
    ) -> None:
        from zeroconf import Error as ZeroconfError
        from zeroconf import ServiceInfo

        if not 0 < port < 65536:
            raise DiscoveryError(f"port: expected 1..65535, got {port!r}")
        if not addresses:
            raise DiscoveryError("addresses: expected at least one IP address, got none")
        try:
            packed = [ipaddress.ip_address(a).packed for a in addresses]
        except ValueError as exc:
            raise DiscoveryError(f"addresses: expected IP addresses, got {list(addresses)!r}") from exc
        self._version = version
        self._models = tuple(models)
        self._secure = secure
        self._txt = encode_txt(version=version, models=self._models, load=load, secure=secure)
        host = re.sub(r"[^A-Za-z0-9-]", "-", name).strip("-") or "splitrt"
        self._lock = threading.Lock()
        self._closed = False
        self._zc = _zeroconf(interfaces, any(len(p) == 16 for p in packed))
        self._info_args: dict[str, Any] = {
            "port": port,
            "server": f"{host}.local.",
            "addresses": packed,
            "host_ttl": ttl_s,
            "other_ttl": ttl_s,
        }
        try:
            self._info = ServiceInfo(
                SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", properties=dict(self._txt), **self._info_args
            )
            self._zc.register_service(self._info, allow_name_change=allow_name_change)
        except (ZeroconfError, OSError, ValueError) as exc:
            self._zc.close()
            raise DiscoveryError(
                f"advertise {name!r}: expected to register {SERVICE_TYPE} on port {port}, got {exc!r}"
            ) from exc

    @property
    def name(self) -> str:
        """The registered instance name (may differ from the requested one with allow_name_change)."""
        return _instance(self._info.name)

    @property
    def txt(self) -> dict[str, str]:
        return dict(self._txt)

    def update_load(self, load: float) -> None:
        """Re-announce with a new load factor (cheap; callers should still rate-limit, e.g. on a
        change of more than 10% or every few seconds)."""
        self.update(load=load)

    def update(self, *, load: float | None = None, models: Iterable[str] | None = None) -> None:
        """Re-announce with a new load and/or model list."""
        from zeroconf import Error as ZeroconfError
        from zeroconf import ServiceInfo

        with self._lock:
            if self._closed:
                raise DiscoveryError(f"advertiser {self.name!r}: expected open, got closed")
            if models is not None:
                self._models = tuple(models)
            new_load = float(load) if load is not None else float(self._txt["load"])
            self._txt = encode_txt(version=self._version, models=self._models, load=new_load, secure=self._secure)
            info = ServiceInfo(SERVICE_TYPE, self._info.name, properties=dict(self._txt), **self._info_args)
            try:
                self._zc.update_service(info)
                self._info = info
            except (ZeroconfError, OSError) as exc:
                raise DiscoveryError(f"advertiser {self.name!r}: update failed: {exc!r}") from exc

    def close(self) -> None:
        """Unregister (goodbye packets, so browsers drop it at once) and close; idempotent."""
        from zeroconf import Error as ZeroconfError

        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._zc.unregister_service(self._info)
            except (ZeroconfError, OSError) as exc:
                log.warning("discovery: goodbye for %s failed: %r", self.name, exc)
            finally:
                self._zc.close()

    def __enter__(self) -> Advertiser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Browser:
    """Follow ``_splitrt._tcp`` servers. ``on_change(servers)`` is called from zeroconf's browser
    thread with a fresh snapshot after every add, TXT update or removal (keep it quick; exceptions
    are logged, not raised). Usable as a context manager."""

    def __init__(
        self,
        on_change: Callable[[dict[str, ServerInfo]], None] | None = None,
        *,
        interfaces: Sequence[str] | None = None,
        ipv6: bool = False,
        resolve_timeout_s: float = 3.0,
        recheck_s: float | None = 5.0,
    ) -> None:
        from zeroconf import Error as ZeroconfError
        from zeroconf import ServiceBrowser

        self._on_change = on_change
        self._resolve_timeout_ms = int(resolve_timeout_s * 1000)
        self._servers: dict[str, ServerInfo] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._zc = _zeroconf(interfaces, ipv6)
        try:
            self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, handlers=[self._handle])
        except (ZeroconfError, OSError) as exc:
            self._zc.close()
            raise DiscoveryError(f"browse {SERVICE_TYPE}: expected to start, got {exc!r}") from exc
        self._stop = threading.Event()
        if recheck_s is not None:
            threading.Thread(target=self._recheck_loop, args=(recheck_s,), daemon=True).start()

    def servers(self) -> dict[str, ServerInfo]:
        """Snapshot of the live set, ``name -> ServerInfo``."""
        with self._cond:
            return dict(self._servers)

    def wait_for(self, predicate: Callable[[dict[str, ServerInfo]], bool], timeout_s: float) -> dict[str, ServerInfo]:
        """Block until ``predicate(snapshot)`` holds; raise DiscoveryError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(dict(self._servers)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DiscoveryError(
                        f"browse: expected the condition within {timeout_s} s, got servers {sorted(self._servers)}"
                    )
                self._cond.wait(left)
            return dict(self._servers)

    def _handle(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        from zeroconf import Error as ZeroconfError
        from zeroconf import IPVersion, ServiceStateChange

        instance = _instance(name)
        if state_change is ServiceStateChange.Removed:
            with self._cond:
                changed = self._servers.pop(instance, None) is not None
        else:
            try:
                info = zeroconf.get_service_info(service_type, name, timeout=self._resolve_timeout_ms)
            except (ZeroconfError, OSError) as exc:
                log.warning("discovery: resolving %s failed: %r", name, exc)
                return
            if info is None or info.port is None:
                log.info("discovery: %s did not resolve within the timeout", name)
                return
            addrs = tuple(info.parsed_addresses(IPVersion.V4Only)) + tuple(info.parsed_addresses(IPVersion.V6Only))
            if not addrs:
                return
            version, models, load = decode_txt(info.properties)
            server = ServerInfo(
                name=instance,
                host=addrs[0],
                port=int(info.port),
                addresses=addrs,
                version=version,
                models=models,
                load=load,
                secure=decode_secure(info.properties),
            )
            with self._cond:
                changed = self._servers.get(instance) != server
                self._servers[instance] = server
        if not changed:
            return
        with self._cond:
            self._cond.notify_all()
            snapshot = dict(self._servers)
        if self._on_change is not None:
            try:
                self._on_change(snapshot)
            except Exception:
                log.exception("discovery: on_change callback failed")

    def _recheck_loop(self, every_s: float) -> None:
        """Drop servers that died without a goodbye. Zeroconf keeps a PTR record at least 1125 s
        (``_DNS_PTR_MIN_TTL``) whatever the advertised TTL, so its browser alone would show a crashed
        server for ~19 min. Every ``every_s`` we resolve each known server: while its SRV/TXT/A records
        are fresh (the advertiser's ``ttl_s``) this is a cache hit with no traffic; once they expired
        it is one query, and no answer within ``resolve_timeout_s`` removes the server."""
        while not self._stop.wait(every_s):
            for name in list(self.servers()):
                if self._stop.is_set():
                    return
                try:
                    info = self._zc.get_service_info(
                        SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", timeout=self._resolve_timeout_ms
                    )
                except Exception as exc:  # a closing zeroconf raises various errors: stop quietly
                    log.debug("discovery: recheck of %s failed: %r", name, exc)
                    return
                if info is not None:
                    continue
                with self._cond:
                    if self._servers.pop(name, None) is None:
                        continue
                    self._cond.notify_all()
                    snapshot = dict(self._servers)
                log.info("discovery: %s stopped answering; dropped", name)
                if self._on_change is not None:
                    try:
                        self._on_change(snapshot)
                    except Exception:
                        log.exception("discovery: on_change callback failed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with contextlib.suppress(Exception):
            self._browser.cancel()
        self._zc.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
