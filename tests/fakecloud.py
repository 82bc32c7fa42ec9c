"""A working cloud without a socket: a real ``CloudServer``'s servicer (real onnxruntime tails), unstarted,
reached through ``splitrt.transport.inprocess.InProcessTransport``. For runtime tests that need a cloud
that answers, not the socket behaviour (a killed process, a refused connection, a call cancelled at its
deadline, TLS): those start real servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.transport.inprocess import InProcessTransport


class FakeCloud:
    """``connect`` is ``AdaptiveDevice(connect=...)``'s; ``address`` names the cloud (any string: no port
    is bound); ``connects`` counts the transports made (one per cloud, one more after each failure).
    ``server_config``: more ``ServerConfig`` fields (workers 1, one intra-op thread by default)."""

    def __init__(self, models_dir: Path, address: str = "in-process-a", **server_config: Any) -> None:
        cfg: dict[str, Any] = {"workers": 1, "intra_op_threads": 1, **server_config}
        self.server = CloudServer(ServerConfig(models_dir=models_dir, **cfg))
        self.address = address
        self.connects = 0

    def connect(self, address: str) -> InProcessTransport:
        self.connects += 1
        return InProcessTransport(self.server.servicer, address=address)


def connect_any(*clouds: FakeCloud) -> Callable[[str], InProcessTransport]:
    """One ``connect`` for several fake clouds, by address."""
    by_address = {c.address: c for c in clouds}
    return lambda address: by_address[address].connect(address)
