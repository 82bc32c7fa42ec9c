"""The one runtime (``AdaptiveDevice``) over three tiers: device -> edge -> cloud with real servers on
127.0.0.1 (ephemeral ports; the edge forwards over its own socket, which the in-process fake cannot).
Each tier is stopped mid-test: the tier before it finishes the request, the outputs equal the full
model's, and no request is lost. The clock is a fake one moved by hand (backoffs), the prober is driven
by hand."""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitrt.cloud.handler.nexthop import NextTier
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model as graph_mod
from splitrt.graph import zoo
from splitrt.plan.controller import Decision
from splitrt.plan.costmodel import CostTable
from splitrt.plan.replay import replay
from tests.conftest import rel_err


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    return tmp_path


@pytest.fixture
def tiers(models_dir: Path) -> Iterator[tuple[CloudServer, CloudServer]]:
    cloud = CloudServer(ServerConfig(models_dir=models_dir, workers=2))
    cloud.start()
    edge = CloudServer(ServerConfig(models_dir=models_dir, workers=2, next_tier=NextTier(address=cloud.address)))
    edge.start()
    yield edge, cloud
    edge.stop(grace_s=0)
    cloud.stop(grace_s=0)


def tables(ids: list[str]) -> tuple[CostTable, CostTable, CostTable]:
    """The input is big, c1 smaller, c3 on small; the device is slow after c1, the edge cheap up to c3 and
    dearer past it (yet cheaper than the device): the plan at the link priors (10 Mbit/s) is c1 -> c3
    unless hop 2's RTT passes ~200 ms (at 10 ms per cut past c3, a 50 ms RTT through the edge on a loaded
    host made the edge finish); with the cloud down the edge finishes."""
    n = len(ids)
    nbytes = [400_000, 20_000, 10_000] + [1_000] * (n - 4) + [0]
    dev_head = [0.0, 1.0] + [100.0 * i for i in range(2, n)]
    edge_head = [0.0, 0.5, 1.0, 1.5] + [50.0 * i for i in range(4, n)]
    cloud_tail = [0.1 * (n - 1 - i) for i in range(n)]

    def table(head: list[float], tail: list[float]) -> CostTable:
        return CostTable(ids=ids, head_ms=head, tail_ms=tail, bytes=nbytes, reply_bytes=40)

    total_d, total_e = dev_head[-1], edge_head[-1]
    return (
        table(dev_head, [total_d - h for h in dev_head]),
        table(edge_head, [total_e - h for h in edge_head]),
        table([cloud_tail[0] - t for t in cloud_tail], cloud_tail),
    )


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def chain_device(
    edge: CloudServer, clock: Clock, log: io.StringIO | None = None, cloud: str | None = None
) -> AdaptiveDevice:
    graph = graph_mod.load(zoo.get("tiny_chain"))
    return AdaptiveDevice(
        graph,
        tables([cut.id for cut in graph.cuts()]),
        path=[[edge.address], [cloud] if cloud else []],
        clock=clock,
        start_prober=False,
        log=log,
        config=RuntimeConfig(backoff_initial_s=1.0, backoff_max_s=4.0, warm_sessions=False),
    )


def test_three_tiers_compose_and_the_cloud_is_learned_from_the_edge(tiers: tuple[CloudServer, CloudServer]) -> None:
    edge, cloud = tiers
    clock = Clock()
    log = io.StringIO()
    with chain_device(edge, clock, log) as dev:
        assert not dev.hops.direct[0]
        dev.probe_once()  # RTTs of both hops (the second through the edge), and the edge's next tier
        assert list(dev.hops.direct[0]) == [cloud.address]
        hop2 = dev.hops.links[0]
        assert dev.link.rtt_confidence(clock()) > 0 and hop2.rtt_confidence(clock()) > 0 and dev.hops.next[0].up()
        x = dev.local.random_inputs(seed=1)
        ref = dev.local.run_local(x)["y"]
        for _ in range(3):
            out = dev.infer(x)
            assert out.plan == "c1@fp32>c3@fp32" and out.route == "edge" and out.finished_by == "cloud"
            assert out.server == cloud.address  # the server that produced the outputs
            assert not out.fallback and rel_err(ref, out.outputs["y"]) <= 1e-5
        assert edge.next_hop.forwarded == 3 and cloud.served == 3
        assert dev.hops.loads[0].estimate(clock()).cloud_factor > 0 and dev.load.estimate(clock()).cloud_factor > 0
        assert dev.stats["completed"] == 3 and dev.stats["relayed"] == 3
    pairs = replay(log.getvalue().splitlines(), dev.tables)
    assert [r.plan for _, r in pairs] == [d.plan for d, _ in pairs] == ["c1@fp32>c3@fp32"] * 3
    assert Decision.from_json(log.getvalue().splitlines()[0]).extra["finished_by"] == "cloud"


def test_cloud_dies_the_edge_finishes_then_the_plan_keeps_it_at_the_edge(
    tiers: tuple[CloudServer, CloudServer],
) -> None:
    edge, cloud = tiers
    clock = Clock()
    with chain_device(edge, clock) as dev:
        x = dev.local.random_inputs(seed=2)
        ref = dev.local.run_local(x)["y"]
        assert dev.infer(x).finished_by == "cloud"
        cloud.stop(grace_s=0)
        hit = dev.infer(x)  # planned through the cloud, which is gone: the edge finished it
        assert hit.plan == "c1@fp32>c3@fp32" and hit.finished_by == "edge" and hit.fallback
        assert rel_err(ref, hit.outputs["y"]) <= 1e-5
        assert not dev.hops.next[0].up()
        after = dev.infer(x)  # re-planned: the edge finishes by plan
        assert after.decision.cuts[1] == "device" and after.finished_by == "edge" and not after.fallback
        assert not dev.hops.next[0].up()  # a request the edge was not asked to forward says nothing of the hop
        assert dev.infer(x).decision.cuts[1] == "device"  # ... so the next plan still has the edge finish
        assert rel_err(ref, after.outputs["y"]) <= 1e-5
        clock.t += 10.0
        dev.probe_once()  # the probe through the edge still fails: the hop stays down
        assert not dev.hops.next[0].up() and "UNAVAILABLE" in dev.hops.next[0].last_error
        assert dev.stats["completed"] == 4


def test_edge_dies_the_device_goes_to_the_cloud_then_finishes_itself(tiers: tuple[CloudServer, CloudServer]) -> None:
    edge, cloud = tiers
    clock = Clock()
    with chain_device(edge, clock, cloud=cloud.address) as dev:
        x = dev.local.random_inputs(seed=3)
        ref = dev.local.run_local(x)["y"]
        assert dev.infer(x).finished_by == "cloud"
        edge.stop(grace_s=0)
        hit = dev.infer(x)  # planned through the edge, which is gone: straight to the cloud
        assert hit.route == "edge" and hit.finished_by == "cloud" and hit.fallback
        assert rel_err(ref, hit.outputs["y"]) <= 1e-5
        direct = dev.infer(x)  # re-planned: two tiers to the cloud
        assert direct.route == "cloud" and ">" not in direct.plan and direct.finished_by == "cloud"
        assert not direct.fallback and rel_err(ref, direct.outputs["y"]) <= 1e-5
        clock.t += 10.0
        dev.probe_once()  # the edge is still down
        assert not dev.clouds()[0]["up"]
        cloud.stop(grace_s=0)
        alone = dev.infer(x)  # the cloud dies too: finished here, from the head already run
        assert alone.finished_by == "device" and alone.fallback and rel_err(ref, alone.outputs["y"]) <= 1e-5
        last = dev.infer(x)
        assert last.plan == "device" and last.route == "local" and rel_err(ref, last.outputs["y"]) <= 1e-5
        assert dev.stats["completed"] == 5 and dev.stats["fallbacks"] == 2


def test_edge_comes_back_after_its_backoff(models_dir: Path) -> None:
    cloud = CloudServer(ServerConfig(models_dir=models_dir))
    cloud.start()
    edge = CloudServer(ServerConfig(models_dir=models_dir, next_tier=NextTier(address=cloud.address)))
    edge.start()
    port = edge.port
    clock = Clock()
    try:
        with chain_device(edge, clock, cloud=cloud.address) as dev:
            x = dev.local.random_inputs(seed=4)
            edge.stop(grace_s=0)
            assert dev.infer(x).finished_by == "cloud" and not dev.clouds()[0]["up"]
            edge = CloudServer(
                ServerConfig(models_dir=models_dir, port=port, next_tier=NextTier(address=cloud.address))
            )
            edge.start()
            dev.probe_once()  # backoff not over: not probed
            assert not dev.clouds()[0]["up"]
            # Back once its backoff is over. gRPC's process-wide subchannel pool keeps the refused
            # connection's own reconnect backoff (~1 s) even on a fresh channel: rounds until it passes.
            stop_at = time.monotonic() + 20.0
            while not dev.clouds()[0]["up"] and time.monotonic() < stop_at:
                clock.t += 5.0
                dev.probe_once()
                time.sleep(0.05)
            assert dev.clouds()[0]["up"], dev.clouds()[0]["last_error"]
            out = dev.infer(x)
            # through the edge again (whether it forwards depends on what the probes measured of hop 2)
            assert out.route == "edge" and out.finished_by in ("edge", "cloud"), (out.plan, out.fallback_reason)
            assert rel_err(dev.local.run_local(x)["y"], out.outputs["y"]) <= 1e-5
    finally:
        edge.stop(grace_s=0)
        cloud.stop(grace_s=0)


def test_an_inflated_first_rtt_does_not_freeze_the_hop_estimate(tiers: tuple[CloudServer, CloudServer]) -> None:
    # A first RTT sample inflated by the channel's set-up (in the rig: 140 ms for an 80 ms hop) is the floor
    # bandwidth probes are judged against; every probe then looked RTT-dominated and hop 1 kept its prior.
    # An RTT probe before each bandwidth probe brings the RTT down, and then bandwidth probes count.
    edge, _ = tiers
    clock = Clock()
    with chain_device(edge, clock) as dev:
        dev.link.add_rtt(clock(), 5_000.0)
        dev.hops.links[0].add_rtt(clock(), 5_000.0)
        for _ in range(6):
            clock.t += 1.0
            dev.probe_once()
        now = clock()
        for hop in (dev.link, dev.hops.links[0]):
            assert hop.rtt_ms() < 5_000.0
            assert hop.samples > 0 and hop.estimate(now).bandwidth_mbps != dev.config.link.prior_bandwidth_mbps
