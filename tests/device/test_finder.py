"""Discovery wiring: the pure cloud-list choice, a CloudFinder fed by hand against real clouds on
127.0.0.1, and (root) two clouds advertised from two namespaces with `splitrt run --discover` in a third:
stop the cloud in use, the device moves to the other with no failed request."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import DeviceConfig
from splitrt.device.discovery import CloudFinder, plan_clouds
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.profile.priors import flops_table
from splitrt.rig.cloudserver import ServerProcess, start_server
from splitrt.transport.discovery import ServerInfo

MODEL = "squeezenet"
REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32
OTHER = "cd" * 32


def info(
    name: str,
    host: str,
    port: int,
    *,
    models: tuple[str, ...] = (SHA[:16],),
    load: float = 1.0,
    secure: bool | None = True,
) -> ServerInfo:
    return ServerInfo(
        name=name, host=host, port=port, addresses=(host,), version="0.1.0", models=models, load=load, secure=secure
    )


def test_plan_clouds_static_first_then_serving_servers_ranked() -> None:
    servers = {
        "near": info("near", "10.0.0.1", 1, load=1.0),
        "far": info("far", "10.0.0.2", 1, load=1.0),
        "busy": info("busy", "10.0.0.3", 1, load=20.0),
        "unprobed": info("unprobed", "10.0.0.4", 1),
        "other-model": info("other-model", "10.0.0.5", 1, models=(OTHER[:16],)),
    }
    rtts = {"10.0.0.1:1": 2.0, "10.0.0.2:1": 50.0, "10.0.0.3:1": 1.0}
    got = plan_clouds(servers, SHA, rtts, static=("192.168.1.9:50051", "10.0.0.2:1"), tail_ms=10.0)
    # static first (in order, no duplicate), then near (2+10), busy (1+200), unprobed last; other model out
    assert got == ["192.168.1.9:50051", "10.0.0.2:1", "10.0.0.1:1", "10.0.0.3:1", "10.0.0.4:1"]
    assert plan_clouds({}, SHA, {}) == []
    assert plan_clouds(servers, OTHER, {}) == ["10.0.0.5:1"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("finder-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


@pytest.fixture()
def two_clouds(models_dir: Path) -> Iterator[tuple[CloudServer, CloudServer]]:
    a = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    b = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    a.start()
    b.start()
    yield a, b
    a.stop(grace_s=0.2)
    b.stop(grace_s=0.2)


def test_finder_follows_the_advertised_set(two_clouds: tuple[CloudServer, CloudServer]) -> None:
    a, b = two_clouds
    mg = graph.load(zoo.get(MODEL))
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    x = {"data_0": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    host_a, port_a = a.address.split(":")
    host_b, port_b = b.address.split(":")
    sa = info("a", host_a, int(port_a), models=(mg.sha256[:16],))
    sb = info("b", host_b, int(port_b), models=(mg.sha256,))
    s_other = info("x", "127.0.0.1", 9, models=(OTHER[:16],))
    updates: list[dict[str, list[str]]] = []
    config = RuntimeConfig(policy="fixed:c30@fp32", prober_interval_s=0.05)
    with (
        AdaptiveDevice(mg, table, config=config, device_config=DeviceConfig(intra_op_threads=1)) as dev,
        CloudFinder(dev, browse=False, rerank_s=0, on_update=updates.append) as finder,
    ):
        assert dev.clouds() == [] and finder.wait_for_cloud(0.1) is False
        finder.update({"a": sa, "x": s_other})
        assert [c["address"] for c in dev.clouds()] == [a.address]  # the other model's server is ignored
        assert dev.infer(x).server == a.address
        finder.update({"a": sa, "b": sb, "x": s_other})
        assert {c["address"] for c in dev.clouds()} == {a.address, b.address}
        finder.update({"b": sb})  # a said goodbye
        assert [c["address"] for c in dev.clouds()] == [b.address]
        out = dev.infer(x)
        assert out.server == b.address and not out.fallback
        assert finder.wait_for_cloud(1.0)
        finder.update({})
        out = dev.infer(x)
        assert out.server is None and out.plan == "device"
    assert [sorted(u[mg.path.name]) for u in updates] == [[a.address], sorted([a.address, b.address]), [b.address], []]


def test_finder_keeps_static_clouds(two_clouds: tuple[CloudServer, CloudServer]) -> None:
    a, b = two_clouds
    mg = graph.load(zoo.get(MODEL))
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    host_b, port_b = b.address.split(":")
    with (
        AdaptiveDevice(mg, table, start_prober=False) as dev,
        CloudFinder(dev, static=[a.address], browse=False, rerank_s=0) as finder,
    ):
        assert [c["address"] for c in dev.clouds()] == [a.address]
        finder.update({"b": info("b", host_b, int(port_b), models=(mg.sha256,))})
        assert [c["address"] for c in dev.clouds()] == [a.address, b.address]
        finder.update({})
        assert [c["address"] for c in dev.clouds()] == [a.address]


class _Recorder:
    """A finder target that records its cloud lists (no runtime, no network)."""

    def __init__(self, sha256: str, caplog: pytest.LogCaptureFixture) -> None:
        self.graph = type("G", (), {"sha256": sha256, "path": Path("m.onnx")})()
        self.caplog = caplog
        self.lists: list[tuple[list[str], int]] = []  # (list, log records so far)
        self._clouds: list[str] = []

    def set_clouds(self, addresses: Any) -> None:
        self._clouds = list(addresses)
        self.lists.append((list(addresses), len(self.caplog.records)))

    def clouds(self) -> list[dict[str, object]]:
        return [{"address": a, "up": False, "rtt_ms": None} for a in self._clouds]


def test_finder_warns_before_a_device_can_send_to_an_insecure_cloud(caplog: pytest.LogCaptureFixture) -> None:
    dev = _Recorder(SHA, caplog)
    servers = {
        "open": info("open", "10.0.0.1", 1, secure=False),
        "old": info("old", "10.0.0.2", 1, secure=None),
        "locked": info("locked", "10.0.0.3", 1, secure=True),
        "static-open": info("static-open", "10.0.0.4", 1, secure=False),
    }
    with (
        caplog.at_level(logging.WARNING, logger="splitrt.device.discovery"),
        CloudFinder(dev, static=["10.0.0.4:1"], browse=False, rerank_s=0) as finder,
    ):
        finder.update(servers)
        finder.update(servers)  # again: each address is warned about once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert any("cloud 'open' at 10.0.0.1:1 advertises secure=0 (no TLS and bearer token)" in w for w in warnings)
    assert any("cloud 'old' at 10.0.0.2:1 does not advertise whether it is secure" in w for w in warnings)
    assert sorted(finder.warnings) == ["10.0.0.1:1", "10.0.0.2:1"]  # not the TLS+token one, not the static one
    # both warnings were logged before the list holding those clouds reached the device
    records_then = next(n for lst, n in dev.lists if "10.0.0.1:1" in lst)
    assert records_then == 2


# -- namespaces (root) --------------------------------------------------------------------------------


class Proc:
    """A process in a namespace whose stdout/stderr lines are collected by threads."""

    def __init__(self, host: Any, argv: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc: subprocess.Popen[str] = host.popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.cond = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self._readers:
            t.start()

    def _read(self, stream: Any, sink: list[str]) -> None:
        for line in stream:
            with self.cond:
                sink.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred: Any, timeout_s: float = 60.0) -> None:
        """Until ``pred()`` holds (a guard against hanging, not a timing assertion)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not pred()):
                    pytest.fail(f"condition not met; stdout {self.out[-20:]}; stderr {''.join(self.err)[-3000:]}")
                self.cond.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The readers end at EOF; then the pipes are closed here, not left to the garbage collector.
        for t in self._readers:
            t.join(timeout=5)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture(scope="module")
def lan() -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    from splitrt.rig import netns

    prefix = f"spl-fd{os.getpid() % 1000}"
    netns.cleanup_leftovers(prefix)
    with netns.make_lan(prefix, 3) as the_lan:
        yield the_lan


@pytest.mark.root
def test_device_moves_to_the_other_advertised_cloud_without_failing(lan: Any, models_dir: Path) -> None:
    h0, h1, h2 = lan.hosts
    model = str(zoo.get(MODEL))
    n = 48

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    def serve(host: Any, name: str) -> ServerProcess:
        # no TLS/token on a test LAN: the choice is explicit (--insecure); ready once it advertises
        flags = ["--host", "0.0.0.0", "--insecure", "--workers", "1", "--intra-op-threads", "1", "--drain-s", "2"]
        flags += ["--advertise", "--advertise-name", name, "--advertise-interface", host.ip]
        return start_server(
            models_dir,
            *flags,
            "--advertise-address",
            host.ip,
            port=50051,
            popen=lambda argv: host.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env),
            wait=False,
        )

    clouds = {f"{h1.ip}:50051": serve(h1, "cloud-a"), f"{h2.ip}:50051": serve(h2, "cloud-b")}
    device: Proc | None = None
    try:
        for p in clouds.values():
            p.event("advertised")
        device = Proc(
            h0,
            [
                sys.executable,
                "-m",
                "splitrt.cli",
                "run",
                model,
                "--discover",
                "--discover-interface",
                h0.ip,
                "--discover-wait-s",
                "30",
                "--cut",
                "c30",
                "--count",
                str(n),
                "--rate",
                "8",
                "--deadline-ms",
                "3000",
                "--json",
                "--verify",
            ],
        )
        dev = device

        def requests() -> list[dict[str, Any]]:
            return [json.loads(ln) for ln in dev.out if ln.startswith('{"id"')]

        dev.wait_for(lambda: len(requests()) >= 12)
        first = requests()[0]["server"]
        assert first in clouds, requests()[:3]
        other = next(a for a in clouds if a != first)
        t_stop = time.monotonic()
        n_before = len(requests())
        assert clouds[first].stop() == 0, clouds[first].output()
        dev.wait_for(lambda: any(r["server"] == other for r in requests()[n_before:]))
        failover_s = time.monotonic() - t_stop
        dev.wait_for(lambda: any(ln.startswith('{"summary"') for ln in dev.out), timeout_s=120)
        assert dev.proc.wait(timeout=30) == 0, "".join(dev.err)[-3000:]
    finally:
        if device is not None:
            device.stop()
        for p in clouds.values():
            p.stop()
    # the servers said they were open, and the device warned before using them
    assert all(p.named("insecure") for p in clouds.values())
    assert any("advertises secure=0" in ln for ln in dev.err), "".join(dev.err)[-2000:]
    rows = requests()
    summary = json.loads(next(ln for ln in dev.out if ln.startswith('{"summary"')))["summary"]
    assert [r["id"] for r in rows] == list(range(n))
    assert all(r["ok"] for r in rows) and all(r["rel_err"] < 1e-5 for r in rows)
    assert summary["completed"] == n and summary["failed"] == 0
    # before the stop the requests are split with either cloud (the device balances over both: idle
    # ones take turns); after it, every request is split with the other one
    i_switch = next(i for i, r in enumerate(rows) if i >= n_before and r["server"] == other)
    assert all(r["server"] in clouds for r in rows[:n_before])
    assert all(r["server"] == other for r in rows[i_switch + 3 :])
    fallbacks = sum(r["fallback"] for r in rows)
    assert summary["fallbacks"] == fallbacks
    print(
        f"\nfinder figures: failover_s={failover_s:.3f} fallbacks={fallbacks} "
        f"local={sum(r['server'] is None for r in rows)} servers={summary['servers']}"
    )
