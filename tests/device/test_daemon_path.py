"""The daemon over a path of tiers: ``edge`` / ``hops`` config, and three tiers served end to end.

Three real processes' worth: a cloud (``splitrt serve``) and an edge (``splitrt serve --next`` the cloud)
as their own processes on 127.0.0.1, SIGKILLed mid-stream; the daemon in-process behind its real local
gRPC API. The device is priced 1000x slower than the host and the edge 200x slower than the cloud, so the plans
send requests through the edge on to the cloud while both are up, and have the edge finish them (not the
device) once the cloud is gone.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cloud.handler.nexthop import NextTier
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig, parse_config
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from tests.conftest import rel_err, session
from tests.loopback import free_port, serve
from tests.prom import samples

MODEL = "squeezenet"
REPO = Path(__file__).resolve().parents[2]
GOOD = {"model": [{"name": "sq", "path": "zoo:squeezenet"}]}


# -- config -----------------------------------------------------------------------------------------


def test_edge_and_hops_give_the_path(tmp_path: Path) -> None:
    two = parse_config({**GOOD, "clouds": ["10.0.0.5:1"]}, base_dir=tmp_path)
    assert two.path == (("10.0.0.5:1",),)
    edge = parse_config({**GOOD, "edge": "10.0.0.2:1", "edge_speed_factor": 4}, base_dir=tmp_path)
    assert edge.path == (("10.0.0.2:1",), ()) and edge.edge_speed_factor == 4  # the cloud: the edge's next tier
    both = parse_config({**GOOD, "edge": "10.0.0.2:1", "clouds": ["10.0.0.5:1"]}, base_dir=tmp_path)
    assert both.path == (("10.0.0.2:1",), ("10.0.0.5:1",))
    hops = parse_config({**GOOD, "hops": ["10.0.0.2:1", "10.0.0.5:1"]}, base_dir=tmp_path)
    assert hops.path == (("10.0.0.2:1",), ("10.0.0.5:1",))
    balanced = parse_config({**GOOD, "hops": [["10.0.0.5:1", "10.0.0.6:1"]]}, base_dir=tmp_path)
    assert balanced.path == (("10.0.0.5:1", "10.0.0.6:1"),)


def test_the_readme_three_tier_config_parses(tmp_path: Path) -> None:
    import re
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    blocks = re.findall(r"```toml\n(.*?)```", (REPO / "docs" / "board.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "edge = " in b]
    cfg = parse_config(tomllib.loads(block), base_dir=tmp_path)
    assert cfg.path == (("10.0.0.2:50051",), ("10.0.0.5:50051",)) and cfg.edge_speed_factor == 4.0


def test_daemon_check_says_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from splitrt.cli.app import main

    cfg = tmp_path / "d.toml"
    cfg.write_text(
        'edge = "10.0.0.2:1"\napi_address = "127.0.0.1:0"\n[[model]]\nname = "sq"\npath = "zoo:squeezenet"\n'
    )
    assert main(["daemon", "--config", str(cfg), "--check"]) == 0
    assert "3 tiers: device -> 10.0.0.2:1 -> the edge's next tier" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"edge": "nohost"}, r"key 'edge': expected HOST:PORT, got 'nohost'"),
        ({"hops": ["a:1", ["b:1", 5]]}, r"key 'hops': hop 1: expected HOST:PORT or a list of them, got \['b:1', 5\]"),
        ({"hops": []}, r"key 'hops': expected 1 to 2 hops .*got 0"),
        ({"hops": ["a:1", "b:1", "c:1"]}, r"key 'hops': expected 1 to 2 hops .*got 3"),
        ({"hops": ["a:1"], "clouds": ["b:1"]}, r"key 'hops': expected hops alone .*got clouds too"),
        ({"edge": "a:1", "discovery": True}, r"three tiers .*expected discovery = false"),
        ({"edge_speed_factor": 0}, r"key 'edge_speed_factor': expected a number > 0 .*got 0"),
    ],
)
def test_path_config_errors_name_what_was_expected(tmp_path: Path, extra: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_config({**GOOD, **extra}, base_dir=tmp_path)


# -- three tiers, tiers killed mid-stream ------------------------------------------------------------


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("path-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


@pytest.fixture()
def tiers(models_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str, str]]:
    """(edge process, cloud process, edge address, cloud address)."""
    cloud_port, edge_port = free_port(), free_port()
    cloud = serve(models_dir, cloud_port)
    edge = None
    try:
        edge = serve(models_dir, edge_port, extra=["--next", f"127.0.0.1:{cloud_port}"])
        yield edge, cloud, f"127.0.0.1:{edge_port}", f"127.0.0.1:{cloud_port}"
    finally:
        for p in (edge, cloud):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait(10)


def _daemon(tmp_path: Path, edge: str, cloud: str, **kw: Any) -> Daemon:
    board = tmp_path / "slow.toml"  # the shipped x86 board, 1000x slower
    x86 = (REPO / "devices" / "x86.toml").read_text()
    board.write_text(x86.replace("cpu_speed_factor = 1.0", "cpu_speed_factor = 1000.0").replace('"x86"', '"slow"'))
    return Daemon(
        DaemonConfig(
            models=(ModelConfig(name="sq", path=f"zoo:{MODEL}"),),
            hops=kw.pop("hops", ((edge,), (cloud,))),
            edge_speed_factor=200.0,
            board=str(board),
            api_address="127.0.0.1:0",
            api_socket_path=None,
            metrics_port=None,
            intra_op_threads=1,
            # Room for a local finish of the whole model on the 1000x board at a busy host's device load
            # (sampled as for two tiers): the reserve would otherwise keep every request here.
            deadline_ms=120_000,
            **kw,
        )
    )


def _stream(api: str, n: int, kill_after: int, kill: subprocess.Popen[bytes]) -> list[Any]:
    """``n`` requests one after another through the local API, SIGKILLing ``kill`` after ``kill_after``
    of them have answered (a request is then in flight or about to be)."""
    x = {"data_0": np.random.default_rng(7).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    results: list[Any] = []
    killed = threading.Event()
    with LocalClient(api, timeout_s=60.0) as client:
        for i in range(n):
            if i == kill_after:
                threading.Timer(0.005, lambda: (kill.send_signal(signal.SIGKILL), killed.set())).start()
            try:
                results.append(client.infer(x, request_id=f"r{i}"))
            except Exception as exc:  # counted as lost below
                results.append(exc)
    assert killed.wait(5)
    return [x, *results]


def _after_first_fallback(results: list[Any]) -> list[Any]:
    """The requests after the one the kill caught (the SIGKILL timer may fire a request or two late on
    a busy host: the first fallback marks it)."""
    first = next((i for i, r in enumerate(results) if r.fallback), len(results))
    return results[first + 1 :]


def _check(x_and_results: list[Any]) -> list[Any]:
    x, *results = x_and_results
    lost = [r for r in results if isinstance(r, Exception)]
    assert lost == [], f"{len(lost)} requests lost: {lost[:3]}"
    want = session(zoo.get(MODEL)).run(None, x)[0]
    for r in results:
        assert rel_err(want, r.outputs["softmaxout_1"]) < 1e-4, (r.request_id, r.plan, r.server)
    return results


@pytest.mark.slow
def test_three_tiers_edge_killed_mid_stream_loses_nothing(tmp_path: Path, tiers: Any) -> None:
    edge_proc, _, edge, cloud = tiers
    with _daemon(tmp_path, edge, cloud) as d:
        assert d.api_address is not None
        results = _check(_stream(d.api_address, 16, 6, edge_proc))
        before, after = results[:6], _after_first_fallback(results[6:])
        assert len(after) >= 4, [(r.plan, r.server, r.fallback) for r in results]
        # through the edge on to the cloud; the request the kill caught went straight to the cloud
        assert all(">" in r.plan and r.server == cloud for r in before), [(r.plan, r.server) for r in before]
        assert any(r.fallback for r in results[6:]), [(r.plan, r.server, r.fallback) for r in results[6:]]
        # then two tiers: device -> cloud, the edge left out
        assert all(">" not in r.plan and r.server == cloud for r in after), [(r.plan, r.server) for r in after]
        status = d.plan(d.model("sq"))
        assert status["completed"] == 16 and status["failed"] == 0
        edge_state = next(c for c in status["clouds"] if c["address"] == edge)
        assert not edge_state["up"] and edge_state["last_error"]


@pytest.mark.slow
def test_three_tiers_cloud_killed_mid_stream_loses_nothing(tmp_path: Path, tiers: Any) -> None:
    _, cloud_proc, edge, cloud = tiers
    with _daemon(tmp_path, edge, cloud) as d:
        assert d.api_address is not None
        results = _check(_stream(d.api_address, 16, 6, cloud_proc))
        before, after = results[:6], _after_first_fallback(results[6:])
        assert len(after) >= 4, [(r.plan, r.server, r.fallback) for r in results]
        assert all(">" in r.plan and r.server == cloud for r in before), [(r.plan, r.server) for r in before]
        # the request the kill caught was finished by the edge; then the plans have the edge finish
        assert any(r.fallback for r in results[6:]), [(r.plan, r.server, r.fallback) for r in results[6:]]
        # (the edge finishing: the hop to the cloud pinned to device)
        assert all(r.plan.endswith(">device") and r.server == edge for r in after), [(r.plan, r.server) for r in after]
        status = d.plan(d.model("sq"))
        assert status["completed"] == 16 and status["failed"] == 0


@pytest.fixture()
def in_process(models_dir: Path) -> Iterator[tuple[str, str]]:
    """An edge and a cloud in this process (for what needs no SIGKILL)."""
    cloud = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    cloud.start()
    edge = CloudServer(
        ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1, next_tier=NextTier(address=cloud.address))
    )
    edge.start()
    yield edge.address, cloud.address
    edge.stop(grace_s=0)
    cloud.stop(grace_s=0)


def test_three_tiers_take_a_fixed_plan_and_constraints(tmp_path: Path, in_process: tuple[str, str]) -> None:
    edge, cloud = in_process
    x = {"data_0": np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    want = session(zoo.get(MODEL)).run(None, x)[0]
    with _daemon(tmp_path, edge, cloud, policy="fixed:c4@fp32>c20@fp32") as d, LocalClient(str(d.api_address)) as c:
        for _ in range(3):
            r = c.infer(x)
            assert (r.plan, r.server) == ("c4@fp32>c20@fp32", cloud)  # the server that made the outputs
            assert rel_err(want, r.outputs["softmaxout_1"]) < 1e-4
        assert c.plan().policy == "fixed:c4@fp32>c20@fp32"
        assert {s.address for s in c.plan().clouds} == {edge, f"{edge}/next", cloud}
        metrics = samples(d.metrics_text())  # the same Prometheus families as two tiers
        assert metrics[("splitrt_cloud_up", (("cloud", edge), ("model", "sq")))] == 1
        assert metrics[("splitrt_requests_total", (("model", "sq"),))] == 3
    # unconstrained, this device sends its input (first cut "cloud", see the kill tests); never with no_raw_input
    with _daemon(tmp_path, edge, cloud, no_raw_input=True) as d, LocalClient(str(d.api_address)) as c:
        plans = [c.infer(x).plan for _ in range(4)]
        assert all(">" in p and not p.startswith("cloud@") for p in plans), plans


def test_three_tiers_balance_the_first_hop_and_lose_nothing_when_an_edge_stops(
    tmp_path: Path, models_dir: Path
) -> None:
    cloud = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    cloud.start()
    cfg = ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1, next_tier=NextTier(address=cloud.address))
    edges = [CloudServer(cfg), CloudServer(cfg)]
    for e in edges:
        e.start()
    x = {"data_0": np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    want = session(zoo.get(MODEL)).run(None, x)[0]
    hops = (tuple(e.address for e in edges), (cloud.address,))
    try:
        with _daemon(tmp_path, "", "", hops=hops) as d, LocalClient(str(d.api_address)) as c:
            assert {s.address for s in c.plan().clouds} >= {e.address for e in edges}
            for _ in range(4):
                r = c.infer(x)
                assert ">" in r.plan and r.server == cloud.address
                assert rel_err(want, r.outputs["softmaxout_1"]) < 1e-4
            assert sum(e.next_hop.forwarded for e in edges) == 4  # every request through one of the edges
            busy = max(edges, key=lambda e: e.next_hop.forwarded)
            other = edges[1 - edges.index(busy)]
            before = other.next_hop.forwarded
            busy.stop(grace_s=0)  # the edge the plans used goes away: the other edge of the hop takes over
            for _ in range(4):
                r = c.infer(x)
                assert rel_err(want, r.outputs["softmaxout_1"]) < 1e-4
            assert other.next_hop.forwarded - before >= 3, (before, other.next_hop.forwarded)
            assert d.plan(d.model("sq"))["failed"] == 0
    finally:
        for e in edges:
            e.stop(grace_s=0)
        cloud.stop(grace_s=0)
