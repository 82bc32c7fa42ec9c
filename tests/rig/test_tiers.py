"""The three-tier rig (root): device, edge and cloud namespaces, both hops shaped (measured with a bulk
TCP flow each), a few seconds of every kind of strategy with 0 failed requests, the three-tier ones
through the edge, every output equal to the full model's, and nothing left behind. Latency and energy
figures belong to bench/bench_tiers.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from splitrt.errors import ConfigError
from splitrt.rig import netns, shaper, traces
from splitrt.rig.tierbench import TierBenchConfig, run_tiers
from splitrt.rig.tiers import TierRig, TierRigConfig

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, tc qdiscs, cgroups); CI runs as root")


def _goodput_mbps(rig: TierRig, rates: tuple[float, float], hop: int) -> float:
    """Bulk TCP goodput across ``hop`` (1: device -> edge, 2: edge -> cloud) with both hops at ``rates``."""
    assert rig.lan is not None and rig.edge_up is not None
    device, edge, cloud = rig.lan.hosts
    rx_host, tx_ns = (edge, device.ns) if hop == 1 else (cloud, edge.ns)
    rx = shaper.BulkReceiver(rx_host.ip, 0, netns_name=rx_host.ns)
    try:
        steps = shaper.measure_steps(
            rig.shaper if hop == 1 else rig.shaper2,
            traces.constant(rates[hop - 1], 2.5),
            rx,
            (rx_host.ip, rx.port),
            send_netns=tx_ns,
        )
    finally:
        rx.close()
    return steps[0].measured_mbps


# One request through all three tiers, from a fresh process in the device's namespace: gRPC connects on its
# own threads, which keep the namespace they were made in, so a thread of this process (where earlier tests
# started gRPC) would dial from the root namespace.
THROUGH_BOTH = """
import json, sys
import numpy as np
from splitrt.device.client import Device
from splitrt.graph import zoo

d = Device(str(zoo.get("squeezenet")), sys.argv[1])
inputs = d.random_inputs(seed=3)
cuts = [c.id for c in d.graph.cuts()]
first, second = cuts[len(cuts) // 3], cuts[2 * len(cuts) // 3]
res = d.send(d.run_head(inputs, first), next_cut=second, timeout_s=60)
ref = d.run_local(inputs)
same = all(np.allclose(res.outputs[k], ref[k], rtol=1e-4, atol=1e-5) for k in ref)
h = res.hops
print(json.dumps({"forwarded": h.forwarded, "next_address": h.next_address, "next_error_code": h.next_error_code,
                  "same": bool(same)}))
d.close()
"""


def _through_both(ns: str, edge: str) -> dict[str, object]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", THROUGH_BOTH, edge],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_three_tier_rig_runs_every_strategy_through_the_edge() -> None:
    cfg = TierRigConfig(
        board="rpi5", models=("squeezenet",), quota_cpus=0.3, edge_cpus=0.5, prefix=f"spl-tt{os.getpid() % 10000}"
    )
    rig = TierRig(cfg)
    with rig:
        # Both hops shaped, each on its own: 4 Mbit/s on hop 1, 1 Mbit/s on hop 2 (veth unshaped: Gbit/s).
        hop1 = _goodput_mbps(rig, (4.0, 1.0), 1)
        hop2 = _goodput_mbps(rig, (4.0, 1.0), 2)
        assert 2.0 < hop1 < 6.0, f"hop 1: expected ~4 Mbit/s, measured {hop1:.2f}"
        assert 0.5 < hop2 < 1.5, f"hop 2: expected ~1 Mbit/s, measured {hop2:.2f}"
        bench = TierBenchConfig(
            model="squeezenet",
            trace="constant:40",
            trace2="constant:20",
            rtt_ms=4.0,
            rtt2_ms=4.0,
            duration_s=3.0,
            turn_s=1.5,
            rate_hz=4.0,
            warmup_s=0.5,
        )
        result = run_tiers(bench, rig)
        # one request straight through all three tiers: the device's head, the edge's middle, the cloud's tail
        assert rig.device_host is not None
        hops = _through_both(rig.device_host.ns, rig.edge_address)
        assert hops["forwarded"] and hops["next_address"] and not hops["next_error_code"], hops
        assert hops["same"], "three-tier outputs differ from the full model's"
    s = result["strategies"]
    assert set(s) == set(bench.strategies)
    assert result["failed"] == 0
    for name, st in s.items():
        assert st["completed"] > 0 and st["failed"] == 0, name
        assert st["mismatched"] == 0, f"{name}: outputs differ from the full model's"
    # edge-only: every request goes through the edge, which finishes it
    edge_only = s["edge-only"]
    assert edge_only["via_edge"] == edge_only["completed"] == edge_only["finished_by"]["edge"]
    # the two-tier strategies never touch the edge's server; device-only never leaves the device
    assert s["cloud-only"]["finished_by"]["cloud"] == s["cloud-only"]["completed"]
    assert s["device-only"]["finished_by"]["device"] == s["device-only"]["completed"]
    assert all(s[n]["via_edge"] == 0 for n in ("device-only", "cloud-only", "static-2tier"))
    assert result["energy"]["source"] == "estimated"
    assert result["hop1"]["median_mbps"] == 40.0 and result["hop2"]["median_mbps"] == 20.0
    # nothing left behind
    assert not [n for n in netns.list_netns(cfg.prefix or "")]


def test_userspace_link_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs the kernel link"):
        TierRigConfig(link="userspace")
