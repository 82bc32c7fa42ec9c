"""A TCP relay whose upstream connections come from another loopback address: a second client address for
tests (tests/test_proxy.py) and attacks (attacks/attacks_proxy.py) on one host."""

from __future__ import annotations

import contextlib
import socket
import threading


class SourceRelay:
    """A TCP relay on 127.0.0.1 whose upstream connections come from ``source``."""

    def __init__(self, target: str, source: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.source = (host, int(port)), source
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                up = socket.create_connection(self.target, timeout=10, source_address=(self.source, 0))
            except OSError:
                return
            up.settimeout(None)
            self.socks += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(1 << 16):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()
