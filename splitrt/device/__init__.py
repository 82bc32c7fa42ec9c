"""The device side: the gRPC client with local fallback, the adaptive runtime (controller +
estimators + prober around it), streams, the long-running daemon and its cloud finder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.device.client import Device, HeadResult, ProbeResult, SplitResult
    from splitrt.device.config import DeviceConfig, read_token
    from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, load_config
    from splitrt.device.runtime import AdaptiveDevice, Outcome, RuntimeConfig

_NAMES = {
    "Device": "client",
    "DeviceConfig": "config",
    "HeadResult": "client",
    "ProbeResult": "messages",
    "SplitResult": "client",
    "read_token": "config",
    "Daemon": "daemon",
    "DaemonConfig": "daemon",
    "LocalClient": "daemon",
    "load_config": "daemon",
    "AdaptiveDevice": "runtime",
    "Outcome": "runtime",
    "RuntimeConfig": "runtime",
    "client": "",
    "daemon": "",
    "finder": "",
    "runtime": "",
    "stream": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="client")
