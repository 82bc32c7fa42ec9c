"""The rig's cloud: one ``splitrt serve`` process on 127.0.0.1 (in the cloud namespace with the kernel
link, in the host's with the userspace link) serving the models of the rig's models directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt.errors import RigError

if TYPE_CHECKING:
    from splitrt.rig import netns
    from splitrt.rig.processes import Children

CLOUD_PORT = 50051  # the server's port inside the cloud namespace (kernel link): the namespace is ours


class CloudProcess:
    """Starts, waits for and restarts the server; ``proc`` is the running one (None before ``start``)."""

    log_name = "cloud.log"  # in the rig's workdir

    def __init__(self, children: Children, models_dir: Path, *, workers: int) -> None:
        self.children = children
        self.models_dir = models_dir
        self.workers = workers
        self.proc: subprocess.Popen[Any] | None = None
        self.host: netns.Host | None = None
        self.port = 0
        self.listen = "127.0.0.1"  # 0.0.0.0: reachable on the namespace's address (then plaintext)
        self.extra: list[str] = []  # more ``serve`` options (``--next``, ``--intra-op-threads``)

    def argv(self, host: str, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "splitrt.cli",
            "serve",
            "--models",
            str(self.models_dir),
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            str(self.workers),
            "--log-level",
            "WARNING",
            *(["--insecure"] if host == "0.0.0.0" else []),
            *self.extra,
        ]

    def start(self, host: netns.Host | None, port: int, *, wait: bool = True) -> None:
        """Serve on ``listen``:``port`` inside ``host``'s namespace (None: this one); returns once it listens
        (``wait``), or at once (then ``wait(host, port)``: several servers start side by side)."""
        self.host, self.port = host, port
        self.proc = self.children.popen(self.argv(self.listen, port), self.log_name, host=host)
        if wait:
            self.wait()

    def wait(self, timeout_s: float = 60.0) -> None:
        """Until the server listens (``RigError`` if it exits first or takes longer)."""

        def probe() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
            return False

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RigError(
                    f"server ({self.log_name}) exited with code {self.proc.returncode}: "
                    f"{(self.children.workdir / self.log_name).read_text()[-2000:]}"
                )
            if self.host.call(probe) if self.host is not None else probe():
                return
            time.sleep(0.2)
        raise RigError(f"server ({self.log_name}) did not listen on port {self.port} within {timeout_s:.0f} s")

    @staticmethod
    def copy_into(models_dir: Path, path: Path) -> Path | None:
        """The copy made, or None if the model was there already (hard link when on the same fs)."""
        dst = models_dir / path.name
        if dst.exists():
            return None
        try:
            os.link(path, dst)
        except OSError:
            shutil.copyfile(path, dst)
        return dst
