"""Issue 23's acceptance: the cloud server against hostile and careless clients.

    .venv/bin/python attacks/bench_attack.py [--quick] [--rows NAME,NAME] [--json]

Every row starts its own ``splitrt serve --workers 2 --token-file F --allow-upload --drain-s D`` child on
127.0.0.1 (the shipped Kubernetes settings; ``--max-memory-mb``, ``--max-store-mb`` and ``--max-models``
are passed when this server has them) with a soft file-descriptor limit of 1024 (systemd's default), then:

1. baseline: a legit client (a valid token, one connection) sends squeezenet at a fixed middle cut every
   50 ms with a 5 s deadline; a second one sends the same request without a deadline every 250 ms; once
   a second a new connection asks health Check and Status (a device that connects now);
2. the attack runs (the same legit clients go on) for one block, then stops;
3. recovery: seconds until three legit requests in a row succeed within max(3 x baseline p99, +50 ms); then
   until the server's CPU is back near its baseline rate (at most the recovery cap: work the attack left
   running would otherwise land in the next baseline block);
4. 2-3 repeat (``blocks`` times), each followed by a baseline block: the phases interleave, so the shared
   host's load drift falls on both sides of the p99 ratio (the ``control`` row reads ~1.0). The ratio is the
   pooled attack blocks' p99 over the pooled baseline blocks'; its 95 % CI resamples (baseline, attack)
   block pairs, then calls;
5. the attack is armed again and the server gets SIGTERM: seconds until it exits (a server still alive at
   drain + 6 s is reported ``hung`` and killed).

Blocks: 5 x 2 s baseline around 4 x 2.5 s attack (~200 calls each side; an attack that needs longer to
take hold, the slow uploads 8-16 s, gets 2 blocks of its own length), recovery at most 6 s, ``--drain-s 2``;
about 35 minutes in all (35 rows). (Before 2026-12-06 the phases were one 5 s baseline, then 8 s of attack:
the host's load moved between them, and the no-attack ``control`` row read 0.5-8.3x.)
``--quick``: 2 x 1.5 s attack blocks between 1 s baseline blocks, ``--drain-s 1``, one row per class
(``QUICK_ROWS``): about 3 minutes on a loaded 2-vCPU host (a server start alone takes seconds there).

The legit clients run in a child process; the attack's client threads (in this process, with the proxy's
copies) run at nice 10 (``--attacker-nice``): on a network an attacker's requests, ``Device.stream`` heads
(here run once per row) and copies use its own machine's CPU, here they share the server's 2 vCPUs with the
legit client. They still send more than the server serves them (the rows' notes count what was answered);
``--attacker-nice 0`` is the same-priority run.

A sampler reads the server's RSS (psutil) every 50 ms; a server above ``--hard-cap-mb`` is killed (this
host is shared) and the row reports it. Lost: a call that ended UNKNOWN, INTERNAL, CANCELLED or never
(no answer within the row), with a deadline and without (the careless clients' calls count without).

Rows (``--rows`` picks some): ``watch`` 64 health Watch streams (no token); ``partial_body`` 64 unary calls
whose body never finishes (raw HTTP/2: HEADERS and part of a DATA frame, no token); ``idle_stream`` 64 idle
InferStream calls (token); ``stalled_upload`` 64 uploads that stop after one chunk (token); ``idle_conns``
1100 idle HTTP/2 connections (preface + SETTINGS, then nothing; connections are the edge proxy's job:
``idle_conns_proxy`` is the documented deployment's row); ``rapid_reset`` HTTP/2 rapid reset
(CVE-2023-44487: 4 connections open Infer streams and reset each at once, batches of 100, no token; a
connection the server ends is opened again); ``resnet_cuts`` 4 clients naming every resnet50 cut in turn (no
tensors: the tail is built, then the request refused); ``free_dim`` bert_tiny bound to sequence 6000;
``probes`` 8 x 64 MiB Probes in flight; ``nodl_unary`` 8 plain gRPC clients without a deadline;
``nodl_stream`` the documented ``Device.stream()`` (no deadline; its head run once: a device's CPU is its
own) beside 4 of those; uploaded hostile models (token): ``loop`` a Loop with trip count 2^62 (then Infer),
``const_shape`` ConstantOfShape of 2 GiB, ``chain`` a 60 000-node chain, ``upload_burst`` 100 distinct 4 MiB
models; ``token_guess`` 4 clients guessing tokens (guesses answered per second, log growth); issue 36's rows
(``attacks_proxy``): ``slow_reader``, ``endless_run``, and the HTTP/2 floods through the edge proxy
(``rapid_reset_proxy``, ``hpack_bomb_proxy``: the real HAProxy with ``deploy/proxy/haproxy.cfg``, everyone
through it) and straight to the server (``hpack_bomb``); issue 36's hostile data (``attack_hostile``):
``value_bomb``, ``value_cos``, ``exfil``, ``trickle``, ``env_errors``, ``hostile_shapes``, ``zstd_bomb``,
``nan_flood``, ``many_outputs``, ``deep_nest``, ``value_ops``, ``nonzero_bomb``; ``control`` runs no attack
(the p99 ratio's noise floor at the host's load).

Targets, per row: 0 legit failures, legit p99 <= 3x its baseline, peak RSS <= the memory budget, 0
requests lost, SIGTERM exit within drain + 5 s; ``upload_burst``: uploads on disk <= 256 MiB; ``token_guess``:
<= 50 guesses answered UNAUTHENTICATED per second and <= 100 MB of log a day. Progress on stderr;
``--json`` prints one JSON document; the load average is printed beside the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
from _shared import code as _code
from _shared import free_port as _free_port
from _shared import progress
from grpc_health.v1 import health_pb2
from hpack import Encoder
from hyperframe.frame import GoAwayFrame, PingFrame, RstStreamFrame, SettingsFrame
from onnx import TensorProto, helper, numpy_helper

from splitrt.cli.tables import render
from splitrt.errors import RigError
from splitrt.graph import zoo
from splitrt.rig.cloudserver import PYTHON_CLI, start_server
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from tests import hostilemodels
from tests.rawh2 import (
    PREFACE,
    data_frame,
    frames,
    grpc_fields,
    grpc_message,
    headers_frame,
    ping_ack,
    rst_stream_frame,
    settings_frame,
    with_stream_id,
)

# Run as a script this module is ``__main__``: ``attack_hostile`` imports it by name, and must get this one.
sys.modules.setdefault("bench_attack", sys.modules[__name__])

TOKEN = "bench-attack-" + hashlib.sha256(b"bench-attack").hexdigest()[:32]
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = f"/{wire.SERVICE_NAME}"
HEALTH = "/grpc.health.v1.Health"
LEGIT_MODEL = "squeezenet"
SETTLE_S = 1.5  # the legit clients run this long before the first baseline block
LOST_CODES = {"UNKNOWN", "INTERNAL", "CANCELLED", "HUNG"}
SERVER_NOFILE = 1024  # systemd's default soft limit: what the shipped unit gave the server
STORE_CAP_MB = 256
MAX_MODELS = 64
GUESS_RATE_MAX = 50.0
LOG_MB_DAY_MAX = 100.0


def lower_priority(nice: int) -> None:
    """This thread at ``nice`` (Linux: a thread's own nice value; elsewhere nothing)."""
    if nice > 0 and sys.platform.startswith("linux"):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _progress(msg: str) -> None:
    progress("attack", msg)


# ``ADDRESS=CA_PATH``: calls to ADDRESS use TLS with that CA (a row with the edge proxy in front,
# ``attacks_proxy``); set in the environment, so the legit clients' child process sees it too.
TLS_ENV = "SPLITRT_BENCH_TLS"


def _channel(address: str) -> grpc.Channel:
    """A channel of its own (its own TCP connection: no subchannel shared with other channels)."""
    mb = 128 * 2**20
    options = [
        ("grpc.max_send_message_length", mb),
        ("grpc.max_receive_message_length", mb),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    tls_address, _, ca = os.environ.get(TLS_ENV, "").partition("=")
    if ca and tls_address == address:
        creds = grpc.ssl_channel_credentials(Path(ca).read_bytes())
        return grpc.secure_channel(address, creds, options=[*options, ("grpc.ssl_target_name_override", "localhost")])
    return grpc.insecure_channel(address, options=options)


@dataclass(frozen=True, kw_only=True)
class Settings:
    baseline_s: float = 4.0
    attack_s: float = 8.0
    recover_cap_s: float = 10.0
    drain_s: float = 3.0
    budget_mb: float = 1024.0
    hard_cap_mb: float = 3072.0
    quick: bool = False
    # Attack blocks per row, each between two baseline blocks (``baseline_s`` and ``attack_s`` are per block).
    blocks: int = 4
    # More ``splitrt serve`` arguments (e.g. ``--log-every-request`` to see each request's queue and tail ms).
    serve_args: tuple[str, ...] = ()
    # The legit clients in this process, beside the attackers' threads (as before 2026-12-04 05:00 UTC).
    legit_in_process: bool = False
    # The nice value of the attack's client threads (their requests, Device.stream heads, the proxy's copies):
    # on a network the attacker's CPU is its own machine's; here it shares the server's 2 vCPUs.
    attacker_nice: int = 10


# -- the server ---------------------------------------------------------------------------------------


def server_flags() -> set[str]:
    """The ``--flags`` this ``splitrt serve`` knows (the memory and store limits are new in issue 23)."""
    out = subprocess.run(
        [sys.executable, "-m", "splitrt.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    ).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", out))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


class Server:
    """``splitrt serve`` in a child process; a sampler keeps its peak RSS and kills it above the cap."""

    def __init__(
        self,
        store: Path,
        token_file: Path,
        log_path: Path,
        settings: Settings,
        flags: set[str],
        extra: tuple[str, ...] = (),
    ) -> None:
        self.store, self.token_file, self.log_path, self.s = store, token_file, log_path, settings
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_mb = 0.0
        self.killed_at_cap = False
        self._stop = threading.Event()
        self.budget_flag = "--max-memory-mb" in flags
        argv = [
            "--token-file",
            str(token_file),
            "--allow-upload",
            "--workers",
            "2",
            "--drain-s",
            f"{settings.drain_s:g}",
        ]
        if self.budget_flag:
            argv += ["--max-memory-mb", f"{settings.budget_mb:g}"]
        if "--max-store-mb" in flags:
            argv += ["--max-store-mb", str(STORE_CAP_MB)]
        if "--max-models" in flags:
            argv += ["--max-models", str(MAX_MODELS)]
        argv += [*settings.serve_args, *extra]
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        limit = SERVER_NOFILE if hard == resource.RLIM_INFINITY else min(SERVER_NOFILE, hard)
        prlimit = shutil.which("prlimit")
        self.flags = argv  # ``splitrt serve`` under systemd's default soft limit on file descriptors
        self.command = (
            [prlimit, f"--nofile={limit}:{'unlimited' if hard == resource.RLIM_INFINITY else hard}", "--"]
            if prlimit
            else []
        ) + list(PYTHON_CLI)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        served = start_server(
            self.store,
            *self.flags,
            port=self.port,
            command=self.command,
            env=_env(),
            log_path=self.log_path,
            wait=False,
        )
        self.proc = served.proc
        threading.Thread(target=self._sample, daemon=True).start()  # from the start: a model may blow up early
        try:
            served.wait_ready(90)
        except RigError as exc:
            raise SystemExit(str(exc)) from exc

    def _sample(self) -> None:
        assert self.proc is not None
        try:
            p = psutil.Process(self.proc.pid)
            while not self._stop.is_set() and self.proc.poll() is None:
                mb = p.memory_info().rss / 2**20
                self.peak_rss_mb = max(self.peak_rss_mb, mb)
                if mb > self.s.hard_cap_mb:
                    self.killed_at_cap = True
                    _progress(f"server RSS {mb:.0f} MiB above the hard cap {self.s.hard_cap_mb:g}: SIGKILL")
                    self.proc.kill()
                    return
                time.sleep(0.05)
        except psutil.Error:
            return

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server and its children (builder, checker) have used so far."""
        if self.proc is None:
            return 0.0
        total = 0.0
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(self.proc.pid)
            for q in (p, *p.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    t = q.cpu_times()
                    total += t.user + t.system
        return total

    def log_bytes(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def sigterm(self) -> float | None:
        """Seconds from SIGTERM to exit; None when it was still alive at drain + 6 s (then killed)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(self.s.drain_s + 6)
            return time.monotonic() - t0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self._stop.set()

    def kill(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- requests -----------------------------------------------------------------------------------------


def legit_request() -> tuple[bytes, str]:
    """A valid InferRequest for squeezenet at its middle cut (random input), and the cut id."""
    from splitrt.device.client import Device, DeviceConfig

    with Device(zoo.get(LEGIT_MODEL), None, config=DeviceConfig(token=TOKEN, upload=False)) as dev:
        cuts = [c.id for c in dev.graph.cuts()]
        cut = cuts[len(cuts) // 2]
        head = dev.run_head(dev.random_inputs(), cut)
        framed = dev._request(head, codec.Codec.parse("fp32"))[0]
        return framed.to_message().SerializeToString(), cut


def infer_bytes(sha256: str, cut: str, tensors: dict[str, np.ndarray], request_id: str = "bench-attack") -> bytes:
    header = pb.InferRequest(model_sha256=sha256, cut_id=cut, codec="fp32", request_id=request_id, output_codec="fp32")
    enc = [codec.encode(n, a, "fp32") for n, a in tensors.items()]
    return bytes(wire.Framed(header=header, tensors=enc).to_message().SerializeToString())


def _infer(ch: grpc.Channel) -> Any:
    return ch.unary_unary(f"{SERVICE}/Infer")


def upload(address: str, data: bytes, name: str, timeout_s: float = 60.0, detail: bool = False) -> str:
    """PutModel ``data`` with the token; the status code name (``detail``: and the message)."""
    sha = hashlib.sha256(data).hexdigest()
    step = 1 << 20
    chunks = [
        pb.ModelChunk(sha256=sha, name=name, total_bytes=len(data), data=data[i : i + step]).SerializeToString()
        for i in range(0, max(1, len(data)), step)
    ]
    with _channel(address) as ch:
        try:
            ch.stream_unary(f"{SERVICE}/PutModel")(iter(chunks), timeout=timeout_s, metadata=AUTH)
            return "OK"
        except Exception as exc:
            details = exc.details() if detail and isinstance(exc, grpc.RpcError) else None
            return _code(exc) + (f" ({str(details)[:160]})" if details else "")


@dataclass
class Call:
    kind: str  # dl (deadline), nodl, fresh (a new connection), attack (a careless client's own call)
    t: float
    ms: float = -1.0
    code: str = "PENDING"
    said: str = ""  # a failure's details (the row's notes keep the first per code)


def _said(exc: BaseException) -> str:
    details = exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else str(exc)
    return str(details or "")[:200]


class Outstanding:
    """Calls without a deadline: futures whose end is recorded; ``settle`` cancels the ones still open
    (they count as HUNG: lost)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: list[tuple[Call, Any]] = []
        self.calls: list[Call] = []

    def submit(self, kind: str, fn: Callable[..., Any], payload: bytes) -> tuple[Call, Any]:
        call = Call(kind, time.monotonic())
        fut = fn.future(payload, metadata=AUTH)  # type: ignore[attr-defined]

        def done(f: Any) -> None:
            code = "OK"
            if f.cancelled():
                code = "HUNG" if call.code == "SETTLING" else "CANCELLED"
            else:
                exc = f.exception()
                if exc is not None:
                    code = _code(exc)
                    call.said = _said(exc)
            call.ms = (time.monotonic() - call.t) * 1e3
            call.code = code

        with self.lock:
            self.calls.append(call)
            self.open.append((call, fut))
        fut.add_done_callback(done)
        return call, fut

    def settle(self, wait_s: float) -> None:
        end = time.monotonic() + wait_s
        for _ in range(3):  # a call submitted while settling is settled too
            with self.lock:
                open_, self.open = self.open, []
            for call, fut in open_:
                with contextlib.suppress(Exception):
                    fut.result(timeout=max(0.0, end - time.monotonic()))
                if not fut.done():
                    call.code = "SETTLING"
                    fut.cancel()
                    call.code = "HUNG"


class Legit:
    """The legit clients: deadline calls every 50 ms, no-deadline calls every 250 ms, a new connection
    (health Check and Status) every second."""

    def __init__(self, address: str, request: bytes) -> None:
        self.address, self.request = address, request
        self.calls: list[Call] = []
        self.nodl = Outstanding()
        self.stop_ev = threading.Event()
        self.ch_dl = _channel(address)
        self.ch_nodl = _channel(address)
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._dl, self._nodl, self._fresh)]

    def warm(self, timeout_s: float = 120.0) -> None:
        end = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < end:
            try:
                _infer(self.ch_dl)(self.request, timeout=30, metadata=AUTH)
                return
            except Exception as exc:
                last = _code(exc)
                time.sleep(0.5)
        raise SystemExit(f"the legit request never succeeded: {last}")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _dl(self) -> None:
        fn = _infer(self.ch_dl)
        while not self.stop_ev.is_set():
            call = Call("dl", time.monotonic())
            try:
                fn(self.request, timeout=5.0, metadata=AUTH)
                call.code = "OK"
            except Exception as exc:
                call.code, call.said = _code(exc), _said(exc)
            call.ms = (time.monotonic() - call.t) * 1e3
            self.calls.append(call)
            self.stop_ev.wait(max(0.0, 0.05 - call.ms / 1e3))

    def _nodl(self) -> None:
        fn = _infer(self.ch_nodl)
        while not self.stop_ev.wait(0.25):
            self.nodl.submit("nodl", fn, self.request)

    def _fresh(self) -> None:
        check = health_pb2.HealthCheckRequest(service="").SerializeToString()
        while not self.stop_ev.wait(1.0):
            call = Call("fresh", time.monotonic())
            try:
                with _channel(self.address) as ch:
                    ch.unary_unary(f"{HEALTH}/Check")(check, timeout=3.0)
                    ch.unary_unary(f"{SERVICE}/Status")(b"", timeout=3.0, metadata=AUTH)
                call.code = "OK"
            except Exception as exc:
                call.code, call.said = _code(exc), _said(exc)
            call.ms = (time.monotonic() - call.t) * 1e3
            self.calls.append(call)

    def stop(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)
        self.ch_dl.close()
        self.ch_nodl.close()

    def all_calls(self) -> list[Call]:
        return self.calls + self.nodl.calls


class LegitProc:
    """``Legit`` in a process of its own (the default): the attackers' threads in this process would
    otherwise hold this interpreter's GIL while a legit call waits for it, and the bench would charge
    the server for its own contention. The child reports each finished call as a JSON line; ``calls``,
    ``nodl.calls``, ``nodl.settle`` and ``all_calls`` behave as ``Legit``'s. Clocks: ``time.monotonic``
    is the same clock in both processes (CLOCK_MONOTONIC)."""

    def __init__(self, address: str, request: bytes, workdir: Path) -> None:
        req_path = workdir / "legit-request.bin"
        req_path.write_bytes(request)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--legit-child", address, str(req_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_env(),
            text=True,
        )
        self.calls: list[Call] = []
        self.nodl = _ChildNodl(self)
        self.lines: dict[str, threading.Event] = {w: threading.Event() for w in ("ready", "settled", "stopped")}
        self.failure = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "event" in msg:
                self.failure = msg.get("error", "")
                self.lines[msg["event"]].set()
                continue
            call = Call(msg["kind"], msg["t"], msg["ms"], msg["code"], msg.get("said", ""))
            (self.nodl.calls if call.kind == "nodl" else self.calls).append(call)
        for ev in self.lines.values():  # the child is gone: nobody waits for it any longer
            ev.set()

    def _say(self, command: str, wait_for: str, timeout_s: float) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        self.lines[wait_for].wait(timeout_s)

    def warm(self, timeout_s: float = 120.0) -> None:
        self.lines["ready"].wait(timeout_s)
        if self.failure or not self.lines["ready"].is_set() or self.proc.poll() is not None:
            raise SystemExit(f"the legit request never succeeded: {self.failure or 'no answer from the child'}")

    def start(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("start\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self._say("stop", "stopped", 30.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(timeout=5)  # it ends at EOF; then the pipes are closed here, not by the GC
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    def all_calls(self) -> list[Call]:
        return self.calls + self.nodl.calls


class _ChildNodl:
    def __init__(self, parent: LegitProc) -> None:
        self.parent = parent
        self.calls: list[Call] = []

    def settle(self, wait_s: float) -> None:
        self.parent._say(f"settle {wait_s}", "settled", wait_s + 30.0)


def legit_child(address: str, req_path: str) -> int:
    """The child of ``LegitProc``: a ``Legit`` that reports its calls on stdout as JSON lines."""
    out_lock = threading.Lock()

    def say(msg: dict[str, Any]) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

    legit = Legit(address, Path(req_path).read_bytes())
    try:
        legit.warm()
    except SystemExit as exc:
        say({"event": "ready", "error": str(exc)})
        return 1
    say({"event": "ready"})
    sent: set[int] = set()
    done = threading.Event()

    def report(final: bool = False) -> None:
        for call in list(legit.calls) + list(legit.nodl.calls):
            if id(call) in sent or (call.code in ("PENDING", "SETTLING") and not final):
                continue
            sent.add(id(call))
            say({"kind": call.kind, "t": call.t, "ms": call.ms, "code": call.code, "said": call.said})

    def reporter() -> None:
        while not done.wait(0.02):
            report()

    threading.Thread(target=reporter, daemon=True).start()
    for line in sys.stdin:
        cmd = line.split()
        if cmd[:1] == ["start"]:
            legit.start()
        elif cmd[:1] == ["settle"]:
            legit.nodl.settle(float(cmd[1]))
            report()
            say({"event": "settled"})
        elif cmd[:1] == ["stop"]:
            break
    # No new calls, then the open ones (no deadline) get their answers before the channels close: a call
    # submitted since the last settle must not end CANCELLED by this process's own close.
    legit.stop_ev.set()
    for t in legit.threads:
        if t.ident is not None:  # started
            t.join(10)
    legit.nodl.settle(2.0)
    legit.stop()
    done.set()
    report(final=True)
    say({"event": "stopped"})
    return 0


# -- the attacker's own address --------------------------------------------------------------------------

ATTACKER_IP = "127.0.0.2"  # loopback too; the server sees a peer other than the legit clients' 127.0.0.1


class Proxy:
    """A TCP forwarder on 127.0.0.1 whose connections reach the server from ``ATTACKER_IP``: the attack's
    gRPC channels go through it, so per-peer limits tell the attacker from the legit clients, as they
    would on a network."""

    def __init__(self, target: str, nice: int = 0) -> None:
        self.nice = nice
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(512)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                if self.closed:
                    return
                continue
            upstream = socket.socket()
            try:
                upstream.bind((ATTACKER_IP, 0))
                upstream.connect(self.target)
            except OSError:  # the server refused (or is gone): drop both ends, never leave them to the GC
                for x in (client, upstream):
                    x.close()
                if self.closed:
                    return
                continue
            with self.lock:
                if self.closed:  # close() ran while this one connected
                    for x in (client, upstream):
                        x.close()
                    return
                self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, self.nice), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, nice: int) -> None:
        lower_priority(nice)
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
        except OSError:
            pass
        for x in (src, dst):
            with contextlib.suppress(OSError):
                x.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            for x in self.socks:
                with contextlib.suppress(OSError):
                    x.close()
            self.socks = []


# -- raw HTTP/2 ----------------------------------------------------------------------------------------


def grpc_headers(path: str, authority: str, metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A gRPC call's header block (never-indexed literals: the same bytes on any connection)."""
    return Encoder().encode(grpc_fields(path, authority, metadata), huffman=False)


class H2Pool:
    """Raw HTTP/2 connections that answer the server's SETTINGS and PINGs (so they are not dropped for
    that) and otherwise do what the attack says: nothing (idle), or a unary call whose body stops."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self.closed = 0
        self.connect_failed = 0
        self.sel = selectors.DefaultSelector()
        self.bufs: dict[int, bytes] = {}
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.lock = threading.Lock()

    def open(self, address: str, n: int, partial_body: bool, time_limit_s: float) -> None:
        host, port = address.rsplit(":", 1)
        end = time.monotonic() + time_limit_s
        for _ in range(n):
            if time.monotonic() > end:
                break
            s = socket.socket()
            try:
                s.settimeout(2.0)
                s.bind((ATTACKER_IP, 0))
                s.connect((host, int(port)))
                s.sendall(PREFACE + settings_frame())
                if partial_body:
                    s.sendall(headers_frame(1, grpc_headers(f"{SERVICE}/Infer", address)))
                    # A gRPC message that announces 100 000 bytes; 10 come.
                    s.sendall(data_frame(1, grpc_message(bytes(10), declared_bytes=100_000)))
                s.setblocking(False)
            except OSError:
                s.close()
                self.connect_failed += 1
                continue
            with self.lock:
                self.socks.append(s)
                self.bufs[s.fileno()] = b""
                self.sel.register(s, selectors.EVENT_READ)

    def _read(self) -> None:
        while not self.stop_ev.is_set():
            with self.lock:
                registered = bool(self.bufs)
            if not registered:
                time.sleep(0.05)
                continue
            for key, _ in self.sel.select(0.1):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._drop(s)
                    continue
                self._frames(s, self.bufs.get(s.fileno(), b"") + data)

    def _frames(self, s: socket.socket, buf: bytes) -> None:
        parsed, buf = frames(buf)
        for f in parsed:
            try:
                if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                    s.send(settings_frame(ack=True))
                elif isinstance(f, PingFrame) and "ACK" not in f.flags:
                    s.send(ping_ack(f.opaque_data))
                elif isinstance(f, (RstStreamFrame, GoAwayFrame)):  # the server let go of us
                    self._drop(s)
                    return
            except OSError:
                self._drop(s)
                return
        self.bufs[s.fileno()] = buf

    def _drop(self, s: socket.socket) -> None:
        with self.lock:
            if s.fileno() in self.bufs:
                self.bufs.pop(s.fileno())
                self.sel.unregister(s)
                self.closed += 1
        s.close()

    def held(self) -> int:
        with self.lock:
            return len(self.bufs)

    def close(self) -> None:
        self.stop_ev.set()
        self.thread.join(5)
        with self.lock:
            for s in self.socks:
                s.close()
            self.bufs.clear()


# -- attacks -----------------------------------------------------------------------------------------


@dataclass
class Ctx:
    address: str  # the attacker's way in: the proxy from ATTACKER_IP
    server_address: str
    settings: Settings
    server: Server
    legit_request: bytes
    legit_cut: str
    store: Path
    shas: dict[str, str] = field(default_factory=dict)
    alive_at_stop: bool = True  # the server was alive as each attack block ended
    baseline_log_bps: float = 0.0  # the server's log growth (bytes/s) under the legit clients alone


class Attack:
    name = ""
    what = ""
    models: tuple[str, ...] = ()
    # Seconds this attack needs to take hold (an upload that is checked for long, 100 uploads).
    min_attack_s = 0.0

    def __init__(self) -> None:
        self.stop_ev = threading.Event()
        self.threads: list[threading.Thread] = []
        self.notes: dict[str, Any] = {}
        self.own = Outstanding()  # a careless client's own calls without a deadline (they count as lost)
        self.nice = 0

    def start(self, ctx: Ctx) -> None:
        self.stop_ev.clear()
        self.nice = ctx.settings.attacker_nice
        self.arm(ctx)

    def arm(self, ctx: Ctx) -> None:
        raise NotImplementedError

    def build(self) -> None:
        """Make what the attack sends (models), before the server starts: generating it is the bench's
        CPU on this shared host, not the attack's load on the server."""

    def stop(self) -> None:
        self.stop_ev.set()
        self.own.settle(2.0)  # a careless call still open now never ends by itself: HUNG (lost)
        for t in self.threads:
            t.join(5)
        self.threads = []
        self.disarm()

    def disarm(self) -> None:
        pass

    def spawn(self, fn: Callable[[], None], n: int = 1) -> None:
        def attacker() -> None:
            lower_priority(self.nice)
            fn()

        for _ in range(n):
            t = threading.Thread(target=attacker, daemon=True)
            t.start()
            self.threads.append(t)

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        return []

    # More ``splitrt serve`` arguments for this row (e.g. ``--trusted-proxy`` behind the edge proxy).
    serve_args: tuple[str, ...] = ()
    # The row of the same attack through the edge proxy, for an attack on connections or HTTP/2 itself: a
    # server alone does not hold it (that is the proxy's job, issue 35), the documented deployment must.
    proxy_row = ""

    def front(self, server_address: str, workdir: Path) -> str:
        """The address everyone (legit clients and attackers) uses: the server's, or a proxy in front of it
        that this attack starts (``attacks_proxy``); ``close_front`` stops it."""
        return server_address

    def close_front(self) -> None:
        pass

    def lost_extra(self) -> int:
        """Requests of this attack's careless clients lost beyond ``own`` (stream frames)."""
        return 0

    def finished(self) -> bool:
        """An attack with an end (the upload burst) ends the attack phase early (after ``attack_s``)."""
        return False


class Control(Attack):
    """No attack: the row's p99 ratio is this host's noise at its load (the other rows' floor)."""

    name = "control"
    what = "no attack (the p99 ratio's noise floor at this load)"

    def arm(self, ctx: Ctx) -> None:
        pass


class HeldCalls(Attack):
    """N gRPC calls held open (health Watch, idle InferStream, stalled PutModel) over 8 connections; a call
    the server ends or refuses is opened again (every 0.25 s), as an attacker would."""

    def __init__(self, name: str, method: str, n: int) -> None:
        super().__init__()
        self.name, self.method, self.n = name, method, n
        token = "no token" if method == "Watch" else "token"
        self.what = {
            "Watch": f"{n} health Watch streams ({token})",
            "InferStream": f"{n} idle InferStream calls ({token})",
            "PutModel": f"{n} uploads stalled after 1 chunk ({token})",
        }[method]
        self.chans: list[grpc.Channel] = []
        self.calls: list[Any] = []
        self.release = threading.Event()
        self.ended: Counter[str] = Counter()

    def _blocked(self, first: bytes | None) -> Iterator[bytes]:
        if first is not None:
            yield first
        self.release.wait(600)

    def _open(self, ch: grpc.Channel) -> Any:
        if self.method == "Watch":
            req = health_pb2.HealthCheckRequest(service="").SerializeToString()
            return ch.unary_stream(f"{HEALTH}/Watch")(req)
        if self.method == "InferStream":
            return ch.stream_stream(f"{SERVICE}/InferStream")(self._blocked(None), metadata=AUTH)
        first = pb.ModelChunk(
            sha256="ab" * 32, name="stalled.onnx", total_bytes=8 << 20, data=bytes(1 << 16)
        ).SerializeToString()
        return ch.stream_unary(f"{SERVICE}/PutModel").future(self._blocked(first), metadata=AUTH)

    def arm(self, ctx: Ctx) -> None:
        self.release.clear()
        self.ended.clear()
        self.chans = [_channel(ctx.address) for _ in range(8)]
        self.calls = [self._open(self.chans[i % 8]) for i in range(self.n)]

        def keep() -> None:
            while not self.stop_ev.wait(0.25):
                for i, call in enumerate(self.calls):
                    if call.done():
                        try:
                            self.ended[call.code().name] += 1
                        except Exception:
                            self.ended["?"] += 1
                        self.calls[i] = self._open(self.chans[i % 8])

        self.spawn(keep)

    def disarm(self) -> None:
        self.notes.setdefault("ended_by_server", dict(self.ended))
        self.notes.setdefault("held_at_stop", sum(1 for c in self.calls if not c.done()))
        self.release.set()
        for c in self.calls:
            c.cancel()
        for ch in self.chans:
            ch.close()
        self.calls, self.chans = [], []


class RawH2(Attack):
    """Raw HTTP/2: idle connections, or unary calls whose body never finishes (one per connection); what
    the server drops is opened again (every 0.5 s)."""

    def __init__(self, name: str, n: int, partial_body: bool) -> None:
        super().__init__()
        self.name, self.n, self.partial = name, n, partial_body
        self.proxy_row = "" if partial_body else "idle_conns_proxy"
        self.what = (
            f"{n} unary calls, body never finishes (no token)" if partial_body else f"{n} idle HTTP/2 connections"
        )
        self.pool: H2Pool | None = None

    def arm(self, ctx: Ctx) -> None:
        pool = self.pool = H2Pool()
        pool.thread.start()
        pool.open(ctx.server_address, self.n, self.partial, time_limit_s=20.0)
        self.notes.setdefault("opened", len(pool.socks))

        def keep() -> None:
            while not self.stop_ev.wait(0.5):
                pool.open(ctx.server_address, self.n - pool.held(), self.partial, time_limit_s=2.0)

        self.spawn(keep)

    def disarm(self) -> None:
        if self.pool is not None:
            self.notes.setdefault("dropped_by_server", self.pool.closed)
            self.notes.setdefault("held_at_stop", self.pool.held())
            self.notes.setdefault("connect_failed", self.pool.connect_failed)
            self.pool.close()
            self.pool = None


class RapidReset(Attack):
    """HTTP/2 rapid reset (CVE-2023-44487): each connection opens Infer streams (HEADERS, no token) and
    resets each at once (RST_STREAM CANCEL), in batches of 100, as fast as it can; a connection the server
    closes (GOAWAY) is opened again."""

    def __init__(self, conns: int = 4, batch: int = 100) -> None:
        super().__init__()
        self.name = "rapid_reset"
        self.proxy_row = "rapid_reset_proxy"
        self.what = f"HTTP/2 rapid reset: {conns} connections opening and resetting streams"
        self.conns, self.batch = conns, batch
        self.sent = 0
        self.ended: Counter[str] = Counter()  # how the attack's connections ended
        self.lock = threading.Lock()

    def arm(self, ctx: Ctx) -> None:
        host, port = ctx.server_address.rsplit(":", 1)
        # One frame of each kind made by hyperframe, sent on every stream with its id written in.
        headers = headers_frame(1, grpc_headers(f"{SERVICE}/Infer", ctx.server_address))
        reset = rst_stream_frame(1)  # CANCEL

        def one_connection() -> str:
            s = socket.socket()
            stream, buf = 1, b""
            try:
                s.settimeout(2.0)
                s.bind((ATTACKER_IP, 0))
                s.connect((host, int(port)))
                s.sendall(PREFACE + settings_frame())
                s.setblocking(False)
                while not self.stop_ev.is_set() and stream < 2**31 - 2 * self.batch:
                    out = []
                    for _ in range(self.batch):
                        out.append(with_stream_id(headers, stream))  # HEADERS, END_HEADERS
                        out.append(with_stream_id(reset, stream))  # RST_STREAM CANCEL
                        stream += 2
                    s.setblocking(True)
                    s.sendall(b"".join(out))
                    s.setblocking(False)
                    with self.lock:
                        self.sent += self.batch
                    with contextlib.suppress(BlockingIOError):  # what the server says; GOAWAY ends it
                        data = s.recv(1 << 16)
                        if not data:
                            return "closed"
                        parsed, buf = frames(buf + data)
                        if any(isinstance(f, GoAwayFrame) for f in parsed):
                            return "goaway"
            except OSError:
                time.sleep(0.05)  # refused or cut: not in a tight loop
                return "error"
            finally:
                s.close()
            return "stopped"

        def keep() -> None:
            while not self.stop_ev.is_set():
                how = one_connection()
                with self.lock:
                    self.ended[how] += 1

        self.spawn(keep, self.conns)

    def disarm(self) -> None:
        self.notes.setdefault("streams_reset", self.sent)
        self.notes.setdefault("connections_ended", dict(self.ended))


class Flood(Attack):
    """``threads`` clients, each sending ``make(i)`` in a loop until stopped (every call time-limited)."""

    def __init__(self, name: str, what: str, threads: int, models: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.name, self.what, self.n_threads, self.models = name, what, threads, models
        self.codes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.sent = 0

    def prepare(self, ctx: Ctx) -> None:
        pass

    def one(self, ch: grpc.Channel, i: int) -> str:
        raise NotImplementedError

    def arm(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.prepare(ctx)

        def loop() -> None:
            with _channel(ctx.address) as ch:
                while not self.stop_ev.is_set():
                    with self.lock:
                        i = self.sent
                        self.sent += 1
                    code = self.one(ch, i)
                    with self.lock:
                        self.codes[code] += 1
                    if code == "UNAVAILABLE":  # the server is gone (SIGTERM): no busy loop
                        self.stop_ev.wait(0.05)

        self.spawn(loop, self.n_threads)

    def disarm(self) -> None:
        self.notes["codes"] = dict(self.codes)  # every block's (the row keeps its notes before the SIGTERM re-arm)


class ResnetCuts(Flood):
    def __init__(self) -> None:
        super().__init__("resnet_cuts", "4 clients naming every resnet50 cut in turn", 4, ("resnet50",))

    def prepare(self, ctx: Ctx) -> None:
        from splitrt.graph import load

        cuts = [c.id for c in load(zoo.get("resnet50")).cuts()][1:-1]
        random.Random(0).shuffle(cuts)
        self.cuts = cuts

    def one(self, ch: grpc.Channel, i: int) -> str:
        req = infer_bytes(self.ctx.shas["resnet50"], self.cuts[i % len(self.cuts)], {})
        try:
            _infer(ch)(req, timeout=30, metadata=AUTH)
            return "OK"
        except Exception as exc:
            return _code(exc)


class FreeDim(Flood):
    """bert_tiny cut after its embeddings, the encoder's free dim (sequence) bound to ``seq`` in the request
    (1.6 MB: what crosses there at that length)."""

    def __init__(self, seq: int = 6000) -> None:
        super().__init__("free_dim", f"bert_tiny encoder at sequence {seq} (2 clients)", 2, ("bert_tiny",))
        self.seq = seq

    def prepare(self, ctx: Ctx) -> None:
        if hasattr(self, "req"):
            return
        from splitrt.graph import load
        from splitrt.graph.zoo import default_binding

        path = zoo.get("bert_tiny")
        short = zoo.DEFAULT_DIMS["bert_tiny"]["seq"]
        graph = load(path, default_binding(path))
        cut = next(c for c in graph.cuts() if {t.name for t in c.tensors} == {"attention_mask", "embeddings.norm"})
        rng = np.random.default_rng(0)
        tensors = {}
        for t in cut.tensors:
            shape = tuple(self.seq if d == short else int(d) for d in t.shape or ())
            tensors[t.name] = (
                rng.standard_normal(shape).astype(t.dtype) if t.dtype.startswith("float") else np.ones(shape, t.dtype)
            )
        self.req = infer_bytes(ctx.shas["bert_tiny"], cut.id, tensors)
        self.notes["request"] = f"{cut.id}, {len(self.req) / 1e6:.2f} MB"

    def one(self, ch: grpc.Channel, i: int) -> str:
        try:
            _infer(ch)(self.req, timeout=30, metadata=AUTH)
            return "OK"
        except Exception as exc:
            return _code(exc)


class Probes(Flood):
    def __init__(self) -> None:
        super().__init__("probes", "8 x 64 MiB Probes in flight (token)", 8)
        n = 64 * 2**20 - 4096
        self.req = pb.ProbeRequest(payload=bytes(n), reply_bytes=n).SerializeToString()

    def one(self, ch: grpc.Channel, i: int) -> str:
        try:
            ch.unary_unary(f"{SERVICE}/Probe")(self.req, timeout=30, metadata=AUTH)
            return "OK"
        except Exception as exc:
            return _code(exc)


class NoDeadline(Flood):
    """Careless clients: the legit request without a deadline, back to back (each its own call)."""

    def __init__(self, name: str = "nodl_unary", threads: int = 8) -> None:
        super().__init__(name, f"{threads} plain gRPC clients, no deadline", threads)

    def one(self, ch: grpc.Channel, i: int) -> str:
        if self.stop_ev.is_set():
            return "STOPPED"
        call, fut = self.own.submit("attack", _infer(ch), self.ctx.legit_request)
        with contextlib.suppress(Exception):
            fut.result(timeout=60)
        return call.code


class DeviceStream(NoDeadline):
    """The documented ``Device.stream()`` (no deadline), 2 streams of frames, beside 4 careless clients.

    The attacker's device loads the model and runs its head once (``prepare``), then sends that head's
    tensors in every frame: on a network a device's heads use its own CPU, and here they took ~0.6 of the 2
    vCPUs the server has (8 plain clients take ~0.03), at the nice value of the server's over-share runs.
    Every frame still goes through ``Device.stream`` (its request and encoding, the stream, the replies'
    decoding) and keeps its own request id."""

    def __init__(self) -> None:
        super().__init__("nodl_stream", 4)
        self.what = "Device.stream() x2 (no deadline) + 4 plain clients"
        self.frames: Counter[str] = Counter()
        self.devices: list[Any] = []

    def prepare(self, ctx: Ctx) -> None:
        if hasattr(self, "head"):
            return
        from splitrt.device.client import Device
        from splitrt.graph import load

        self.graph = load(zoo.get(LEGIT_MODEL))
        with Device(self.graph, None) as dev:
            self.head = dev.run_head(dev.random_inputs(), ctx.legit_cut)

    def arm(self, ctx: Ctx) -> None:
        super().arm(ctx)

        def stream() -> None:
            dev = _device_of_one_head(self.graph, ctx.address, self.head)
            self.devices.append(dev)
            sent = [0]

            def frames() -> Iterator[dict[str, np.ndarray]]:
                while not self.stop_ev.wait(0.02):
                    sent[0] += 1
                    yield {}  # the head is the one computed in ``prepare``

            answered = 0
            try:
                for r in dev.stream(frames(), cut=ctx.legit_cut):
                    answered += 1
                    with self.lock:
                        self.frames["OK" if r.error is None else r.error.code or "UNKNOWN"] += 1
            except Exception as exc:
                with self.lock:  # the stream ended under the client: its frames in flight had no answer
                    self.frames[f"stream:{_code(exc)}"] += 1
                    self.frames["HUNG"] += sent[0] - answered

        self.spawn(stream, 2)

    def disarm(self) -> None:
        super().disarm()
        for dev in self.devices:
            dev.close()
        self.devices = []
        self.notes.setdefault("frames", dict(self.frames))

    def lost_extra(self) -> int:
        return sum(n for c, n in self.frames.items() if not c.startswith("stream:") and _lost(c))


def _device_of_one_head(graph: Any, address: str, head: Any) -> Any:
    """A ``Device`` whose ``run_head`` returns ``head`` (with a fresh request id) whatever the frame."""
    from splitrt.device.client import Device, DeviceConfig

    class OneHead(Device):
        def run_head(self, inputs: Any, cut: str, *, checked: bool = False) -> Any:
            return dataclasses.replace(head, request_id=os.urandom(8).hex())

    return OneHead(graph, address, config=DeviceConfig(token=TOKEN, upload=False))


class TokenGuess(Flood):
    """The rates are over every attack block (``codes`` counts them all): the log writes a kind's first
    lines and one summary per 10 s interval, so one 8 s block holds one interval's end or none, and read
    alone it gave 47 or 122 MB/day on the same code."""

    def __init__(self) -> None:
        super().__init__("token_guess", "4 clients guessing tokens", 4)
        self.t0 = 0.0
        self.log0 = 0
        self.secs = 0.0  # of the attack blocks so far
        self.grown = 0.0  # log bytes they wrote beyond the legit clients' rate

    def arm(self, ctx: Ctx) -> None:
        self.t0, self.log0 = time.monotonic(), ctx.server.log_bytes()
        super().arm(ctx)

    def one(self, ch: grpc.Channel, i: int) -> str:
        guess = hashlib.sha256(f"guess{i}".encode()).hexdigest()
        try:
            ch.unary_unary(f"{SERVICE}/Status")(b"", timeout=5, metadata=(("authorization", f"Bearer {guess}"),))
            return "OK"
        except Exception as exc:
            return _code(exc)

    def disarm(self) -> None:
        super().disarm()
        # every block's (the row keeps its notes before the SIGTERM re-arm, whose disarm comes after)
        secs = max(1e-3, time.monotonic() - self.t0)
        self.secs += secs
        self.notes["guesses_per_s"] = round(self.codes["UNAUTHENTICATED"] / self.secs, 1)
        # What the legit clients' requests log at the same time is not the guesser's doing.
        self.grown += self.ctx.server.log_bytes() - self.log0 - self.ctx.baseline_log_bps * secs
        self.notes["log_mb_per_day"] = round(max(0.0, self.grown) / self.secs * 86400 / 2**20, 1)

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        return [
            (f"guesses/s <= {GUESS_RATE_MAX:g}", self.notes.get("guesses_per_s", 1e9) <= GUESS_RATE_MAX),
            (f"log <= {LOG_MB_DAY_MAX:g} MB/day", self.notes.get("log_mb_per_day", 1e9) <= LOG_MB_DAY_MAX),
        ]


# -- hostile uploads -----------------------------------------------------------------------------------


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any], opset: int = 17) -> bytes:
    g = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return bytes(m.SerializeToString())


def loop_model() -> bytes:
    """A Loop whose trip count is 2^62: y = x + 1, forever."""
    m = hostilemodels.loop_model(1 << 62)
    m.ir_version = 8
    return bytes(m.SerializeToString())


def const_shape_model(shape: tuple[int, ...] = (1, 512, 1024, 1024)) -> bytes:
    """ConstantOfShape of ``shape`` float32 (2 GiB) plus the input: 200 bytes of valid ONNX (it passes the
    checker: the output declares its shape)."""
    nodes = [
        helper.make_node(
            "ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        ),
        helper.make_node("Add", ["big", "x"], ["y"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(np.array(shape, np.int64), "shape")],
    )


def chain_model(n: int = 60_000) -> bytes:
    nodes = [
        helper.make_node("Neg", ["x" if i == 0 else f"t{i - 1}"], ["y" if i == n - 1 else f"t{i}"]) for i in range(n)
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [],
    )


def distinct_model(seed: int, mb: float = 4.0) -> bytes:
    w = np.random.default_rng(seed).standard_normal(int(mb * 2**20 / 4)).astype(np.float32)
    nodes = [helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0), helper.make_node("Add", ["x", "s"], ["y"])]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(w, "w")],
    )


class HostileModel(Attack):
    """Upload ``data`` (token), then waves of Infer at cut ``cloud`` (every call with a deadline)."""

    def __init__(
        self,
        name: str,
        what: str,
        data: Callable[[], bytes],
        per_wave: int,
        timeout_s: float,
        min_attack_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.name, self.what, self.make, self.per_wave, self.timeout_s = name, what, data, per_wave, timeout_s
        self.min_attack_s = min_attack_s
        self.data: bytes | None = None
        self.codes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def build(self) -> None:
        if self.data is None:
            self.data = self.make()
            self.notes["model_bytes"] = len(self.data)

    def arm(self, ctx: Ctx) -> None:
        self.build()

        def run() -> None:
            assert self.data is not None
            t0 = time.monotonic()
            code = upload(ctx.address, self.data, f"{self.name}.onnx", timeout_s=30.0, detail=True)
            self.notes.setdefault("upload", f"{code} in {time.monotonic() - t0:.1f} s")
            if code != "OK":
                return
            sha = hashlib.sha256(self.data).hexdigest()
            req = infer_bytes(sha, "cloud", {"x": np.ones(1, np.float32)})
            with _channel(ctx.address) as ch:
                while not self.stop_ev.is_set():
                    futs = [_infer(ch).future(req, timeout=self.timeout_s, metadata=AUTH) for _ in range(self.per_wave)]
                    for f in futs:
                        try:
                            f.result()
                            code = "OK"
                        except Exception as exc:
                            code = _code(exc)
                        with self.lock:
                            self.codes[code] += 1
                    self.stop_ev.wait(0.5)

        self.spawn(run)

    def disarm(self) -> None:
        self.notes["infer_codes"] = dict(self.codes)  # over every block so far


class UploadBurst(Attack):
    name = "upload_burst"
    min_attack_s = 15.0  # or until the 100 are through

    def __init__(self, n: int = 100, mb: float = 4.0) -> None:
        super().__init__()
        self.n, self.mb = n, mb
        self.what = f"{n} distinct {mb:g} MiB models uploaded in a burst (token)"
        self.codes: Counter[str] = Counter()
        self.done = False

    def arm(self, ctx: Ctx) -> None:
        self.ctx = ctx
        if self.done:  # the SIGTERM re-arm: a few more uploads in flight
            self.spawn(lambda: self._upload(ctx, 1000), 2)
            return
        self.done = True
        nxt = iter(range(self.n))
        lock = threading.Lock()

        def worker() -> None:
            while not self.stop_ev.is_set():
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                self._upload(ctx, i)

        self.spawn(worker, 8)

    def finished(self) -> bool:
        return sum(self.codes.values()) >= self.n

    def build(self) -> None:
        if not getattr(self, "blobs", None):
            self.blobs = {i: distinct_model(i, self.mb) for i in (*range(self.n), 1000, 1001)}

    def _upload(self, ctx: Ctx, i: int) -> None:
        self.build()
        data = self.blobs.get(i) or distinct_model(i, self.mb)
        code = upload(ctx.address, data, f"m{i}.onnx", timeout_s=30)
        with self.lock_codes():
            self.codes[code] += 1

    def lock_codes(self) -> threading.Lock:
        if not hasattr(self, "_lock"):
            self._lock = threading.Lock()
        return self._lock

    def disarm(self) -> None:
        self.notes.setdefault("upload_codes", dict(self.codes))
        staged = {f"{m}.onnx" for m in (LEGIT_MODEL, *self.models)}  # put there by the bench, not uploaded
        size = sum(p.stat().st_size for p in self.ctx.store.rglob("*") if p.is_file() and p.name not in staged)
        self.notes["uploaded_mib"] = max(self.notes.get("uploaded_mib", 0.0), round(size / 2**20, 1))

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        return [(f"uploads <= {STORE_CAP_MB} MiB", self.notes.get("uploaded_mib", 1e9) <= STORE_CAP_MB)]


QUICK_ROWS = ("watch", "partial_body", "idle_conns", "resnet_cuts", "nodl_unary", "loop", "token_guess")


def attacks() -> list[Attack]:
    from attacks_proxy import proxy_attacks  # imports this module: here, not at the top

    # The counts are the issue's: --quick shortens the phases and runs one row per class, not smaller attacks.
    return [
        Control(),
        HeldCalls("watch", "Watch", 64),
        RawH2("partial_body", 64, partial_body=True),
        HeldCalls("idle_stream", "InferStream", 64),
        HeldCalls("stalled_upload", "PutModel", 64),
        RawH2("idle_conns", 1100, partial_body=False),
        RapidReset(),
        ResnetCuts(),
        FreeDim(),
        Probes(),
        NoDeadline(),
        DeviceStream(),
        HostileModel("loop", "uploaded Loop, trip count 2^62, then Infer", loop_model, 4, 2.0),
        HostileModel("const_shape", "uploaded ConstantOfShape 2 GiB, then Infer", const_shape_model, 1, 10.0, 8.0),
        HostileModel("chain", "uploaded 60 000-node chain, then Infer", chain_model, 1, 20.0, 10.0),
        UploadBurst(),
        TokenGuess(),
        *proxy_attacks(),
        *hostile_data_rows(),
    ]


def hostile_data_rows() -> list[Attack]:
    """Issue 36's rows (``attack_hostile``): hostile values, files and pace."""
    from attack_hostile import rows

    return rows()


# -- one row -------------------------------------------------------------------------------------------


def _lost(code: str) -> bool:
    return code in LOST_CODES or code.startswith("client")


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ratio_ci(units: list[tuple[list[float], list[float]]], q: float = 99, n: int = 2000) -> list[float] | None:
    """A 95 % two-stage bootstrap interval of percentile ``q`` during over before: the (baseline, attack)
    block pairs are resampled (so the host's load drift between blocks is in the interval), then the calls
    within the pooled pick. The verdict keeps the point value (pooled during / pooled before)."""
    units = [(b, d) for b, d in units if b and d]
    if not units or sum(len(b) for b, _ in units) < 2 or sum(len(d) for _, d in units) < 2:
        return None
    rng = np.random.default_rng(0)
    ratios = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(units), len(units))
        b = np.concatenate([units[k][0] for k in pick])
        d = np.concatenate([units[k][1] for k in pick])
        ratios[i] = np.percentile(rng.choice(d, d.size), q) / np.percentile(rng.choice(b, b.size), q)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return [round(float(lo), 2), round(float(hi), 2)]


def _stage(attack: Attack, root: Path) -> tuple[Path, Path, dict[str, str]]:
    """The row's own store (the legit model + the attack's) and token file."""
    row_dir = root / attack.name
    store = row_dir / "store"
    store.mkdir(parents=True)
    shas = {}
    for name in (LEGIT_MODEL, *attack.models):
        src, dst = zoo.get(name), store / f"{name}.onnx"
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
        h = hashlib.sha256()
        with open(dst, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        shas[name] = h.hexdigest()
    token_file = row_dir / "tokens.txt"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return store, token_file, shas


def _recovery(legit: Legit | LegitProc, t_from: float, base_p99: float, cap_s: float) -> float | None:
    """Seconds after ``t_from`` until three legit deadline calls in a row succeed in time."""
    limit = max(3 * base_p99, base_p99 + 50.0)
    end = t_from + cap_s
    while True:
        calls = sorted((c for c in legit.calls if c.kind == "dl" and c.t >= t_from), key=lambda c: c.t)
        for i in range(len(calls) - 2):
            if all(c.code == "OK" and c.ms <= limit for c in calls[i : i + 3]):
                return max(0.0, calls[i].t - t_from)
        if time.monotonic() > end:
            return None
        time.sleep(0.1)


def _quiesce(server: Server, base_cpu: float, cap_s: float) -> float:
    """Seconds until the server's CPU (over 0.5 s) is back near its baseline rate, at most ``cap_s``: work
    an attack left running (a tail build, a checker) would otherwise land in the next baseline block and
    flatter the ratio."""
    t0 = time.monotonic()
    c0 = server.cpu_s()
    while time.monotonic() - t0 < cap_s and server.alive():
        time.sleep(0.5)
        c1 = server.cpu_s()
        if (c1 - c0) / 0.5 <= 1.5 * base_cpu + 0.2:
            break
        c0 = c1
    return time.monotonic() - t0


@dataclass
class Blocks:
    """The row's phases, interleaved: baseline, attack, baseline, ... baseline (``[t0, t1)`` each)."""

    base: list[tuple[float, float]] = field(default_factory=list)
    attack: list[tuple[float, float]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # the 1-min load average as each block began
    recover_s: list[float | None] = field(default_factory=list)
    quiesce_s: list[float] = field(default_factory=list)
    cpu_base_s: float = 0.0
    cpu_attack_s: float = 0.0

    def ms(self, calls: list[Call], which: list[tuple[float, float]]) -> list[list[float]]:
        """Each block's successful deadline calls' latencies (ms), by the call's start."""
        return [[c.ms for c in calls if c.kind == "dl" and a <= c.t < b and c.code == "OK"] for a, b in which]

    def units(self, calls: list[Call]) -> list[tuple[list[float], list[float]]]:
        """(baseline block k, attack block k) pairs; the last baseline block joins the last pair."""
        base, during = self.ms(calls, self.base), self.ms(calls, self.attack)
        pairs = [(list(base[k]), during[k]) for k in range(len(during))]
        if pairs and len(base) > len(during):
            pairs[-1][0].extend(base[-1])
        return pairs


def _timed_block(server: Server, blocks: Blocks, kind: str, run: Callable[[], None]) -> None:
    t, cpu = time.monotonic(), server.cpu_s()
    blocks.loads.append(round(os.getloadavg()[0], 2))
    run()
    (blocks.base if kind == "base" else blocks.attack).append((t, time.monotonic()))
    if kind == "base":
        blocks.cpu_base_s += server.cpu_s() - cpu
    else:
        blocks.cpu_attack_s += server.cpu_s() - cpu


def _interleave(attack: Attack, ctx: Ctx, legit: Legit | LegitProc, s: Settings) -> Blocks:
    """Baseline and attack blocks in turn (``s.blocks`` attack blocks, one more baseline block), so the
    host's load drift falls on both sides of the ratio. After each attack block: the recovery (three legit
    calls in time), then the server's CPU back near its baseline rate, then the next baseline block."""
    server, blocks = ctx.server, Blocks()
    n = s.blocks if attack.min_attack_s <= s.attack_s else min(s.blocks, 2)  # long attacks: two long blocks
    block_s = max(s.attack_s, attack.min_attack_s)

    def base() -> None:
        time.sleep(s.baseline_s)

    def hit() -> None:
        t = time.monotonic()
        attack.start(ctx)
        while time.monotonic() - t < block_s and not (time.monotonic() - t >= s.attack_s and attack.finished()):
            time.sleep(0.1)
        ctx.alive_at_stop = ctx.alive_at_stop and server.alive()
        attack.stop()  # in the block: the attacker's calls still in flight are its load until they end

    # The legit clients' first calls (the no-deadline channel's first, the first new connection at 1 s) are
    # not a baseline: a slow start there would raise the baseline's p99 and bias the ratio towards a pass.
    time.sleep(SETTLE_S)
    log0 = server.log_bytes()
    _timed_block(server, blocks, "base", base)
    a, b = blocks.base[0]
    ctx.baseline_log_bps = (server.log_bytes() - log0) / max(1e-3, b - a)
    for k in range(n):
        _progress(f"{attack.name}: attack block {k + 1}/{n}: {attack.what}")
        _timed_block(server, blocks, "attack", hit)
        t_stop = blocks.attack[-1][1]
        base_ms = [x for b in blocks.ms(legit.calls, blocks.base) for x in b]
        blocks.recover_s.append(
            _recovery(legit, t_stop, _pct(base_ms, 99) or 1e3, s.recover_cap_s) if server.alive() else None
        )
        base_cpu = blocks.cpu_base_s / max(1e-3, sum(b - a for a, b in blocks.base))
        blocks.quiesce_s.append(round(_quiesce(server, base_cpu, s.recover_cap_s), 2))
        _timed_block(server, blocks, "base", base)
    return blocks


def run_row(
    attack: Attack,
    s: Settings,
    flags: set[str],
    legit_req: bytes,
    legit_cut: str,
    root: Path,
    keep_logs: Path | None = None,
) -> dict[str, Any]:
    store, token_file, shas = _stage(attack, root)
    attack.build()
    server = Server(store, token_file, root / attack.name / "server.log", s, flags, attack.serve_args)
    _progress(f"{attack.name}: starting the server")
    server.start()
    try:
        front = attack.front(server.address, root / attack.name)
    except BaseException:
        server.kill()
        raise
    legit: Legit | LegitProc = Legit(front, legit_req) if s.legit_in_process else LegitProc(front, legit_req, root)
    proxy = Proxy(front, s.attacker_nice)
    try:
        legit.warm()
        rss_before = server.peak_rss_mb
        legit.start()
        ctx = Ctx(
            address=proxy.address,
            server_address=server.address,
            settings=s,
            server=server,
            legit_request=legit_req,
            legit_cut=legit_cut,
            store=store,
            shas=shas,
        )
        blocks = _interleave(attack, ctx, legit, s)
        t1, t_end = blocks.attack[0][0], time.monotonic()
        legit.nodl.settle(2.0)
        legit.stop()
        own_lost = sum(1 for c in attack.own.calls if _lost(c.code))
        extra_lost = attack.lost_extra()
        own_codes = Counter(f"attack:{c.code}" for c in attack.own.calls if _lost(c.code))
        own_n = len(attack.own.calls)
        notes = json.loads(json.dumps(attack.notes, default=str))  # the blocks', not the SIGTERM re-arm's
        _progress(f"{attack.name}: attack armed again, then SIGTERM")
        attack.start(ctx)
        time.sleep(1.0)
        exit_s = server.sigterm()
        attack.stop()
    finally:
        proxy.close()
        legit.stop()
        server.kill()
        attack.close_front()
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(server.log_path, keep_logs / f"{attack.name}.log")
    attack.notes = notes  # the targets judge the blocks' notes too
    calls = legit.all_calls()
    units = blocks.units(legit.calls)
    base = [x for b, _ in units for x in b]
    ok_ms = [x for _, d in units for x in d]
    # Every legit call from the first attack block on counts: the attack blocks, the recoveries and the
    # baseline blocks between them.
    after = [c for c in calls if t1 <= c.t < t_end]
    window = [c for c in calls if c.t >= t1]
    failed = Counter(c.code for c in after if c.code != "OK")
    lost_dl = sum(1 for c in window if c.kind == "dl" and _lost(c.code))
    lost_nodl = sum(1 for c in window if c.kind == "nodl" and _lost(c.code)) + own_lost + extra_lost
    lost_codes = Counter(f"{c.kind}:{c.code}" for c in window if _lost(c.code)) + own_codes
    recovered = [r for r in blocks.recover_s if r is not None]
    row: dict[str, Any] = {
        "row": attack.name,
        "attack": attack.what,
        "blocks": len(blocks.attack),
        "base_p50_ms": _pct(base, 50),
        "base_p99_ms": _pct(base, 99),
        "base_n": len(base),
        "attack_p50_ms": _pct(ok_ms, 50),
        "attack_p99_ms": _pct(ok_ms, 99),
        "attack_ok": len(ok_ms),
        "base_block_p99_ms": [_pct(b, 99) for b, _ in units],
        "attack_block_p99_ms": [_pct(d, 99) for _, d in units],
        "p99_x_ci95": _ratio_ci(units),
        "legit_calls": len(after),
        "legit_failed": sum(failed.values()),
        "legit_failed_by_code": dict(failed),
        "legit_said": {c.code: c.said for c in reversed(after) if c.code != "OK"},
        "lost_deadline": lost_dl,
        "lost_no_deadline": lost_nodl,
        "lost_by_code": dict(lost_codes),
        "nodl_calls": sum(1 for c in window if c.kind == "nodl") + own_n,
        "rss_before_mb": round(rss_before, 1),
        "peak_rss_mb": round(server.peak_rss_mb, 1),
        "budget_mb": s.budget_mb,
        "budget_enforced": server.budget_flag,
        "killed_at_hard_cap": server.killed_at_cap,
        "alive_at_attack_end": ctx.alive_at_stop,
        "load_1m": blocks.loads[1],  # this host's load average as the first attack block began
        "load_1m_blocks": blocks.loads,
        # The server's CPU (cores busy, its children included) in the baseline and the attack blocks.
        "server_cpu_base": round(blocks.cpu_base_s / max(1e-3, sum(b - a for a, b in blocks.base)), 2),
        "server_cpu_attack": round(blocks.cpu_attack_s / max(1e-3, sum(b - a for a, b in blocks.attack)), 2),
        "recover_s": None if len(recovered) < len(blocks.recover_s) else max(recovered, default=0.0),
        "quiesce_s": blocks.quiesce_s,
        "sigterm_exit_s": exit_s,
        "drain_s": s.drain_s,
        "notes": notes,
        "proxy_row": attack.proxy_row,
    }
    row["targets"] = targets(row, attack)
    row["pass"] = all(ok for _, ok in row["targets"])
    _progress(
        f"{attack.name}: {'PASS' if row['pass'] else 'FAIL'} "
        f"({', '.join(n for n, ok in row['targets'] if not ok) or 'every target met'})"
    )
    return row


def targets(row: dict[str, Any], attack: Attack) -> list[tuple[str, bool]]:
    base, p99 = row["base_p99_ms"], row["attack_p99_ms"]
    exit_s = row["sigterm_exit_s"]
    return [
        ("0 legit failures", row["legit_failed"] == 0),
        ("p99 <= 3x", base is not None and p99 is not None and p99 <= 3 * base),
        ("RSS <= budget", row["peak_rss_mb"] <= row["budget_mb"]),
        ("0 lost", row["lost_deadline"] == 0 and row["lost_no_deadline"] == 0),
        ("SIGTERM <= drain+5", exit_s is not None and exit_s <= row["drain_s"] + 5 and not row["killed_at_hard_cap"]),
        *attack.extra_targets(row),
    ]


# -- the table -----------------------------------------------------------------------------------------


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f" ({ci[0]:.1f}-{ci[1]:.1f})"


def _load(r: dict[str, Any]) -> str:
    """The 1-min load average over the row's blocks (lowest-highest), or as its attack began."""
    loads = r.get("load_1m_blocks")
    if loads:
        return f"{min(loads):.1f}-{max(loads):.1f}"
    return f"{r['load_1m']:.1f}" if "load_1m" in r else "-"


def _ms(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.0f}/{b:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        ratio = (r["attack_p99_ms"] / r["base_p99_ms"]) if r["attack_p99_ms"] and r["base_p99_ms"] else None
        rss = f"{r['peak_rss_mb']:.0f}/{r['budget_mb']:g}" + ("" if r["budget_enforced"] else "*")
        if r["killed_at_hard_cap"]:
            rss = ">" + rss + " killed"
        exit_s = r["sigterm_exit_s"]
        term = (
            "killed"
            if r["killed_at_hard_cap"]
            else (f"hung>{r['drain_s'] + 6:g}" if exit_s is None else f"{exit_s:.1f}")
        )
        fails = [n for n, ok in r["targets"] if not ok]
        out.append(
            [
                r["row"],
                r["attack"],
                _load(r),
                _ms(r["base_p50_ms"], r["base_p99_ms"]),
                _ms(r["attack_p50_ms"], r["attack_p99_ms"]),
                "-" if ratio is None else f"{ratio:.1f}" + _ci(r.get("p99_x_ci95")),
                f"{r['legit_failed']}/{r['legit_calls']}",
                f"{r['lost_deadline']}/{r['lost_no_deadline']}",
                rss,
                f"{r['server_cpu_base']:.2f}/{r['server_cpu_attack']:.2f}" if "server_cpu_base" in r else "-",
                "never" if r["recover_s"] is None else f"{r['recover_s']:.1f}",
                term,
                "PASS"
                if r["pass"]
                else (
                    "FAIL: " + ", ".join(fails) + (f" (the proxy's: {r['proxy_row']})" if r.get("proxy_row") else "")
                ),
            ]
        )
    return render(
        [
            "row",
            "attack",
            "load",
            "before p50/p99 ms",
            "during p50/p99 ms",
            "p99 x (95 % CI)",
            "legit failed",
            "lost dl/no-dl",
            "peak RSS/budget MiB",
            "server CPU before/during",
            "recover s",
            "SIGTERM s",
            "verdict",
        ],
        out,
    )


def _proxys(r: dict[str, Any]) -> str:
    return f" (the edge proxy's job: {r['proxy_row']})" if r.get("proxy_row") else ""


def _note(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), default=str)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases, one row per class (about 2 min)")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument(
        "--budget-mb",
        type=float,
        default=1024.0,
        help="the server's memory budget (passed as --max-memory-mb when it has the flag)",
    )
    ap.add_argument("--hard-cap-mb", type=float, default=3072.0, help="kill a server above this RSS (shared host)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--blocks", type=int, help="attack blocks per row (default 4; --quick: 2)")
    ap.add_argument("--logs", type=Path, metavar="DIR", help="keep each row's server log here (<row>.log)")
    ap.add_argument("--render", type=Path, metavar="FILE", help="print the table of a saved --json run")
    ap.add_argument(
        "--legit-in-process",
        action="store_true",
        help="run the legit clients in this process, beside the attackers' threads (default: a child process)",
    )
    ap.add_argument(
        "--attacker-nice",
        type=int,
        default=10,
        help="nice value of the attack's client threads in this process (default 10; 0: the server's priority)",
    )
    ap.add_argument("--legit-child", nargs=2, metavar=("ADDRESS", "REQUEST"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for every row's splitrt serve (repeatable; e.g. --serve-arg=--log-every-request)",
    )
    args = ap.parse_args(argv)
    if args.legit_child:
        return legit_child(*args.legit_child)
    if args.render is not None:
        print(report(json.loads(args.render.read_text())))
        return 0
    s = (
        Settings(baseline_s=1.0, attack_s=1.5, blocks=2, recover_cap_s=3.0, drain_s=1.0, quick=True)
        if args.quick
        else Settings(baseline_s=2.0, attack_s=2.5, blocks=4, recover_cap_s=6.0, drain_s=2.0)
    )
    s = Settings(
        **{
            **s.__dict__,
            "budget_mb": args.budget_mb,
            "hard_cap_mb": args.hard_cap_mb,
            "serve_args": tuple(args.serve_arg),
            "legit_in_process": args.legit_in_process,
            "attacker_nice": args.attacker_nice,
            **({"blocks": args.blocks} if args.blocks else {}),
        }
    )
    names = args.rows.split(",") if args.rows else (QUICK_ROWS if s.quick else [a.name for a in attacks()])
    chosen = [a for a in attacks() if a.name in names]
    if not chosen:
        ap.error(f"--rows: expected some of {[a.name for a in attacks()]}, got {args.rows!r}")
    result = run(chosen, s, args.logs)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(report(result))
    return 0 if all(r["pass"] or r.get("proxy_row") for r in result["rows"]) else 1


def run(chosen: list[Attack], s: Settings, keep_logs: Path | None = None) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < want:  # 1100 sockets of our own, plus the legit clients'
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    flags = server_flags()
    load0 = os.getloadavg()
    t0 = time.monotonic()
    _progress("building the legit request")
    legit_req, legit_cut = legit_request()
    rows = []
    with tempfile.TemporaryDirectory(prefix="splitrt-attack-") as tmp:
        for attack in chosen:
            rows.append(run_row(attack, s, flags, legit_req, legit_cut, Path(tmp), keep_logs))
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": s.__dict__,
        "server_flags": sorted(f for f in flags if f.startswith("--max")),
        "legit": f"{LEGIT_MODEL} at {legit_cut}",
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"bench_attack {result['date_utc']}: splitrt serve --workers 2 --token-file --allow-upload "
        f"--drain-s {s['drain_s']:g} (RLIMIT_NOFILE {SERVER_NOFILE}); legit {result['legit']} every 50 ms "
        f"(5 s deadline) + every 250 ms (no deadline) + a new connection every 1 s; "
        f"the attack's client threads at nice {s.get('attacker_nice', 0)}",
        f"load average {result['load_before']} before, {result['load_after']} after; "
        f"{result['seconds']} s in all; server limits: {', '.join(result['server_flags']) or 'none'}",
        f"phases interleaved: {s.get('blocks', 1)} attack blocks of {s['attack_s']:g} s, each between baseline "
        f"blocks of {s['baseline_s']:g} s (after each attack block: recovery, then the server's CPU back near its "
        "baseline rate); load: the 1-min load average over the blocks",
        "targets: 0 legit failures (from the first attack block on), legit p99 <= 3x before (pooled blocks, on "
        "the point value; the 95 % CI resamples block pairs, then calls), peak RSS <= budget (* = the server has no "
        "--max-memory-mb: a nominal budget), 0 lost (dl/no-dl), SIGTERM exit <= drain + 5 s; "
        f"upload_burst: uploads on disk <= {STORE_CAP_MB} MiB (--max-store-mb); "
        f"token_guess: <= {GUESS_RATE_MAX:g} guesses/s, <= {LOG_MB_DAY_MAX:g} MB/day of log; a row marked "
        '"the edge proxy\'s job" floods connections or HTTP/2 straight at a server alone (no exit status: its '
        "_proxy row is the documented deployment's)",
        "",
        table(result["rows"]),
        "",
    ]
    lines += [
        f"{r['row']}: {_note(r['notes'])}"
        + (f" failed {_note(r['legit_failed_by_code'])} {_note(r.get('legit_said', {}))}" if r["legit_failed"] else "")
        + (f" lost {_note(r['lost_by_code'])}" if r.get("lost_by_code") else "")
        for r in result["rows"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
