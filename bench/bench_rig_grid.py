"""The acceptance grid of the rig (issue 6): every strategy on each shipped HSDPA trace, for resnet50 and
inception_v1 on an emulated Raspberry Pi 4, at bandwidth scale 1 and 5, with load none and
device-burst. Prints one row per cell (and --json). One rig (calibrated once) serves every cell.

Targets per cell: adaptive mean <= 1.10 x oracle mean, adaptive p95 <= 1.15 x oracle p95, adaptive mean
<= 1.02 x the best of device-only, cloud-only, static and periodic, zero failed requests.

Default: 32 cells x 5 measured strategies x 12 s, in 1 s turns (+ ~35 s set-up per cell): about 50 minutes.
    .venv/bin/python bench/bench_rig_grid.py [--traces hsdpa/bus,hsdpa/car] [--models resnet50]
        [--scales 1,5] [--loads none,device-burst] [--duration 12] [--turn 1] [--rate 4] [--json grid.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from typing import Any

from splitrt import cmd_bench, rig, rigbench, traces
from splitrt.tables import render


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", default=",".join(n for n in traces.shipped() if n.startswith("hsdpa/")))
    p.add_argument("--models", default="resnet50,inception_v1")
    p.add_argument("--scales", default="1,5")
    p.add_argument("--loads", default="none,device-burst")
    p.add_argument("--board", default="rpi4")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of trace per strategy per cell")
    p.add_argument("--turn", type=float, default=1.0, help="strategies take turns on slices this long (s)")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--offset", type=float, default=0.0, help="start of the trace window (s)")
    p.add_argument("--link", default="auto", choices=["auto", "kernel", "userspace"])
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    models = a.models.split(",")
    cells = list(itertools.product(a.traces.split(","), models, [float(x) for x in a.scales.split(",")],
                                   a.loads.split(",")))
    line = cmd_bench.LiveLine()
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with rig.Rig(rig.RigConfig(board=a.board, link=a.link, models=tuple(models)), progress=line.say) as r:
        for k, (trace, model, scale, load) in enumerate(cells):
            line.say(f"cell {k + 1}/{len(cells)}: {trace} {model} x{scale:g} load {load} "
                     f"({(time.monotonic() - t_start) / 60:.1f} min so far)")
            cfg = rigbench.BenchConfig(model=model, trace=trace, bandwidth_scale=scale, load=load, rate_hz=a.rate,
                                  duration_s=a.duration, turn_s=a.turn,
                                       trace_offset_s=a.offset)
            try:
                result = rigbench.run_bench(cfg, r, progress=line.say, live=line)
            except Exception as exc:  # one broken cell must not lose the others
                line.say(f"cell failed: {exc}")
                rows.append({"trace": trace, "model": model, "scale": scale, "load": load, "error": str(exc)})
                continue
            v = cmd_bench.verdict(result)
            s = result["strategies"]
            rows.append({"trace": trace, "model": model, "scale": scale, "load": load, "link": result["link"],
                         "verdict": v, "strategies": {n: {key: s[n][key] for key in (
                             "mean_ms", "p50_ms", "p95_ms", "p99_ms", "completed", "failed", "switches",
                             "energy_mj", "plans")} for n in s},
                         "calibration": result["calibration"], "cloud_calibration": result["cloud_calibration"],
                         "policies": result["policies"], "measured_costs": result["measured_costs"]})
            print(table([rows[-1]]).splitlines()[-1], flush=True)
    print(table(rows))
    ok = [x for x in rows if x.get("verdict", {}).get("pass")]
    print(f"{len(ok)}/{len(rows)} cells meet every target; {(time.monotonic() - t_start) / 60:.1f} min")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cells": rows, "duration_s": a.duration, "rate_hz": a.rate, "board": a.board}, f, indent=1,
                      default=float)
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for x in rows:
        if "error" in x:
            out.append((x["trace"], x["model"], f"x{x['scale']:g}", x["load"], "", "ERROR", "", "", "", "", "", "",
                        "", x["error"][:40]))
            continue
        s, v = x["strategies"], x["verdict"]
        others = {n: s[n]["mean_ms"] for n in ("device-only", "cloud-only", "static", "periodic") if n in s}
        best = min(others, key=lambda n: others[n]) if others else "-"
        out.append((x["trace"], x["model"], f"x{x['scale']:g}", x["load"], twin_gap(s), s["adaptive"]["mean_ms"],
                    s["oracle"]["mean_ms"], s["adaptive"]["p95_ms"], s["oracle"]["p95_ms"],
                    f"{best} {others.get(best, math.nan):.0f}", f"{v['mean_vs_oracle']:.3f}",
                    f"{v['p95_vs_oracle']:.3f}", f"{v['mean_vs_best_other']:.3f}",
                    f"{v['failed']} {'PASS' if v['pass'] else 'miss'}"))
    return render(["trace", "model", "scale", "load", "twin gap", "adapt mean", "oracle mean", "adapt p95",
                   "oracle p95", "best other (mean)", "mean/orc", "p95/orc", "mean/best", "failed"], out)


def twin_gap(s: dict[str, Any]) -> str:
    """The measurement's resolution in this cell: when two fixed strategies ran the very same plan
    (static's pick is often device-only's or cloud-only's), how far apart their means came out."""
    plans = {n: s[n].get("plans", {}) for n in ("device-only", "cloud-only", "static") if n in s}
    for other in ("device-only", "cloud-only"):
        if other in plans and "static" in plans and plans[other].keys() == plans["static"].keys() \
                and len(plans[other]) == 1:
            a, b = s[other]["mean_ms"], s["static"]["mean_ms"]
            return f"{abs(a / b - 1) * 100:.1f}%"
    return "-"


if __name__ == "__main__":
    sys.exit(main())
