"""The cloud inference server: ``server`` (lifecycle) and ``config`` over four concepts, ``handler`` (a request's
path), ``capacity`` (admission, memory, runs ended when they must), ``models`` (store, uploads, tail sessions)
and ``guard`` (defences at the door); ``metrics`` and ``advertise`` beside them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.cloud.server import CloudServer, ServerConfig, tokens_from_file

_NAMES = {"CloudServer": "server", "ServerConfig": "server", "tokens_from_file": "server", "server": ""}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="server")
