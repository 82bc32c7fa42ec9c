"""A working cloud without a socket: a real ``CloudServer``'s servicer (real onnxruntime tails), unstarted,
reached through ``splitrt.transport.inprocess.InProcessTransport``. For runtime tests that need a cloud
that answers, not the socket behaviour (a killed process, a refused connection, TLS): those start real
servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.transport.inprocess import InProcessTransport


class FakeCloud:
    """``connect`` is ``AdaptiveDevice(connect=...)``'s; ``address`` names the cloud (any string: no port
    is bound); ``connects`` counts the transports made (one per cloud, one more after each failure)."""

    def __init__(self, models_dir: Path, address: str = "in-process-a") -> None:
        self.server = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
        self.address = address
        self.connects = 0

    def connect(self, address: str) -> InProcessTransport:
        self.connects += 1
        return InProcessTransport(self.server.servicer, address=address)
