"""`splitrt sim`: every bench strategy replayed on a bandwidth trace in simulation (no root, no rig).

The decision logic the device runtime runs (policies, controller, estimators), fed as the runtime feeds
it, against a trace and a model's shipped profile scaled to a board: what `splitrt bench` measures in
the rig, without the host's jitter and in seconds. For what-if runs: a profile that is off
(--device-speed 1.2), a longer trace, another estimator setting (bench/bench_sim.py --set).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from splitrt import paths
from splitrt.cli.tables import render
from splitrt.errors import ConfigError
from splitrt.graph import model as graph
from splitrt.plan.controller import ROUTE_CUTS, ControllerConfig
from splitrt.plan.netmon import LinkConfig
from splitrt.profile import boards
from splitrt.rig import bench as rigbench
from splitrt.rig import models, sim, tracespec
from splitrt.rig import stats as rigstats
from splitrt.rig import strategies as rigstrategies

OTHERS = ("device-only", "cloud-only", "static", "periodic")


def sim_cell(
    model: str,
    trace: str,
    *,
    board: str = "rpi4",
    scale: float = 1.0,
    load: str = "none",
    rate_hz: float = 4.0,
    duration_s: float | None = None,
    offset_s: float = 0.0,
    jitter: float = 0.0,
    seed: int = 0,
    device_speed: float = 1.0,
    cloud_speed: float = 1.0,
    link: LinkConfig | None = None,
    controller: ControllerConfig | None = None,
    strategies: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Every strategy and the oracles on ``trace`` (``duration_s`` None: to its end) for ``model``;
    ``strategies`` (adaptive and route among them): only those, and no static-best search."""
    if load not in ("none", "device-burst"):
        raise ConfigError(f"load: the simulation has none and device-burst, got {load!r}")
    b = boards.load_board(board)
    path = models.model_path_for(model)
    prof = models.shipped_profile(model)
    if prof is None:
        raise ConfigError(
            f"no shipped profile of {model!r} in {paths.profiles_dir()}: expected a zoo model "
            f"with a profile there (splitrt profile writes one)"
        )
    table = models.cost_table_for(prof, graph.file_sha256(path), b.cpu_speed_factor)
    full = tracespec.load_trace(trace)
    if not 0 <= offset_s < full.duration_s:
        raise ConfigError(f"offset: expected 0 <= offset < {full.duration_s:g} s (the trace), got {offset_s:g}")
    dur = min(duration_s or full.duration_s, full.duration_s - offset_s)
    window = full.window(offset_s, dur)
    played = window.scaled(scale) if scale != 1 else window
    rtt = tracespec.typical_rtt_ms(full)
    bursts = tuple(rigstats.burst_intervals(load, dur))
    cfg = sim.SimConfig(
        rate_hz=rate_hz,
        duration_s=dur,
        rtt_ms=rtt,
        bursts=bursts,
        jitter=jitter,
        seed=seed,
        device_speed=device_speed,
        cloud_speed=cloud_speed,
        link=link or LinkConfig(),
        controller=controller or ControllerConfig(codecs=None),
    )
    policies = rigbench.strategy_policies(
        rigbench.BenchConfig(model=model, trace=trace, bandwidth_scale=scale, load=load), table, rtt
    )
    if strategies is not None:
        if not {"adaptive", "route"} <= set(strategies):
            raise ConfigError(f"strategies: expected adaptive and route among them, got {list(strategies)}")
        policies = {n: p for n, p in policies.items() if n in strategies}
    runs = sim.simulate_all(table, policies, played, cfg)
    if strategies is None:  # static-best: the best single plan for this cell in hindsight (per-cell oracle)
        candidates = {
            f"fixed:{c}" if c == "device" else f"fixed:{c}@{k}"
            for c in rigstrategies.likely_plans([table, table], [rtt])[0]
            for k in (cfg.controller.codecs or table.codecs)
            if c == "device" or k in table.codecs
        }
        fixed_runs = sim.simulate_all(table, {p: p for p in sorted(candidates)}, played, cfg)
        policies["static-best"] = min(fixed_runs, key=lambda p: statistics.fmean(sim.latencies(fixed_runs[p])))
        runs["static-best"] = fixed_runs[policies["static-best"]]
    costs = rigstats.MeasuredCosts(
        device_ratio_idle=device_speed,
        device_ratio_burst=device_speed / (1.0 - cfg.burst_util),
        cloud_ratio=cloud_speed,
        net_overhead_ms=rtt,
        local_overhead_ms=0.0,
    )
    stats = {n: rigstats.summarize(sim.latencies(rs), [r.plan for r in rs], 0, []) for n, rs in runs.items()}
    for oname, ref in rigbench.ORACLE_REFS.items():
        picks = rigstats.oracle(
            table,
            costs,
            [r.t_s for r in runs[ref]],
            played,
            list(bursts),
            None,
            [(r.plan, r.latency_ms) for r in runs[ref]],
            cuts=ROUTE_CUTS if oname == "oracle-route" else None,
        )
        stats[oname] = rigstats.summarize([ms for _, ms in picks], [p for p, _ in picks], 0, [])
        stats[oname]["policy"] = f"hindsight over the {ref} run's request times"
    for n, s in stats.items():
        s.pop("energy_mj", None)
        s.setdefault("policy", policies.get(n, ""))
    best = min([n for n in OTHERS if n in stats] or ["adaptive"], key=lambda n: stats[n]["mean_ms"])
    a, o = stats["adaptive"], stats["oracle"]
    return {
        "link": "simulated",
        "model": model,
        "trace": trace,
        "board": board,
        "bandwidth_scale": scale,
        "load": load,
        "rate_hz": rate_hz,
        "duration_s": dur,
        "trace_offset_s": offset_s,
        "rtt_ms": rtt,
        "jitter": jitter,
        "device_speed": device_speed,
        "cloud_speed": cloud_speed,
        "best_other": best,
        "mean_vs_oracle": a["mean_ms"] / o["mean_ms"],
        "p95_vs_oracle": a["p95_ms"] / o["p95_ms"],
        "mean_vs_best": a["mean_ms"] / stats[best]["mean_ms"],
        "route_over_adaptive": stats["route"]["mean_ms"] / a["mean_ms"],
        "route_over_oracle": stats["oracle-route"]["mean_ms"] / o["mean_ms"],
        "route_over_adaptive_p95": stats["route"]["p95_ms"] / a["p95_ms"],
        "route_over_oracle_p95": stats["oracle-route"]["p95_ms"] / o["p95_ms"],
        "strategies": stats,
    }


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="replay a bandwidth trace in simulation and compare every strategy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="resnet50", help="zoo model with a shipped profile (default resnet50)")
    p.add_argument(
        "--trace",
        default="hsdpa/car",
        help="shipped trace (hsdpa/bus ...), a file, or step:1,8/5 | square:1,8,20 | constant:4",
    )
    p.add_argument("--device", default="rpi4", help="board (devices/<NAME>.toml)")
    p.add_argument("--bandwidth-scale", type=float, default=1.0)
    p.add_argument("--load", default="none", choices=["none", "device-burst"])
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (paced, one in flight)")
    p.add_argument("--duration", type=float, default=0.0, help="seconds of trace (0: to its end)")
    p.add_argument("--trace-offset", type=float, default=0.0)
    p.add_argument("--jitter", type=float, default=0.0, help="relative sd of compute per request (seeded)")
    p.add_argument("--device-speed", type=float, default=1.0, help="device compute takes this x the profile")
    p.add_argument("--cloud-speed", type=float, default=1.0, help="cloud compute takes this x the profile")
    p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON ('-': stdout)")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    r = sim_cell(
        args.model,
        args.trace,
        board=args.device,
        scale=args.bandwidth_scale,
        load=args.load,
        rate_hz=args.rate,
        duration_s=args.duration or None,
        offset_s=args.trace_offset,
        jitter=args.jitter,
        device_speed=args.device_speed,
        cloud_speed=args.cloud_speed,
    )
    if args.json == "-":
        print(json.dumps(r, default=float))
        return 0
    rows = []
    for name in [*rigbench.STRATEGIES, "static-best"]:
        s = r["strategies"][name]
        plans = ", ".join(f"{p} x{n}" for p, n in sorted(s["plans"].items(), key=lambda kv: -kv[1])[:3])
        rows.append((name, s["mean_ms"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["completed"], s["switches"], plans))
    print(
        f"{r['model']} on {r['board']} (simulated) | trace {r['trace']} x{r['bandwidth_scale']:g} from "
        f"{r['trace_offset_s']:g} s, {r['duration_s']:g} s, rtt +{r['rtt_ms']:g} ms | load {r['load']} | "
        f"{r['rate_hz']:g} req/s | jitter {r['jitter']:g}, true/profiled compute: device "
        f"x{r['device_speed']:g}, cloud x{r['cloud_speed']:g}"
    )
    print(render(["strategy", "mean ms", "p50 ms", "p95 ms", "p99 ms", "done", "switches", "plans"], rows))
    print(
        f"adaptive: mean {r['mean_vs_oracle']:.3f} x oracle, p95 {r['p95_vs_oracle']:.3f} x oracle, "
        f"mean {r['mean_vs_best']:.3f} x best other strategy ({r['best_other']})"
    )
    print(
        f"split vs route (route mean / split mean, > 1: splitting pays): adaptive {r['route_over_adaptive']:.3f}, "
        f"oracle {r['route_over_oracle']:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1, default=float)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
