"""The socket tests' one loopback server: ``splitrt serve`` as its own process on 127.0.0.1 and an
ephemeral port, for what only a real process and socket show (SIGKILL mid-stream, a restart on the same
port, gRPC's channel balancing). Tests that need a cloud that answers use ``tests.fakecloud``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitrt.rig.cloudserver import start_server
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
    ``["--next", "127.0.0.1:PORT"]``), once it listens (``rig.cloudserver.start_server``; its output to
    /dev/null). The caller ends it (``proc.kill()`` and ``reap``, or a SIGTERM)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    flags = ("--workers", "1", "--intra-op-threads", "1", *extra)
    return start_server(models_dir, *flags, port=port, env=env, log_path=Path(os.devnull), timeout_s=timeout_s).proc
