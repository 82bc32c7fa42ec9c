"""A cost table from FLOPs alone: the plan to start from before a board has been profiled.

Measured profiles (``splitrt.profile.profiler``) replace it; until then a device that knows only its rough
GFLOP/s can still split sensibly. Pure.

``splitrt.profile.priors``: ``flops_table(graph, device_gflops=, cloud_gflops=)``: a CostTable before profiling.
"""

from __future__ import annotations

from splitrt.graph.model import ModelGraph
from splitrt.plan.costmodel import CostTable


def flops_table(mg: ModelGraph, *, device_gflops: float, cloud_gflops: float, per_node_ms: float = 0.02) -> CostTable:
    """Head/tail times as FLOPs / throughput plus a small per-node cost (kernel launch, memory)."""
    total = mg.flops / 1e9
    n = len(mg.nodes)
    cuts = mg.cuts()
    return CostTable(
        ids=[c.id for c in cuts],
        head_ms=[1e3 * total * c.head_flops_fraction / device_gflops + per_node_ms * c.head_nodes for c in cuts],
        tail_ms=[
            1e3 * total * (1 - c.head_flops_fraction) / cloud_gflops + per_node_ms * (n - c.head_nodes) for c in cuts
        ],
        bytes=[c.bytes for c in cuts],
        float_bytes=[sum(t.bytes for t in c.tensors if t.dtype == "float32") for c in cuts],
        reply_bytes=[c.reply_bytes for c in cuts],
    )
