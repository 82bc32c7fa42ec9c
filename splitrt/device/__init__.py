"""The device side, four concepts: :mod:`.client` (``Device``: a model on this device and its cloud, the
Python API apps use), :mod:`.runtime` (``AdaptiveDevice``: the plan per request, the route's servers with
failover and the local fallback, what each request teaches), :mod:`.discovery` (``CloudFinder``: the clouds
from mDNS or DNS) and :mod:`.daemon` (the long-running service and its local API)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.device.client import Device, DeviceConfig, HeadResult, ProbeResult, SplitResult, read_token
    from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, load_config
    from splitrt.device.discovery import CloudFinder
    from splitrt.device.runtime import AdaptiveDevice, Outcome, RuntimeConfig

_NAMES = {
    "Device": "client",
    "DeviceConfig": "client",
    "HeadResult": "client",
    "ProbeResult": "client",
    "SplitResult": "client",
    "read_token": "client",
    "Daemon": "daemon",
    "DaemonConfig": "daemon",
    "LocalClient": "daemon",
    "load_config": "daemon",
    "CloudFinder": "discovery",
    "AdaptiveDevice": "runtime",
    "Outcome": "runtime",
    "RuntimeConfig": "runtime",
    "client": "",
    "daemon": "",
    "discovery": "",
    "runtime": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="client")
