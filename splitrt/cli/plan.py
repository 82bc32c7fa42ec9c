"""`splitrt plan`: where to cut, at what cost, from a device and a cloud profile (`splitrt profile`: cli/profile.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from splitrt.cli import constraints as constraintcli
from splitrt.cli import explain as explaincli
from splitrt.cli.codecarg import HELP as codec_help
from splitrt.cli.codecarg import codec_or_all
from splitrt.cli.inputs import add_shape_arguments, load_graph
from splitrt.errors import ConfigError, PlanError
from splitrt.plan import constraints, costmodel, solver
from splitrt.profile import accuracy, boards, cutfacts, energy, profiler, reprice, sanity, tables
from splitrt.profile import costs as costs_mod


def register(subparsers: Any) -> None:
    q = subparsers.add_parser(
        "plan",
        help="predict every cut's cost and pick the best",
        description="Predict each candidate cut's latency, energy and throughput from a device and a cloud "
        "profile, and print the best plan (or, with --sweep, the bandwidths where the best plan changes).",
    )
    q.add_argument("model", help="ONNX file, or a zoo model name")
    q.add_argument("--device", default=None, help="device profile (JSON; required unless --explain)")
    q.add_argument("--cloud", default=None, help="cloud profile (JSON; required unless --explain)")
    q.add_argument("--bandwidth-mbps", type=float, default=None, help="required unless --explain")
    q.add_argument("--rtt-ms", type=float, default=None, help="required unless --explain")
    q.add_argument("--objective", choices=solver.OBJECTIVES, default="latency")
    q.add_argument("--device-load", type=float, default=1.0, help="multiplies device compute (>= 1)")
    q.add_argument("--cloud-load", type=float, default=1.0, help="multiplies cloud compute (>= 1)")
    q.add_argument(
        "--board", default=None, help="devices/<NAME>.toml: power figures, and emulate it from a host profile"
    )
    q.add_argument(
        "--codec",
        action="append",
        default=None,
        type=codec_or_all,
        help=f"allowed codec(s), repeatable: {codec_help}, or 'all' (default: fp32, lossless "
        "like the runtime; lossy codecs change the answer, so they are opt-in)",
    )
    q.add_argument(
        "--min-agreement",
        type=float,
        default=accuracy.MIN_AGREEMENT,
        help="a lossy codec is used at a cut only where at least this share of the device profile's samples "
        f"gave the uncompressed model's output (default {accuracy.MIN_AGREEMENT}; a profile made without "
        "--samples: lossless codecs only; 0 turns the guard off)",
    )
    q.add_argument("--min-cut", action="store_true", help="also solve the DADS min-cut over the node DAG")
    q.add_argument("--sweep", action="store_true", help="print the bandwidths where the best plan changes")
    q.add_argument("--sweep-min-mbps", type=float, default=0.1)
    q.add_argument("--sweep-max-mbps", type=float, default=None, help="default 1000 (--explain: 100)")
    q.add_argument("--plot", default=None, help="with --sweep: write a PNG (needs matplotlib)")
    q.add_argument("--json", action="store_true")
    explaincli.add_arguments(q)
    constraintcli.add_arguments(q)
    add_shape_arguments(q)
    q.set_defaults(func=_plan)


def _explain(args: argparse.Namespace) -> int:
    g = load_graph(args)
    board = boards.load_board(args.board) if args.board else None
    costs = explaincli.table_for(g, args, board)
    table, source = costs.table, costs.source
    power = board.power if board is not None else costmodel.DEFAULT_POWER
    if args.device:
        power = energy.plan_power(
            profiler.load_profile(args.device, sha256=g.sha256), board, profile_label=str(args.device)
        ).power
    codecs = None if args.codec == ["all"] else (args.codec or ["fp32"])
    table = tables.with_codecs(table, codecs)
    allowed = cutfacts.allowed_for(g, table, constraintcli.constraints(args, board))
    try:
        v = explaincli.verdict(
            table,
            rtt_ms=explaincli.DEFAULT_RTT_MS if args.rtt_ms is None else args.rtt_ms,
            min_mbps=args.sweep_min_mbps,
            max_mbps=args.sweep_max_mbps or explaincli.DEFAULT_MAX_MBPS,
            loads=explaincli.parse_loads(args.explain_loads),
            power=power,
            codecs=codecs,
            cuts=allowed.cuts if allowed else None,
            objectives=[o for o in args.explain_objectives.split(",") if o],
        )
    except PlanError as exc:
        raise ConfigError(str(exc)) from exc
    if allowed is not None and not args.json:
        print(allowed.note())
    explaincli.print_verdict(
        v,
        source,
        as_json=args.json,
        extra={
            "codecs": codecs or list(table.codecs),
            "constraints": allowed.as_dict() if allowed else None,
            "cost_table": costs.summary(),
        },
    )
    return 0


def _plan(args: argparse.Namespace) -> int:
    if args.explain:
        return _explain(args)
    missing = [
        f
        for f, v in (
            ("--device", args.device),
            ("--cloud", args.cloud),
            ("--bandwidth-mbps", args.bandwidth_mbps),
            ("--rtt-ms", args.rtt_ms),
        )
        if v is None
    ]
    if missing:
        raise ConfigError(f"plan: expected {', '.join(missing)} (or --explain), got none")
    args.sweep_max_mbps = args.sweep_max_mbps or 1000.0
    g = load_graph(args)
    board = boards.load_board(args.board) if args.board else None
    if not 0 <= args.min_agreement <= 1:
        raise ConfigError(f"--min-agreement: expected a share in [0, 1], got {args.min_agreement}")
    costs = tables.build(g, device=args.device, cloud=args.cloud, board=board, min_agreement=args.min_agreement)
    device, cloud, factor = costs.device_profile, costs.cloud_profile, costs.device_speed_factor
    # measured idle/busy power from the device profile when it has them, else the board's estimates
    figures = energy.plan_power(device, board, profile_label=str(args.device))
    power = figures.power
    table, pricing, warnings = _priced(args, costs)
    try:
        cond = costmodel.Conditions(
            link=costmodel.Link(bandwidth_mbps=args.bandwidth_mbps, rtt_ms=args.rtt_ms),
            device_load=args.device_load,
            cloud_load=args.cloud_load,
        )
    except PlanError as exc:
        raise ConfigError(str(exc)) from exc
    codecs = args.codec = None if args.codec == ["all"] else (args.codec or ["fp32"])
    table = tables.with_codecs(table, codecs)
    allowed = _allowed(g, table, args, board)
    cuts = list(allowed.cuts) if allowed is not None else None
    if args.sweep:
        _sweep(args, table, cond, power, codecs, cuts, pricing, warnings, figures)
        return 0

    best = solver.solve(table, cond, objective=args.objective, power=power, codecs=codecs, cuts=cuts)
    rows = []
    several = codecs is None or len(codecs) > 1
    for cut in table.ids:
        # each cut at its own best allowed codec (the ratios of compressed codecs differ per cut)
        codec = (
            solver.solve(table, cond, objective=args.objective, power=power, codecs=codecs, cuts=[cut]).codec
            if several
            else best.codec
        )
        e = table.estimate(cut, codec, cond, power)
        rows.append(
            {
                "cut": cut,
                "codec": codec,
                "device_ms": round(e.device_ms, 4),
                "transfer_ms": round(e.transfer_ms, 4),
                "download_ms": round(e.download_ms, 4),
                "rtt_ms": round(e.rtt_ms, 4),
                "encode_ms": round(e.encode_ms, 4),
                "call_ms": round(e.call_ms, 4),
                "decode_ms": round(e.decode_ms, 4),
                "cloud_ms": round(e.cloud_ms, 4),
                "total_ms": round(e.latency_ms, 4),
                "energy_mj": round(e.energy_mj, 4),
                "energy_source": figures.source,
                "period_ms": round(e.period_ms, 4),
                "bytes": e.bytes,
                "sent_bytes": e.sent_bytes,
                "reply_bytes": e.reply_bytes,
                "excluded": allowed.excluded.get(cut) if allowed is not None else None,
            }
        )
    out: dict[str, Any] = {
        "best": {
            "plan": best.key,
            "cut": best.cut,
            "codec": best.codec,
            "objective": best.objective,
            "predicted_ms": round(best.predicted_ms, 4),
            "energy_mj": round(best.energy_mj, 4),
            "energy_source": figures.source,
            "period_ms": round(best.period_ms, 4),
            "throughput_fps": round(1000.0 / best.period_ms, 3) if best.period_ms > 0 else None,
            "device_ms": round(best.device_ms, 4),
            "transfer_ms": round(best.transfer_ms, 4),
            "download_ms": round(best.download_ms, 4),
            "rtt_ms": round(best.rtt_ms, 4),
            "encode_ms": round(best.encode_ms, 4),
            "call_ms": round(best.call_ms, 4),
            "decode_ms": round(best.decode_ms, 4),
            "cloud_ms": round(best.cloud_ms, 4),
            "bytes": best.bytes,
            "sent_bytes": best.sent_bytes,
            "reply_bytes": best.reply_bytes,
        },
        "conditions": {
            "bandwidth_mbps": args.bandwidth_mbps,
            "rtt_ms": args.rtt_ms,
            "device_load": args.device_load,
            "cloud_load": args.cloud_load,
            "board": args.board,
            "device_speed_factor": factor,
        },
        "cost_table": costs.summary(),
        "power": figures.as_dict(args.bandwidth_mbps),
        "shapes": pricing.as_dict(),
        "warnings": warnings,
        "accuracy_guard": costs_mod.guard_note(device, min_agreement=args.min_agreement),
        "cuts": rows,
    }
    if allowed is not None:
        out["constraints"] = {
            **allowed.as_dict(),
            "price": constraints.price(
                table, cond, allowed, objective=args.objective, power=power, codecs=codecs
            ).as_dict(),
        }
    if args.min_cut:
        from splitrt.plan import mincut

        choice = mincut.best_head(profiler.dag(g, device, cloud, device_speed_factor=factor), cond)
        out["min_cut"] = {
            "head_nodes": len(choice.head),
            "predicted_ms": round(choice.latency_ms, 4),
            "bytes": choice.crossing_bytes,
            "note": "additive per-node model, fp32, over every down-closed node set"
            + (" (per-node times at the profiles' shapes: not re-priced)" if pricing.repriced else ""),
        }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    _print_plan(out, args.objective)
    return 0


def _sweep(
    args: argparse.Namespace,
    table: costmodel.CostTable,
    cond: costmodel.Conditions,
    power: costmodel.Power,
    codecs: list[str] | None,
    cuts: list[str] | None,
    pricing: Any,
    warnings: list[str],
    figures: Any,
) -> None:
    bands = solver.sweep(
        table,
        cond,
        objective=args.objective,
        power=power,
        min_mbps=args.sweep_min_mbps,
        max_mbps=args.sweep_max_mbps,
        codecs=codecs,
        cuts=cuts,
    )
    if args.plot:
        _plot(table, cond, bands, args, power)
    if args.json:
        print(
            json.dumps(
                {
                    "sweep": [vars_of(b) for b in bands],
                    "shapes": pricing.as_dict(),
                    "warnings": warnings,
                    "power": figures.as_dict(args.bandwidth_mbps),
                },
                indent=1,
            )
        )
    else:
        print(f"shapes: {pricing.note}")
        print(f"{'from Mbit/s':>12} {'to Mbit/s':>12}  {'plan':<16}{'bytes':>12}{'ms at from':>12}{'ms at to':>11}")
        for b in bands:
            print(
                f"{b.from_mbps:>12.4g} {b.to_mbps:>12.4g}  {b.plan:<16}{b.bytes:>12}"
                f"{b.predicted_ms_from:>12.2f}{b.predicted_ms_to:>11.2f}"
            )


def _allowed(g: Any, table: costmodel.CostTable, args: argparse.Namespace, board: Any) -> Any:
    try:
        return cutfacts.allowed_for(g, table, constraintcli.constraints(args, board))
    except PlanError as exc:
        raise ConfigError(str(exc)) from exc


def _priced(args: argparse.Namespace, costs: tables.Costs) -> tuple[costmodel.CostTable, reprice.Pricing, list[str]]:
    """The cost table at the plan's binding (profiles measured elsewhere re-priced, said), and the
    warnings about profiles that contradict themselves (on stderr too)."""
    table, pricing = costs.table, costs.pricing
    warnings = [
        w
        for w in (
            sanity.warning(costs.device_profile, str(args.device)),
            sanity.warning(costs.cloud_profile, str(args.cloud)) if args.cloud != args.device else None,
        )
        if w
    ]
    for w in warnings:
        print(w, file=sys.stderr)
    if pricing.repriced and args.json:
        print(f"splitrt plan: {pricing.note}", file=sys.stderr)
    return table, pricing, warnings


def vars_of(b: solver.SweepBand) -> dict[str, Any]:
    return {
        "from_mbps": b.from_mbps,
        "to_mbps": b.to_mbps,
        "plan": b.plan,
        "bytes": b.bytes,
        "predicted_ms_from": b.predicted_ms_from,
        "predicted_ms_to": b.predicted_ms_to,
    }


def _plot(
    table: costmodel.CostTable,
    cond: costmodel.Conditions,
    bands: list[solver.SweepBand],
    args: argparse.Namespace,
    power: costmodel.Power,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'splitrt[plot]'") from exc
    import numpy as np

    bws = np.geomspace(args.sweep_min_mbps, args.sweep_max_mbps, 300)
    lat = []
    for bw in bws:
        c = costmodel.Conditions(
            link=costmodel.Link(bandwidth_mbps=float(bw), rtt_ms=cond.link.rtt_ms),
            device_load=cond.device_load,
            cloud_load=cond.cloud_load,
        )
        lat.append(solver.solve(table, c, objective=args.objective, power=power, codecs=args.codec).predicted_ms)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(bws, lat, color="black")
    for b in bands:
        ax.axvspan(b.from_mbps, b.to_mbps, alpha=0.15, color=f"C{bands.index(b) % 10}")
        mid = (b.from_mbps * b.to_mbps) ** 0.5
        ax.text(mid, max(lat) * 0.95, b.plan, rotation=90, va="top", ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("bandwidth (Mbit/s)")
    ax.set_ylabel("predicted latency (ms)")
    ax.set_title(f"best plan vs bandwidth, RTT {cond.link.rtt_ms} ms ({args.objective})")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"wrote {args.plot}", file=sys.stderr)


def _ratio(row: dict[str, Any]) -> str:
    """Sent bytes over the raw crossing bytes (what the codec buys at this cut)."""
    return f"{row['sent_bytes'] / row['bytes']:.3f}" if row["bytes"] else "-"


def _print_plan(out: dict[str, Any], objective: str) -> None:
    rows, best = out["cuts"], out["best"]
    # transfer ms prices the sent bytes (after the codec), download ms the reply bytes; encode + call ms
    # what the device pays to send beyond its head, decode ms the cloud's before its tail.
    print(
        f"{'cut':<10}{'codec':<12}{'device ms':>11}{'encode ms':>11}{'call ms':>9}{'transfer ms':>13}"
        f"{'sent bytes':>12}{'x fp32':>8}{'download ms':>13}{'reply bytes':>13}{'rtt ms':>9}{'decode ms':>11}"
        f"{'cloud ms':>10}{'total ms':>10}{'energy mJ':>11}"
    )
    for r in rows:
        mark = "  <- best" if r["cut"] == best["cut"] else (f"  (excluded: {r['excluded']})" if r["excluded"] else "")
        print(
            f"{r['cut']:<10}{r['codec'] if r['cut'] != 'device' else '-':<12}{r['device_ms']:>11.2f}"
            f"{r['encode_ms']:>11.2f}{r['call_ms']:>9.2f}{r['transfer_ms']:>13.2f}{r['sent_bytes']:>12}{_ratio(r):>8}"
            f"{r['download_ms']:>13.2f}{r['reply_bytes']:>13}{r['rtt_ms']:>9.2f}{r['decode_ms']:>11.2f}"
            f"{r['cloud_ms']:>10.2f}{r['total_ms']:>10.2f}{r['energy_mj']:>11.1f}{mark}"
        )
    b = out["best"]
    print(
        f"best ({objective}): {b['plan']}  latency {b['predicted_ms']:.2f} ms, energy {b['energy_mj']:.1f} mJ, "
        f"{b['throughput_fps']} frames/s pipelined, sends {b['sent_bytes']} bytes, receives {b['reply_bytes']}"
    )
    pw = out["power"]
    print(
        f"energy {pw['source']}: idle {pw['idle_w']:.2f} W, active {pw['active_w']:.2f} W from {pw['origin']}"
        + (f" (reader {pw['reader']})" if pw["reader"] else f" ({pw['note']})")
        + f"; radio {pw['radio_w']:.2f} W = {pw['radio_uj_per_byte']:.3g} uJ/byte here, from {pw['radio_source']}"
    )
    print(f"shapes: {out['shapes']['note']}")
    print(_guard_line(out["accuracy_guard"]))
    if "constraints" in out:
        c = out["constraints"]
        print(
            f"{c['note']}; unconstrained best {c['price']['unconstrained']}, the constraints cost "
            f"{c['price']['cost']:.2f} ({objective})"
        )
    if "min_cut" in out:
        mc = out["min_cut"]
        print(f"min-cut over the node DAG: {mc['predicted_ms']:.2f} ms ({mc['head_nodes']} nodes on the device)")


def _guard_line(guard: dict[str, Any]) -> str:
    """One line: the tolerance, how the agreement was measured, and where lossy codecs are allowed."""
    acc, allowed = guard["accuracy"], guard["allowed_cuts"]
    if guard["min_agreement"] <= 0:
        return "accuracy guard: off (--min-agreement 0): lossy codecs priced by their bytes alone"
    if not acc:
        return "accuracy guard: the device profile has no samples (splitrt profile --samples): lossless codecs only"
    ok = {c: cuts for c, cuts in allowed.items() if cuts}
    where = "; ".join(f"{c} at {len(cuts)} cut(s)" for c, cuts in ok.items()) or "none anywhere"
    return (
        f"accuracy guard: lossy codecs where >= {guard['min_agreement']:g} of {acc['samples']} samples "
        f"({acc['source']}, {acc['metric']}) agree with the uncompressed model: {where}"
    )
