"""The three-tier acceptance table (issue 16): device -> edge -> cloud in the rig (root), 2 models x 2 trace
pairs, 3-tier adaptive against every static alternative (device-only, cloud-only, edge-only, the best
static 2-tier split, the best static 3-tier cut pair), mean/p95 latency with bootstrap intervals over
turns, device energy per inference (ESTIMATED from the board file's power figures: this host has no
power reader for the emulated board), failed requests, and the host's load average. One rig (the
device calibrated once) serves every cell. Prints the table (and --json).

Hop 1 (device -> edge, the access link) plays an HSDPA trace, hop 2 (edge -> cloud, the backhaul) an
FCC one, each scaled (--scale1/--scale2) and from --offset s into the trace.

Default: 4 cells x 6 strategies x 20 s in 2 s turns (+ ~40 s set-up per cell): about 13 minutes.
    .venv/bin/python bench/bench_tiers.py [--models resnet50,inception_v1] [--board rpi4]
        [--pairs hsdpa/bus:fcc/amazon-214390,hsdpa/car:fcc/amazon-799296] [--scale1 10] [--scale2 5]
        [--objective latency|energy] [--duration 20] [--turn 2] [--json tiers.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

from splitrt.cli import tiers as tierscli
from splitrt.cli.bench import LiveLine
from splitrt.cli.tables import render
from splitrt.rig.bench import TIER_STRATEGIES, TierBenchConfig, run_tiers
from splitrt.rig.harness import Rig, RigConfig, three_tiers


def _la() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def cell_rows(label: str, result: dict[str, Any]) -> list[tuple[Any, ...]]:
    out = []
    for name in TIER_STRATEGIES:
        s = result["strategies"].get(name)
        if s is None:
            continue
        lo, hi = s["mean_ci_ms"]
        ci = "-" if math.isnan(lo) else f"{lo:.0f}-{hi:.0f}"
        r = s.get("adaptive_over_this")
        vs = f"{r['mean']['call']}/{r['energy']['call']}" if r else ""
        inc = s.get("energy_increment_mj", math.nan)
        out.append(
            (
                label,
                name,
                tierscli._plans(s),
                round(s["mean_ms"]),
                ci,
                round(s["p95_ms"]),
                round(s["energy_mj"]),
                "-" if math.isnan(inc) else round(inc),
                f"{s['completed']}/{s['failed']}",
                s["via_edge"],
                vs,
            )
        )
    return out


def gains_row(label: str, result: dict[str, Any]) -> tuple[Any, ...]:
    g = result["gains"]

    def fmt(key: str) -> str:
        x = g.get(key, {})
        return f"{x['pct']:+.1f}% ({x['against']})" if x.get("against") else "-"

    la = result["load_average"]
    return (
        label,
        fmt("latency_vs_static_split"),
        fmt("energy_vs_static_split"),
        fmt("latency_vs_static_2tier"),
        fmt("energy_vs_static_2tier"),
        fmt("latency_vs_any_static"),
        fmt("energy_vs_any_static"),
        result["failed"],
        f"{la['start'][0]:.1f} -> {la['end'][0]:.1f}",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,inception_v1")
    p.add_argument("--board", default="rpi4")
    p.add_argument(
        "--pairs",
        default="hsdpa/bus:fcc/amazon-214390,hsdpa/car:fcc/amazon-799296",
        help="comma-separated HOP1:HOP2 trace pairs",
    )
    p.add_argument("--scale1", type=float, default=10.0, help="hop 1 bandwidth scale (x10: Wi-Fi/LTE class)")
    p.add_argument("--scale2", type=float, default=5.0, help="hop 2 bandwidth scale")
    p.add_argument("--offset", type=float, default=60.0, help="start of both windows in their traces (s)")
    p.add_argument("--edge-cpus", type=float, default=1.0, help="the edge server's CPU quota (CPUs)")
    p.add_argument("--objective", choices=["latency", "energy"], default="latency")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--turn", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    models = a.models.split(",")
    pairs = [tuple(x.split(":", 1)) for x in a.pairs.split(",")]
    line = LiveLine()
    t0 = time.monotonic()
    cells: list[dict[str, Any]] = []
    rc = RigConfig(board=a.board, link="kernel", models=tuple(models), tiers=three_tiers(a.edge_cpus))
    rig = Rig(rc, progress=line.say)
    with rig:
        for k, ((t1, t2), model) in enumerate((pr, m) for pr in pairs for m in models):
            line.say(
                f"cell {k + 1}/{len(pairs) * len(models)}: {model}, {t1} x{a.scale1:g} -> {t2} x{a.scale2:g} "
                f"({(time.monotonic() - t0) / 60:.1f} min so far, load average {_la()})"
            )
            cfg = TierBenchConfig(
                model=model,
                trace=t1,
                trace2=t2,
                bandwidth_scale=a.scale1,
                bandwidth_scale2=a.scale2,
                trace_offset_s=a.offset,
                trace2_offset_s=a.offset,
                objective=a.objective,
                duration_s=a.duration,
                turn_s=a.turn,
                rate_hz=a.rate,
            )
            try:
                result = run_tiers(cfg, rig, progress=line.say, live=line)
            except Exception as exc:  # one broken cell must not lose the others
                line.say(f"cell failed: {exc}")
                cells.append({"model": model, "pair": [t1, t2], "error": str(exc)})
                continue
            result["pair"] = [t1, t2]
            cells.append(result)
            line.say(tierscli.table_text(result))
    ok = [c for c in cells if "error" not in c]
    rows = [r for c in ok for r in cell_rows(f"{c['model']} {c['pair'][0]}>{c['pair'][1]}", c)]
    print(
        f"three tiers: {a.board} device -> edge ({a.edge_cpus:g} CPU) -> cloud | objective {a.objective} | "
        f"hop 1 x{a.scale1:g}, hop 2 x{a.scale2:g}, from {a.offset:g} s | {a.duration:g} s per strategy, "
        f"{a.turn:g} s turns, {a.rate:g} req/s | energy ESTIMATED (devices/{a.board}.toml power figures)"
    )
    print(
        render(
            [
                "cell",
                "strategy",
                "plans",
                "mean ms",
                "95% CI",
                "p95 ms",
                "energy mJ (est.)",
                "(idle+radio upload)",
                "done/failed",
                "via edge",
                "adaptive vs: lat/energy",
            ],
            rows,
        )
    )
    print()
    print(
        "adaptive's gain, % lower (negative: higher): vs the static split (static-2tier, same objective), vs the "
        "best static 2-tier strategy and vs the best static strategy of any kind, per figure"
    )
    print(
        render(
            [
                "cell",
                "lat vs split",
                "energy vs split",
                "lat vs best 2-tier",
                "energy vs best 2-tier",
                "lat vs any static",
                "energy vs any static",
                "failed",
                "load avg (1 min)",
            ],
            [gains_row(f"{c['model']} {c['pair'][0]}>{c['pair'][1]}", c) for c in ok],
        )
    )
    for key in (
        "latency_vs_static_split",
        "energy_vs_static_split",
        "latency_vs_static_2tier",
        "energy_vs_static_2tier",
        "latency_vs_any_static",
        "energy_vs_any_static",
    ):
        vals = [c["gains"][key]["pct"] for c in ok if key in c["gains"] and not math.isnan(c["gains"][key]["pct"])]
        if vals:
            print(f"{key}: {min(vals):+.1f}% .. {max(vals):+.1f}% (mean {statistics.fmean(vals):+.1f}%)")
    failed = sum(int(c.get("failed", 1)) for c in cells)
    print(
        f"failed requests: {failed} | cells {len(ok)}/{len(cells)} | wall {(time.monotonic() - t0) / 60:.1f} min | "
        f"host load average now {_la()}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cells": cells, "args": vars(a)}, f, indent=1, default=float)
        print(f"wrote {a.json}", file=sys.stderr)
    return 1 if failed or len(ok) < len(cells) else 0


if __name__ == "__main__":
    sys.exit(main())
