"""Fair admission on a real server (2 workers, 127.0.0.1): a client whose requests hold workers (held in
the tail by a test hook, as a Loop running to its deadline would) from 127.0.0.2 gets one worker while
another client is active; the other client, on 127.0.0.1, is served at once meanwhile (first come first
served, the held client would have both workers and the other would wait out its deadline). Served
requests are logged a few per interval, the rest summarised (``RateLog.request``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from splitrt.cloud.capacity.admission import current_client
from splitrt.cloud.capacity.fairq import FairConfig, FairQueue
from splitrt.cloud.common import client_key
from splitrt.cloud.guard.ratelog import RateLog
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


@contextlib.contextmanager
def from_address(target: tuple[str, int], source: str) -> Iterator[str]:
    """A TCP forwarder on 127.0.0.1 whose connections reach ``target`` from ``source`` (another peer)."""
    listener = socket.create_server(("127.0.0.1", 0))
    socks: list[socket.socket] = []

    def pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(1 << 16):
                b.sendall(data)
        for x in (a, b):
            with contextlib.suppress(OSError):
                x.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                up = socket.create_connection(target, source_address=(source, 0))
                socks.extend((client, up))
                for a, b in ((client, up), (up, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for x in socks:
            with contextlib.suppress(OSError):
                x.close()


@contextlib.contextmanager
def held_client(s: CloudServer, release: threading.Event, cut: str) -> Iterator[tuple[Device, Any, list[Any]]]:
    """A legit client on 127.0.0.1 (active: it has asked) and a client from 127.0.0.2 with 4 requests at
    ``cut`` whose tails wait for ``release`` (a test hook, as a Loop running to its deadline would): one
    runs, three wait. Yields the legit device, an input, and the held requests' futures."""

    def hold(header: pb.InferRequest) -> None:
        if current_client() == "127.0.0.2":
            release.wait(60)

    # Active for the whole test (the default counts a client active 1 s after its last request).
    s.admission.queue = FairQueue(FairConfig(workers=2, active_window_s=3600.0))
    s.handler.before_tail = hold
    model = zoo.get("tiny_chain")
    with (
        Device(model, s.address, config=DeviceConfig(timeout_s=20)) as legit,
        from_address(("127.0.0.1", s.port), "127.0.0.2") as via,
        Device(model, via, config=DeviceConfig(timeout_s=60)) as heavy,
        ThreadPoolExecutor(4) as pool,
    ):
        x = legit.random_inputs()
        legit.run(x, cut="c2")
        held = [pool.submit(heavy.run, x, cut=cut) for _ in range(4)]
        for _ in range(2000):
            if s.admission.running == 1 and len(s.admission.queue.waiting) == 3:
                break
            release.wait(0.005)
        try:
            yield legit, x, held
        finally:
            release.set()


def test_a_client_holding_workers_gets_its_share_and_the_other_is_served(models_dir: Path) -> None:
    release = threading.Event()
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=2, max_queue=8)) as s,
        held_client(s, release, "c2") as (legit, x, held),
    ):
        # One held request runs, three wait for the held client's next turn.
        assert s.admission.running == 1 and len(s.admission.queue.waiting) == 3
        assert {j.client for j in s.admission.queue.waiting} == {"127.0.0.2"}
        # The other worker is the legit client's: served while the held ones still hold.
        for _ in range(3):
            assert legit.run(x, cut="c2")["y"].shape
        assert not release.is_set() and s.admission.running == 1
        release.set()
        for f in held:
            assert f.result(timeout=60)["y"].shape
    assert s.admission.running == 0 and not s.admission.queue.waiting


def test_client_keys() -> None:
    assert client_key("ipv4:10.0.0.5:51234") == "10.0.0.5"
    assert client_key("ipv6:[2001:db8::1:2]:7") == "2001:db8::/64"  # one host's /64 is one client
    assert client_key("ipv6:[::ffff:1.2.3.4]:9") == "1.2.3.4"
    assert client_key("unix:/run/s.sock") == "unix:/run/s.sock"


def test_served_requests_are_logged_a_few_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLog(interval_s=10.0, burst=5, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "splitrt.cloud"):
        for i in range(100):
            log.request("infer", code="OK", request_id=f"r{i}")
        log.request("infer", logging.WARNING, code="DEADLINE_EXCEEDED", request_id="late")
        now[0] = 10.5
        log.flush()
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [e["request_id"] for e in lines if e["event"] == "infer"] == ["r0", "r1", "r2", "r3", "r4", "late"]
    (summary,) = [e for e in lines if e["event"] == "suppressed"]
    assert summary["counts"] == {"infer:OK": 95}
    caplog.clear()
    every = RateLog(interval_s=10.0, every_request=True, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "splitrt.cloud"):
        for i in range(20):
            every.request("infer", code="OK", request_id=f"r{i}")
    assert sum('"event": "infer"' in r.getMessage() for r in caplog.records) == 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
@pytest.mark.parametrize("nice", [10, 0])
def test_the_runs_of_a_client_over_its_share_yield_the_cpu(models_dir: Path, nice: int) -> None:
    release = threading.Event()
    runs: list[tuple[str, int]] = []  # (what the run was, the nice value of the thread it ran on)
    with CloudServer(ServerConfig(models_dir=models_dir, workers=2, max_queue=8, over_share_nice=nice)) as s:
        real_run = s.canceller.run

        def spy(*args: Any, **kwargs: Any) -> Any:  # the real run, on whichever thread it was given
            runs.append((kwargs["what"], os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            return real_run(*args, **kwargs)

        s.canceller.run = spy  # type: ignore[method-assign]
        with held_client(s, release, "c1") as (legit, x, held):
            for _ in range(3):
                legit.run(x, cut="c2")
            release.set()
            for f in held:
                assert f.result(timeout=60)["y"].shape
    base = os.getpriority(os.PRIO_PROCESS, 0)
    light = [n for what, n in runs if "'c2'" in what]
    over = [n for what, n in runs if "'c1'" in what]
    assert len(light) == 4 and len(over) == 4
    assert light == [base] * 4  # the light client's runs keep the server's priority
    # One at a time (the legit client is active): the second and third were granted with others of the
    # held client's still waiting, so they yield; the last had none waiting. (The first, granted as the
    # others arrived, may go either way.)
    assert over[1:] == [min(19, base + nice)] * 2 + [base]
