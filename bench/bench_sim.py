"""The rig's acceptance grid, simulated (``splitrt.rig.sim``): the decision logic without the host's jitter.

Same cells as bench/bench_rig_grid.py (every shipped HSDPA trace x resnet50, inception_v1 on rpi4 x
bandwidth scale 1, 5 x load none, device-burst), same strategies and oracle, but each strategy is a
pure replay of the trace against the shipped profile's cost table: no processes, no kernel link, no
cgroup. With ``--jitter 0`` (default) two strategies on the same plan cost exactly the same, so
"adaptive mean <= 1.02 x the best of device-only, cloud-only, static and periodic" is settled by the
decisions alone, over whole traces (the rig plays 12 s of each). ``--jitter 0.1`` draws the rig's +-10 %
per-request compute noise (the same draw for request n of every strategy).

    .venv/bin/python bench/bench_sim.py [--duration S] [--offset S] [--jitter 0.1] [--json FILE]

Target: the same per-cell targets as the rig grid; runs in about 4 minutes here (whole traces).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
from _common import add_grid_arguments, grid_cells

from splitrt.cli import sim as cmd_sim
from splitrt.cli.tables import render
from splitrt.plan.controller import ControllerConfig
from splitrt.plan.netmon import LinkConfig
from splitrt.rig import regret


def cell(model: str, trace_name: str, scale: float, load: str, args: argparse.Namespace) -> dict[str, Any]:
    return cmd_sim.sim_cell(
        model,
        trace_name,
        board=args.board,
        scale=scale,
        load=load,
        rate_hz=args.rate,
        duration_s=args.duration or None,
        offset_s=args.offset,
        jitter=args.jitter,
        seed=args.seed,
        device_speed=args.device_speed,
        cloud_speed=args.cloud_speed,
        link=args.link_config,
        controller=args.controller_config,
    )


def overrides(items: list[str]) -> tuple[LinkConfig, ControllerConfig]:
    fields: dict[str, dict[str, Any]] = {"link": {}, "controller": {}}
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in fields or not name or not value:
            raise SystemExit(f"--set: expected link.FIELD=VALUE or controller.FIELD=VALUE, got {item!r}")
        num = None if value == "None" else float(value)
        fields[section][name] = int(num) if num is not None and "." not in value else num
    return (LinkConfig(**fields["link"]), ControllerConfig(**{"codecs": None, **fields["controller"]}))


def regret_text(cells: list[dict[str, Any]]) -> str:
    """The regret table: each strategy's worst cell and geometric mean against the per-cell best."""
    labelled = [(f"{c['trace']} {c['model']} x{c['bandwidth_scale']:g} {c['load']}", c["strategies"]) for c in cells]
    table = regret.regret(labelled)
    by = {r.strategy: r for r in table}
    a = by["adaptive"]
    fixed = [by[n] for n in regret.FIXED if n in by]
    ok = a.worst_mean <= 1.05 and a.worst_p95 <= 1.10 and all(f.worst_mean >= 1.25 for f in fixed)
    return (
        render(regret.HEADER, regret.rows(table)) + "\n"
        f"adaptive worst cell: mean {a.worst_mean:.3f}, p95 {a.worst_p95:.3f} x the per-cell best (targets 1.05, "
        f"1.10); fixed strategies' worst cells: "
        + ", ".join(f"{f.strategy} {f.worst_mean:.2f}" for f in fixed)
        + f" (target >= 1.25): {'PASS' if ok else 'miss'}\n\n"
        + render(
            regret.SPLIT_ROUTE_HEADER,
            regret.split_route_rows([regret.split_route(labelled, "adaptive"), regret.split_route(labelled, "oracle")]),
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(p)
    p.add_argument("--duration", type=float, default=0.0, help="seconds of each trace (0: the whole trace)")
    p.add_argument("--offset", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--jitter", type=float, default=0.0, help="relative sd of compute times per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device-speed",
        type=float,
        default=1.0,
        help="device compute really takes this x the profile (the profile's error)",
    )
    p.add_argument("--cloud-speed", type=float, default=1.0, help="the same for the cloud's compute")
    p.add_argument("--json", default=None, metavar="FILE", help="write the cells as JSON ('-': stdout)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a LinkConfig (link.) or ControllerConfig (controller.) field, e.g. "
        "link.max_sample_age_s=2 (repeatable): what-if runs of the decision logic",
    )
    args = p.parse_args(argv)
    args.link_config, args.controller_config = overrides(args.set)
    t0 = time.monotonic()
    cells = []
    grid = grid_cells(args)
    for n, (tr, model, scale, load) in enumerate(grid, 1):
        print(f"cell {n}/{len(grid)}: {tr} {model} x{scale:g} {load}", file=sys.stderr, flush=True)
        cells.append(cell(model, tr, scale, load, args))
    rows = []
    for c in cells:
        s = c["strategies"]
        ok = c["mean_vs_oracle"] <= 1.10 and c["p95_vs_oracle"] <= 1.15 and c["mean_vs_best"] <= 1.02
        rows.append(
            [
                c["trace"],
                c["model"],
                f"x{c['bandwidth_scale']:g}",
                c["load"],
                f"{c['duration_s']:.0f}",
                str(s["adaptive"]["completed"]),
                f"{s['adaptive']['mean_ms']:.0f}",
                f"{s['oracle']['mean_ms']:.0f}",
                f"{s['adaptive']['p95_ms']:.0f}",
                f"{s['oracle']['p95_ms']:.0f}",
                f"{c['best_other']} {s[c['best_other']]['mean_ms']:.0f}",
                f"{c['mean_vs_oracle']:.3f}",
                f"{c['p95_vs_oracle']:.3f}",
                f"{c['mean_vs_best']:.3f}",
                str(s["adaptive"]["switches"]),
                "PASS" if ok else "miss",
            ]
        )
    if args.json == "-":
        json.dump(
            {"cells": cells, "jitter": args.jitter, "device_speed": args.device_speed, "cloud_speed": args.cloud_speed},
            sys.stdout,
            indent=1,
        )
        return 0
    print(
        render(
            [
                "trace",
                "model",
                "scale",
                "load",
                "s",
                "reqs",
                "adapt mean",
                "oracle mean",
                "adapt p95",
                "oracle p95",
                "best other (mean)",
                "mean/orc",
                "p95/orc",
                "mean/best",
                "switches",
                "",
            ],
            rows,
        )
    )
    n = len(cells)
    ratios = [c["mean_vs_best"] for c in cells]
    print(
        f"adaptive mean <= 1.10 x oracle: {sum(c['mean_vs_oracle'] <= 1.10 for c in cells)}/{n}; "
        f"p95 <= 1.15 x oracle: {sum(c['p95_vs_oracle'] <= 1.15 for c in cells)}/{n}; "
        f"mean <= 1.02 x best other: {sum(r <= 1.02 for r in ratios)}/{n} (worst {max(ratios):.3f}, "
        f"geometric mean {float(np.exp(np.mean(np.log(ratios)))):.3f}); jitter {args.jitter:g}, "
        f"true/profiled compute: device x{args.device_speed:g}, cloud x{args.cloud_speed:g}"
    )
    print()
    print(regret_text(cells))
    print(
        f"{(time.monotonic() - t0):.0f} s; median adaptive requests per cell "
        f"{statistics.median(c['strategies']['adaptive']['completed'] for c in cells):.0f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "cells": cells,
                    "jitter": args.jitter,
                    "device_speed": args.device_speed,
                    "cloud_speed": args.cloud_speed,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
