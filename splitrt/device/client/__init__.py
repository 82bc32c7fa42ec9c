"""The device client: a model on this device (``Device``: its head and tail sessions, the input checks) and its
cloud (``Remote``: the transport, the model check and upload, one request's round trip).

:mod:`.device` (``Device``; its contract in the docstring), :mod:`.config` (``DeviceConfig``, ``read_token``),
:mod:`.inputs` (a request's inputs checked), :mod:`.sessions` (onnxruntime sessions per cut), :mod:`.messages`
(what goes on the wire and what comes back: ``HeadResult``, ``SplitResult``, ``ProbeResult``), :mod:`.remote`
(``Remote``), :mod:`.upload` (the model check and upload). The public names of each are re-exported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.device.client.config import DeviceConfig, read_token
    from splitrt.device.client.device import DEVICE_CUT, Device
    from splitrt.device.client.messages import HeadResult, ProbeResult, SplitResult
    from splitrt.device.client.remote import Remote

_NAMES = {
    "DEVICE_CUT": "device",
    "Device": "device",
    "DeviceConfig": "config",
    "read_token": "config",
    "HeadResult": "messages",
    "ProbeResult": "messages",
    "SplitResult": "messages",
    "Remote": "remote",
    "config": "",
    "device": "",
    "inputs": "",
    "messages": "",
    "remote": "",
    "sessions": "",
    "upload": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
