"""A model too slow for the device is offloaded, not held back by the local reserve, and the simulator
decides the same (both through ``plan.reserve``): issue 33's 33-GFLOP detector on a Pi, as a table whose
local finish misses the deadline. A real servicer through the in-process transport answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.costmodel import CLOUD_CUT, DEVICE_CUT
from splitrt.profile.priors import flops_table
from splitrt.rig import sim, traces
from tests.fakecloud import FakeCloud

MODEL = "squeezenet"
DEADLINE_MS = 2000.0


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("reserve-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


def _slow_table(mg: graph.ModelGraph):  # type: ignore[no-untyped-def]
    # the device would take ~35 s for the whole model: any local finish misses a 2 s deadline
    table = flops_table(mg, device_gflops=mg.flops / 1e9 / 35.0, cloud_gflops=100)
    assert float(table.head_ms[table.index(DEVICE_CUT)]) > 10 * DEADLINE_MS
    return table


def test_a_model_too_slow_for_the_device_is_served_and_the_simulator_agrees(models_dir: Path) -> None:
    mg = graph.load(zoo.get(MODEL))
    table = _slow_table(mg)
    cloud = FakeCloud(models_dir)
    cfg = RuntimeConfig(policy=f"fixed:{CLOUD_CUT}@fp32", deadline_ms=DEADLINE_MS)
    with AdaptiveDevice(mg, table, [cloud.address], config=cfg, connect=cloud.connect, start_prober=False) as dev:
        x = dev.local.random_inputs()
        outs = [dev.infer(x) for _ in range(3)]
        expected = dev.local.run_local(x)
    for out in outs:  # served: never a fallback, never held back
        assert out.server == cloud.address and not out.fallback and not out.not_sent, out.fallback_reason
        for name, value in expected.items():
            np.testing.assert_allclose(out.outputs[name], value, rtol=1e-4, atol=1e-5)
    run = sim.simulate(
        table,
        f"fixed:{CLOUD_CUT}@fp32",
        traces.constant(50.0, 10.0),
        sim.SimConfig(duration_s=5.0, deadline_ms=DEADLINE_MS),
    )
    assert run and all(r.served and not r.fallback and not r.not_sent for r in run)


def test_the_simulator_falls_back_when_the_reserve_limited_rpc_cannot_finish() -> None:
    """A warm tail whose reply takes longer than what the reserve leaves: a fallback in the simulator,
    as the runtime's RPC would time out (the same ``send_budget``)."""
    from splitrt.plan.costmodel import CostTable

    table = CostTable(
        ids=["cloud", "device"], head_ms=[0.0, 400.0], tail_ms=[900.0, 0.0], bytes=[1000, 0], codecs={"fp32": 1.0}
    )
    cfg = sim.SimConfig(duration_s=3.0, deadline_ms=1500.0, rtt_ms=10.0)
    run = sim.simulate(table, "fixed:cloud@fp32", traces.constant(50.0, 10.0), cfg)
    # warm-up sent the cut once; after it: 1500 - 610 = 890 ms for a 900+ ms reply -> the RPC expires
    assert run and all(r.fallback and not r.served for r in run)
    assert all(r.latency_ms == pytest.approx(1500 - 610 + 400, abs=1) for r in run)
