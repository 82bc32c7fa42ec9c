"""The rig's child processes: each started with its log in the rig's workdir and ``PR_SET_PDEATHSIG``
(it dies with the rig, even a SIGKILLed one), tracked so the rig can end them all; and the JSON-line
workers (``python -m splitrt.rig.worker``) the rig talks to over stdin/stdout."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitrt.errors import RigError

if TYPE_CHECKING:
    from splitrt.rig import netns

log = logging.getLogger(__name__)

# util-linux's setpriv sets PR_SET_PDEATHSIG and execs the command (same pid). Preferred to a preexec_fn:
# with one, Python must fork() (not vfork), and grpcio >= 1.80's fork handlers restart its poller in the
# child, which aborts on the epoll fd ("epoll_wait error: Bad file descriptor", grpc/grpc#43055) when the
# rig's process has gRPC channels open (the fleet rig lost a device worker that way before it ran).
SETPRIV = shutil.which("setpriv")


def end(p: subprocess.Popen[Any], grace_s: float = 3.0) -> None:
    """SIGTERM ``p``, SIGKILL it if it has not exited within ``grace_s``."""
    with contextlib.suppress(OSError):
        p.terminate()
    try:
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(grace_s)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the one copy: ``tests/loopback.py`` and ``bench/_common.py``
    import it). Free when picked, not reserved: a server started on it may still lose a race."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Children:
    """Starts the rig's children (log ``workdir/<log_name>``) and ends them all, newest first."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[Any]] = []

    def popen(
        self, argv: list[str], log_name: str, host: netns.Host | None = None, pipes: bool = False
    ) -> subprocess.Popen[Any]:
        """``argv`` in ``host``'s namespace (the current one if None); ``pipes``: text stdin/stdout
        for a JSON-line worker, else stdout goes to the log too."""
        log = open(self.workdir / log_name, "ab")  # noqa: SIM115 - owned by the child
        kw: dict[str, Any] = {"stderr": log, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}}
        if SETPRIV is not None:  # it dies with the rig
            argv = [SETPRIV, "--pdeathsig", "KILL", "--", *argv]
        else:  # the child sets PR_SET_PDEATHSIG (1) between fork and exec
            kw["preexec_fn"] = lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        if pipes:
            kw.update(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        else:
            kw.update(stdout=log, stdin=subprocess.DEVNULL)
        try:
            proc: subprocess.Popen[Any] = host.popen(argv, **kw) if host is not None else subprocess.Popen(argv, **kw)
        except OSError as exc:
            raise RigError(f"cannot start {' '.join(argv)}: {exc}") from exc
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def terminate_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                end(p)
        # A JSON worker's pipes: closed here, not left to the garbage collector (only once it exited: a
        # reader thread blocked on a live child's stdout would hold the pipe's lock).
        for p in self.procs:
            if p.poll() is None:
                continue
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()


class JsonWorker:
    """A child speaking JSON lines on stdin/stdout; stdout events go to ``on_event``. An ``on_event`` that
    raises loses that one event (logged on ``splitrt.rig.processes``' logger once per exception type), not
    the reader: the worker's later events and replies are still read."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc = proc
        self.name = name
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._callback_errors: set[str] = set()  # exception types already logged
        threading.Thread(target=self._read, name=f"rig-{name}-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") != "progress":
                self._replies.put(msg)
            else:
                self._deliver(msg)
        self._replies.put({"event": "eof"})

    def _deliver(self, msg: dict[str, Any]) -> None:
        callback = self.on_event  # read once: the rig swaps it between turns
        if callback is None:
            return
        try:
            callback(msg)
        except Exception as exc:  # the reader must live on: the rig waits for this worker's replies
            kind = type(exc).__name__
            if kind not in self._callback_errors:
                self._callback_errors.add(kind)
                log.warning(
                    "%s worker: on_event raised %s on event %s; event dropped, reading on "
                    "(further %s from it are not logged)",
                    self.name,
                    kind,
                    json.dumps(msg, default=str)[:200],
                    kind,
                    exc_info=exc,
                )

    def send(self, line: str) -> None:
        """One JSON line (``rig.protocol.encode``) to the worker."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise RigError(f"{self.name} worker is gone (exit code {self.proc.poll()})") from exc

    def reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            msg = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise RigError(f"{self.name} worker did not answer within {timeout_s:.0f} s") from None
        if msg.get("event") == "eof":
            raise RigError(f"{self.name} worker exited (code {self.proc.wait(5)}); see its log")
        if msg.get("event") == "error":
            raise RigError(f"{self.name} worker failed: {msg.get('message')}")
        return msg

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RigError):
                self.send('{"type": "Quit"}')  # rig.protocol.Quit
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
