"""`splitrt bench` (every strategy in the hardware-in-the-loop rig on a bandwidth trace) and
`splitrt rig cleanup` (remove what a killed rig left behind). See splitrt.rig."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from splitrt.cli import constraints as constraintcli
from splitrt.cli import fleet as fleetcli
from splitrt.cli import tiers as tierscli
from splitrt.cli.inputs import add_shape_arguments, binding, load_graph
from splitrt.cli.tables import render
from splitrt.rig import bench as rigbench
from splitrt.rig import harness as rig
from splitrt.rig import netns


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="replay a bandwidth trace in the rig and compare every strategy", description=__doc__
    )
    p.add_argument("--model", default="resnet50", help="zoo name or .onnx file (default resnet50)")
    p.add_argument(
        "--trace",
        default="hsdpa/car",
        help="shipped trace (hsdpa/bus ...), a file, or step:1,8/5 | square:1,8,20 | constant:4",
    )
    p.add_argument("--device", default="rpi4", help="board to emulate (devices/<NAME>.toml)")
    p.add_argument("--bandwidth-scale", type=float, default=1.0, help="multiply the trace (x5: LTE-class)")
    p.add_argument("--load", default="none", choices=rigbench.LOADS)
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (paced, one in flight)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of trace every strategy plays")
    p.add_argument(
        "--turn",
        type=float,
        default=1.0,
        help="strategies take turns on slices this long, so host drift hits all alike (s)",
    )
    p.add_argument("--trace-offset", type=float, default=0.0, help="start this far into the trace (s)")
    p.add_argument("--rtt-ms", type=float, default=None, help="added round trip (default: typical of the trace)")
    p.add_argument(
        "--codecs",
        default=None,
        help="comma-separated codecs every strategy may use (default: all; fp32 = lossless only)",
    )
    p.add_argument("--strategies", default=",".join(rigbench.STRATEGIES))
    p.add_argument(
        "--profile",
        default=None,
        help="a profile of --model measured on this host (`splitrt profile`; the rig emulates the board from "
        "it, as `sim --device P --cloud P` does; default: the shipped one, else measured now)",
    )
    p.add_argument(
        "--link",
        default="auto",
        choices=["auto", "kernel", "userspace"],
        help="kernel shaping (root) or the userspace relay (default: kernel when root)",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON ('-': stdout)")
    p.add_argument("--plot", metavar="PNG", default=None, help="timeline plot (needs matplotlib)")
    p.add_argument("--keep-workdir", action="store_true", help="keep logs and per-request records")
    # the runtime's strategies (adaptive, route, periodic) plan within them; compare with device-only
    constraintcli.add_arguments(p)
    add_shape_arguments(p)
    p.set_defaults(func=cmd_bench)

    r = sub.add_parser("rig", help="hardware-in-the-loop rig maintenance")
    rs = r.add_subparsers(dest="rig_command", required=True)
    c = rs.add_parser("cleanup", help="remove spl- namespaces, qdiscs and cgroups left by dead runs")
    c.add_argument("--all", action="store_true", help="also those of runs still alive (careful)")
    c.set_defaults(func=cmd_rig_cleanup)
    fleetcli.register(rs)
    tierscli.register(rs, two_tier=cmd_bench, live_line=LiveLine)


def cmd_rig_cleanup(args: argparse.Namespace) -> int:
    if not netns.is_root():
        print(
            "splitrt rig cleanup: not root: nothing the rig made needs removing (userspace link only)", file=sys.stderr
        )
        return 0
    removed = netns.cleanup_leftovers(include_live=args.all)
    for r in removed:
        print(r)
    print(f"removed {len(removed)} leftover(s)", file=sys.stderr)
    return 0


class LiveLine:
    """One status line on stderr, rewritten in place."""

    def __init__(self) -> None:
        self.width = 0
        self.tty = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        if not self.tty:
            return
        pad = max(0, self.width - len(text))
        sys.stderr.write("\r" + text + " " * pad + ("\r" if not text else ""))
        sys.stderr.flush()
        self.width = len(text)

    def say(self, text: str) -> None:
        if self.width:
            self("")
            self.width = 0
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def bound_model(args: argparse.Namespace) -> Iterator[str]:
    """``--model``, or with ``--shape``/``--dim``/``--sample`` a copy of it whose inputs have those shapes
    (a temporary file, for the run): the rig's devices, servers, profile and tables all take a model file,
    so every one of them sees the model at the bound shapes (``inputs.load_graph``, as `plan` and `sim`)."""
    import tempfile

    import onnx

    from splitrt.graph import shapes
    from splitrt.rig.models import model_path_for

    if binding(args).empty:
        yield args.model
        return
    mg = load_graph(args, model_path_for(args.model))
    with tempfile.TemporaryDirectory(prefix="splitrt-bound-") as tmp:
        path = Path(tmp) / Path(mg.path).name
        onnx.save(shapes.with_input_shapes(mg.model, mg.input_shapes or {}), str(path))
        shown = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in (mg.input_shapes or {}).items())
        print(f"splitrt bench: {args.model} bound at {shown}", file=sys.stderr)
        yield str(path)


def bench_config(args: argparse.Namespace, model: str | None = None) -> rigbench.BenchConfig:
    """The rig's run of ``model`` (default ``--model``; ``bound_model`` gives the bound one)."""
    model = model or args.model
    return rigbench.BenchConfig(
        model=model,
        trace=args.trace,
        bandwidth_scale=args.bandwidth_scale,
        load=args.load,
        rate_hz=args.rate,
        duration_s=args.duration,
        turn_s=args.turn,
        trace_offset_s=args.trace_offset,
        rtt_ms=args.rtt_ms,
        codecs=tuple(args.codecs.split(",")) if args.codecs else None,
        strategies=tuple(s for s in args.strategies.split(",") if s),
        cuts=_allowed_cuts(args, model),
        profile_path=getattr(args, "profile", None),
    )


def _allowed_cuts(args: argparse.Namespace, model: str) -> tuple[str, ...] | None:
    """The cuts ``--no-raw-input`` / ``--min-head-flops`` / ``--device-memory-mb`` leave the runtime's
    plans (None: no constraint). Fixed strategies (cloud-only, static) are not constrained."""
    if not hasattr(args, "no_raw_input"):
        return None
    from splitrt.graph import model as graph
    from splitrt.profile import boards
    from splitrt.profile.cutfacts import allowed_for
    from splitrt.rig.models import model_path_for

    cons = constraintcli.constraints(args, boards.load_board(args.device))
    mg = graph.load(model_path_for(model))
    allowed = allowed_for(mg, None, cons)  # never a cut that only moves the input (it is cloud)
    return None if allowed is None else tuple(allowed.cuts)


def run(
    cfg: rigbench.BenchConfig, *, board: str, link: str, keep_workdir: bool = False, line: LiveLine | None = None
) -> dict[str, Any]:
    line = line or LiveLine()
    rc = rig.RigConfig(board=board, link=link, keep_workdir=keep_workdir, models=(cfg.model,))
    with rig.Rig(rc, progress=line.say) as r:
        if keep_workdir:
            line.say(f"rig workdir: {r.workdir}")
        return rigbench.run_bench(cfg, r, progress=line.say, live=line)


def cmd_bench(args: argparse.Namespace) -> int:
    with bound_model(args) as model:
        cfg = bench_config(args, model)
        result = run(cfg, board=args.device, link=args.link, keep_workdir=args.keep_workdir)
    report(result, json_path=args.json, plot_path=args.plot)
    bad = sum(int(s["failed"]) for s in result["strategies"].values())
    return 1 if bad else 0


def table_text(result: dict[str, Any]) -> str:
    rows = []
    for name in rigbench.TWO_TIER:
        s = result["strategies"].get(name)
        if s is None:
            continue
        plans = ", ".join(f"{p} x{n}" for p, n in sorted(s["plans"].items(), key=lambda kv: -kv[1])[:3])
        rows.append(
            (
                name,
                s["mean_ms"],
                s["p50_ms"],
                s["p95_ms"],
                s["p99_ms"],
                s["energy_mj"],
                f"{s['completed']}/{s['failed']}",
                s["switches"],
                plans,
            )
        )
    cal = result["calibration"]
    head = (
        f"{result['model']} on emulated {result['board']} | trace {result['trace']} x{result['bandwidth_scale']:g} "
        f"from {result['trace_offset_s']:g} s, rtt +{result['rtt_ms']:g} ms | load {result['load']} | "
        f"{result['rate_hz']:g} req/s, {result['duration_s']:g} s per strategy | link {result['link']}\n"
        f"board emulation: resnet50 {cal['measured_ms']:.0f} ms (target {cal['target_ms']:.0f} ms, "
        f"{cal['error_pct']:+.1f}%; "
        + (
            f"cgroup quota {cal['quota_cpus']:.3f} CPU)"
            if cal["quota_cpus"]
            else f"compute padded x{cal['pad_factor']:.2f})"
        )
    )
    head += " | host load average " + "/".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        head
        + "\n"
        + render(
            ["strategy", "mean ms", "p50 ms", "p95 ms", "p99 ms", "energy mJ", "done/failed", "switches", "plans"], rows
        )
    )


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance ratios for one run."""
    s = result["strategies"]
    if "adaptive" not in s or "oracle" not in s:
        return {}
    a, o = s["adaptive"], s["oracle"]
    others = [s[n]["mean_ms"] for n in ("device-only", "cloud-only", "static", "periodic") if n in s]
    best = min(others) if others else math.nan
    v = {
        "mean_vs_oracle": a["mean_ms"] / o["mean_ms"],
        "p95_vs_oracle": a["p95_ms"] / o["p95_ms"],
        "mean_vs_best_other": a["mean_ms"] / best if others else math.nan,
        "failed": sum(int(x["failed"]) for x in s.values()),
    }
    v["pass"] = bool(
        v["mean_vs_oracle"] <= 1.10
        and v["p95_vs_oracle"] <= 1.15
        and (not others or v["mean_vs_best_other"] <= 1.02)
        and v["failed"] == 0
    )
    # What splitting buys over whole-request routing (> 1: splitting is faster); not a pass criterion.
    if "route" in s:
        v["route_over_adaptive"] = s["route"]["mean_ms"] / a["mean_ms"]
    routers = [n for n in ("route", "route-codec") if n in s]
    if routers:  # the best router is the baseline (issue 34): adaptive / min(route, route-codec), <= 1 wanted
        best_router = min(routers, key=lambda n: s[n]["mean_ms"])
        v["best_router"] = best_router
        v["adaptive_over_best_router"] = a["mean_ms"] / s[best_router]["mean_ms"]
    if "oracle-route" in s:
        v["route_over_oracle"] = s["oracle-route"]["mean_ms"] / o["mean_ms"]
    return v


def report(result: dict[str, Any], *, json_path: str | None, plot_path: str | None) -> None:
    result["verdict"] = verdict(result)
    if json_path == "-":
        print(json.dumps(result, default=float))
    else:
        print(table_text(result))
        v = result["verdict"]
        if v:
            print(
                f"adaptive: mean {v['mean_vs_oracle']:.3f} x oracle, p95 {v['p95_vs_oracle']:.3f} x oracle, "
                f"mean {v['mean_vs_best_other']:.3f} x best other strategy"
            )
            if "adaptive_over_best_router" in v:
                print(
                    f"adaptive / best router ({v['best_router']}): {v['adaptive_over_best_router']:.3f} "
                    "(<= 1: never worse than routing the whole request)"
                )
            if "route_over_adaptive" in v:
                print(
                    f"split vs route (route mean / split mean, > 1: splitting pays): adaptive "
                    f"{v['route_over_adaptive']:.3f}"
                    + (f", oracle {v['route_over_oracle']:.3f}" if "route_over_oracle" in v else "")
                )
        if json_path:
            Path(json_path).write_text(json.dumps(result, indent=1, default=float))
            print(f"wrote {json_path}", file=sys.stderr)
    if plot_path and plot(result, plot_path):
        print(f"wrote {plot_path}", file=sys.stderr)


def plot(result: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: skipping the plot (pip install 'splitrt[plot]')", file=sys.stderr)
        return False
    tl = result["timeline"]
    fig, axes = plt.subplots(4, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [2, 0.6, 1.6, 2.6]})
    dur = float(result["duration_s"])
    bw = tl["bandwidth_mbps"]
    xs = [t for t, _ in bw] + [dur]
    ys = [r for _, r in bw] + [bw[-1][1]]
    axes[0].step(xs, ys, where="post", color="tab:blue")
    axes[0].set_ylabel("link Mbit/s")
    axes[0].set_title(
        f"{result['model']} on emulated {result['board']}, {result['trace']} "
        f"x{result['bandwidth_scale']:g}, load {result['load']}, link {result['link']}"
    )
    for a, b in tl["load_intervals"]:
        axes[1].axvspan(a, b, color="tab:red", alpha=0.4)
    axes[1].set_yticks([])
    axes[1].set_ylabel("load")
    colors = {
        "device-only": "tab:gray",
        "cloud-only": "tab:purple",
        "static": "tab:olive",
        "periodic": "tab:orange",
        "route": "tab:cyan",
        "route-codec": "tab:olive",
        "adaptive": "tab:green",
        "oracle": "black",
        "oracle-route": "tab:brown",
    }
    plans = sorted({p for reqs in tl["requests"].values() for _, _, p in reqs}, key=lambda p: (p != "device", p))
    idx = {p: i for i, p in enumerate(plans)}
    for name, reqs in tl["requests"].items():
        if not reqs:
            continue
        off = (list(colors).index(name) - 2.5) * 0.08 if name in colors else 0
        axes[2].plot(
            [t for t, _, _ in reqs], [idx[p] + off for _, _, p in reqs], ".", ms=4, color=colors.get(name), label=name
        )
        axes[3].plot(
            [t for t, _, _ in reqs],
            [ms for _, ms, _ in reqs],
            "-" if name == "oracle" else ".-",
            lw=0.8,
            ms=3,
            color=colors.get(name),
            label=name,
        )
    # Where adaptive changed its cut: the moments the demo is about.
    ad = tl["requests"].get("adaptive", [])
    for (_, _, p0), (t1, _, p1) in itertools.pairwise(ad):
        if p1 != p0:
            for ax in (axes[0], axes[2]):
                ax.axvline(t1, color="tab:green", ls="--", lw=0.8, alpha=0.7)
    axes[2].set_yticks(range(len(plans)), plans)
    axes[2].set_ylabel("plan")
    axes[3].set_ylabel("latency ms")
    axes[3].set_xlabel("time s")
    axes[3].legend(ncol=6, fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
