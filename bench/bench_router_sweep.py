"""Where adaptive beats the best whole-request router, simulated (``splitrt.rig.sim``; issue 34).

Per cell (model x board x trace window x bandwidth scale x device load x encode pricing) ``adaptive``,
``route`` and ``route-codec`` decide through the runtime's own policy and controller, and the ratio
adaptive / min(route, route-codec) of the mean latency is printed (< 1: adaptive is faster). The cells
where adaptive is >= 10 % faster get a row of their own: adaptive's main plan against the router's, each
plan's mean terms (device compute, encode + call, on the wire, cloud tail + decode) and bytes sent: why
the plan wins.

The table is the one the rig plans with (``rig.models.cost_table_for``): the shipped profile x the
board's speed, lossy codecs where the accuracy guard allows them (the guard cached by earlier rig runs,
``rig.models.guard_cache_dir``, the one measured at the most cuts; a model with none cached: the guard
off, every codec priced by its bytes, marked ``off``). Device load: ``none``, ``device-burst`` (other
work takes 1/2 of the CPU 20 s of every 60 s) and ``device-busy`` (3/4 all along), as the rig's
(``rig.stats.burst_intervals``). ``--encode``: the device's encode and call priced at the board's compute
factor (``board``, what ``splitrt sim`` does), or at ``N`` x the host profile's (``2``: what the rig's
CPU quota really charges a short encode, measured 1.7-2.5x at each rig start while compute is ~18x: a
quota lets a burst run at the host's speed).

    .venv/bin/python bench/bench_router_sweep.py [--models squeezenet,resnet50] [--boards rpi4]
        [--traces tuned] [--scales 0.5,1,2,5] [--loads none,device-burst,device-busy] [--window 60]
        [--encode board,2] [--jitter 0.1 --seed N] [--json FILE]

Default: every shipped profile's model x rpi4 x the 8 HSDPA traces x 4 scales x 3 loads x 2 pricings
(~2100 cells of 60 s) in about 25 minutes on a quiet 2-core host; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import run_commit

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.plan.constraints import Constraints
from splitrt.plan.controller import ControllerConfig, is_image_codec
from splitrt.plan.solver import parse_plan
from splitrt.profile import boards, cutfacts, profiler
from splitrt.rig import bench as rigbench
from splitrt.rig import models as rigmodels
from splitrt.rig import sim, tracespec
from splitrt.rig import stats as rigstats

ROUTERS = ("route", "route-codec")
#: The input of a profile that measured no image codec, sent at most at this ratio to fp32 (a 224 x 224 photo
#: as jpeg50: squeezenet's and resnet50's profiles measure 0.0119 on the zoo's photographs): what a router
#: sending the camera's JPEG sends. Without it (``--camera-jpeg 1``) such a router sends the input as
#: int8+zstd tensors (~0.2), and splits "beat" a router no one would deploy (densenet121's c2 up to 3x,
#: in 2026-12-06's sweep; with it, every cell of those 8 models ties at 1.000).
CAMERA_JPEG = 0.012
#: A win worth a row: adaptive's mean at least 10 % below the best router's.
WIN = 1.10


def cached_guard(model: str) -> tuple[Path, str]:
    """(profile, guard label): the shipped profile with the accuracy guard a rig run cached for it (the one
    measured at the most cuts), else the shipped profile itself (``off``: the guard is switched off)."""
    shipped = rigmodels.shipped_profile(model)
    if shipped is None:
        raise SystemExit(f"{model}: expected a shipped profile, found none")
    sha = profiler.load_profile(shipped).sha256
    found = sorted(rigmodels.guard_cache_dir().glob(f"{sha[:16]}-*.json"), key=lambda p: int(p.stem.split("x")[-1]))
    return (found[-1], f"{found[-1].stem.split('-')[-1]}") if found else (shipped, "off")


def plan_terms(table: Any, reqs: list[sim.SimRequest], plan: str) -> dict[str, Any]:
    """A plan's mean terms over the requests that ran it (ms; encode + call at the load the device read)
    and the bytes it sends."""
    mine = [r for r in reqs if r.plan == plan]
    cut, codec = parse_plan(plan, table.codecs[0])
    i = table.index(cut)
    out: dict[str, Any] = {"plan": plan, "share": len(mine) / max(1, len(reqs))}
    if not mine:
        return out
    out["mean_ms"] = statistics.fmean(r.latency_ms for r in mine)
    out["head_ms"] = statistics.fmean(r.head_ms for r in mine)
    out["wire_ms"] = statistics.fmean(r.send_ms for r in mine)
    if cut != "device":
        k = table.codec_index(codec)
        slowed = statistics.fmean(r.device_load for r in mine)
        out["encode_ms"] = (float(table.encode_ms[i, k]) + table.call_ms) * slowed
        out["tail_ms"] = float(table.tail_ms[i]) + float(table.decode_ms[i, k])
        out["bytes"] = int(table.sent_bytes[i, k])
    return out


def main_plan(reqs: list[sim.SimRequest]) -> str:
    counts: dict[str, int] = {}
    for r in reqs:
        counts[r.plan] = counts.get(r.plan, 0) + 1
    return max(counts, key=lambda k: counts[k])


def sweep_model(model: str, board: str, args: argparse.Namespace, say: Any) -> list[dict[str, Any]]:
    b = boards.load_board(board)
    path = rigmodels.model_path_for(model)
    mg = graph.load(path)
    prof, guard = cached_guard(model)
    traces = [t for item in args.traces.split(",") for t in rigbench.TRACE_SETS.get(item, (item,))]
    out = []
    for pricing in args.encode.split(","):
        factor = None if pricing == "board" else float(pricing)
        table = rigmodels.cost_table_for(
            prof, mg.sha256, b.cpu_speed_factor, codec_factor=factor, min_agreement=None if guard != "off" else 0.0
        )
        if not any(is_image_codec(k) for k in table.codecs):  # the router sends the camera's JPEG anyway
            table = table.with_ratio_cap("cloud", args.camera_jpeg)
        allowed = cutfacts.allowed_for(mg, table, Constraints())
        controller = ControllerConfig(codecs=None, cuts=allowed.cuts if allowed is not None else None)
        for trace in traces:
            full = tracespec.load_trace(trace)
            dur = min(args.window, full.duration_s - args.offset)
            window = full.window(args.offset, dur)
            rtt = tracespec.typical_rtt_ms(full)
            for scale in (float(x) for x in args.scales.split(",")):
                played = window.scaled(scale) if scale != 1 else window
                for load in args.loads.split(","):
                    cfg = sim.SimConfig(
                        rate_hz=args.rate,
                        duration_s=dur,
                        rtt_ms=rtt,
                        bursts=tuple(rigstats.burst_intervals(load, dur)),
                        burst_util=rigstats.burst_util(load),
                        controller=controller,
                        jitter=args.jitter,
                        seed=args.seed,
                    )
                    runs = sim.simulate_all(table, {n: n for n in ("adaptive", *ROUTERS)}, played, cfg)
                    means = {n: statistics.fmean(sim.latencies(rs)) for n, rs in runs.items()}
                    best = min(ROUTERS, key=lambda n: means[n])
                    a_plan, r_plan = main_plan(runs["adaptive"]), main_plan(runs[best])
                    cell = {
                        "model": model,
                        "board": board,
                        "guard": guard,
                        "encode": pricing,
                        "trace": trace,
                        "scale": scale,
                        "load": load,
                        "means_ms": means,
                        "best_router": best,
                        "ratio": means["adaptive"] / means[best],
                        "adaptive": plan_terms(table, runs["adaptive"], a_plan),
                        "router": plan_terms(table, runs[best], r_plan),
                    }
                    out.append(cell)
        say(f"{model} on {board}, encode {pricing}: {len(traces)} traces done")
    return out


def label(c: dict[str, Any]) -> str:
    return f"{c['model']} {c['board']} {c['trace']} x{c['scale']:g} {c['load']} enc {c['encode']}"


def terms(t: dict[str, Any]) -> str:
    keys = ("head_ms", "encode_ms", "wire_ms", "tail_ms")
    got = " + ".join(f"{t[k]:.0f}" for k in keys if k in t)
    return f"{t['plan']} {t['share']:.0%}: {got}" + (f" ({t['bytes'] / 1e3:.1f} kB)" if "bytes" in t else "")


def summary_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    """Per model, load and pricing: cells, geometric mean of adaptive / best router, worst, wins."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["board"], c["load"], c["encode"]), []).append(c["ratio"])
    return [
        [
            *k,
            str(len(rs)),
            f"{math.exp(statistics.fmean(math.log(r) for r in rs)):.3f}",
            f"{min(rs):.3f}",
            f"{max(rs):.3f}",
            str(sum(r <= 1 / WIN for r in rs)),
        ]
        for k, rs in groups.items()
    ]


SUMMARY_HEADER = ["model", "board", "load", "encode", "cells", "geo-mean", "best", "worst", "wins"]
CELL_HEADER = ["cell", "ratio", "adaptive ms", "router ms", "adaptive's plan: head + enc + wire + tail", "router's"]


def cell_row(c: dict[str, Any]) -> list[str]:
    return [
        label(c),
        f"{c['ratio']:.3f}",
        f"{c['means_ms']['adaptive']:.0f}",
        f"{c['best_router']} {c['means_ms'][c['best_router']]:.0f}",
        terms(c["adaptive"]),
        terms(c["router"]),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated (default: every shipped profile's model)")
    p.add_argument("--boards", default="rpi4")
    p.add_argument("--traces", default="tuned,heldout")
    p.add_argument("--scales", default="0.5,1,2,5")
    p.add_argument("--loads", default="none,device-burst,device-busy")
    p.add_argument("--window", type=float, default=60.0, help="seconds of each trace")
    p.add_argument("--offset", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--jitter", type=float, default=0.0, help="relative sd of compute per request (the rig's ~0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encode", default="board,2", help="encode pricing: board and/or N x the host's")
    p.add_argument(
        "--camera-jpeg",
        type=float,
        default=CAMERA_JPEG,
        help="a profile without image codecs: the input sent at most at this ratio to fp32 (the camera's JPEG)",
    )
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    models = (a.models or ",".join(sorted(f.stem.split("__")[1] for f in Path("profiles").glob("*__*.json")))).split(
        ","
    )
    t0 = time.monotonic()
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def say(msg: str) -> None:
        print(f"[sweep] {time.monotonic() - t0:5.0f} s {msg}", file=sys.stderr, flush=True)

    cells = [c for m in models for b in a.boards.split(",") for c in sweep_model(m, b, a, say)]
    load_end = os.getloadavg()
    wins = sorted((c for c in cells if c["ratio"] <= 1 / WIN), key=lambda c: c["ratio"])
    losses = sorted((c for c in cells if c["ratio"] >= WIN), key=lambda c: -c["ratio"])
    doc = {
        "settings": {
            k: getattr(a, k)
            for k in ("boards", "traces", "scales", "loads", "window", "rate", "encode", "jitter", "seed")
        }
        | {"camera_jpeg": a.camera_jpeg, "models": ",".join(models)},
        "summary": [dict(zip(SUMMARY_HEADER, r, strict=True)) for r in summary_rows(cells)],
        "wins": [dict(zip(CELL_HEADER, cell_row(c), strict=True)) for c in wins],
        "losses": [dict(zip(CELL_HEADER, cell_row(c), strict=True)) for c in losses],
        # every cell's ratio (the plans' terms only in wins and losses: a page, not megabytes)
        "cells": [{"cell": label(c), "ratio": round(c["ratio"], 4)} for c in cells],
        "load_average_start": load_start,
        "load_average_end": load_end,
        "started": started,
        "commit": run_commit(),
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    print(f"adaptive / min(route, route-codec), simulated ({a.window:g} s windows, {a.rate:g} req/s)")
    print(render(SUMMARY_HEADER, summary_rows(cells)))
    for title, rows in (("adaptive >= 10 % faster", wins), ("adaptive >= 10 % slower", losses)):
        print(f"\n{title}: {len(rows)} cells")
        print(render(CELL_HEADER, [cell_row(c) for c in rows[:40]]))
    print(
        f"\n{time.monotonic() - t0:.0f} s; load average at start "
        + "/".join(f"{x:.2f}" for x in load_start)
        + ", at end "
        + "/".join(f"{x:.2f}" for x in load_end)
        + " (a shared host: other work ran beside; the simulation's figures do not depend on it)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
