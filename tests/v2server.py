"""A real third-party Open Inference Protocol v2 server for the tests: MLServer from PyPI, in its OWN venv
(its pins would fight ours), installed once and cached, started on 127.0.0.1 ephemeral ports.

- ``server_venv()``: ``$SPLITRT_V2SERVER_VENV``, else ``~/.cache/splitrt/v2server-venv`` (``$XDG_CACHE_HOME``
  honoured); (re)installed when its stamp does not name ``REQUIREMENTS``. Needs the package index: without
  it the test FAILS with pip's reason (a skip would hide that the v2 path is untested).
- ``MLServer(repository, venv)``: ``mlserver start`` as a child process; ``.address`` is ``v2://...``.

Used by tests/cloud/test_v2_mlserver.py.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitrt.errors import CloudError
from splitrt.transport.v2 import V2Transport

MLSERVER = "mlserver==1.7.1"
# The same onnxruntime as ours: the tails must compute what the device's local fallback computes.
REQUIREMENTS = (MLSERVER, f"onnxruntime=={importlib.metadata.version('onnxruntime')}")
STAMP = ".splitrt-installed"
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 120


def venv_dir() -> Path:
    env = os.environ.get("SPLITRT_V2SERVER_VENV")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    return cache / "splitrt" / "v2server-venv"


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{what}: expected it to finish within {INSTALL_TIMEOUT_S} s, got a timeout "
            f"(package index unreachable?): {exc}"
        )
    if proc.returncode != 0:
        # pip's own words say whether the index was unreachable (no network) or a pin failed.
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "is ignored" not in ln]
        pytest.fail(
            f"{what}: expected exit 0, got {proc.returncode} (no network or no package index?):\n"
            + "\n".join(lines[-25:])
        )


def server_venv() -> Path:
    """The cached MLServer venv, installed (under a lock, once) if missing or stale."""
    venv = venv_dir()
    want = "\n".join(REQUIREMENTS) + "\n"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be installing it right now
        stamp = venv / STAMP
        if stamp.exists() and stamp.read_text() == want and (venv / "bin" / "mlserver").exists():
            return venv
        if venv.exists():
            shutil.rmtree(venv)  # half-installed or other pins: start over
        t0 = time.monotonic()
        _run([sys.executable, "-m", "venv", str(venv)], f"python -m venv {venv}")
        _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
            f"pip install {' '.join(REQUIREMENTS)} into {venv}",
        )
        seconds = time.monotonic() - t0
        (venv / "install-seconds").write_text(f"{seconds:.1f}\n")
        print(f"installed {' '.join(REQUIREMENTS)} into {venv} in {seconds:.1f} s", file=sys.stderr)
        stamp.write_text(want)
    return venv


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (held together while picked, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class MLServer:
    """``mlserver start repository`` on 127.0.0.1 (gRPC, HTTP and metrics on free ports), one worker
    process (no parallel inference pool: 2 cores), until ``stop()``."""

    def __init__(self, repository: Path, venv: Path, workdir: Path) -> None:
        self.grpc_port, http_port, metrics_port = free_ports(3)
        env = {
            **os.environ,
            "MLSERVER_HOST": "127.0.0.1",
            "MLSERVER_GRPC_PORT": str(self.grpc_port),
            "MLSERVER_HTTP_PORT": str(http_port),
            "MLSERVER_METRICS_PORT": str(metrics_port),
            "MLSERVER_PARALLEL_WORKERS": "0",
            "MLSERVER_DEBUG": "false",
            "OMP_NUM_THREADS": "1",
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "mlserver.log"
        self._log = self.log_path.open("wb")
        # cwd: MLServer writes .metrics/ and .envs/ there.
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(repository)],
            cwd=workdir,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.address = f"v2://127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        """Poll ServerReady until the models are loaded; fail with the server's log otherwise."""
        probe = V2Transport(self.address)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(f"mlserver exited with {self.proc.returncode} before it was ready:\n{self.log()}")
                try:
                    probe.status(timeout_s=2.0)
                    return
                except CloudError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"mlserver not ready within {START_TIMEOUT_S} s:\n{self.log()}")
                    time.sleep(0.5)
        finally:
            probe.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
