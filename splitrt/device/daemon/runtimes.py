"""The one place the daemon builds a model's runtime over its configured path of tiers
(:func:`build_runtime`), and what the rest of the daemon reads of any runtime (:class:`Runtime`).

Two tiers (device -> cloud(s)): ``AdaptiveDevice``. Three tiers (device -> edge -> cloud, ``edge`` or two
``hops``): ``ChainDevice`` behind :class:`ChainRuntime`, which answers ``status()`` in the daemon's keys.
The edge and the cloud are priced from the cloud profile (else the shipped profile or the FLOPs prior,
unscaled: server-class tiers), as ``splitrt run --edge`` does; the edge's times x ``edge_speed_factor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from splitrt.device.daemon.config import DaemonConfig, ModelConfig
from splitrt.device.daemon.costs import constrained, select_cost_table

if TYPE_CHECKING:
    from splitrt.device.chain import ChainDevice
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


def build_runtime(
    config: DaemonConfig,
    model: ModelConfig,
    graph: Any,
    table: CostTable,
    *,
    board: Any,
    device_config: DeviceConfig,
    log: TextIO | None,
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
            config=RuntimeConfig(deadline_ms=config.deadline_ms, policy=config.policy, controller=controller),
            device_config=device_config,
            power=power,
            log=log,
        )
    from splitrt.device.chain import ChainConfig, ChainDevice

    server, _ = select_cost_table(
        graph, profile_device=model.profile_cloud_path, profile_cloud=model.profile_cloud_path
    )
    chain = ChainDevice(
        graph,
        table,
        _scaled(server, config.edge_speed_factor),
        server,
        edge=path[0][0],
        cloud=path[1][0] if path[1] else None,
        config=ChainConfig(
            deadline_ms=config.deadline_ms,
            policy=config.policy,
            controller=controller,
        ),
        device_config=device_config,
        power=power,
        log=log,
    )
    return ChainRuntime(chain)


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
    )


class ChainRuntime:
    """``ChainDevice`` as the daemon reads a runtime: the first hop's link estimate, the edge's load, the
    servers it knows (the edge, ``EDGE/next``: the edge's next tier, and the cloud reached directly when
    the edge is down). Goes when the one runtime over a path of tiers lands."""

    def __init__(self, chain: ChainDevice) -> None:
        self.chain = chain
        self.graph = chain.graph
        self.table = chain.tables[0]

    def infer(self, inputs: Mapping[str, Any], *, request: str | None = None, deadline_ms: float | None = None) -> Any:
        return self.chain.infer(inputs, request=request, deadline_ms=deadline_ms)

    def status(self) -> dict[str, Any]:
        c = self.chain
        policy = c.config.policy
        st = c.status()
        now = c.clock()
        with c._lock:  # the estimators change under requests; ChainDevice.status reads them so too
            hop1 = c.hop1.estimate(now)
            device_load = c.load.estimate(now).device_factor
            edge_load = c.edge_load.estimate(now).cloud_factor
        edge, nxt, cloud = st["edge"], st["next"], st["cloud"]
        assert isinstance(edge, dict) and isinstance(nxt, dict)
        servers = [(str(edge["name"]), edge, hop1.rtt_ms), (f"{edge['name']}/next", nxt, None)]
        if isinstance(cloud, dict):
            servers.append((str(cloud["name"]), cloud, None))
        return {
            **st,
            "policy": policy,
            "bandwidth_mbps": hop1.bandwidth_mbps,
            "rtt_ms": hop1.rtt_ms,
            "confidence": hop1.confidence,
            "device_load": device_load,
            "cloud_load": edge_load,
            "clouds": [
                {"address": a, "up": bool(t["up"]), "rtt_ms": rtt, "last_error": str(t["last_error"] or "")}
                for a, t, rtt in servers
            ],
        }

    def close(self) -> None:
        self.chain.close()
