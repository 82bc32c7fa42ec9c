"""`splitrt rig bench`: the rig benchmark by tiers. `--tiers 3` (root): a device, an edge and a cloud
namespace over two links shaped from two traces, the device and the edge CPU-throttled; 3-tier adaptive
against device-only, cloud-only, edge-only, the best static 2-tier split and the best static 3-tier cut
pair: latency and device energy per inference (estimated from the board's power figures). `--tiers 2`
is `splitrt bench`. See splitrt.rig.bench (run_tiers) and splitrt.rig.harness. Registered under `splitrt rig` by
splitrt.cli.bench."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench


def register(rig_sub: Any, *, two_tier: Callable[[argparse.Namespace], int], live_line: Callable[[], Any]) -> None:
    """``two_tier``: the `splitrt bench` handler (``--tiers 2``); ``live_line``: its progress line (both
    passed in by splitrt.cli.bench, which registers this: no import circle)."""
    d = rigbench.TierBenchConfig()
    p = rig_sub.add_parser("bench", help="the rig benchmark; --tiers 3: device -> edge -> cloud", description=__doc__)
    p.add_argument("--tiers", type=int, choices=[2, 3], default=3, help="3: device, edge, cloud; 2: splitrt bench")
    p.add_argument("--model", default=d.model, help="zoo name or .onnx file (default resnet50)")
    p.add_argument("--device", default="rpi4", help="board to emulate (devices/<NAME>.toml)")
    p.add_argument("--trace", default=d.trace, help="hop 1 (device -> edge) trace: shipped, a file, or synthetic")
    p.add_argument("--trace2", default=d.trace2, help="hop 2 (edge -> cloud) trace (--tiers 3)")
    p.add_argument("--bandwidth-scale", type=float, default=1.0, help="multiply the hop 1 trace")
    p.add_argument("--bandwidth-scale2", type=float, default=1.0, help="multiply the hop 2 trace")
    p.add_argument("--trace-offset", type=float, default=0.0, help="start this far into the hop 1 trace (s)")
    p.add_argument("--trace2-offset", type=float, default=0.0, help="start this far into the hop 2 trace (s)")
    p.add_argument("--rtt-ms", type=float, default=None, help="hop 1 round trip (default: typical of the trace)")
    p.add_argument("--rtt2-ms", type=float, default=None, help="hop 2 round trip (default: typical of the trace)")
    p.add_argument("--edge-cpus", type=float, default=1.0, help="the edge server's CPU quota (CPUs)")
    p.add_argument(
        "--objective",
        choices=["latency", "energy"],
        default="latency",
        help="what the adaptive runtime and the static choices minimise",
    )
    p.add_argument("--rate", type=float, default=d.rate_hz, help="requests per second (paced, one in flight)")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of trace every strategy plays")
    p.add_argument("--turn", type=float, default=d.turn_s, help="strategies take turns on slices this long (s)")
    p.add_argument("--codecs", default=",".join(d.codecs), help="codecs the plans may use (default fp32: lossless)")
    p.add_argument(
        "--strategies",
        default=",".join(d.strategies),
        help=f"comma-separated, of {', '.join(rigbench.TIER_STRATEGIES)}",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON ('-': stdout)")
    p.add_argument("--keep-workdir", action="store_true", help="keep logs and per-request records")
    p.set_defaults(func=cmd_rig_bench, two_tier=two_tier, live_line=live_line)


def config_from(args: argparse.Namespace) -> Any:
    return rigbench.TierBenchConfig(
        model=args.model,
        trace=args.trace,
        trace2=args.trace2,
        bandwidth_scale=args.bandwidth_scale,
        bandwidth_scale2=args.bandwidth_scale2,
        trace_offset_s=args.trace_offset,
        trace2_offset_s=args.trace2_offset,
        rtt_ms=args.rtt_ms,
        rtt2_ms=args.rtt2_ms,
        objective=args.objective,
        rate_hz=args.rate,
        duration_s=args.duration,
        turn_s=args.turn,
        codecs=tuple(c for c in args.codecs.split(",") if c),
        strategies=tuple(s for s in args.strategies.split(",") if s),
    )


def run(cfg: Any, *, board: str, edge_cpus: float, line: Any, keep_workdir: bool = False) -> dict[str, Any]:
    """One three-tier bench in a fresh rig (root); ``line`` shows progress (``cli.bench.LiveLine``)."""
    from splitrt.rig.harness import Rig, RigConfig, three_tiers

    tiers = three_tiers(edge_cpus)
    rc = RigConfig(board=board, link="kernel", keep_workdir=keep_workdir, models=(cfg.model,), tiers=tiers)
    with Rig(rc, progress=line.say) as r:
        if keep_workdir:
            line.say(f"rig workdir: {r.workdir}")
        return rigbench.run_tiers(cfg, r, progress=line.say, live=line)


def cmd_rig_bench(args: argparse.Namespace) -> int:
    if args.tiers == 2:
        # the two-tier bench (`splitrt bench`) with these options; the hop 2 and edge options do not apply
        args.load, args.link, args.plot = "none", "auto", None
        args.strategies = ",".join(rigbench.DEFAULT_STRATEGIES)
        return int(args.two_tier(args))
    result = run(
        config_from(args),
        board=args.device,
        edge_cpus=args.edge_cpus,
        line=args.live_line(),
        keep_workdir=args.keep_workdir,
    )
    if args.json == "-":
        print(json.dumps(result, default=float))
    else:
        print(table_text(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=float))
            print(f"wrote {args.json}", file=sys.stderr)
    return 1 if result["failed"] else 0


def _ci(ci: list[float]) -> str:
    return "-" if not ci or math.isnan(ci[0]) else f"{ci[0]:.0f}-{ci[1]:.0f}"


def _plans(s: dict[str, Any]) -> str:
    return ", ".join(f"{p} x{n}" for p, n in sorted(s["plans"].items(), key=lambda kv: -kv[1])[:2])


def rows(result: dict[str, Any]) -> list[tuple[Any, ...]]:
    out = []
    for name in rigbench.TIER_STRATEGIES:
        s = result["strategies"].get(name)
        if s is None:
            continue
        r = s.get("adaptive_over_this", {})
        vs = f"{r['mean']['call']}/{r['energy']['call']}" if r else ""
        out.append(
            (
                name,
                s["tiers"],
                s["mean_ms"],
                _ci(s["mean_ci_ms"]),
                s["p95_ms"],
                s["energy_mj"],
                f"{s['completed']}/{s['failed']}",
                s["via_edge"],
                s["mismatched"],
                vs,
                _plans(s),
            )
        )
    return out


HEADERS = [
    "strategy",
    "tiers",
    "mean ms",
    "95% CI",
    "p95 ms",
    "energy mJ (est.)",
    "done/failed",
    "via edge",
    "wrong outputs",
    "adaptive vs: latency/energy",
    "plans",
]


def header(result: dict[str, Any]) -> str:
    h1, h2, cal, e = result["hop1"], result["hop2"], result["calibration"], result["energy"]
    la = result["load_average"]
    return (
        f"{result['model']} on emulated {result['board']} -> edge ({result['edge']['cpus']:g} CPU, whole model "
        f"{result['edge']['measured_ms']:.0f} ms) -> cloud (whole model {result['factors']['cloud_ms']:.0f} ms) | "
        f"objective {result['objective']} | {result['rate_hz']:g} req/s, {result['duration_s']:g} s per strategy\n"
        f"hop 1 {h1['trace']} x{h1['scale']:g} from {h1['offset_s']:g} s (median {h1['median_mbps']:.2f} Mbit/s, "
        f"window mean {h1['window_mean_mbps']:.2f}), rtt +{h1['rtt_ms']:g} ms | "
        f"hop 2 {h2['trace']} x{h2['scale']:g} from {h2['offset_s']:g} s (median {h2['median_mbps']:.2f}, "
        f"window mean {h2['window_mean_mbps']:.2f}), "
        f"rtt +{h2['rtt_ms']:g} ms\n"
        f"device: resnet50 {cal['measured_ms']:.0f} ms (target {cal['target_ms']:.0f} ms); this model "
        f"{result['factors']['device_ms']:.0f} ms | energy {e['source'].upper()} from {e['origin']} (idle "
        f"{e['idle_w']:g} W, active {e['active_w']:g} W, radio {e['radio_w']:g} W) | host load average "
        + "/".join(f"{x:.2f}" for x in la["start"])
        + " at start, "
        + "/".join(f"{x:.2f}" for x in la["end"])
        + " at end"
    )


def gains_text(result: dict[str, Any]) -> str:
    g = result["gains"]
    parts = []
    for key, label in (
        ("latency_vs_static_split", "latency vs the static split"),
        ("energy_vs_static_split", "energy vs the static split"),
        ("latency_vs_static_2tier", "latency vs best static 2-tier"),
        ("energy_vs_static_2tier", "energy vs best static 2-tier"),
        ("latency_vs_any_static", "latency vs best static (any)"),
        ("energy_vs_any_static", "energy vs best static (any)"),
    ):
        if key in g and g[key]["against"]:
            parts.append(f"{label} ({g[key]['against']}): {g[key]['pct']:+.1f}%")
    return "adaptive: " + "; ".join(parts) + " (positive: adaptive lower)" if parts else ""


def table_text(result: dict[str, Any]) -> str:
    return "\n".join([header(result), render(HEADERS, rows(result)), gains_text(result)]) + (
        f"\nhost load average now {'/'.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
