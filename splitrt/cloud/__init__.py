"""The cloud inference server: model store, tail sessions, admission, load reporting, probes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.cloud.server import CloudServer, ServerConfig, tokens_from_file

_NAMES = {"CloudServer": "server", "ServerConfig": "server", "tokens_from_file": "server", "server": ""}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="server")
