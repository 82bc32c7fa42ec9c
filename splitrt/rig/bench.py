"""The rig's benchmarks as topologies of the one runner (``rig.runner``) and report (``rig.report``):

- ``run_bench`` (``splitrt bench``): one device, one cloud, one trace; the two-tier strategy set and the
  hindsight oracles; optional device-burst / device-busy / cloud-busy load;
- ``run_tiers`` (``splitrt rig bench --tiers 3``): a device, an edge (its own CPU quota) and a cloud, two
  traces (hop 1 the access link, hop 2 the backhaul), the direct path crossing both; energy objective too;
- ``run_fleet`` (``splitrt rig fleet``): N devices (CPU quotas cycled: a mixed fleet), M servers with
  quotas, every device its own trace, no added RTT, closed loop, the last server killed mid-turn.

Each maps its config onto a topology (``harness.Tier``s), the hops' trace windows (``runner.HopPlay``)
and a ``runner.RunSpec``, and lays the report out as its table's readers expect.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from splitrt.errors import ConfigError
from splitrt.rig import report, runner, strategies
from splitrt.rig.harness import Rig, RigConfig, Tier
from splitrt.rig.stats import burst_intervals, measured_costs
from splitrt.rig.strategies import ONLY_THREE, ONLY_TWO, ORACLE_REFS
from splitrt.rig.tracespec import family_median_mbps, load_trace, trace_family

# two tiers (bench, fleet); the ablations only when named (``strategies.HOLD_ABLATION``, ``SLOW_ABLATION``)
TWO_TIER = tuple(n for n in strategies.STRATEGIES if n not in ONLY_THREE)
ABLATIONS = (strategies.HOLD_ABLATION, strategies.SLOW_ABLATION, strategies.NEWS_ABLATION)
STRATEGIES = tuple(n for n in TWO_TIER if n not in ABLATIONS)
TIER_STRATEGIES = tuple(n for n in strategies.STRATEGIES if n not in ONLY_TWO)
DEFAULT_STRATEGIES = ("device-only", "cloud-only", "static", "periodic", "adaptive", "oracle")
TIER_DEFAULTS = ("device-only", "cloud-only", "static-2tier", "edge-only", "static-3tier", "adaptive")
FLEET_DEFAULTS = ("adaptive", "device-only", "cloud-only", "static", "route", "route-codec", "oracle-route")
LOADS = ("none", "device-burst", "device-busy", "cloud-busy")
OBJECTIVES = ("latency", "energy")
# The HSDPA traces the controller and estimators were tuned on, and ones never used for tuning.
TRACE_SETS = {
    "tuned": ("hsdpa/bus", "hsdpa/car", "hsdpa/metro", "hsdpa/train"),
    "heldout": ("hsdpa/ferry", "hsdpa/tram", "hsdpa/bus-0929", "hsdpa/car-elverum"),
}


def _positive(**xs: float) -> None:
    bad = {k: v for k, v in xs.items() if not v > 0}
    if bad:
        raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in bad.items())}: must be > 0")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    model: str = "resnet50"
    trace: str = "hsdpa/car"
    bandwidth_scale: float = 1.0
    load: str = "none"
    rate_hz: float = 4.0
    duration_s: float = 30.0  # the trace window every strategy plays
    turn_s: float = 1.0  # strategies take turns on slices this long (>= duration_s: one whole run each)
    warmup_s: float = 2.0  # uncounted requests per strategy before its first turn
    trace_offset_s: float = 0.0
    rtt_ms: float | None = None  # None: typical of the trace's family
    codecs: tuple[str, ...] | None = None  # None: every codec of the cost table, for every strategy
    cuts: tuple[str, ...] | None = None  # the cuts the runtime's plans may use (constraints); None: all
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    deadline_ms: float = 5000.0
    periodic_s: float = 5.0
    seed: int = 0
    profile_path: str | None = None  # a host profile of the model; None: the shipped one, else measured
    guard_every_cut: bool = False  # the accuracy guard at every cut, not a spread few (``runner.RunSpec``)

    def __post_init__(self) -> None:
        if self.load not in LOADS:
            raise ConfigError(f"load: expected one of {', '.join(LOADS)}, got {self.load!r}")
        strategies.check(self.strategies, 2)
        if self.warmup_s < 0:
            raise ConfigError(f"warmup_s: expected >= 0, got {self.warmup_s}")
        _positive(
            rate_hz=self.rate_hz, duration_s=self.duration_s, turn_s=self.turn_s, bandwidth_scale=self.bandwidth_scale
        )


@dataclass(frozen=True, kw_only=True)
class TierBenchConfig:
    model: str = "resnet50"
    trace: str = "hsdpa/bus"  # hop 1: device -> edge (the access link)
    trace2: str = "fcc/amazon-214390"  # hop 2: edge -> cloud (the backhaul)
    bandwidth_scale: float = 1.0
    bandwidth_scale2: float = 1.0
    trace_offset_s: float = 0.0
    trace2_offset_s: float = 0.0
    rtt_ms: float | None = None  # None: typical of the trace's family
    rtt2_ms: float | None = None
    objective: str = "latency"
    rate_hz: float = 4.0
    duration_s: float = 20.0
    turn_s: float = 2.0
    warmup_s: float = 2.0
    codecs: tuple[str, ...] = ("fp32",)  # lossless: the outputs are compared with the full model's
    strategies: tuple[str, ...] = TIER_DEFAULTS
    deadline_ms: float = 5000.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        strategies.check(self.strategies, 3)
        _positive(
            rate_hz=self.rate_hz,
            duration_s=self.duration_s,
            turn_s=self.turn_s,
            scale=self.bandwidth_scale,
            scale2=self.bandwidth_scale2,
        )


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    devices: int = 24
    servers: int = 2
    model: str = "squeezenet"
    traces: tuple[str, ...] = (*TRACE_SETS["tuned"], *TRACE_SETS["heldout"])
    trace_offset_step_s: float = 60.0  # device i plays traces[i % k] from (i // k) x this
    bandwidth_scale: float = 4.0
    # Cycled over the devices (a mixed fleet). With 2 x 0.4 for the servers the fleet is budgeted at ~1.5
    # of this host's 2 vCPUs: 0.04/0.08 (+ 2 x 0.5) asked for ~2.4, more than the host has, and then no
    # quota holds (load average ~20, every device slower than calibrated, by how busy the host is).
    device_cpus: tuple[float, ...] = (0.02, 0.04)
    cfs_period_us: int = 50_000  # 0.02 CPU in 20 ms periods would be under the kernel's 1 ms minimum
    server_cpus: float = 0.4
    server_workers: int = 2
    segment_s: float = 15.0
    rounds: int = 2  # rotating order: a drift of the (shared, busy) host cancels instead of hitting one strategy
    kill_at_fraction: float | None = 0.5  # None: no kill
    rate_hz: float = 0.0  # per device; 0: closed loop, back to back
    strategies: tuple[str, ...] = FLEET_DEFAULTS
    codecs: tuple[str, ...] | None = ("fp32", "fp16", "int8")
    warmup_s: float = 3.0
    deadline_ms: float = 5000.0
    board: str = "rpi4"  # power figures only: the CPU is the cgroup quota
    player_step_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.devices < 1 or self.servers < 1 or self.rounds < 1 or not self.traces or not self.device_cpus:
            raise ConfigError(
                f"devices, servers, rounds >= 1, a trace and a device quota expected, got {self.devices}, "
                f"{self.servers}, {self.rounds}, {list(self.traces)}, {list(self.device_cpus)}"
            )
        if self.kill_at_fraction is not None and (self.servers < 2 or not 0 < self.kill_at_fraction < 1):
            raise ConfigError(
                f"kill_at_fraction: expected in (0, 1) with >= 2 servers (one survives), or None; got "
                f"{self.kill_at_fraction} with {self.servers}"
            )
        strategies.check(self.strategies, 2)
        _positive(segment_s=self.segment_s, bandwidth_scale=self.bandwidth_scale)


def strategy_policies(cfg: BenchConfig, table: Any, rtt_ms: float) -> dict[str, str]:
    """Policy per measured two-tier strategy (the oracles are computed, not run): ``splitrt sim``'s."""
    from splitrt.plan.costmodel import Link

    family = family_median_mbps(trace_family(load_trace(cfg.trace)))
    link = Link(bandwidth_mbps=family * cfg.bandwidth_scale, rtt_ms=rtt_ms)
    names = [n for n in TWO_TIER if n not in ORACLE_REFS]
    got = strategies.choose(
        names, [table, table], [link], fixed_mbps=family, codecs=cfg.codecs, periodic_s=cfg.periodic_s
    )
    return {n: c.policy for n, c in got.items()}


def _spec(cfg: BenchConfig | TierBenchConfig | FleetConfig, **kw: Any) -> runner.RunSpec:
    """The run of a bench's config: the fields they share by name, then ``kw``."""
    shared = {f.name: getattr(cfg, f.name) for f in fields(runner.RunSpec) if hasattr(cfg, f.name)}
    return runner.RunSpec(**(shared | kw))


def _hop(trace: str, offset_s: float, scale: float, rtt_ms: float | None, span_s: float) -> runner.HopPlay:
    """One host playing ``trace``; its median is the whole (scaled) trace's."""
    return runner.hop_play([trace], 1, offset_s=offset_s, step_s=0.0, scale=scale, span_s=span_s, rtt_ms=rtt_ms)


def run_bench(
    cfg: BenchConfig,
    rig: Rig,
    *,
    progress: Callable[[str], None] | None = None,
    live: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every strategy of ``cfg`` on ``rig`` (two tiers, one device) on the same trace window."""
    hop = _hop(cfg.trace, cfg.trace_offset_s, cfg.bandwidth_scale, cfg.rtt_ms, cfg.duration_s)
    family = family_median_mbps(trace_family(load_trace(cfg.trace)))
    hop = replace(hop, median_mbps=family * cfg.bandwidth_scale)
    out = runner.run(_spec(cfg, hops=(hop,), fixed_mbps=family), rig, progress=progress, live=live)
    sched = burst_intervals(cfg.load, cfg.duration_s)
    res, turns = report.strategies_report(out, rig.board.power, sched)
    played = hop.played[0]
    records = [r for t in out.turns for r in t.devices[0]]
    cal = rig.calibration
    assert cal is not None
    tm = out.times_ms
    return {
        "link": rig.kind,
        "model": cfg.model,
        "trace": cfg.trace,
        "trace_offset_s": cfg.trace_offset_s,
        "board": rig.board.name,
        "bandwidth_scale": cfg.bandwidth_scale,
        "load": cfg.load,
        "rate_hz": cfg.rate_hz,
        "duration_s": cfg.duration_s,
        "rtt_ms": hop.rtt_ms,
        "codecs": list(cfg.codecs) if cfg.codecs else list(out.tables[0].codecs),
        "calibration": {**asdict(cal), "error_pct": cal.error_pct},
        "measured_costs": asdict(measured_costs(out.tables[0], records, played, sched, hop.rtt_ms)),
        "strategies": res,
        "timeline": {
            "bandwidth_mbps": [[round(t, 3), r] for t, r in zip(played.times_s, played.rates_mbps, strict=True)],
            "load_intervals": sched or ([[0.0, cfg.duration_s]] if cfg.load == "cloud-busy" else []),
            "requests": _requests(turns),
            "predicted": _predicted(turns),
        },
        "cloud_calibration": {
            "model": cfg.model,
            "measured_ms": tm["server_ms"][0],
            "profile_ms": tm["host_cloud_ms"],
            "factor": tm["server_ms"][0] / tm["host_cloud_ms"],
        },
        "device_calibration": {
            "model": cfg.model,
            "measured_ms": tm["device_ms"][0],
            "table_ms": tm["host_device_ms"] * rig.board.cpu_speed_factor,
            "speed_factor": out.speeds[0],
        },
        "policies": {n: c.policy for n, c in out.choices.items()},
        "turns": {"turn_s": cfg.turn_s, "played": len(out.turns)},
        "load_average": {"start": list(out.load_start), "end": list(out.load_end)},
    }


def _requests(turns: dict[str, list[runner.Turn]]) -> dict[str, list[list[Any]]]:
    """Per strategy, device 0's completed requests as [t_s, latency ms, plan] (oracles: their picks)."""
    return {
        n: [[round(r.t_s, 3), round(r.latency_ms, 1), r.plan] for t in ts for r in t.devices[0] if not r.error]
        for n, ts in turns.items()
    }


def _predicted(turns: dict[str, list[runner.Turn]]) -> dict[str, list[list[Any]]]:
    """Per strategy played, device 0's requests that ran their plan (no error, no fallback) as [plan,
    latency ms, predicted ms]: how well the cost model priced each plan (``bench/bench_prediction.py``)."""
    return {
        n: [
            [r.plan, round(r.latency_ms, 2), round(r.predicted_ms, 2)]
            for t in ts
            for r in t.devices[0]
            if not (r.error or r.fallback) and math.isfinite(r.predicted_ms)
        ]
        for n, ts in turns.items()
    }


def run_tiers(
    cfg: TierBenchConfig,
    rig: Rig,
    *,
    progress: Callable[[str], None] | None = None,
    live: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every strategy of ``cfg`` on ``rig`` (three tiers) on the same two windows."""
    h1 = _hop(cfg.trace, cfg.trace_offset_s, cfg.bandwidth_scale, cfg.rtt_ms, cfg.duration_s)
    h2 = _hop(cfg.trace2, cfg.trace2_offset_s, cfg.bandwidth_scale2, cfg.rtt2_ms, cfg.duration_s)
    out = runner.run(_spec(cfg, hops=(h1, h2)), rig, progress=progress, live=live)
    figures, power, cal, tm = out.power, out.power.power, rig.calibration, out.times_ms
    res, turns = report.strategies_report(out, power)
    assert cal is not None
    return {
        "tiers": 3,
        "model": cfg.model,
        "objective": cfg.objective,
        "rate_hz": cfg.rate_hz,
        "duration_s": cfg.duration_s,
        "turn_s": cfg.turn_s,
        "codecs": list(cfg.codecs),
        "energy": {
            "source": figures.source,
            "origin": figures.origin,
            "note": figures.note,
            "idle_w": power.idle_w,
            "active_w": power.active_w,
            "radio_w": power.radio_w,
            "radio_source": figures.radio_source,
            "model": "active_w x device compute + (idle_w + radio_w) x upload (hop 1) + idle_w x the rest",
        },
        "strategies": res,
        "gains": report.gains(res),
        "failed": sum(int(s["failed"]) for s in res.values()),
        "requests": _requests(turns),
        "link": rig.kind,
        "board": rig.board.name,
        "hop1": _hop_dict(cfg.trace, h1),
        "hop2": _hop_dict(cfg.trace2, h2),
        "factors": {
            "device_ms": tm["device_ms"][0],
            "edge_ms": tm["server_ms"][0],
            "cloud_ms": tm["server_ms"][1],
            "host_ms": tm["host_cloud_ms"],
        },
        "edge": {
            "cpus": rig.config.tiers[1].cpus[0] if rig.config.tiers[1].cpus else math.nan,
            "measured_ms": tm["server_ms"][0],
        },
        "calibration": {**asdict(cal), "error_pct": cal.error_pct},
        "load_average": {"start": list(out.load_start), "end": list(out.load_end)},
    }


def _hop_dict(trace: str, h: runner.HopPlay) -> dict[str, Any]:
    w = h.played[0]
    return {
        "trace": trace,
        "offset_s": h.offset_s,
        "scale": h.scale,
        "rtt_ms": h.rtt_ms,
        "median_mbps": h.median_mbps,
        "window_mean_mbps": w.mean_mbps(),
        "bandwidth_mbps": [[round(t, 3), r] for t, r in zip(w.times_s, w.rates_mbps, strict=True)],
    }


def fleet_rig_config(cfg: FleetConfig, workdir: Path) -> RigConfig:
    tiers = (
        Tier(name="device", count=cfg.devices, cpus=cfg.device_cpus),
        Tier(name="cloud", count=cfg.servers, cpus=(cfg.server_cpus,), workers=cfg.server_workers, threads=1),
    )
    return RigConfig(
        board=cfg.board,
        link="kernel",
        tiers=tiers,
        delays=False,
        workdir=workdir,
        cfs_period_us=cfg.cfs_period_us,
        models=(cfg.model,),
    )


def run_fleet(cfg: FleetConfig, workdir: Path, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build the fleet, calibrate, run every strategy's turns; the result dict."""
    say = progress or (lambda s: None)
    span = cfg.segment_s * cfg.rounds + 60.0
    hop = runner.hop_play(
        list(cfg.traces),
        cfg.devices,
        offset_s=0.0,
        step_s=cfg.trace_offset_step_s,
        scale=cfg.bandwidth_scale,
        span_s=span,
        rtt_ms=1.0,
    )
    spec = _spec(
        cfg,
        hops=(hop,),
        fixed_mbps=hop.median_mbps / cfg.bandwidth_scale,
        duration_s=cfg.segment_s * cfg.rounds,
        turn_s=cfg.segment_s,
        kill_at=cfg.kill_at_fraction,
    )
    with Rig(fleet_rig_config(cfg, workdir), progress=say) as rig:
        out = runner.run(spec, rig, progress=say)
        power = rig.board.power
    res, _ = report.strategies_report(out, power)
    tm = out.times_ms
    return {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "servers": list(out.servers),
        "strategies": res,
        "vs_adaptive": {n: s["adaptive_over_this"] for n, s in res.items() if "adaptive_over_this" in s},
        "verdict": report.verdict(res),
        "segments": [
            {
                "strategy": t.name,
                "from_s": t.from_s,
                "killed": t.killed,
                "kill_at_s": t.kill_at_s,
                "load_avg": list(t.load_avg),
                **report.kill_account(t),
            }
            for t in out.turns
        ],
        "calibration": {
            "device_head_ms": tm["device_ms"],
            "profiled_device_ms": tm["host_device_ms"],
            "server_ms": tm["server_ms"][0],
            "cloud_factor": tm["server_ms"][0] / tm["host_cloud_ms"],
            "median_link_mbps": hop.median_mbps,
        },
        "devices_model": {
            "kind": "process per device",
            "startup_s": out.startup_s,
            "rss_mb_each": statistics.fmean(out.rss_mb) if out.rss_mb else 0.0,
            "rss_mb_total": sum(out.rss_mb),
        },
        "load_before": list(out.load_start),
        "load_after": list(out.load_end),
        "median_speed": statistics.median(out.speeds),
    }
