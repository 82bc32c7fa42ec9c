"""The adaptive runtime's data: its configuration (``RuntimeConfig``: deadline, policy, controller and link
settings, backoff, probing, shapes, balancing), what a request returns (``Outcome``, and how it ended: ``ended``) and
the names of its tiers (``tier_name``). ``device.runtime``
re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from splitrt.device.client import SplitResult
from splitrt.errors import ConfigError
from splitrt.plan.balance import BalanceConfig
from splitrt.plan.controller import ControllerConfig, Decision, parse_policy
from splitrt.plan.netmon import LinkConfig
from splitrt.plan.reserve import NOT_SENT

__all__ = ["Outcome", "RuntimeConfig", "ended", "tier_name"]


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


@dataclass(frozen=True, kw_only=True)
class Outcome:
    request: str
    outputs: dict[str, np.ndarray]
    plan: str
    latency_ms: float
    fallback: bool  # a tier the plan counted on failed (the one before it, or the device, finished)
    server: str | None  # the server that produced the outputs (None: the device)
    decision: Decision
    result: SplitResult
    fallback_reason: str = ""  # why the cloud's part ran locally (each cloud's error, or the deadline)
    route: str = "local"  # the tier the plan sent the request to (``tier_name``), or local
    finished_by: str = "device"  # the tier that produced the outputs
    not_sent: str = ""  # planned for a cloud but never sent (no cloud up, no time after the reserve): why


def tier_name(tier: int, tiers: int) -> str:
    """``device``, then ``edge`` (three tiers) or ``tier1``.., and ``cloud`` for the last."""
    if tier == 0:
        return "device"
    if tier == tiers - 1:
        return "cloud"
    return "edge" if tiers == 3 else f"tier{tier}"


def ended(why: str | None, *, answered: bool) -> tuple[bool, bool]:
    """(not sent, fallback) of a request a server ``answered`` or not, ``why`` a tier the plan counted on
    did not (None: none failed): nothing reached the wire (no cloud, or no time for one after the local
    reserve) is no fallback; any other reason is."""
    not_sent = not answered and why is not None and all(w.startswith(NOT_SENT) for w in why.split("; "))
    return not_sent, why is not None and not not_sent
