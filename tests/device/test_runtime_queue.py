"""The adaptive runtime prices the cloud's queue: a cloud reporting a long queue moves the plan to the
device (the decision records the queue it was made with, and the log replays), an idle one brings the
plan back; a refusal keeps the cloud out of plans until its hint has passed."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import CloudError
from splitrt.graph import model as graph_model
from splitrt.graph import zoo
from splitrt.plan.replay import replay
from splitrt.profile.priors import flops_table
from splitrt.transport.wire import LoadInfo
from tests.fakecloud import FakeCloud


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def server(tmp_path: Path) -> FakeCloud:
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    return FakeCloud(tmp_path)  # a cloud that answers is all this needs: in-process, no socket


def test_a_reported_queue_moves_the_plan_and_replays(server: FakeCloud) -> None:
    graph = graph_model.load(zoo.get("tiny_chain"))
    # The device takes 50 ms for the whole model, the cloud ~0: splitting pays unless the cloud queues.
    table = flops_table(graph, device_gflops=graph.flops / 1e9 / 0.05, cloud_gflops=100.0)
    clock, log = Clock(), io.StringIO()
    with AdaptiveDevice(
        graph,
        table,
        [server.address],
        config=RuntimeConfig(),
        clock=clock,
        log=log,
        start_prober=False,
        connect=server.connect,
    ) as dev:
        dev.link.add_rate(clock(), 500.0)
        dev.link.add_rtt(clock(), 1.0)
        x = dev.local.random_inputs()
        first = dev.infer(x)
        assert first.server == server.address and first.decision.cloud_queue_ms == 0.0
        cloud = dev._clouds[server.address]
        # 20 requests ahead of one worker at 10 ms each: ~200 ms of queue.
        cloud.add_load(
            clock(), LoadInfo(queue_depth=20, running=1, workers=1, cpu_percent=0.0, service_ms=10.0), own=False
        )
        busy = dev.infer(x)
        # Smoothed: half of the new report (alpha 0.5) after the idle reply of the first request.
        assert busy.plan == "device" and busy.decision.cloud_queue_ms == pytest.approx(100.0, rel=0.01)
        clock.t += 60.0  # a minute without news: the queue has drained
        back = dev.infer(x)
        assert back.plan != "device" and back.decision.cloud_queue_ms < 1e-3
        # A refusal: out of plans until the hint expires.
        dev._clouds.refused(
            cloud, clock(), CloudError("busy", code="RESOURCE_EXHAUSTED", retryable=True, retry_after_ms=500.0)
        )
        assert dev.infer(x).plan == "device" and dev._clouds.admitting(clock()) == []
        clock.t += 0.5
        assert dev._clouds.admitting(clock()) == [cloud]
    lines = log.getvalue().splitlines()
    for old, new in replay(lines, table):
        assert (new.plan, new.queue_ms, new.cloud_queue_ms) == (old.plan, old.queue_ms, old.cloud_queue_ms)
