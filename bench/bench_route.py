"""Split vs whole-request routing, simulated (``splitrt.rig.sim``): what inner cuts buy over routing.

``route`` is the adaptive runtime restricted to the cuts ``device`` and ``cloud`` (everything else equal,
every codec), ``oracle-route`` the hindsight oracle over those two; ``adaptive`` and ``oracle`` may use
every cut. Per cell (model x held-out HSDPA trace window x bandwidth scale x load) the ratio route/split of
the mean latency (> 1: splitting is faster); per model and over the grid its geometric mean (95 %
bootstrap interval over cells) and its largest cell, for adaptive and for the oracle.

    .venv/bin/python bench/bench_route.py [--models a,b] [--traces heldout] [--scales 1,5]
        [--loads none,device-burst] [--window 120] [--windows 1] [--board rpi4] [--json FILE]

Default: 8 models x 4 held-out traces x 1 window of 120 s x 2 scales x 2 loads = 128 cells; about
2 minutes on a quiet 2-core host. ``--models squeezenet --traces hsdpa/ferry --window 30`` is a smoke run.

``--pays-sim --scales 1,5,20 --window 60``: only "when does splitting pay", route vs adaptive on the
``PAYS_CASES`` (model, board, a steady device load, a codec set) with the input priced three ways
(``INPUT_VARIANTS``); about 2 minutes. ``--rig-json A.json,B.json``: device-only / adaptive and route /
adaptive of `splitrt bench --json` runs with 95 % intervals over the turns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from splitrt.cli import sim as cmd_sim
from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench
from splitrt.rig import models as rigmodels
from splitrt.rig import regret, tracespec

MODELS = ("resnet50", "inception_v1", "squeezenet", "densenet121", "vgg19", "bvlc_alexnet", "vgg16", "mobilenetv2")
STRATEGIES = ("route", "adaptive")
#: The accuracy guard off: simulated latency of the zoo's random-weight models, whose answers say nothing of
#: a codec's harm (the rig and the demo measure the guard on photographs, rig.models.guarded_profile); every
#: codec here is priced by its bytes, as a guard that allowed it would.
GUARD_OFF = 0.0


def cells(args: argparse.Namespace) -> list[tuple[str, str, float, float, str]]:
    """(model, trace, window offset, scale, load) of every cell."""
    out = []
    for trace in [t for item in args.traces.split(",") for t in rigbench.TRACE_SETS.get(item, (item,))]:
        length = tracespec.load_trace(trace).duration_s
        offsets = [k * args.window for k in range(args.windows) if k * args.window + args.window <= length] or [0.0]
        for model in args.models.split(","):
            for off in offsets:
                for scale in (float(x) for x in args.scales.split(",")):
                    for load in args.loads.split(","):
                        out.append((model, trace, off, scale, load))
    return out


def label(c: dict[str, Any]) -> str:
    return f"{c['model']} {c['trace']}@{c['trace_offset_s']:g} x{c['bandwidth_scale']:g} {c['load']}"


def summary_rows(results: Sequence[dict[str, Any]], models: Sequence[str]) -> list[list[str]]:
    """Per model and over all: route/split geo-mean (CI) and largest cell, for adaptive and the oracle."""
    rows = []
    for m in [*models, "all"]:
        sel = [(label(c), c["strategies"]) for c in results if m in ("all", c["model"])]
        if not sel:
            continue
        a = regret.split_route(sel, "adaptive")
        o = regret.split_route(sel, "oracle")
        rows.append(
            [
                m,
                str(len(sel)),
                f"{a.geo:.3f} ({a.geo_ci[0]:.3f}-{a.geo_ci[1]:.3f})",
                f"{a.worst:.3f}",
                f"{a.worst_p95:.3f}",
                f"{o.geo:.3f} ({o.geo_ci[0]:.3f}-{o.geo_ci[1]:.3f})",
                f"{o.worst:.3f}",
                f"{o.worst_p95:.3f}",
                f"{a.gain_cells}/{o.gain_cells}",
            ]
        )
    return rows


def pays_rows(
    models: Sequence[str], board_names: Sequence[str], *, rtt_ms: float, constrained: Sequence[str] = ()
) -> list[list[str]]:
    """Where splitting beats routing by >= 10 % (``plan.explain``, every codec, 0.1-100 Mbit/s, device load
    1/2/4): per model, board and objective, the bands and the largest gain. ``constrained`` models also get a
    row under the privacy floor --no-raw-input, where routing cannot comply and the comparison is device-only."""
    from splitrt.graph import model as graph
    from splitrt.plan import explain
    from splitrt.plan.constraints import Constraints
    from splitrt.profile import boards, profiler
    from splitrt.profile.cutfacts import allowed_for

    rows = []
    for m in models:
        prof = profiler.load_profile(rigmodels.shipped_profile(m))  # type: ignore[arg-type]
        for bn in board_names:
            b = boards.load_board(bn)
            table = profiler.cost_table(prof, prof, device_speed_factor=b.cpu_speed_factor, min_agreement=0.0)
            variants: list[tuple[str, Any]] = [("-", None)]
            if m in constrained:
                allowed = allowed_for(graph.load(rigmodels.model_path_for(m)), table, Constraints(no_raw_input=True))
                variants.append(("no raw input (vs device-only)", allowed.cuts if allowed else None))
            for label_, cuts in variants:
                v = explain.explain(table, rtt_ms=rtt_ms, objectives=("latency", "energy"), power=b.power, cuts=cuts)
                for objective in ("latency", "energy"):
                    paying = [x for x in v.bands if x.objective == objective and x.max_gain >= 1.10]
                    if not paying:
                        rows.append([m, bn, objective, label_, "never >= 10 %", "-"])
                        continue
                    best = max(paying, key=lambda x: x.max_gain)
                    where = "; ".join(f"load {x.device_load:g}: {x.from_mbps:.3g}-{x.to_mbps:.3g}" for x in paying)
                    rows.append(
                        [
                            m,
                            bn,
                            objective,
                            label_,
                            where,
                            f"{(best.max_gain - 1) * 100:.0f} % ({best.best_plan}, load {best.device_load:g}, "
                            f"{best.at_mbps:.3g} Mbit/s)",
                        ]
                    )
    return rows


def privacy_rows(
    models: Sequence[str], traces: Sequence[str], scales: Sequence[float], window_s: float, board: str
) -> list[list[str]]:
    """Under the privacy floor --no-raw-input routing cannot comply; adaptive (allowed cuts only) against
    device-only, simulated per model over ``traces`` x ``scales`` (load none): device-only mean / adaptive
    mean, geometric mean and range over the cells."""
    import math
    import statistics

    from splitrt.graph import model as graph
    from splitrt.plan.constraints import Constraints
    from splitrt.plan.controller import ControllerConfig
    from splitrt.profile import boards
    from splitrt.profile.cutfacts import allowed_for
    from splitrt.rig import sim

    b = boards.load_board(board)
    rows = []
    for m in models:
        path = rigmodels.model_path_for(m)
        table = rigmodels.cost_table_for(
            rigmodels.shipped_profile(m),  # type: ignore[arg-type]
            graph.file_sha256(path),
            b.cpu_speed_factor,
            min_agreement=GUARD_OFF,
        )
        allowed = allowed_for(graph.load(path), table, Constraints(no_raw_input=True))
        assert allowed is not None
        ratios = []
        for trace in traces:
            full = tracespec.load_trace(trace)
            window = full.window(0.0, min(window_s, full.duration_s))
            rtt = tracespec.typical_rtt_ms(full)
            for scale in scales:
                played = window.scaled(scale) if scale != 1 else window
                cfg = sim.SimConfig(
                    duration_s=window.duration_s,
                    rtt_ms=rtt,
                    controller=ControllerConfig(codecs=None, cuts=allowed.cuts),
                )
                ad = statistics.fmean(sim.latencies(sim.simulate(table, "adaptive", played, cfg)))
                dev = statistics.fmean(
                    sim.latencies(sim.simulate(table, "fixed:device", played, cfg, with_cloud=False))
                )
                ratios.append(dev / ad)
        geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
        lo, hi = regret.geo_ci(ratios)
        rows.append([m, str(len(ratios)), f"{geo:.3f} ({lo:.3f}-{hi:.3f})", f"{min(ratios):.3f}-{max(ratios):.3f}"])
    return rows


#: Codec sets of the "when does splitting pay" simulation: lossless (fp32 and fp32+zstd: no output
#: changes), and the per-channel int8 family (per-tensor int8 is left out: on some cuts, e.g. densenet121's
#: c2, one outlier channel collapses the rest and the output changes: bench_codec.py).
CODEC_SETS = {
    "lossless": ("fp32", "fp32+zstd"),
    "int8c": ("fp32", "fp32+zstd", "fp16", "fp16+zstd", "int8c", "int8c+zstd"),
}
#: The cases simulated (model, board, device load, codec set), picked where ``plan --explain`` shows a gain.
PAYS_CASES = (
    ("squeezenet", "rpi4", 4.0, "int8c"),
    ("squeezenet", "rpi4", 4.0, "lossless"),
    ("squeezenet", "jetson-nano", 4.0, "int8c"),
    ("shufflenet", "jetson-nano", 4.0, "lossless"),
    ("inception_v1", "rpi4", 4.0, "lossless"),
    ("mobilenetv2", "rpi4", 4.0, "int8c"),
    ("bvlc_alexnet", "rpi4", 2.0, "lossless"),
    ("resnet50", "rpi4", 4.0, "lossless"),
)
#: What routing sends for the input, x fp32, measured on a real photo (matplotlib's grace_hopper.jpg at
#: 224 x 224, ImageNet-normalised): the profiles' random-normal input does not compress (fp32+zstd 0.93),
#: a real frame does (fp32+zstd 0.38, int8+zstd 0.22, PNG 0.133), and a router sends the camera's JPEG
#: (quality 90: 16 KB, 0.027; slightly lossy). ``tensor``: as the profile measured it.
INPUT_VARIANTS = {"tensor": None, "png": 0.133, "jpeg": 0.027}


def pays_sim(
    case: tuple[str, str, float, str], traces: Sequence[str], scales: Sequence[float], window_s: float
) -> dict[str, Any]:
    """One case over ``traces`` x ``scales``: route/adaptive mean latency per cell (> 1: splitting is faster),
    the input priced as measured and as a real frame's PNG and JPEG (``INPUT_VARIANTS``); geometric mean
    with a 95 % bootstrap interval over the cells."""
    import statistics

    from splitrt.graph import model as graph
    from splitrt.plan.controller import ControllerConfig
    from splitrt.profile import boards
    from splitrt.rig import sim

    model, board, device_load, codec_set = case
    b = boards.load_board(board)
    path = rigmodels.model_path_for(model)
    base = rigmodels.cost_table_for(
        rigmodels.shipped_profile(model),  # type: ignore[arg-type]
        graph.file_sha256(path),
        b.cpu_speed_factor,
        min_agreement=GUARD_OFF,
    )
    out: dict[str, Any] = {"model": model, "board": board, "device_load": device_load, "codecs": codec_set}
    for variant, floor in INPUT_VARIANTS.items():
        table = base if floor is None else base.with_ratio_cap("cloud", floor)
        ratios, plans = [], {}
        for trace in traces:
            full = tracespec.load_trace(trace)
            window = full.window(0.0, min(window_s, full.duration_s))
            rtt = tracespec.typical_rtt_ms(full)
            for scale in scales:
                played = window.scaled(scale) if scale != 1 else window
                # a steady device load: other processes hold 1 - 1/load of the CPU all along (the prober
                # reads it, as psutil does on a board)
                cfg = sim.SimConfig(
                    duration_s=window.duration_s,
                    rtt_ms=rtt,
                    bursts=((-60.0, window.duration_s + 60.0),) if device_load > 1 else (),
                    burst_util=1.0 - 1.0 / device_load,
                    controller=ControllerConfig(codecs=CODEC_SETS[codec_set]),
                )
                route = sim.simulate(table, "route", played, cfg)
                adaptive = sim.simulate(table, "adaptive", played, cfg)
                ratios.append(statistics.fmean(sim.latencies(route)) / statistics.fmean(sim.latencies(adaptive)))
                for r in adaptive:
                    plans[r.plan] = plans.get(r.plan, 0) + 1
        lo, hi = regret.geo_ci(ratios)
        top = max(plans, key=lambda k: plans[k])
        out[variant] = {
            "cells": len(ratios),
            "geo": math.exp(statistics.fmean(math.log(r) for r in ratios)),
            "ci": (lo, hi),
            "min": min(ratios),
            "max": max(ratios),
            "pays_cells": sum(r >= 1.10 for r in ratios),
            "top_plan": f"{top} ({plans[top] / sum(plans.values()):.0%})",
        }
    return out


def pays_sim_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        row = [r["model"], r["board"], f"x{r['device_load']:g}", r["codecs"]]
        for v in INPUT_VARIANTS:
            x = r[v]
            row.append(f"{x['geo']:.3f} ({x['ci'][0]:.3f}-{x['ci'][1]:.3f}) {x['pays_cells']}/{x['cells']}")
        row.append(r["tensor"]["top_plan"])
        rows.append(row)
    return rows


PAYS_SIM_HEADER = [
    "model",
    "board",
    "device load",
    "codecs",
    "route/split geo (95 % CI) cells >= 1.10",
    "same, route sends a PNG frame",
    "same, route sends a JPEG frame",
    "adaptive's main plan",
]
PRIVACY_HEADER = ["model (--no-raw-input)", "cells", "device-only / adaptive, geo-mean (95 % CI)", "range"]
PAYS_HEADER = ["model", "board", "objective", "constraint", "Mbit/s where split beats route by >= 10 %", "largest gain"]
HEADER = [
    "model",
    "cells",
    "adaptive route/split geo (95 % CI)",
    "worst mean",
    "worst p95",
    "oracle route/split geo (95 % CI)",
    "worst mean",
    "worst p95",
    ">= 1.10 (a/o)",
]


def pays_main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    traces = [t for item in args.traces.split(",") for t in rigbench.TRACE_SETS.get(item, (item,))]
    scales = [float(x) for x in args.scales.split(",")]
    results = []
    for text in args.pays_cases.split(","):
        m, board, dl, cs = text.split(":")
        if cs not in CODEC_SETS:
            raise SystemExit(f"--pays-cases: codecs {cs!r}: expected one of {', '.join(CODEC_SETS)}")
        print(f"pays: {text}", file=sys.stderr, flush=True)
        results.append(pays_sim((m, board, float(dl), cs), traces, scales, args.window))
    load = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pays_sim": results, "load_average": load}, f, indent=1, default=float)
    print(
        f"when does splitting pay, simulated: route vs adaptive (latency), traces {args.traces} ({args.window:g} s), "
        f"scales {args.scales}, a steady device load; > 1: splitting is faster"
    )
    print(render(PAYS_SIM_HEADER, pays_sim_rows(results)))
    print(f"{time.monotonic() - t0:.0f} s; host load average " + "/".join(f"{x:.2f}" for x in load))
    return 0


RIG_HEADER = ["run", "requests", "device-only / adaptive (95 % CI)", "route / adaptive (95 % CI)", "adaptive plans"]


def _turns(reqs: dict[str, Any], name: str, turn_s: float) -> list[list[float]]:
    """A strategy's request latencies grouped by the turn they ran in."""
    groups: dict[int, list[float]] = {}
    for t_s, ms, _plan in reqs.get(name, []):
        groups.setdefault(int(t_s // turn_s), []).append(float(ms))
    return list(groups.values())


def rig_rows(paths: Sequence[str]) -> list[list[str]]:
    """Per ``splitrt bench --json`` run: ratios of mean latency to adaptive's, 95 % intervals over turns."""
    rows = []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        reqs = d["timeline"]["requests"]
        turn_s = float(d["turns"]["turn_s"])
        s = d["strategies"]
        cols = []
        for other in ("device-only", "route"):
            if other in s and "adaptive" in s:
                lo, hi = regret.bootstrap_ratio(_turns(reqs, other, turn_s), _turns(reqs, "adaptive", turn_s))
                r = s[other]["mean_ms"] / s["adaptive"]["mean_ms"]
                verdict = {"worse": "adaptive faster", "better": "adaptive slower"}.get(regret.call((lo, hi)), "same")
                cols.append(f"{r:.3f} ({lo:.3f}-{hi:.3f}) {verdict}")
            else:
                cols.append("-")
        plans: dict[str, int] = {}
        for _t, _ms, plan in reqs.get("adaptive", []):
            plans[plan] = plans.get(plan, 0) + 1
        label_ = f"{d['model']} {d['trace']} x{d['bandwidth_scale']:g} {d['load']}"
        n = sum(len(v) for v in reqs.values())
        rows.append(
            [label_, str(n), *cols, ", ".join(f"{k} x{v}" for k, v in sorted(plans.items(), key=lambda kv: -kv[1]))]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--traces", default="heldout", help="comma-separated traces or 'tuned'/'heldout'")
    p.add_argument("--scales", default="1,5")
    p.add_argument("--loads", default="none,device-burst")
    p.add_argument("--window", type=float, default=120.0, help="seconds of trace per cell")
    p.add_argument("--windows", type=int, default=1, help="consecutive windows per trace")
    p.add_argument("--board", default="rpi4")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--json", default=None, metavar="FILE", help="write every cell as JSON ('-': stdout)")
    p.add_argument(
        "--pays-boards",
        default="rpi4,rpi5,jetson-nano",
        help="boards for the 'when does splitting pay' table ('' to skip it)",
    )
    p.add_argument(
        "--constrained",
        default="resnet50,squeezenet,mobilenetv2",
        help="models that also get a --no-raw-input row in that table, and the privacy table",
    )
    p.add_argument(
        "--pays-sim",
        action="store_true",
        help="only the 'when does splitting pay' simulation: route vs adaptive on --pays-cases over the "
        "held-out traces x --scales (try --scales 1,5,20 --window 60), the input priced three ways",
    )
    p.add_argument(
        "--pays-cases",
        default=",".join(":".join(str(x) for x in c) for c in PAYS_CASES),
        help="MODEL:BOARD:DEVICE_LOAD:CODECS,... (CODECS: " + ", ".join(CODEC_SETS) + ")",
    )
    p.add_argument(
        "--rig-json",
        default=None,
        metavar="FILES",
        help="only summarise `splitrt bench --json` runs (comma-separated): device-only / adaptive and "
        "route / adaptive, 95 %% intervals over the turns",
    )
    args = p.parse_args(argv)
    if args.rig_json:
        print(render(RIG_HEADER, rig_rows(args.rig_json.split(","))))
        return 0
    if args.pays_sim:
        return pays_main(args)
    t0 = time.monotonic()
    grid = cells(args)
    results = []
    for n, (model, trace, off, scale, load) in enumerate(grid, 1):
        print(f"cell {n}/{len(grid)}: {model} {trace}@{off:g} x{scale:g} {load}", file=sys.stderr, flush=True)
        results.append(
            cmd_sim.sim_cell(
                model,
                trace,
                board=args.board,
                scale=scale,
                load=load,
                rate_hz=args.rate,
                duration_s=args.window,
                offset_s=off,
                strategies=STRATEGIES,
            )
        )
    models = args.models.split(",")
    constrained = [m for m in args.constrained.split(",") if m in models]
    pays = (
        pays_rows(models, [b for b in args.pays_boards.split(",") if b], rtt_ms=80.0, constrained=constrained)
        if args.pays_boards
        else []
    )
    traces = [t for item in args.traces.split(",") for t in rigbench.TRACE_SETS.get(item, (item,))]
    privacy = (
        privacy_rows(constrained, traces, [float(x) for x in args.scales.split(",")], args.window, args.board)
        if constrained
        else []
    )
    doc = {
        "cells": results,
        "privacy": [dict(zip(PRIVACY_HEADER, r, strict=True)) for r in privacy],
        "board": args.board,
        "window_s": args.window,
        "load_average": os.getloadavg(),
        "pays": [dict(zip(PAYS_HEADER, r, strict=True)) for r in pays],
        "summary": {
            m: {
                k: regret.split_route(
                    [(label(c), c["strategies"]) for c in results if m in ("all", c["model"])], k
                ).__dict__
                for k in ("adaptive", "oracle")
            }
            for m in [*models, "all"]
        },
    }
    if args.json == "-":
        json.dump(doc, sys.stdout, default=float)
        return 0
    print(
        f"split vs route, simulated: {args.board}, shipped profiles, traces {args.traces} ({args.window:g} s "
        f"windows x{args.windows}), scales {args.scales}, loads {args.loads}, every codec; route/split > 1: "
        f"splitting is faster"
    )
    print(render(HEADER, summary_rows(results, models)))
    top = sorted(results, key=lambda c: -c["route_over_oracle"])[:5]
    print(
        "largest oracle gains: "
        + "; ".join(f"{label(c)} {c['route_over_oracle']:.3f} (adaptive {c['route_over_adaptive']:.3f})" for c in top)
    )
    if privacy:
        print("\nprivacy floor --no-raw-input (routing cannot comply), simulated, load none: adaptive vs device-only")
        print(render(PRIVACY_HEADER, privacy))
    if pays:
        print("\nwhen does splitting pay (plan --explain, every codec, rtt 80 ms, 0.1-100 Mbit/s, device load 1/2/4):")
        print(render(PAYS_HEADER, pays))
    print(f"{time.monotonic() - t0:.0f} s; host load average " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
