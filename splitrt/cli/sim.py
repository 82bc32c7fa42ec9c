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
from pathlib import Path
from typing import Any

from splitrt.cli.explain import min_agreement
from splitrt.cli.inputs import add_shape_arguments, load_graph
from splitrt.cli.tables import render
from splitrt.errors import ConfigError
from splitrt.graph import model as graph
from splitrt.plan.constraints import Constraints
from splitrt.plan.controller import ROUTE_CUTS, ControllerConfig
from splitrt.plan.netmon import LinkConfig
from splitrt.profile import boards, cutfacts, tables
from splitrt.profile.accuracy import MIN_AGREEMENT
from splitrt.rig import bench as rigbench
from splitrt.rig import models, sim, tracespec
from splitrt.rig import stats as rigstats
from splitrt.rig import strategies as rigstrategies

OTHERS = ("device-only", "cloud-only", "static", "periodic")
ROUTERS = ("route", "route-codec")


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
    device_profile: str | Path | None = None,
    cloud_profile: str | Path | None = None,
    codecs: Sequence[str] | None = None,
    mg: Any = None,
    deadline_ms: float = 5000.0,
    rtt_ms: float | None = None,
    warmup_s: float = 2.0,
    min_agreement: float = MIN_AGREEMENT,
    stalls: tuple[float, float] = (0.0, 0.0),
) -> dict[str, Any]:
    """Every strategy and the oracles on ``trace`` (``duration_s`` None: to its end) for ``model`` (a zoo
    name or an .onnx file; ``mg``: that model already loaded and bound); ``strategies`` (adaptive and route
    among them): only those, and no static-best search. The cost table is ``profile.tables.build``'s (the
    profiles, else a shipped profile, else the FLOPs prior, at ``board``'s speed): what `plan` and `run`
    use. ``codecs``: the plans may use only these (None: every codec the table prices), lossy ones where
    the device profile's samples agree (``min_agreement``, ``profile.costs.measured_codecs``). ``stalls``
    (share, ms): that share of the remote calls wait that long on the device, whatever the plan (``rig.sim``)."""
    if load not in ("none", *rigstats.DEVICE_HOGS):
        raise ConfigError(f"load: expected one of none, {', '.join(rigstats.DEVICE_HOGS)}, got {load!r}")
    b = boards.load_board(board)
    if mg is None:
        mg = graph.load(models.model_path_for(model))
    built = tables.build(mg, device=device_profile, cloud=cloud_profile, board=b, min_agreement=min_agreement)
    table = tables.with_codecs(built.table, codecs)
    allowed = cutfacts.allowed_for(mg, table, Constraints())
    cuts = allowed.cuts if allowed is not None else None
    if controller is None:
        controller = ControllerConfig(codecs=tuple(codecs) if codecs else None, cuts=cuts)
    full = tracespec.load_trace(trace)
    if not 0 <= offset_s < full.duration_s:
        raise ConfigError(f"offset: expected 0 <= offset < {full.duration_s:g} s (the trace), got {offset_s:g}")
    dur = min(duration_s or full.duration_s, full.duration_s - offset_s)
    window = full.window(offset_s, dur)
    played = window.scaled(scale) if scale != 1 else window
    rtt = tracespec.typical_rtt_ms(full) if rtt_ms is None else rtt_ms
    bursts = tuple(rigstats.burst_intervals(load, dur))
    cfg = sim.SimConfig(
        rate_hz=rate_hz,
        duration_s=dur,
        rtt_ms=rtt,
        bursts=bursts,
        burst_util=rigstats.burst_util(load),
        jitter=jitter,
        seed=seed,
        device_speed=device_speed,
        cloud_speed=cloud_speed,
        link=link or LinkConfig(),
        controller=controller,
        deadline_ms=deadline_ms,
        warmup_s=warmup_s,
        stalls=stalls,
    )
    policies = rigbench.strategy_policies(
        rigbench.BenchConfig(
            model=model, trace=trace, bandwidth_scale=scale, load=load, codecs=tuple(codecs) if codecs else None
        ),
        table,
        rtt,
    )
    if strategies is not None and not {"adaptive", "route"} <= set(strategies):
        raise ConfigError(f"strategies: expected adaptive and route among them, got {list(strategies)}")
    keep = strategies if strategies is not None else rigbench.STRATEGIES  # the hold ablation when named
    policies = {n: p for n, p in policies.items() if n in keep}
    runs = sim.simulate_all(table, policies, played, cfg)
    if strategies is None:  # static-best: the best single plan for this cell in hindsight (per-cell oracle)
        candidates = {
            f"fixed:{c}" if c == "device" else f"fixed:{c}@{k}"
            for c in rigstrategies.likely_plans([table, table], [rtt])[0]
            if cuts is None or c in cuts
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
    for n, rs in runs.items():  # how cloud plans ended (``plan.reserve``, as `run` reports them)
        stats[n]["cloud_share"] = sum(r.served for r in rs) / max(1, len(rs))
        stats[n]["fallbacks"] = sum(r.fallback for r in rs)
        stats[n]["not_sent"] = sum(r.not_sent for r in rs)
    for oname, ref in rigbench.ORACLE_REFS.items():
        picks = rigstats.oracle(
            table,
            costs,
            [r.t_s for r in runs[ref]],
            played,
            list(bursts),
            None,
            [(r.plan, r.latency_ms) for r in runs[ref]],
            cuts=ROUTE_CUTS if oname == "oracle-route" else cuts,
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
        "cost_table": built.summary(),
        "codecs": list(codecs) if codecs else None,
        "cuts_excluded": dict(allowed.excluded) if allowed is not None else {},
        "jitter": jitter,
        "stalls": list(stalls),
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
        # the best router is the baseline (issue 34): <= 1 wanted
        "adaptive_over_best_router": a["mean_ms"] / min(stats[n]["mean_ms"] for n in ROUTERS if n in stats),
        "strategies": stats,
    }


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="replay a bandwidth trace in simulation and compare every strategy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default="resnet50",
        help="zoo model or .onnx file (default resnet50); its cost table as `plan` and `run` find it: "
        "--device/--cloud profiles, else a profile in profiles/ ($SPLITRT_PROFILES_DIR), else FLOPs priors",
    )
    p.add_argument(
        "--trace",
        default="hsdpa/car",
        help="shipped trace (hsdpa/bus ...), a file, or step:1,8/5 | square:1,8,20 | constant:4",
    )
    p.add_argument(
        "--device",
        default=None,
        help="device profile (JSON, from `splitrt profile`; with --cloud); a board name here is read as --board",
    )
    p.add_argument("--cloud", default=None, help="cloud profile (JSON; with --device)")
    p.add_argument("--board", default=None, help="board (devices/<NAME>.toml; default rpi4): its speed and power")
    p.add_argument(
        "--codecs",
        default=None,
        help="comma-separated codecs the plans may use (default: every codec the table prices; fp32 = lossless)",
    )
    p.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="SHARE",
        help="lossy codecs only where this share of the device profile's samples kept the output (default "
        "0.99, as `plan`; a profile without samples: lossless only; 0: the guard off, e.g. the zoo's random "
        "weights)",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help="comma-separated strategies (adaptive and route among them; default all: "
        f"{','.join(rigbench.STRATEGIES)})",
    )
    p.add_argument("--bandwidth-scale", type=float, default=1.0)
    p.add_argument("--load", default="none", choices=["none", "device-burst", "device-busy"])
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (paced, one in flight)")
    p.add_argument("--duration", type=float, default=0.0, help="seconds of trace (0: to its end)")
    p.add_argument("--trace-offset", type=float, default=0.0)
    p.add_argument("--deadline-ms", type=float, default=5000.0, help="per-request deadline, as `run` (default 5000)")
    p.add_argument("--rtt-ms", type=float, default=None, help="added round trip (default: typical of the trace)")
    p.add_argument(
        "--warmup", type=float, default=2.0, help="uncounted seconds of requests first (default 2; 0: as `run --count`)"
    )
    p.add_argument("--jitter", type=float, default=0.0, help="relative sd of compute per request (seeded)")
    p.add_argument(
        "--stalls",
        default="0,0",
        metavar="SHARE,MS",
        help="that share of the remote calls waits MS on the device whatever the plan (a busy board's scheduler; "
        "the rig's busy board: about 0.25,50)",
    )
    p.add_argument("--device-speed", type=float, default=1.0, help="device compute takes this x the profile")
    p.add_argument("--cloud-speed", type=float, default=1.0, help="cloud compute takes this x the profile")
    p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON ('-': stdout)")
    add_shape_arguments(p)
    p.set_defaults(func=cmd_sim)


def profile_and_board(device: str | None, cloud: str | None, board: str | None) -> tuple[str | None, str | None, str]:
    """(device profile, cloud profile, board) from ``--device/--cloud/--board``: ``--device`` that is no
    .json file names the board, as before profiles could be given (``sim --device rpi4``)."""
    if device is not None and not device.endswith(".json") and not Path(device).is_file():
        if board is not None and board != device:
            raise ConfigError(f"--device {device!r} is a board, and --board {board!r} another: expected one board")
        board, device = device, None
    if (device is None) != (cloud is None):
        raise ConfigError(
            "profiles: expected both --device and --cloud profiles (JSON), got only "
            f"{'--device' if cloud is None else '--cloud'}"
        )
    return device, cloud, board or "rpi4"


def _stalls(text: str) -> tuple[float, float]:
    try:
        share, ms = (float(x) for x in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"--stalls: expected SHARE,MS (e.g. 0.25,50), got {text!r}") from exc
    if not (0.0 <= share <= 1.0 and ms >= 0.0):
        raise ConfigError(f"--stalls: expected a share in [0, 1] and ms >= 0, got {text!r}")
    return share, ms


def _list(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def cmd_sim(args: argparse.Namespace) -> int:
    from splitrt.cli.codecarg import codec_arg

    device, cloud, board = profile_and_board(args.device, args.cloud, args.board)
    codecs = _list(args.codecs)
    for c in codecs or ():
        try:
            codec_arg(c)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--codecs: {exc}") from exc
    mg = load_graph(args)  # bound at --shape/--dim/--sample, as `plan`
    r = sim_cell(
        args.model,
        args.trace,
        board=board,
        scale=args.bandwidth_scale,
        load=args.load,
        rate_hz=args.rate,
        duration_s=args.duration or None,
        offset_s=args.trace_offset,
        jitter=args.jitter,
        device_speed=args.device_speed,
        cloud_speed=args.cloud_speed,
        device_profile=device,
        cloud_profile=cloud,
        codecs=codecs,
        strategies=_list(args.strategies),
        mg=mg,
        deadline_ms=args.deadline_ms,
        rtt_ms=args.rtt_ms,
        warmup_s=args.warmup,
        min_agreement=min_agreement(args),
        stalls=_stalls(args.stalls),
    )
    print(f"splitrt sim: cost table from {r['cost_table']['source']}", file=sys.stderr)
    if args.json == "-":
        print(json.dumps(r, default=float))
        return 0
    rows = []
    for name in [n for n in [*rigbench.TWO_TIER, "static-best"] if n in r["strategies"]]:
        s = r["strategies"][name]
        plans = ", ".join(f"{p} x{n}" for p, n in sorted(s["plans"].items(), key=lambda kv: -kv[1])[:3])
        rows.append((name, s["mean_ms"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["completed"], s["switches"], plans))
    print(
        f"{r['model']} on {r['board']} (simulated) | trace {r['trace']} x{r['bandwidth_scale']:g} from "
        f"{r['trace_offset_s']:g} s, {r['duration_s']:g} s, rtt +{r['rtt_ms']:g} ms | load {r['load']} | "
        f"{r['rate_hz']:g} req/s | jitter {r['jitter']:g}, stalls {r['stalls'][0]:g} x {r['stalls'][1]:g} ms, "
        f"true/profiled compute: device "
        f"x{r['device_speed']:g}, cloud x{r['cloud_speed']:g}"
    )
    print(render(["strategy", "mean ms", "p50 ms", "p95 ms", "p99 ms", "done", "switches", "plans"], rows))
    print(
        f"adaptive: mean {r['mean_vs_oracle']:.3f} x oracle, p95 {r['p95_vs_oracle']:.3f} x oracle, "
        f"mean {r['mean_vs_best']:.3f} x best other strategy ({r['best_other']})"
    )
    print(
        f"split vs route (route mean / split mean, > 1: splitting pays): adaptive {r['route_over_adaptive']:.3f}, "
        f"oracle {r['route_over_oracle']:.3f}; adaptive / best router (route, route-codec) "
        f"{r['adaptive_over_best_router']:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1, default=float)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
