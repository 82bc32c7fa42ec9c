"""The acceptance grid of the rig (issues 6, 34): every strategy asked for on each shipped HSDPA trace, on
an emulated Raspberry Pi 4, over the parts of ``GRID``: resnet50 and inception_v1 at bandwidth scale 1
with load none and device-burst; squeezenet at scale 1 and 5 on a busy board (device-busy). Prints one
row per cell (and --json), adaptive against the best router (route, route-codec) per cell with a 95 %
bootstrap over turns, and the ablations among the strategies beside it (``ABLATIONS``: adaptive-hold, the
controller before held gains added up; adaptive-keep, the link estimate before a lone slow sample was
dropped). One rig (calibrated once) serves every cell. Why these cells and no others (no cell where a
split or a per-condition codec realistically beats the routers by >= 10 %: bench/bench_router_sweep.py):
``GRID``'s comment.

Targets per cell: adaptive mean <= 1.10 x oracle mean, adaptive p95 <= 1.15 x oracle p95, adaptive mean
<= 1.02 x the best of device-only, cloud-only, static and periodic, zero failed requests.

Default: 24 cells x the strategies x 12 s, in 1 s turns (+ ~35 s set-up per cell): with adaptive,
adaptive-hold, route, route-codec and oracle about 40 minutes. --models, --scales, --loads pick cells of
the grid (e.g. --models squeezenet); --product makes the plain product of them instead.
    .venv/bin/python bench/bench_rig_grid.py [--traces hsdpa/bus,hsdpa/car] [--models resnet50]
        [--scales 1,5] [--loads none,device-burst] [--duration 12] [--turn 1] [--rate 4] [--json grid.json]
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

import numpy as np
from _common import Groups, add_grid_arguments, grid_cells, prediction_figures, run_commit

from splitrt.cli import bench as cmd_bench
from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench
from splitrt.rig import harness as rig
from splitrt.rig import regret


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(p)
    # the grid's parts (GRID); --models, --scales, --loads pick cells of it
    p.set_defaults(models=None, scales=None, loads=None)
    p.add_argument("--product", action="store_true", help="the product of --models, --scales, --loads, not GRID")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of trace per strategy per cell")
    p.add_argument("--turn", type=float, default=1.0, help="strategies take turns on slices this long (s)")
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--offset", type=float, default=0.0, help="start of the trace window (s)")
    p.add_argument("--link", default="auto", choices=["auto", "kernel", "userspace"])
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument(
        "--cloud-weight", type=int, default=8, help="the cloud's CPU weight (x default; 1: as before the one rig)"
    )
    p.add_argument(
        "--strategies",
        default=",".join(rigbench.STRATEGIES),
        help="strategies per cell (default: all, with static-fixed for the regret table)",
    )
    a = p.parse_args(argv)
    if a.product:
        a.models, a.scales, a.loads = a.models or "resnet50", a.scales or "1", a.loads or "none"
    cells = grid_cells(a, () if a.product else GRID)
    line = cmd_bench.LiveLine()
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    run: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": run_commit(),
        "load_average_start": list(os.getloadavg()),
    }
    tiers = (rig.Tier(name="device"), rig.Tier(name="cloud", weight=a.cloud_weight))
    with rig.Rig(
        rig.RigConfig(board=a.board, link=a.link, models=tuple(dict.fromkeys(c[1] for c in cells)), tiers=tiers),
        progress=line.say,
    ) as r:
        for k, (trace, model, scale, load) in enumerate(cells):
            line.say(
                f"cell {k + 1}/{len(cells)}: {trace} {model} x{scale:g} load {load} "
                f"({(time.monotonic() - t_start) / 60:.1f} min so far)"
            )
            cfg = rigbench.BenchConfig(
                model=model,
                trace=trace,
                bandwidth_scale=scale,
                load=load,
                rate_hz=a.rate,
                duration_s=a.duration,
                turn_s=a.turn,
                trace_offset_s=a.offset,
                strategies=tuple(a.strategies.split(",")),
                guard_every_cut=model in GUARD_EVERY_CUT,
            )
            try:
                result = rigbench.run_bench(cfg, r, progress=line.say, live=line)
            except Exception as exc:  # one broken cell must not lose the others
                line.say(f"cell failed: {exc}")
                rows.append({"trace": trace, "model": model, "scale": scale, "load": load, "error": str(exc)})
                continue
            v = cmd_bench.verdict(result)
            s = result["strategies"]
            rows.append(
                {
                    "trace": trace,
                    "model": model,
                    "scale": scale,
                    "load": load,
                    "link": result["link"],
                    "verdict": v,
                    "strategies": {
                        n: {
                            key: s[n][key]
                            for key in (
                                "mean_ms",
                                "p50_ms",
                                "p95_ms",
                                "p99_ms",
                                "completed",
                                "failed",
                                "switches",
                                "energy_mj",
                                "plans",
                            )
                        }
                        for n in s
                    },
                    "calibration": result["calibration"],
                    "cloud_calibration": result["cloud_calibration"],
                    "policies": result["policies"],
                    "measured_costs": result["measured_costs"],
                    "latencies_ms": {n: [q[1] for q in reqs] for n, reqs in result["timeline"]["requests"].items()},
                    "turn_s": a.turn,
                    "requests": {n: [[q[0], q[1]] for q in reqs] for n, reqs in result["timeline"]["requests"].items()},
                    "load_average": list(os.getloadavg()),
                    "prediction": prediction(result["timeline"].get("predicted", {}).get("adaptive", [])),
                }
            )
            if a.json:  # after every cell: a run cut short keeps what it measured
                save(a, rows, run)
            print(table([rows[-1]]).splitlines()[-1], flush=True)
    run["load_average_end"] = list(os.getloadavg())
    if a.json:
        save(a, rows, run)
    print(table(rows))
    print(summary(rows))
    print(regret_text(rows))
    print(router_text(rows))
    print(prediction_text(rows))
    print(
        f"{(time.monotonic() - t_start) / 60:.1f} min; host load average (1/5/15 min) "
        + "/".join(f"{x:.2f}" for x in os.getloadavg())
    )
    return 0


def prediction(reqs: list[list[Any]]) -> dict[str, dict[str, float]]:
    """Per plan of adaptive's: requests, median |measured - predicted| / measured, its noise floor, the bias
    median(measured) / median(predicted) and the median figures (``_common.prediction_figures``)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for plan, ms, predicted in reqs:
        if ms > 0:
            by.setdefault(plan, []).append((ms, predicted))
    return {plan: prediction_figures([m for m, _ in xs], [p for _, p in xs]) for plan, xs in by.items()}


def prediction_text(rows: list[dict[str, Any]]) -> str:
    """Adaptive's prediction per cell and plan: the error beside its noise floor and bias; then per plan
    over the grid's cells (the median of the cells' medians)."""
    per: dict[str, list[tuple[int, float]]] = {}
    cells = []
    for x in rows:
        for plan, f in x.get("prediction", {}).items():
            per.setdefault(plan, []).append((f["n"], f["median_err"]))
            cells.append(
                [f"{x['trace']} {x['model']} x{x['scale']:g} {x['load']}", plan, str(f["n"])]
                + [f"{100 * f[k]:.1f} %" if k in f else "" for k in ("median_err", "floor")]
                + [f"{f['ratio']:.2f}" if "ratio" in f else ""]
            )
    if not per:
        return ""
    by_cell = render(["cell", "adaptive's plan", "n", "median |m-p|/m", "floor", "measured / predicted"], cells)
    return (
        by_cell
        + "\n"
        + render(
            ["adaptive's plan", "cells", "requests", "median over cells of median |m-p|/m", "worst cell"],
            [
                [
                    plan,
                    str(len(v)),
                    str(sum(n for n, _ in v)),
                    f"{100 * statistics.median(e for _, e in v):.1f} %",
                    f"{100 * max(e for _, e in v):.1f} %",
                ]
                for plan, v in sorted(per.items(), key=lambda kv: -sum(n for n, _ in kv[1]))
            ],
        )
    )


def save(a: argparse.Namespace, rows: list[dict[str, Any]], run: dict[str, Any]) -> None:
    """The grid's JSON: the settings, when and on what code, the load average, the cells, the routers."""
    doc = {
        **run,
        "duration_s": a.duration,
        "turn_s": a.turn,
        "rate_hz": a.rate,
        "board": a.board,
        "routers": router_summary(rows),
        "cells": rows,
    }
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1, default=float)


def ratio_ci(a: list[float], b: list[float], *, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of mean(a) / mean(b), each resampled on its own."""
    if not a or not b:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    ra = xa[rng.integers(0, len(xa), (n, len(xa)))].mean(axis=1)
    rb = xb[rng.integers(0, len(xb), (n, len(xb)))].mean(axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return float(lo), float(hi)


def by_turn(x: dict[str, Any], name: str) -> list[list[float]]:
    """A strategy's latencies grouped by the turn they ran in (the bootstrap's unit)."""
    turns: dict[int, list[float]] = {}
    for t, ms in x.get("requests", {}).get(name, []):
        turns.setdefault(int(t // x.get("turn_s", 1.0)), []).append(ms)
    return [turns[k] for k in sorted(turns)]


def regret_text(rows: list[dict[str, Any]]) -> str:
    """Regret over the grid, and per cell adaptive against the best other with a bootstrap over turns:
    'better'/'worse' only when the 95 % interval excludes 1."""
    done = [x for x in rows if "verdict" in x]
    if not done:
        return ""
    labelled = [(f"{x['trace']} {x['model']} x{x['scale']:g} {x['load']}", x["strategies"]) for x in done]
    table_ = regret.regret(labelled)
    by = {r.strategy: r for r in table_}
    a = by.get("adaptive")
    fixed = [by[n] for n in regret.FIXED if n in by]
    calls = []
    for x in done:
        s = x["strategies"]
        others = [n for n in s if n not in ("adaptive", *ABLATIONS, "oracle", "oracle-route", "route", "route-codec")]
        if not others:  # a grid of the routers only: the router table says it
            continue
        best = min(others, key=lambda n: s[n]["mean_ms"])
        ci = regret.bootstrap_ratio(by_turn(x, "adaptive"), by_turn(x, best))
        calls.append(regret.call(ci))
    ok = a is not None and a.worst_mean <= 1.05 and a.worst_p95 <= 1.10 and all(f.worst_mean >= 1.25 for f in fixed)
    lines = [render(regret.HEADER, regret.rows(table_))]
    if a is not None:
        lines.append(
            f"adaptive worst cell: mean {a.worst_mean:.3f}, p95 {a.worst_p95:.3f} x the per-cell best "
            f"(targets 1.05, 1.10); fixed strategies' worst cells: "
            + ", ".join(f"{f.strategy} {f.worst_mean:.2f}" for f in fixed)
            + f" (target >= 1.25): "
            f"{'PASS' if ok else 'miss'}"
        )
    lines.append(
        f"adaptive vs the best other, per cell (95 % bootstrap over turns): better {calls.count('better')}, "
        f"same {calls.count('same')}, worse {calls.count('worse')} of {len(calls)}"
    )
    pairs = [regret.split_route(labelled, n) for n in ("adaptive", "oracle")]
    if any(p.cells for p in pairs):
        lines.append(render(regret.SPLIT_ROUTE_HEADER, regret.split_route_rows(pairs)))
        route_calls = [
            regret.call(regret.bootstrap_ratio(by_turn(x, "adaptive"), by_turn(x, "route")))
            for x in done
            if "route" in x["strategies"]
        ]
        lines.append(
            f"adaptive vs route, per cell (95 % bootstrap over turns): better {route_calls.count('better')}, "
            f"same {route_calls.count('same')}, worse {route_calls.count('worse')} of {len(route_calls)}"
        )
    return "\n".join(lines)


def _top(plans: dict[str, int], k: int = 3) -> str:
    """A strategy's most used plans with their request counts."""
    return ", ".join(f"{p} x{n}" for p, n in sorted(plans.items(), key=lambda kv: -kv[1])[:k])


def _why(adaptive: dict[str, int], router: dict[str, int], name: str) -> str:
    """Why adaptive's plans could beat the router's, from the plans alone."""
    a = max(adaptive, key=lambda p: adaptive[p]) if adaptive else "-"
    r = max(router, key=lambda p: router[p]) if router else "-"
    if a == r:
        return f"the same main plan ({a}) as {name}: the gap is the link and the host, not the plan"
    if a.split("@")[0] not in ("device", "cloud"):
        return f"a split ({a}) sends less or computes less than {name}'s {r}"
    return f"{a} where {name} chose {r}"


def split_half(x: dict[str, Any], routers: list[str]) -> float:
    """adaptive's mean over the best router's, the router chosen on the other half of the turns (even
    turns choose for the odd ones and back). The lower of two noisy means of one plan (route and
    route-codec often run the same) is biased low: choosing on the turns measured favours the router."""
    turns = {n: by_turn(x, n) for n in ("adaptive", *routers)}

    def half(n: str, h: int) -> list[float]:
        return [ms for k, t in enumerate(turns[n]) if k % 2 == h for ms in t]

    chosen: list[float] = []
    for h in (0, 1):
        pick = min(routers, key=lambda n: statistics.fmean(half(n, 1 - h) or [math.inf]))
        chosen += half(pick, h)
    mine = [ms for t in turns["adaptive"] for ms in t]
    return statistics.fmean(mine) / statistics.fmean(chosen) if mine and chosen else math.nan


#: Relabelings per cell for ``null_ratio`` (its 2 % spread over seeds: a few thousandths in the geomean).
NULL_DRAWS = 1000


def null_ratio(x: dict[str, Any], routers: list[str], draws: int = NULL_DRAWS) -> float:
    """adaptive / min(routers) expected if the strategies did not differ: the geometric mean over ``draws``
    relabelings of the requests, shuffled among adaptive and the routers within each turn (each keeps its
    count there). Not 1: the lower of two noisy means is biased low (on the 13:30 grid, 1.024 against
    the observed 1.025), so a target of 1.00 on the raw ratio asks adaptive to be that much better."""
    names = ["adaptive", *routers]
    turns = {n: by_turn(x, n) for n in names}
    rng = np.random.default_rng(0)
    logs = []
    for _ in range(draws):
        sums = dict.fromkeys(names, 0.0)
        counts = dict.fromkeys(names, 0)
        for k in range(min(len(t) for t in turns.values())):
            pooled = np.array([ms for n in names for ms in turns[n][k]])
            labels = np.array([n for n in names for _ in turns[n][k]])
            rng.shuffle(labels)
            for n in names:
                sums[n] += float(pooled[labels == n].sum())
                counts[n] += len(turns[n][k])
        means = {n: sums[n] / counts[n] for n in names if counts[n]}
        if len(means) == len(names):
            logs.append(math.log(means["adaptive"] / min(means[n] for n in routers)))
    return math.exp(statistics.fmean(logs)) if logs else math.nan


def router_cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: adaptive / the best router (the lower mean of route and route-codec) with a 95 %
    bootstrap over turns and its call, both strategies' plans, and (a win by >= 10 %) why."""
    out = []
    for x in rows:
        s = x.get("strategies", {})
        routers = [n for n in ("route", "route-codec") if n in s]
        if "verdict" not in x or "adaptive" not in s or not routers:
            continue
        best = min(routers, key=lambda n: s[n]["mean_ms"])
        ratio = s["adaptive"]["mean_ms"] / s[best]["mean_ms"]
        ci = regret.bootstrap_ratio(by_turn(x, "adaptive"), by_turn(x, best))
        plans, rplans = s["adaptive"].get("plans", {}), s[best].get("plans", {})
        out.append(
            {
                "cell": f"{x['trace']} {x['model']} x{x['scale']:g} {x['load']}",
                "best_router": best,
                "adaptive_ms": s["adaptive"]["mean_ms"],
                "router_ms": s[best]["mean_ms"],
                "ratio": ratio,
                "ci": list(ci),
                "ratio_split_half": split_half(x, routers),
                "ratio_null": null_ratio(x, routers),
                "call": regret.call(ci),
                "adaptive_plans": _top(plans),
                "router_plans": _top(rplans),
                "why": _why(plans, rplans, best) if ratio <= 1 / WIN else "",
                **_ablation(x, best),
            }
        )
    return out


#: Ablations reported beside adaptive when a cell ran them: strategy -> (key in the JSON, what it is).
ABLATIONS = {
    "adaptive-hold": ("hold", "the controller before held gains added up"),
    "adaptive-keep": ("keep", "the link estimate before a lone slow sample was dropped"),
    "adaptive-news": ("news", "the link estimate before a lone slow sample waited to be confirmed"),
}


def _ablation(x: dict[str, Any], best: str) -> dict[str, Any]:
    """Each ablation the cell ran (``ABLATIONS``): its ratio to the same best router, the 95 % interval
    and its plans, beside adaptive's."""
    s, out = x["strategies"], {}
    for name, (key, _) in ABLATIONS.items():
        if name in s:
            out[f"{key}_ratio"] = s[name]["mean_ms"] / s[best]["mean_ms"]
            out[f"{key}_ci"] = list(regret.bootstrap_ratio(by_turn(x, name), by_turn(x, best)))
            out[f"{key}_plans"] = _top(s[name].get("plans", {}))
    return out


#: The grid's parts, each over every trace (issue 34: the cases a user meets). resnet50 and inception_v1
#: on the Pi 4, unloaded and with a CPU burst, at the traces' own bandwidth: every strategy sends a JPEG
#: of the input (or runs the model here), so adaptive can at best tie the routers. Their x5 cells are left
#: out: in the 2026-12-06 grid all 16 ran the same plan as x1 for every strategy. squeezenet on a board
#: other work holds at 3/4 (device-busy) at x1 and x5: where a cut after the first fire module's squeeze,
#: int8 and zstd, costs the loaded device less than encoding the input as a JPEG (priced 56 ms at 4x),
#: and can beat both routers once the link carries its 24 kB quickly. (Unloaded, squeezenet runs here in
#: 23 ms, under one round trip: every strategy ties on ``device``, a cell that says nothing.)
#: No other cells: bench/bench_router_sweep.py (2026-12-06) simulated every shipped model on the Pi 4 (and
#: the three with measured image codecs on the Pi 5 and both Jetsons) x the 8 HSDPA traces x bandwidth
#: x0.25-x20 x none, device-burst, device-busy, and found adaptive >= 10 % ahead of the best router only
#: where the router's own price is wrong: squeezenet on a busy board with the input's JPEG priced at the
#: board's compute factor (56-75 ms; the rig's quota charges ~2x the host's, ~6 ms, and there no cell
#: wins), or a model whose profile measured no image codec, so that its router sends int8 tensors (with
#: the camera's JPEG instead, none).
GRID: Groups = (
    (("resnet50", "inception_v1"), (1.0,), ("none", "device-burst")),
    (("squeezenet",), (1.0, 5.0), ("device-busy",)),
)

#: Models whose accuracy guard covers every cut (lossy codecs at any cut that keeps the answer, as the
#: demo's split case plans): squeezenet's is measured once in ~2 min and cached; resnet50's would take
#: about an hour, and its splits do not pay here.
GUARD_EVERY_CUT = ("squeezenet",)

#: A win worth a row of its own: adaptive's mean at least 10 % below the best router's.
WIN = 1.10


def router_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The grid against the best router: the cells, the geometric mean of the ratios and the calls."""
    cells = router_cells(rows)
    if not cells:
        return {}
    calls = [c["call"] for c in cells]
    ablated = {
        f"geomean_{key}": math.exp(statistics.fmean(math.log(c[f"{key}_ratio"]) for c in cells if f"{key}_ratio" in c))
        for key, _ in ABLATIONS.values()
        if any(f"{key}_ratio" in c for c in cells)
    }
    return {
        **ablated,
        "cells": cells,
        "geomean": math.exp(statistics.fmean(math.log(c["ratio"]) for c in cells)),
        "geomean_split_half": math.exp(statistics.fmean(math.log(c["ratio_split_half"]) for c in cells)),
        "geomean_null": math.exp(statistics.fmean(math.log(c["ratio_null"]) for c in cells)),
        "better": calls.count("better"),
        "same": calls.count("same"),
        "worse": calls.count("worse"),
        "wins": [c for c in cells if c["ratio"] <= 1 / WIN],
    }


def router_text(rows: list[dict[str, Any]]) -> str:
    """The best router as the baseline (issue 34): per cell adaptive / min(route, route-codec) with a 95 %
    bootstrap over turns, the geometric mean over cells, and the cells where adaptive beats the best
    router by >= 10 % with the plans it used and why."""
    summ = router_summary(rows)
    if not summ:
        return ""
    cells = summ["cells"]
    lines = [
        render(
            ["cell", "best router", "adaptive / router", "95 % CI", "call", "split-half", "adaptive's plans"],
            [
                [
                    c["cell"],
                    c["best_router"],
                    f"{c['ratio']:.3f}",
                    "{:.3f}-{:.3f}".format(*c["ci"]),
                    c["call"],
                    f"{c['ratio_split_half']:.3f}",
                    c["adaptive_plans"],
                ]
                for c in cells
            ],
        ),
        f"adaptive / min(route, route-codec): geometric mean {summ['geomean']:.3f} over {len(cells)} cells "
        f"(target <= 1.00); better {summ['better']}, same {summ['same']}, worse {summ['worse']}",
        f"the same with the best router chosen on the other half of the turns (no winner's curse): geometric "
        f"mean {summ['geomean_split_half']:.3f}",
        f"the same expected if adaptive and the routers did not differ (requests relabelled within turns): "
        f"geometric mean {summ['geomean_null']:.3f}",
    ]
    for name, (key, what) in ABLATIONS.items():
        if f"geomean_{key}" not in summ:
            continue
        lines.append(
            render(
                ["cell", "adaptive / router", "95 % CI", f"{name} / router", "95 % CI", f"{name}'s plans"],
                [
                    [
                        c["cell"],
                        f"{c['ratio']:.3f}",
                        "{:.3f}-{:.3f}".format(*c["ci"]),
                        f"{c[key + '_ratio']:.3f}",
                        "{:.3f}-{:.3f}".format(*c[key + "_ci"]),
                        c[key + "_plans"],
                    ]
                    for c in cells
                    if key + "_ratio" in c
                ],
            )
        )
        lines.append(f"{name} ({what}): geometric mean {summ['geomean_' + key]:.3f}")
    if summ["wins"]:
        lines.append(f"cells where adaptive beats the best router by >= {100 * (WIN - 1):.0f} %:")
        for c in summ["wins"]:
            lines.append(f"  {c['cell']}: {c['ratio']:.3f} x {c['best_router']}; {c['adaptive_plans']}; {c['why']}")
    return "\n".join(lines)


def best_other(x: dict[str, Any]) -> str:
    s = x["strategies"]
    others = [n for n in ("device-only", "cloud-only", "static", "periodic") if n in s]
    return min(others, key=lambda n: s[n]["mean_ms"]) if others else "-"


def best_ci(x: dict[str, Any]) -> tuple[float, float]:
    lat = x.get("latencies_ms", {})
    return ratio_ci(lat.get("adaptive", []), lat.get(best_other(x), []))


def summary(rows: list[dict[str, Any]]) -> str:
    """Per target, how many cells meet it; for the 1.02 target, also whether the noise resolves it."""
    done = [x for x in rows if "verdict" in x]
    v = [x["verdict"] for x in done]
    n = len(done)
    cis = [best_ci(x) for x in done]
    resolved_ok = sum(1 for lo, hi in cis if hi <= 1.02)
    resolved_miss = sum(1 for lo, hi in cis if lo > 1.02)
    ratios = [y["mean_vs_best_other"] for y in v if math.isfinite(y.get("mean_vs_best_other", math.nan))]
    return "\n".join(
        [
            f"{sum(1 for y in v if y.get('pass'))}/{n} cells meet every target",
            f"adaptive mean <= 1.10 x oracle: {sum(1 for y in v if y.get('mean_vs_oracle', math.nan) <= 1.10)}/{n}; "
            f"p95 <= 1.15 x oracle: {sum(1 for y in v if y.get('p95_vs_oracle', math.nan) <= 1.15)}/{n}; "
            f"zero failed: {sum(1 for y in v if y.get('failed') == 0)}/{n}",
            f"adaptive mean <= 1.02 x best other: {sum(1 for r in ratios if r <= 1.02)}/{n} "
            f"(<= 1.05: {sum(1 for r in ratios if r <= 1.05)}/{n}; geometric mean over cells "
            f"{math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else math.nan:.3f}); "
            f"95 % interval entirely <= 1.02: {resolved_ok}/{n}, entirely > 1.02: {resolved_miss}/{n}, "
            f"not resolved by the noise: {n - resolved_ok - resolved_miss}/{n}",
        ]
    )


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    for x in rows:
        if "error" in x:
            out.append(
                (
                    x["trace"],
                    x["model"],
                    f"x{x['scale']:g}",
                    x["load"],
                    "",
                    "ERROR",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    x["error"][:40],
                )
            )
            continue
        s, v = x["strategies"], x["verdict"]
        others = {n: s[n]["mean_ms"] for n in ("device-only", "cloud-only", "static", "periodic") if n in s}
        best = min(others, key=lambda n: others[n]) if others else "-"
        out.append(
            (
                x["trace"],
                x["model"],
                f"x{x['scale']:g}",
                x["load"],
                twin_gap(s),
                s["adaptive"]["mean_ms"],
                s.get("oracle", {}).get("mean_ms", math.nan),
                s["adaptive"]["p95_ms"],
                s.get("oracle", {}).get("p95_ms", math.nan),
                f"{best} {others.get(best, math.nan):.0f}",
                # a run without the oracle (or the others) has no such ratio: nan, not a crash
                f"{v.get('mean_vs_oracle', math.nan):.3f}",
                f"{v.get('p95_vs_oracle', math.nan):.3f}",
                f"{v.get('mean_vs_best_other', math.nan):.3f}",
                "{:.2f}-{:.2f}".format(*best_ci(x)),
                f"{v['failed']} {'PASS' if v['pass'] else 'miss'}" if v else "-",
            )
        )
    return render(
        [
            "trace",
            "model",
            "scale",
            "load",
            "twin gap",
            "adapt mean",
            "oracle mean",
            "adapt p95",
            "oracle p95",
            "best other (mean)",
            "mean/orc",
            "p95/orc",
            "mean/best",
            "95% CI",
            "failed",
        ],
        out,
    )


def twin_gap(s: dict[str, Any]) -> str:
    """The measurement's resolution in this cell: when two fixed strategies ran the very same plan
    (static's pick is often device-only's or cloud-only's), how far apart their means came out."""
    plans = {n: s[n].get("plans", {}) for n in ("device-only", "cloud-only", "static") if n in s}
    for other in ("device-only", "cloud-only"):
        if (
            other in plans
            and "static" in plans
            and plans[other].keys() == plans["static"].keys()
            and len(plans[other]) == 1
        ):
            a, b = s[other]["mean_ms"], s["static"]["mean_ms"]
            return f"{abs(a / b - 1) * 100:.1f}%"
    return "-"


if __name__ == "__main__":
    sys.exit(main())
