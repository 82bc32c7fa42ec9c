"""The adaptive runtime's configuration (``RuntimeConfig``: deadline, policy, controller and link settings,
backoff, probing, shapes, balancing); ``device.runtime`` re-exports it."""

from __future__ import annotations

from dataclasses import dataclass, field

from splitrt.errors import ConfigError
from splitrt.plan.balance import BalanceConfig
from splitrt.plan.controller import ControllerConfig, parse_policy
from splitrt.plan.netmon import LinkConfig

__all__ = ["RuntimeConfig"]


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    deadline_ms: float = 5000.0
    policy: str = "adaptive"  # adaptive | periodic:SECONDS | fixed:PLAN
    # Where the cost table came from (``profile.tables.Costs.source``: the profiles, the board's factor and
    # the accuracy guard its lossy codecs were admitted under); every decision records it as
    # ``extra["costs"]`` when set, so a decision log says which tolerance its plans met.
    table_source: str = ""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    # A cloud that failed is retried after backoff_initial_s, doubling up to backoff_max_s.
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 2.0
    prober_interval_s: float = 0.25
    probe_timeout_s: float = 2.0
    # A bandwidth probe on an idle connection goes out twice, back to back, and the second counts: after
    # idle, TCP restarts from its initial window (tcp_slow_start_after_idle), and the first probe
    # measures that. None: pairs only where this host's kernel restarts (net.ipv4.tcp_slow_start_after_idle
    # is 1, Linux's default, or cannot be read); False halves the probe traffic.
    bandwidth_probe_pairs: bool | None = None
    warm_sessions: bool = True
    # Request shapes other than the profiled one whose scaled table and controller are kept (LRU).
    max_shapes: int = 16
    # Several clouds: least expected queue + RTT first, near-ties in turn (``plan.balance``).
    balance: BalanceConfig = field(default_factory=BalanceConfig)

    def __post_init__(self) -> None:
        parse_policy(self.policy)
        if self.deadline_ms <= 0:
            raise ConfigError(f"deadline_ms: expected > 0, got {self.deadline_ms!r}")
        if self.max_shapes < 1:
            raise ConfigError(f"max_shapes: expected >= 1, got {self.max_shapes!r}")
