"""`splitrt demo`: the main job on an embedded default, for a new user's first `make demo`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TypedDict

import numpy as np

from splitrt.cli.tables import human_bytes, render
from splitrt.errors import ConfigError
from splitrt.graph import model as graph
from splitrt.graph import partition, zoo
from splitrt.graph.ort_errors import onnxruntime_errors

DEFAULT_MODEL = "resnet50"
# The rig part: a window where the best cut really moves, so every fixed choice is wrong part of the
# time. resnet50 on a Raspberry Pi 4 (device 490 ms) against cloud@int8 (150 KB + 80 ms RTT + 27 ms tail)
# breaks even near 2.5 Mbit/s; on hsdpa/car from 123 s the link climbs from 0.9 to 3 Mbit/s and falls
# back to 0.8, while a burst of other work doubles the device's time in the middle third: device-only is
# wrong in the middle, cloud-only at both ends, and static (the median-bandwidth pick: device) with
# device-only. Found by scanning every 12 s window of the shipped traces in `splitrt sim` for the one
# where each fixed strategy is furthest behind adaptive. 5 measured strategies x 12 s in 3 s turns, then
# the oracles; about 105 s on 2 vCPUs with the exactness table.
DEMO_TRACE = "hsdpa/car"
DEMO_OFFSET_S = 123.0
DEMO_DURATION_S = 12.0
DEMO_TURN_S = 3.0
DEMO_WARMUP_S = 1.0  # the bench's 2 s, halved: the warm-up starts with a probe, the estimate is right at once
DEMO_LOAD = "device-burst"
# route: the adaptive runtime over device and cloud only (whole-request routing), beside adaptive; route-codec:
# the same sending the input under the best allowed image codec (a camera router's JPEG). Adaptive's plans
# include both routers' (issue 34: never worse than the best router).
DEMO_STRATEGIES = (
    "device-only",
    "cloud-only",
    "static",
    "route",
    "route-codec",
    "adaptive",
    "oracle",
    "oracle-route",
)
ROUTERS = ("route", "route-codec")
DEMO_BOARD = "rpi4"
# A case where splitting does pay, simulated beside the rig run (the same decision logic, ~1 s):
# squeezenet on a Raspberry Pi 4 whose CPU other work holds at 3/4 (4x slower), on hsdpa/car at x5,
# per-channel int8 (+zstd) allowed. Routing sends the input (cloud@int8c+zstd, 130 KB) or runs the
# whole model on the busy device; splitting after the first fire module's squeeze (c5, 43 KB at
# int8c+zstd: ReLU zeros compress) beats both. Found with bench/bench_route.py --pays-sim.
JPEG_RATIO = 0.027
PAYS_CASE: dict[str, Any] = {
    "model": "squeezenet",
    "board": "rpi4",
    "device_load": 4.0,
    "trace": "hsdpa/car",
    "offset_s": 0.0,
    "duration_s": 30.0,
    "scale": 5.0,
    "codecs": ("fp32", "fp32+zstd", "fp16", "fp16+zstd", "int8c", "int8c+zstd"),
}


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main job on the embedded default model")
    p.add_argument("--model", default=DEFAULT_MODEL, choices=zoo.names())
    p.add_argument("--cuts", type=int, default=4, help="how many single-tensor cuts to prove exact")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-rig", action="store_true", help="only the exactness table (skip the rig run)")
    p.add_argument("--trace", default=DEMO_TRACE, help=f"bandwidth trace for the rig run (default {DEMO_TRACE})")
    p.add_argument("--trace-offset", type=float, default=DEMO_OFFSET_S)
    p.add_argument("--duration", type=float, default=DEMO_DURATION_S, help="seconds per strategy in the rig")
    p.add_argument(
        "--load",
        default=DEMO_LOAD,
        choices=["none", "device-burst"],
        help=f"other work on the device (default {DEMO_LOAD}: the middle third of the window)",
    )
    p.add_argument("--plot", default="splitrt-demo.png", help="timeline PNG ('' for none)")
    p.add_argument("--link", default="auto", choices=["auto", "kernel", "userspace"])
    p.set_defaults(func=cmd_demo)


class SplitCheck(TypedDict):
    cut: str
    tensor: str
    bytes: int
    head_flops_fraction: float
    max_rel_err: float
    exact: bool


def exactness_rows(model: str, count: int) -> list[SplitCheck]:
    """Split ``model`` at ``count`` evenly spread single-tensor cuts; compare with the full model."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    path = zoo.get(model)
    mg = graph.load(path)
    feeds = zoo.random_inputs(path, seed=1)
    with onnxruntime_errors(model, stage="run", feeds=feeds):
        full = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    single = [c for c in mg.cuts() if len(c.tensors) == 1 and c.id not in ("cloud", "device")]
    picks = [single[round(i * (len(single) - 1) / max(count - 1, 1))] for i in range(min(count, len(single)))]
    rows = []
    for k, c in enumerate(dict.fromkeys(picks)):
        print(f"\rsplitting {model} at {c.id} ({k + 1}/{len(picks)})", end="", file=sys.stderr, flush=True)
        head, tail = partition.head_tail(mg, c.id)
        with onnxruntime_errors(f"{model} split at {c.id}", stage="run", feeds=feeds):
            hs = ort.InferenceSession(head.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            ts = ort.InferenceSession(tail.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            mid = dict(zip(head.outputs, hs.run(list(head.outputs), feeds), strict=True))
            out = ts.run([o.name for o in mg.outputs], {n: mid[n] for n in tail.inputs})
        err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) or 1.0)) for a, b in zip(full, out, strict=True))
        rows.append(
            SplitCheck(
                cut=c.id,
                tensor=c.tensors[0].name,
                bytes=c.bytes,
                head_flops_fraction=c.head_flops_fraction,
                max_rel_err=err,
                exact=err <= 1e-5,
            )
        )
    print(file=sys.stderr)
    return rows


def cmd_demo(args: argparse.Namespace) -> int:
    rows = exactness_rows(args.model, args.cuts)
    if args.json:
        out: dict[str, Any] = {"model": args.model, "splits": rows}
        if not args.no_rig:
            out["rig"] = rig_part(args, quiet=True)
        print(json.dumps(out, default=float))
    else:
        print(f"{args.model}: head on the device, tail in the cloud, at {len(rows)} cuts")
        print(
            render(
                ["cut", "crossing tensor", "bytes sent", "head FLOPs", "max rel err", "exact"],
                [
                    (
                        r["cut"],
                        r["tensor"],
                        human_bytes(r["bytes"]),
                        f"{100 * r['head_flops_fraction']:.0f}%",
                        f"{r['max_rel_err']:.1e}",
                        "yes" if r["exact"] else "NO",
                    )
                    for r in rows
                ],
            )
        )
        if not args.no_rig:
            print(flush=True)
            rig_part(args, quiet=False)
    return 0 if all(r["exact"] for r in rows) else 1


def rig_part(args: argparse.Namespace, *, quiet: bool) -> dict[str, Any]:
    """The main job: every strategy in the rig on a real 3G trace, the table and the timeline."""
    from splitrt.cli import bench as cmd_bench
    from splitrt.rig import bench as rigbench

    cfg = rigbench.BenchConfig(
        model=args.model,
        trace=args.trace,
        trace_offset_s=args.trace_offset,
        duration_s=args.duration,
        turn_s=DEMO_TURN_S,
        load=args.load,
        warmup_s=DEMO_WARMUP_S,
        rate_hz=4.0,
        strategies=DEMO_STRATEGIES,
    )
    print(
        f"rig: {args.model} on an emulated {DEMO_BOARD}, {cfg.trace} from {cfg.trace_offset_s:g} s, load {cfg.load}, "
        f"{len([n for n in cfg.strategies if n not in rigbench.ORACLE_REFS])} strategies x {cfg.duration_s:g} s, "
        "then the oracles",
        file=sys.stderr,
    )
    result = cmd_bench.run(cfg, board=DEMO_BOARD, link=args.link)
    result["closing"] = closing(result, pays=pays_case())
    if not quiet:
        cmd_bench.report(result, json_path=None, plot_path=args.plot or None)
        print()
        print(closing_text(result["closing"]))
    else:
        result["verdict"] = cmd_bench.verdict(result)
    return result


FIXED = ("device-only", "cloud-only", "static")


def pays_case(case: dict[str, Any] | None = None) -> dict[str, Any]:
    """``PAYS_CASE`` simulated (``splitrt.rig.sim``): route and adaptive, mean and p95, and adaptive's plans."""
    import statistics
    from dataclasses import replace

    from splitrt.plan.controller import ControllerConfig
    from splitrt.plan.costmodel import is_image_codec
    from splitrt.profile import boards
    from splitrt.rig import models, sim, tracespec

    c = case or PAYS_CASE
    b = boards.load_board(c["board"])
    path = models.model_path_for(c["model"])
    prof = models.shipped_profile(c["model"])
    if prof is None:
        raise ConfigError(f"demo: expected a shipped profile of {c['model']!r}, found none")
    # planned as the rig plans: lossy codecs where the guard (measured once on the zoo's photographs, here
    # at every cut: the case is a split) allows them
    say = lambda m: print(f"demo: {m}", file=sys.stderr, flush=True)  # noqa: E731
    prof = models.guarded_profile(prof, path, say, inner_cuts=len(graph.load(path).cuts()))
    table = models.cost_table_for(prof, graph.file_sha256(path), b.cpu_speed_factor)
    window = tracespec.load_trace(c["trace"]).window(c["offset_s"], c["duration_s"]).scaled(c["scale"])
    rtt = tracespec.typical_rtt_ms(tracespec.load_trace(c["trace"]))
    cfg = sim.SimConfig(
        duration_s=c["duration_s"],
        rtt_ms=rtt,
        bursts=((-60.0, c["duration_s"] + 60.0),),  # other work holds 1 - 1/load of the CPU all along
        burst_util=1.0 - 1.0 / c["device_load"],
        controller=ControllerConfig(codecs=tuple(c["codecs"])),
    )
    out: dict[str, Any] = {
        "label": f"{c['model']}, {c['board']} at {c['device_load']:g}x load, {c['trace']} x{c['scale']:g}, simulated"
    }
    # what a router that sends the camera's JPEG (quality 90, 0.027 x fp32 on a real 224 x 224 photo:
    # bench/bench_route.py's INPUT_VARIANTS) gets in the same window
    # route-codec sends the input under the best image codec the profile allows; a profile without image
    # codecs: as a JPEG of the frame (JPEG_RATIO), the camera's own
    image = [k for k in table.codecs if is_image_codec(k)]
    routed = table if image else table.with_ratio_cap("cloud", JPEG_RATIO)
    everything = replace(cfg.controller, codecs=(*(cfg.controller.codecs or ()), *image))
    for name, tbl, policy, ctl in (
        ("route", table, "route", cfg.controller),
        ("adaptive", table, "adaptive", everything),
        ("route-codec", routed, "route-codec" if image else "route", cfg.controller),
    ):
        reqs = sim.simulate(tbl, policy, window, replace(cfg, controller=ctl))
        ms = sim.latencies(reqs)
        plans: dict[str, int] = {}
        for r in reqs:
            plans[r.plan] = plans.get(r.plan, 0) + 1
        top = max(plans, key=lambda k: plans[k])
        out[name] = {
            "mean_ms": statistics.fmean(ms),
            "p95_ms": float(np.percentile(ms, 95)),
            "plan": f"{top} {plans[top] / len(reqs):.0%}",
        }
    out["route_over_split"] = out["route"]["mean_ms"] / out["adaptive"]["mean_ms"]
    out["route_codec_over_split"] = out["route-codec"]["mean_ms"] / out["adaptive"]["mean_ms"]
    return out


def closing(result: dict[str, Any], *, pays: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each strategy's mean and p95 and their ratio to the oracle; whether adaptive beat every fixed
    strategy on mean or p95 (strictly); ``pays``: a case where splitting pays (``pays_case``)."""
    s = result["strategies"]
    o = s.get("oracle")
    rows = {
        n: {
            "mean_ms": s[n]["mean_ms"],
            "p95_ms": s[n]["p95_ms"],
            "mean_vs_oracle": s[n]["mean_ms"] / o["mean_ms"] if o else None,
            "p95_vs_oracle": s[n]["p95_ms"] / o["p95_ms"] if o else None,
        }
        for n in s
    }
    a = s.get("adaptive")
    beats = {f: bool(a and (a["mean_ms"] < s[f]["mean_ms"] or a["p95_ms"] < s[f]["p95_ms"])) for f in FIXED if f in s}
    route = {
        k: s[r]["mean_ms"] / s[n]["mean_ms"]
        for k, n, r in (("adaptive", "adaptive", "route"), ("oracle", "oracle", "oracle-route"))
        if n in s and r in s
    }
    return {
        "strategies": rows,
        "vs_routers": vs_routers(result),
        "adaptive_beats": beats,
        "adaptive_beats_every_fixed": bool(beats) and all(beats.values()),
        "route_over_split": route,
        **({"pays_case": pays} if pays else {}),
    }


def vs_routers(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Adaptive's mean over each router's, with a 95 % bootstrap interval over the turns and its call
    (``worse`` only when the whole interval is above 1)."""
    from splitrt.rig import regret

    s, reqs = result["strategies"], result.get("timeline", {}).get("requests", {})
    turn_s = float(result.get("turns", {}).get("turn_s", DEMO_TURN_S))

    def turns(name: str) -> list[list[float]]:
        got: dict[int, list[float]] = {}
        for t, ms, _plan in reqs.get(name, []):
            got.setdefault(int(t // turn_s), []).append(ms)
        return [got[k] for k in sorted(got)]

    out = {}
    for r in ROUTERS:
        if r in s and "adaptive" in s:
            ci = regret.bootstrap_ratio(turns("adaptive"), turns(r))
            out[r] = {"ratio": s["adaptive"]["mean_ms"] / s[r]["mean_ms"], "ci": list(ci), "call": regret.call(ci)}
    return out


def closing_text(c: dict[str, Any]) -> str:
    rows = [
        (
            n,
            f"{r['mean_ms']:.0f}",
            f"{r['p95_ms']:.0f}",
            f"{r['mean_vs_oracle']:.2f}" if r["mean_vs_oracle"] else "-",
            f"{r['p95_vs_oracle']:.2f}" if r["p95_vs_oracle"] else "-",
        )
        for n, r in c["strategies"].items()
    ]
    lost = [f for f, ok in c["adaptive_beats"].items() if not ok]
    verdict = (
        "adaptive beats every fixed strategy (" + ", ".join(c["adaptive_beats"]) + ") on mean or p95"
        if c["adaptive_beats_every_fixed"]
        else f"adaptive does not beat {', '.join(lost)} here"
    )
    pc = c.get("pays_case")
    if pc:
        rows += [
            (f"{n} [{pc['label']}]", f"{pc[n]['mean_ms']:.0f}", f"{pc[n]['p95_ms']:.0f}", "-", "-")
            for n in ("route", "route-codec", "adaptive")
        ]
    vr = c.get("vs_routers", {})
    if vr:
        verdict += "\nadaptive vs the routers (adaptive mean / router mean, 95 % CI over turns): " + ", ".join(
            f"{k} {v['ratio']:.3f} ({v['ci'][0]:.3f}-{v['ci'][1]:.3f}, {v['call']})" for k, v in vr.items()
        )
    r = c.get("route_over_split", {})
    if r:
        verdict += (
            "\nsplitting vs routing whole requests (route mean / split mean, > 1: splitting pays): "
            + ", ".join(f"{k} {v:.3f}" for k, v in r.items())
            + "; where splitting pays for your model: splitrt plan MODEL --explain"
        )
    if pc:
        verdict += (
            f"\nwhere splitting pays ({pc['label']}): route/split {pc['route_over_split']:.3f}, adaptive runs "
            f"{pc['adaptive']['plan']}, route {pc['route']['plan']}, route-codec {pc['route-codec']['plan']} "
            f"(route-codec/split {pc['route_codec_over_split']:.3f})"
        )
    return render(["strategy", "mean ms", "p95 ms", "mean / oracle", "p95 / oracle"], rows) + "\n" + verdict
