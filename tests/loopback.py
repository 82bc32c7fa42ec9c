"""The socket tests' one loopback server: ``splitrt serve`` as its own process on 127.0.0.1 and an
ephemeral port, for what only a real process and socket show (SIGKILL mid-stream, a restart on the same
port, gRPC's channel balancing). Tests that need a cloud that answers use ``tests.fakecloud``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitrt.rig.processes import free_port as free_port  # re-exported: the one copy


def reap(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """Kill ``proc`` if it still runs, wait for it, and close its pipes (left to the garbage collector,
    they are ResourceWarnings, errors under ``filterwarnings = error``)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout_s)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def serve(
    models_dir: Path, port: int, *, timeout_s: float = 30.0, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """``splitrt serve --models models_dir --port port`` (one worker, one thread; ``extra`` flags, e.g.
    ``["--next", "127.0.0.1:PORT"]``), once it listens."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "splitrt.cli",
            "serve",
            "--models",
            str(models_dir),
            "--port",
            str(port),
            "--workers",
            "1",
            "--intra-op-threads",
            "1",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    raise AssertionError(f"splitrt serve did not listen on 127.0.0.1:{port} within {timeout_s:g} s")
