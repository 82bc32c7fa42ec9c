"""rig.worker: the userspace board emulation pads the runtime's own head and tail calls."""

from __future__ import annotations

from typing import Any

from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model, zoo
from splitrt.profile.priors import flops_table
from splitrt.rig.worker import _slowed


def test_a_slowed_device_pads_the_heads_the_runtime_runs() -> None:
    mg = model.load(zoo.get("tiny_chain"))
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    config = RuntimeConfig(policy="fixed:device")
    with AdaptiveDevice(mg, table, [], config=config, start_prober=False) as dev:
        raw: list[float] = []
        run_head = dev.local.run_head

        def measured(inputs: Any, cut: str, **kw: Any) -> Any:
            h = run_head(inputs, cut, **kw)
            raw.append(h.head_ms)
            return h

        dev.local.run_head = measured  # type: ignore[method-assign]
        _slowed(dev.local, 3.0)
        out = dev.infer(dev.local.random_inputs(seed=1))
    assert out.plan == "device" and len(raw) == 1
    assert out.result.head_ms == 3.0 * raw[0]
