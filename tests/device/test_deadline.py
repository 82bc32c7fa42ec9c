"""The local fallback after a stalled cloud keeps the request's deadline: the RPC only gets what is left
once the local finish (with its safety margin) is kept in reserve, and with no room left the cloud is
not asked. A real server on 127.0.0.1 that holds every request (its worker waits on an event)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import remote
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.device.runtime.deadline import LOCAL_SAFETY, LOCAL_SLACK_MS, rpc_timeout_ms
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.costmodel import DEVICE_CUT
from splitrt.profile.priors import flops_table


def test_the_rpc_gets_what_the_local_reserve_leaves() -> None:
    assert (
        rpc_timeout_ms(deadline_ms=500, elapsed_ms=100, local_finish_ms=40)
        == 500 - 100 - 40 * LOCAL_SAFETY - LOCAL_SLACK_MS
    )
    assert rpc_timeout_ms(deadline_ms=100, elapsed_ms=0, local_finish_ms=-5) == 90.0  # no negative reserve
    # the local finish would be late anyway (20 + 90 + 10 > 100): the whole budget, never less than it
    assert rpc_timeout_ms(deadline_ms=100, elapsed_ms=20, local_finish_ms=60) == 80.0
    assert rpc_timeout_ms(deadline_ms=100, elapsed_ms=90, local_finish_ms=60) == 60.0
    # a cold tail: the whole budget (its build)
    assert rpc_timeout_ms(deadline_ms=500, elapsed_ms=100, local_finish_ms=40, cold=True) == 400.0
    # the reserve fits but leaves under MIN_RPC_MS: not sent
    assert rpc_timeout_ms(deadline_ms=100.5, elapsed_ms=0, local_finish_ms=60) is None


@pytest.fixture()
def stalled(tmp_path: Path) -> Iterator[tuple[CloudServer, threading.Event]]:
    shutil.copyfile(zoo.get("squeezenet"), tmp_path / "squeezenet.onnx")
    release = threading.Event()
    with CloudServer(ServerConfig(models_dir=tmp_path, workers=1)) as s:
        s.handler.before_tail = lambda header: release.wait(30)  # the server stalls every request
        yield s, release
        release.set()


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    timeouts: list[float] = []
    real = remote.Remote.send

    def send(self: remote.Remote, head: Any, **kw: Any) -> Any:
        timeouts.append(kw["timeout_s"])
        return real(self, head, **kw)

    monkeypatch.setattr(remote.Remote, "send", send)
    return timeouts


@pytest.mark.parametrize("deadline_ms", [400.0, 3.0])
def test_a_stalled_cloud_leaves_time_to_finish_locally(
    stalled: tuple[CloudServer, threading.Event], monkeypatch: pytest.MonkeyPatch, deadline_ms: float
) -> None:
    """The first request of a cut (a cold tail) gets the whole budget; the next ones what the reserve leaves
    when the local finish meets the deadline, else (3 ms: late anyway) the whole budget, at least the local
    finish. Every request ends with the outputs of a local finish."""
    server, _ = stalled
    mg = graph.load(zoo.get("squeezenet"))
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cut = mg.cuts()[5].id
    local_ms = float(table.head_ms[table.index(DEVICE_CUT)] - table.head_ms[table.index(cut)])
    timeouts = _spy(monkeypatch)
    cfg = RuntimeConfig(policy=f"fixed:{cut}", deadline_ms=deadline_ms)
    with AdaptiveDevice(mg, table, [server.address], config=cfg, start_prober=False) as dev:
        x = dev.local.random_inputs()
        outs = [dev.infer(x) for _ in range(2)]
        expected = dev.local.run_local(x)
    for out in outs:
        assert out.fallback and out.server is None and not out.not_sent
        for name, value in expected.items():
            np.testing.assert_allclose(out.outputs[name], value, rtol=1e-4, atol=1e-5)
    first, second = (t * 1e3 for t in timeouts)
    assert first <= deadline_ms or first == pytest.approx(local_ms, rel=0.5)  # cold: the whole budget
    if deadline_ms > local_ms * LOCAL_SAFETY + LOCAL_SLACK_MS + 50:
        assert second <= deadline_ms - local_ms * LOCAL_SAFETY - LOCAL_SLACK_MS
        assert first > second  # the cold request was not cut to the reserve
    else:  # late anyway: the cloud is still asked, for at least the local finish
        assert second >= local_ms * 0.99
