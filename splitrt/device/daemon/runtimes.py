"""The one place the daemon builds a model's runtime over its configured path of tiers
(:func:`build_runtime`), and what the rest of the daemon reads of any runtime (:class:`Runtime`).

One runtime for both: ``AdaptiveDevice`` over two tiers (device -> cloud(s)) or three (device -> edge ->
cloud, ``edge`` or two ``hops``).
The edge and the cloud are priced from the cloud profile (else the shipped profile or the FLOPs prior,
unscaled: server-class tiers), as ``splitrt run --edge`` does; the edge's times x ``edge_speed_factor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from splitrt.device.daemon import metrics
from splitrt.device.daemon.config import DaemonConfig, ModelConfig
from splitrt.device.daemon.costs import constrained, select_cost_table

if TYPE_CHECKING:
    from splitrt.device.client import DeviceConfig
    from splitrt.plan.costmodel import CostTable


class Runtime(Protocol):
    """What the daemon uses of a model's runtime."""

    graph: Any
    table: CostTable  # the device's cost table (its cut ids: the metrics' cut index)

    def infer(self, inputs: Mapping[str, Any], *, request: str | None = None, deadline_ms: float | None = None) -> Any:
        """An outcome with ``outputs``, ``plan``, ``latency_ms``, ``fallback`` and ``server``."""
        ...

    def status(self) -> dict[str, Any]:
        """``plan``, ``policy``, ``bandwidth_mbps``, ``rtt_ms``, ``confidence``, ``device_load``,
        ``cloud_load``, ``clouds`` (address, up, rtt_ms, last_error), ``completed``, ``fallbacks``, ``switches``."""
        ...

    def close(self) -> None: ...


@dataclass
class ServedModel:
    """A model the daemon serves: its configuration, its runtime and its request counters."""

    config: ModelConfig
    device: Runtime
    table_source: str
    stats: metrics.ModelStats = field(default_factory=metrics.ModelStats)


def build_runtime(
    config: DaemonConfig,
    model: ModelConfig,
    graph: Any,
    table: CostTable,
    *,
    board: Any,
    device_config: DeviceConfig,
    log: TextIO | None,
    table_source: str = "",
) -> Runtime:
    """The runtime serving ``model`` over ``config.path``: one hop -> two tiers, two hops -> three."""
    from splitrt.plan.controller import ControllerConfig
    from splitrt.plan.costmodel import DEFAULT_POWER

    power = board.power if board is not None else DEFAULT_POWER
    path = config.path
    controller = ControllerConfig(objective=config.objective, codecs=config.codecs)
    controller = constrained(controller, graph, table, config, board, model.name)
    if len(path) == 1:
        from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig

        clouds = [] if config.discovery else list(path[0])
        return AdaptiveDevice(
            graph,
            table,
            clouds,
            config=RuntimeConfig(
                deadline_ms=config.deadline_ms, policy=config.policy, controller=controller, table_source=table_source
            ),
            device_config=device_config,
            power=power,
            log=log,
        )
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.plan.controller import ControllerConfig

    server, _ = select_cost_table(
        graph,
        profile_device=model.profile_cloud_path,
        profile_cloud=model.profile_cloud_path,
        codecs=config.codecs,
        min_agreement=config.min_agreement,
        name=f"model {model.name!r} (servers)",
    )
    return AdaptiveDevice(
        graph,
        (table, _scaled(server, config.edge_speed_factor), server),
        path=[list(hop) for hop in path],  # the first tier's servers balanced
        config=RuntimeConfig(
            deadline_ms=config.deadline_ms,
            policy=config.policy,
            controller=controller,
            table_source=table_source,
        ),
        device_config=device_config,
        power=power,
        log=log,
    )


def _scaled(table: CostTable, factor: float) -> CostTable:
    """``table`` with its compute times x ``factor`` (a slower or faster server of the same model)."""
    if factor == 1.0:
        return table
    from splitrt.plan.costmodel import CostTable

    return CostTable(
        ids=table.ids,
        head_ms=table.head_ms * factor,
        tail_ms=table.tail_ms * factor,
        bytes=table.bytes.astype("int64"),
        float_bytes=table.float_bytes.astype("int64"),
        reply_bytes=table.reply_bytes,
        codecs=table.codec_map(),
        encode_ms=table.codec_time_map(table.encode_ms),
        decode_ms=table.codec_time_map(table.decode_ms * factor),
        call_ms=table.call_ms,
    )
