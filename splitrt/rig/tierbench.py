"""The three-tier benchmark (``splitrt rig bench --tiers 3``): every strategy on the same two trace windows.

One device process (``rig.tierworker``) holds a runtime per strategy (``rig.tierplans``); the strategies
take turns on the same ``turn_s`` slices of both windows (hop 1 and hop 2 replay them for each), in
rotating order, with their clocks and probers parked between turns, exactly as ``rig.bench`` does for
two tiers. Before the timed part, with both hops unshaped, the worker times the whole model on the cloud,
on the edge (under its quota) and on the throttled device; each tier's profile times are rescaled to
what it takes now, and every strategy plans with those tables. Static choices are made once, at the
whole traces' median bandwidths.

Device energy per inference is ESTIMATED here: the board file's power figures (``profile.energy.
plan_power``; this host has no power reader for the emulated board) applied to each request's measured
compute time on the device, its upload time on hop 1 (the trace's rate) and the rest of its latency.

- ``run_tiers(TierBenchConfig(model, trace, trace2, bandwidth_scale[2], trace[2]_offset_s, rtt[2]_ms, objective,
  rate_hz, duration_s, turn_s, codecs=("fp32",), strategies), rig) -> dict`` (``splitrt rig bench --tiers 3``):
  one ``python -m splitrt.rig.tierworker`` process, a runtime per strategy (``tierplans.STRATEGIES``: 2-tier
  ones on ``AdaptiveDevice`` over the direct path, 3-tier ones on ``ChainDevice``, a static pair via
  ``tierplans.FixedChain``), turns as ``rig.bench``'s (both hops replay the slice). Static plans from
  ``tierplans.choose`` at the whole traces' medians, on tables rescaled to each tier's whole-model time measured
  at start. JSON: ``strategies.{NAME}.{mean_ms, mean_ci_ms, p95_ms, p95_ci_ms, energy_mj, energy_ci_mj,
  completed, failed, via_edge, finished_by, mismatched, plans, adaptive_over_this}``, ``gains``,
  ``energy.source`` (``estimated``: the board's figures through ``stats.energy_mj``, upload time on hop 1),
  ``hop1``/``hop2``, ``factors``, ``load_average``. Every request's outputs are compared with the full model's.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from splitrt.errors import ConfigError
from splitrt.rig import traces
from splitrt.rig.bench import turn_plan
from splitrt.rig.models import model_path_for, profile_for
from splitrt.rig.stats import energy_mj, summarize
from splitrt.rig.tierplans import (
    DEFAULT_STRATEGIES,
    STRATEGIES,
    Strategy,
    bootstrap_ci,
    by_turn,
    choose,
    gains,
    likely_first_cuts,
    likely_pairs,
)
from splitrt.rig.tiers import TierRig
from splitrt.rig.tierworker import tier_tables
from splitrt.rig.tracespec import DEFAULT_RTT_MS, FAMILY_RTT_MS, load_trace, trace_family

OBJECTIVES = ("latency", "energy")


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
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    deadline_ms: float = 5000.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad or not self.strategies:
            raise ConfigError(f"strategies: expected names in {', '.join(STRATEGIES)}, got {list(self.strategies)}")
        nums = (self.rate_hz, self.duration_s, self.turn_s, self.bandwidth_scale, self.bandwidth_scale2)
        if not all(x > 0 for x in nums):
            raise ConfigError(f"rate_hz, duration_s, turn_s and both bandwidth scales must be > 0, got {nums}")


@dataclass(frozen=True, kw_only=True)
class Hop:
    """One hop's trace as played: the window, its RTT and the whole trace's median (static choices)."""

    trace: str
    offset_s: float
    scale: float
    rtt_ms: float
    median_mbps: float
    played: traces.Trace

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "offset_s": self.offset_s,
            "scale": self.scale,
            "rtt_ms": self.rtt_ms,
            "median_mbps": self.median_mbps,
            "window_mean_mbps": self.played.mean_mbps(),
            "bandwidth_mbps": [
                [round(t, 3), r] for t, r in zip(self.played.times_s, self.played.rates_mbps, strict=True)
            ],
        }


def hop(spec: str, offset_s: float, scale: float, rtt_ms: float | None, duration_s: float) -> Hop:
    full = load_trace(spec)
    full = full.scaled(scale) if scale != 1 else full
    rtt = rtt_ms if rtt_ms is not None else FAMILY_RTT_MS.get(trace_family(full) or "", DEFAULT_RTT_MS)
    return Hop(
        trace=spec,
        offset_s=offset_s,
        scale=scale,
        rtt_ms=rtt,
        median_mbps=full.median_mbps(),
        played=full.window(offset_s, duration_s),
    )


def _calibrate(rig: TierRig, worker: Any, host_ms: float, say: Callable[[str], None]) -> dict[str, float]:
    """Each tier's whole-model time now (both hops unshaped) over the host profile's: the factors."""
    rig.set_rates(None, None)
    got = worker.call({"cmd": "calibrate", "runs": 5}, 300)
    rig.throttle_in(worker.proc.pid)
    try:
        dev_ms = float(worker.call({"cmd": "device-calibrate", "runs": 3}, 300)["head_ms"])
    finally:
        rig.throttle_out(worker.proc.pid)
    f = {"host_ms": host_ms, "device_ms": dev_ms, "edge_ms": float(got["edge_ms"]), "cloud_ms": float(got["cloud_ms"])}
    for tier in ("device", "edge", "cloud"):
        f[f"{tier}_factor"] = f[f"{tier}_ms"] / host_ms
    say(
        f"whole model now: device {dev_ms:.0f} ms, edge {f['edge_ms']:.0f} ms, cloud {f['cloud_ms']:.0f} ms "
        f"(host profile {host_ms:.0f} ms)"
    )
    return f


def run_tiers(
    cfg: TierBenchConfig,
    rig: TierRig,
    *,
    progress: Callable[[str], None] | None = None,
    live: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every strategy of ``cfg`` in ``rig`` on the same two windows; return the result dict."""
    from splitrt.graph import model as graph
    from splitrt.profile import profiler
    from splitrt.profile.energy import plan_power

    say = progress or (lambda s: None)
    load_start = os.getloadavg()
    model_file = model_path_for(cfg.model)
    mg = graph.load(model_file)
    rig.install_model(model_file)
    cal = rig.calibrate()
    prof_path = profile_for(cfg.model, model_file, rig.workdir, say)
    prof = profiler.load_profile(prof_path, sha256=mg.sha256)
    figures = plan_power(prof, rig.board)
    h1 = hop(cfg.trace, cfg.trace_offset_s, cfg.bandwidth_scale, cfg.rtt_ms, cfg.duration_s)
    h2 = hop(cfg.trace2, cfg.trace2_offset_s, cfg.bandwidth_scale2, cfg.rtt2_ms, cfg.duration_s)
    rig.set_rtts(h1.rtt_ms, h2.rtt_ms)
    base = tier_tables(prof_path, mg.sha256, device_speed=rig.board.cpu_speed_factor, edge_factor=1.0, cloud_factor=1.0)
    host_ms = float(base[1].head_ms[base[1].index("device")])
    plan_kw: dict[str, Any] = {"objective": cfg.objective, "power": figures.power, "codecs": cfg.codecs}
    spec = {
        "model_path": str(model_file),
        "profile_path": str(prof_path),
        "board": rig.board.name,
        "edge": rig.edge_address,
        "cloud": rig.cloud_address,
        "codecs": list(cfg.codecs),
        "objective": cfg.objective,
        "deadline_ms": cfg.deadline_ms,
        "threads": rig.config.device_threads,
        "seed": cfg.seed,
        "warm_cuts": likely_first_cuts(*base, rtt1_ms=h1.rtt_ms, rtt2_ms=h2.rtt_ms, **plan_kw),
    }
    worker = rig.start_tier_worker(spec)
    try:
        factors = _calibrate(rig, worker, host_ms, say)
        tables = tier_tables(
            prof_path,
            mg.sha256,
            device_speed=factors["device_factor"],
            edge_factor=factors["edge_factor"],
            cloud_factor=factors["cloud_factor"],
        )
        from splitrt.plan.costmodel import Link

        chosen = choose(
            *tables,
            hop1=Link(bandwidth_mbps=h1.median_mbps, rtt_ms=h1.rtt_ms),
            hop2=Link(bandwidth_mbps=h2.median_mbps, rtt_ms=h2.rtt_ms),
            names=cfg.strategies,
            **plan_kw,
        )
        rates = [(h1.played.rate_at(t), h2.played.rate_at(t)) for t in range(int(cfg.duration_s) + 1)]
        warm = [p for p in [s.plan for s in chosen.values() if s.tiers == 3] if p and ">" in p]
        warm += [
            p for p in likely_pairs(*tables, rates, rtt1_ms=h1.rtt_ms, rtt2_ms=h2.rtt_ms, **plan_kw) if p not in warm
        ]
        worker.call({"cmd": "warm-edge", "plans": warm[:12]}, 600)
        for s in chosen.values():
            say(f"[{s.name}] {s.tiers} tiers, policy {s.policy}: preparing")
            rig.set_rates(max(h1.played.rate_at(0.0), 0.05), max(h2.played.rate_at(0.0), 0.05))
            (rig.workdir / f"requests-{s.name}.jsonl").unlink(missing_ok=True)
            worker.call(
                {
                    "cmd": "prepare",
                    "name": s.name,
                    "tiers": s.tiers,
                    "policy": s.policy,
                    "speed_factor": factors["device_factor"],
                    "edge_factor": factors["edge_factor"],
                    "cloud_factor": factors["cloud_factor"],
                    "rate_hz": cfg.rate_hz,
                    "warmup_s": cfg.warmup_s,
                },
                300,
            )
        roles = worker.call({"cmd": "roles"}, 30)
        rig.throttle_threads(worker.proc.pid, roles.get("compute_tids", []), roles.get("other_tids", []))
        try:
            records = _play_turns(cfg, rig, worker, h1, h2, list(chosen), say, live)
        finally:
            rig.throttle_out(worker.proc.pid)
    finally:
        worker.close()
    result = assemble(cfg, chosen, records, h1, figures)
    result.update(
        link=rig.kind,
        board=rig.board.name,
        hop1=h1.as_dict(),
        hop2=h2.as_dict(),
        factors=factors,
        edge={"cpus": rig.tier_config.edge_cpus, "measured_ms": factors["edge_ms"]},
        calibration={**{k: v for k, v in asdict(cal).items() if k != "rounds"}, "error_pct": cal.error_pct},
        load_average={"start": list(load_start), "end": list(os.getloadavg())},
    )
    return result


def _play_turns(
    cfg: TierBenchConfig,
    rig: TierRig,
    worker: Any,
    h1: Hop,
    h2: Hop,
    names: Sequence[str],
    say: Callable[[str], None],
    live: Callable[[str], None] | None,
) -> dict[str, list[dict[str, Any]]]:
    """Every strategy's turns, both hops replaying the strategy's slice of their windows."""
    from splitrt.rig import shaper

    pos = dict.fromkeys(names, 0.0)
    count = dict.fromkeys(names, 0)
    for name, until in turn_plan(names, cfg.duration_s, cfg.turn_s):
        from_s = pos[name]
        if from_s >= until:  # its last request of the previous turn ran past this slice
            continue

        def on_event(ev: dict[str, Any], name: str = name) -> None:
            count[name] += 1
            if live is not None:
                t = float(ev["t_s"])
                live(
                    f"[{name}] {t:5.1f}/{cfg.duration_s:g} s  req {count[name]:3d}  hops "
                    f"{h1.played.rate_at(t):5.2f}/{h2.played.rate_at(t):5.2f} Mbit/s  plan {ev['plan']:<16} "
                    f"{ev['latency_ms']:7.0f} ms"
                )

        worker.on_event = on_event
        left = cfg.duration_s - from_s
        players = [
            shaper.TracePlayer(s, h.played.window(from_s, left), duration_s=left)
            for s, h in ((rig.shaper, h1), (rig.shaper2, h2))
        ]
        t0 = time.monotonic() + 0.05
        try:
            worker.send(
                {
                    "cmd": "run",
                    "name": name,
                    "t0": t0,
                    "from_s": from_s,
                    "until_s": until,
                    "rate_hz": cfg.rate_hz,
                    "log_path": str(rig.workdir / f"requests-{name}.jsonl"),
                }
            )
            while time.monotonic() < t0:
                time.sleep(0.005)
            for p in players:
                p.start()
            done = worker.reply(until - from_s + cfg.deadline_ms / 1e3 + 120)
        finally:
            for p in players:
                p.stop()
            worker.on_event = None
        pos[name] = max(until, float(done["end_s"]))
    if live is not None:
        live("")
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        path = rig.workdir / f"requests-{name}.jsonl"
        out[name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ms = [r["latency_ms"] for r in out[name]]
        say(f"[{name}] {len(ms)} requests, mean {statistics.fmean(ms) if ms else math.nan:.0f} ms")
    return out


def assemble(
    cfg: TierBenchConfig, chosen: dict[str, Strategy], records: dict[str, list[dict[str, Any]]], h1: Hop, figures: Any
) -> dict[str, Any]:
    """Per strategy: latency and energy summaries, bootstrap intervals over turns, where requests went,
    outputs that differed from the full model's; adaptive's gains."""
    power = figures.power
    # The energy model now counts idle + radio while sending (radio_w is the board files' increment), so
    # energy_increment_mj equals energy_mj; kept for the JSON's readers (it was the corrected figure
    # while the model counted radio_w alone).
    increment = power
    strategies: dict[str, Any] = {}
    for name, s in chosen.items():
        recs = records.get(name, [])
        ok = [r for r in recs if not r.get("error")]
        for r in ok:
            r["energy_mj"] = energy_mj(r, h1.played, power)
            r["energy_increment_mj"] = energy_mj(r, h1.played, increment)
        summary = summarize(
            [r["latency_ms"] for r in ok],
            [r["plan"] for r in ok],
            failed=len(recs) - len(ok),
            energies=[r["energy_mj"] for r in ok],
            fallbacks=sum(1 for r in ok if r.get("fallback")),
        )
        lat_turns = by_turn(ok, cfg.turn_s, "latency_ms")
        summary.update(
            tiers=s.tiers,
            policy=s.policy,
            predicted_ms=s.predicted_ms,
            predicted_mj=s.predicted_mj,
            mean_ci_ms=list(bootstrap_ci(lat_turns, seed=cfg.seed)),
            p95_ci_ms=list(bootstrap_ci(lat_turns, stat="p95", seed=cfg.seed)),
            energy_ci_mj=list(bootstrap_ci(by_turn(ok, cfg.turn_s, "energy_mj"), seed=cfg.seed)),
            energy_increment_mj=statistics.fmean(r["energy_increment_mj"] for r in ok) if ok else math.nan,
            finished_by={k: sum(1 for r in ok if r.get("finished_by") == k) for k in ("device", "edge", "cloud")},
            via_edge=sum(1 for r in ok if r.get("route") == "edge"),
            mismatched=sum(1 for r in ok if r.get("match") is False),
        )
        strategies[name] = summary
    _ratios(cfg, strategies, records)
    result: dict[str, Any] = {
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
            "model": "active_w x device compute + radio_w x upload (hop 1) + idle_w x the rest",
            "increment_model": "energy_increment_mj: (idle_w + radio_w) during the upload",
        },
        "strategies": strategies,
        "gains": gains(strategies),
        "failed": sum(int(s["failed"]) for s in strategies.values()),
        "requests": {
            n: [
                [
                    round(float(r["t_s"]), 3),
                    round(float(r["latency_ms"]), 1),
                    r["plan"],
                    round(float(r.get("energy_mj", math.nan)), 1),
                ]
                for r in recs
            ]
            for n, recs in records.items()
        },
    }
    return result


def _ratios(cfg: TierBenchConfig, strategies: dict[str, Any], records: dict[str, list[dict[str, Any]]]) -> None:
    """Adaptive over each other strategy: 95 % intervals of the ratios of mean latency, p95 latency and
    mean energy (turns resampled, ``regret.bootstrap_ratio``), and the call (better / same / worse)."""
    from splitrt.rig.regret import bootstrap_ratio, call

    if "adaptive" not in strategies:
        return

    def turns(name: str, key: str) -> list[list[float]]:
        return by_turn([r for r in records.get(name, []) if not r.get("error")], cfg.turn_s, key)

    for name in strategies:
        if name == "adaptive":
            continue
        ratios: dict[str, Any] = {}
        for label, key, stat in (
            ("mean", "latency_ms", "mean"),
            ("p95", "latency_ms", "p95"),
            ("energy", "energy_mj", "mean"),
        ):
            ci = bootstrap_ratio(turns("adaptive", key), turns(name, key), stat=stat, seed=cfg.seed)
            ratios[label] = {"ci": list(ci), "call": call(ci)}
        strategies[name]["adaptive_over_this"] = ratios
