"""``splitrt serve`` as a child process: the one launcher the rig, the tests and the benchmarks share, and the
rig's cloud (``CloudProcess``: one server on 127.0.0.1, in the cloud namespace with the kernel link, in the
host's with the userspace link, serving the rig's models directory).

``start_server(models_dir, *flags, port=, ...) -> ServerProcess`` runs ``[*command, "serve", "--models",
models_dir, "--port", port, *flags]`` (``command``: ``python -m splitrt.cli`` of this interpreter by default, or
e.g. an installed ``splitrt`` script, or a ``prlimit ... --`` prefix before it) and, with ``wait``, returns
once the server is ready: a TCP connection to 127.0.0.1:``port`` succeeds (``reachable`` tests it, e.g. inside
a network namespace) or its ``listening`` event arrives. ``RigError`` names the exit code and the end of the
server's output when it exits first, or the timeout when it does not listen within ``timeout_s``.

- ``port``: ``None`` picks a free one here (``free_port``: free when picked, not reserved); ``0`` lets the
  server choose, told by its ``listening`` event (then stderr must be read here and the log level be INFO).
- Output: by default stderr is read here, each JSON line kept in ``events`` (at most ``MAX_EVENTS``), every
  line's end in ``tail``; ``log_path``: stdout and stderr appended to that file instead (``events`` stays
  empty). ``popen``: the caller starts the process (``popen(argv) -> Popen``, e.g. the rig's ``Children`` with
  its logs and death signal) and owns its output; ``log_path`` then only names where the output went.
- Environment: ``env`` (default ``os.environ``) with ``PYTHONPATH=pythonpath`` when given; the working
  directory is ``cwd``, else ``pythonpath``: ``python -m`` puts the working directory first on ``sys.path``, so
  a server started from a checkout would run the checkout's splitrt whatever ``PYTHONPATH`` says.
- ``ServerProcess.stop(grace_s)`` sends SIGTERM (the server drains), SIGKILLs after ``grace_s``, closes the
  pipes it opened and returns the exit code; calling it again (or after the process exited) returns the
  code. A ``ServerProcess`` is a context manager that stops it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from splitrt.errors import RigError
from splitrt.rig.processes import free_port

if TYPE_CHECKING:
    from splitrt.rig import netns
    from splitrt.rig.processes import Children

CLOUD_PORT = 50051  # the server's port inside the cloud namespace (kernel link): the namespace is ours
MAX_EVENTS = 100_000  # JSON lines kept from a server's stderr (one per request with --log-every-request)
PYTHON_CLI = (sys.executable, "-m", "splitrt.cli")


def connects(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP connection to ``host:port`` succeeds now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


class ServerProcess:
    """A started ``splitrt serve`` (see the module's docstring); ``proc`` is its ``Popen``."""

    def __init__(self, proc: subprocess.Popen[Any], port: int, log_path: Path | None) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self._cond = threading.Condition()
        self._eof = proc.stderr is None
        self._reader: threading.Thread | None = None
        if proc.stderr is not None:
            self._reader = threading.Thread(target=self._read, name=f"serve-{proc.pid}-stderr", daemon=True)
            self._reader.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(OSError, ValueError):  # the pipe closed under us: the process is gone
            for line in self.proc.stderr:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                with self._cond:
                    self.tail.append(line)
                    if isinstance(event, dict) and "event" in event and len(self.events) < MAX_EVENTS:
                        self.events.append(event)
                        if event["event"] == "listening" and not self.port:
                            self.port = int(event["port"])
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def output(self) -> str:
        """The end of what the server wrote (its stderr read here, else the log file's last 2000 characters)."""
        if self.proc.stderr is not None:
            with self._cond:
                return "".join(self.tail)[-2000:]
        if self.log_path is not None and self.log_path.exists() and self.log_path != Path(os.devnull):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def named(self, name: str) -> list[dict[str, Any]]:
        """The ``name`` events so far (without waiting)."""
        with self._cond:
            return [e for e in self.events if e["event"] == name]

    def event(self, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The first ``name`` event, waiting for it; ``RigError`` if the output ends or ``timeout_s`` passes
        without it (a guard against hanging, not a timing assertion)."""
        with self._cond:
            found = self._cond.wait_for(
                lambda: self._eof or any(e["event"] == name for e in self.events), timeout=timeout_s
            )
            hits = [e for e in self.events if e["event"] == name]
        if not hits:
            why = "its output ended" if found else f"{timeout_s:g} s passed"
            raise RigError(f"expected a {name!r} event from splitrt serve, got none ({why}): {self.output()}")
        return hits[0]

    def wait_ready(self, timeout_s: float = 60.0, reachable: Callable[[int], bool] | None = None) -> None:
        """Until it listens (see the module's docstring); ``RigError`` if it exits first or takes longer."""
        reachable = reachable or connects
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RigError(
                    f"splitrt serve exited with code {self.proc.returncode} before listening on port "
                    f"{self.port or '(its choice)'}: {self.output()}"
                )
            with self._cond:
                listening = any(e["event"] == "listening" for e in self.events)
            if listening or (self.port and reachable(self.port)):
                return
            with self._cond:
                self._cond.wait(timeout=0.05)
        raise RigError(f"splitrt serve did not listen on port {self.port or '(its choice)'} within {timeout_s:g} s")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM, SIGKILL after ``grace_s``; the exit code (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._reader is not None:
            self._reader.join(timeout=5)  # it ends at EOF; then the pipe is closed here, not by the GC
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_server(
    models_dir: Path | str,
    *flags: str,
    port: int | None = None,
    command: Sequence[str] = PYTHON_CLI,
    env: Mapping[str, str] | None = None,
    pythonpath: Path | str | None = None,
    cwd: Path | str | None = None,
    log_path: Path | None = None,
    popen: Callable[[list[str]], subprocess.Popen[Any]] | None = None,
    reachable: Callable[[int], bool] | None = None,
    wait: bool = True,
    timeout_s: float = 60.0,
) -> ServerProcess:
    """``splitrt serve --models models_dir --port port *flags`` (the contract: the module's docstring)."""
    chosen = free_port() if port is None else port
    if chosen == 0 and (log_path is not None or popen is not None):
        raise RigError("port 0 needs the server's stderr read here (its listening event names the port)")
    argv = [*command, "serve", "--models", str(models_dir), "--port", str(chosen), *flags]
    if popen is not None:
        proc = popen(argv)
    else:
        full_env = dict(os.environ if env is None else env)
        if pythonpath is not None:
            full_env["PYTHONPATH"] = str(pythonpath)
        kw: dict[str, Any] = {"env": full_env, "cwd": cwd or pythonpath, "stdin": subprocess.DEVNULL}
        try:
            if log_path is None:
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
            else:
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(argv, stdout=log, stderr=log, **kw)
        except OSError as exc:
            raise RigError(f"cannot start {' '.join(argv)}: {exc}") from exc
    server = ServerProcess(proc, chosen, log_path)
    if wait:
        try:
            server.wait_ready(timeout_s, reachable)
        except RigError:
            server.stop(grace_s=5)
            raise
    return server


class CloudProcess:
    """Starts, waits for and restarts the rig's server; ``proc`` is the running one (None before ``start``)."""

    log_name = "cloud.log"  # in the rig's workdir

    def __init__(self, children: Children, models_dir: Path, *, workers: int) -> None:
        self.children = children
        self.models_dir = models_dir
        self.workers = workers
        self.server: ServerProcess | None = None
        self.host: netns.Host | None = None
        self.port = 0
        self.listen = "127.0.0.1"  # 0.0.0.0: reachable on the namespace's address (then plaintext)
        self.extra: list[str] = []  # more ``serve`` options (``--next``, ``--intra-op-threads``)

    @property
    def proc(self) -> subprocess.Popen[Any] | None:
        return self.server.proc if self.server is not None else None

    def start(self, host: netns.Host | None, port: int, *, wait: bool = True) -> None:
        """Serve on ``listen``:``port`` inside ``host``'s namespace (None: this one); returns once it listens
        (``wait``), or at once (then ``wait()``: several servers start side by side)."""
        self.host, self.port = host, port
        self.server = start_server(
            self.models_dir,
            "--host",
            self.listen,
            "--workers",
            str(self.workers),
            "--log-level",
            "WARNING",
            *(["--insecure"] if self.listen == "0.0.0.0" else []),
            *self.extra,
            port=port,
            popen=lambda argv: self.children.popen(argv, self.log_name, host=host),
            log_path=self.children.workdir / self.log_name,
            wait=False,
        )
        if wait:
            self.wait()

    def wait(self, timeout_s: float = 60.0) -> None:
        """Until the server listens (``RigError`` if it exits first or takes longer)."""
        assert self.server is not None
        host = self.host

        def reachable(port: int) -> bool:
            return bool(host.call(lambda: connects(port))) if host is not None else connects(port)

        self.server.wait_ready(timeout_s, reachable)

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
