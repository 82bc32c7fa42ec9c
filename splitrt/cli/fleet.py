"""`splitrt rig fleet`: N emulated devices (own namespace, shaped link, CPU quota) against M servers,
one killed mid-run; throughput and latency of adaptive vs device-only, cloud-only and best static.
See splitrt.rig.bench (run_fleet). Registered under `splitrt rig` by splitrt.cli.bench."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from splitrt.cli.tables import render
from splitrt.rig import bench as fleet


def register(rig_sub: Any) -> None:
    d = fleet.FleetConfig()
    p = rig_sub.add_parser(
        "fleet", help="many emulated devices sharing servers, one server killed mid-run", description=__doc__
    )
    p.add_argument("--devices", type=int, default=d.devices)
    p.add_argument("--servers", type=int, default=d.servers)
    p.add_argument("--model", default=d.model, help="zoo name or .onnx file (default squeezenet)")
    p.add_argument("--traces", default=",".join(d.traces), help="shipped traces the devices play in turn")
    p.add_argument("--bandwidth-scale", type=float, default=d.bandwidth_scale, help="multiply every trace")
    p.add_argument(
        "--device-cpus",
        default=",".join(f"{c:g}" for c in d.device_cpus),
        help="CPU quota per device, cycled over the fleet (e.g. 0.04,0.08)",
    )
    p.add_argument("--server-cpus", type=float, default=d.server_cpus, help="CPU quota per server")
    p.add_argument("--server-workers", type=int, default=d.server_workers, help="tails a server runs at once")
    p.add_argument("--segment", type=float, default=d.segment_s, help="seconds each strategy runs per round")
    p.add_argument("--rounds", type=int, default=d.rounds, help="rounds of every strategy (rotating order)")
    p.add_argument(
        "--kill-at",
        type=float,
        default=d.kill_at_fraction,
        help="kill the last server at this fraction of every segment (<= 0: no kill)",
    )
    p.add_argument("--rate", type=float, default=d.rate_hz, help="requests/s per device (0: back to back)")
    p.add_argument("--codecs", default=",".join(d.codecs or ()), help="codecs the plans may use")
    p.add_argument("--strategies", default=",".join(d.strategies))
    p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON ('-': stdout)")
    p.add_argument("--keep-workdir", action="store_true", help="keep the servers' and devices' logs")
    p.set_defaults(func=cmd_fleet)


def config_from(args: argparse.Namespace) -> fleet.FleetConfig:
    return fleet.FleetConfig(
        devices=args.devices,
        servers=args.servers,
        model=args.model,
        traces=tuple(t for t in args.traces.split(",") if t),
        bandwidth_scale=args.bandwidth_scale,
        device_cpus=tuple(float(x) for x in args.device_cpus.split(",") if x),
        server_cpus=args.server_cpus,
        server_workers=args.server_workers,
        segment_s=args.segment,
        rounds=args.rounds,
        kill_at_fraction=args.kill_at if args.kill_at and args.kill_at > 0 else None,
        rate_hz=args.rate,
        codecs=tuple(c for c in args.codecs.split(",") if c) or None,
        strategies=tuple(s for s in args.strategies.split(",") if s),
    )


def cmd_fleet(args: argparse.Namespace) -> int:
    cfg = config_from(args)
    workdir = Path(tempfile.mkdtemp(prefix="splitrt-fleet-"))
    try:
        result = fleet.run_fleet(cfg, workdir, progress=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        if args.keep_workdir:
            print(f"fleet workdir: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json == "-":
        print(json.dumps(result, indent=1, default=float))
    else:
        print(table_text(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    return 1 if result["verdict"]["failed"] else 0


def _ci(c: dict[str, Any] | None, key: str) -> str:
    if not c:
        return "-"
    lo, hi = c[key]["ci"]
    return "-" if math.isnan(lo) else f"{lo:.2f}-{hi:.2f} {c[key]['call']}"


def table_text(result: dict[str, Any]) -> str:
    cfg = result["config"]
    servers = result["servers"]
    rows = []
    for name, s in result["strategies"].items():
        c = result["vs_adaptive"].get(name)
        util = "/".join(f"{100 * u:.0f}" for u in s["server_util"].values())
        per = "/".join(str(s["by_server"][a]) for a in servers)
        rows.append(
            (
                name,
                s["policy"].removeprefix("fixed:"),
                s["throughput_rps"],
                _ci(c, "throughput"),
                s["p50_ms"],
                s["p95_ms"],
                _ci(c, "p95"),
                s["p99_ms"],
                s["local"],
                per,
                util,
                f"{s['failed']}/{s['requests']}",
                s["moved"],
                "/".join(f"{x[0]:.2f}" for x in s["load_avg"]),
            )
        )
    cal, dm = result["calibration"], result["devices_model"]
    head = (
        f"fleet: {cfg['devices']} devices x {cfg['servers']} servers | {cfg['model']} | traces "
        f"{len(cfg['traces'])} HSDPA/FCC x{cfg['bandwidth_scale']:g} (median {cal['median_link_mbps']:.1f} "
        f"Mbit/s), no added RTT | device CPU {','.join(f'{c:g}' for c in cfg['device_cpus'])} "
        f"(whole model {min(cal['device_head_ms']):.0f}-{max(cal['device_head_ms']):.0f} ms) | server CPU "
        f"{cfg['server_cpus']:g} x{cfg['server_workers']} workers ({cal['server_ms']:.0f} ms) | "
        f"{cfg['rounds']} x {cfg['segment_s']:g} s per strategy, "
        + (
            f"server {servers[-1]} killed at {100 * cfg['kill_at_fraction']:.0f} % of each"
            if cfg["kill_at_fraction"]
            else "no kill"
        )
        + f"\ndevices: {dm['kind']}, {dm['rss_mb_each']:.0f} MB RSS each ({dm['rss_mb_total']:.0f} MB), "
        f"loaded in {dm['startup_s']:.0f} s | host load average before "
        + "/".join(f"{x:.2f}" for x in result["load_before"])
        + ", after "
        + "/".join(f"{x:.2f}" for x in result["load_after"])
    )
    table = render(
        [
            "strategy",
            "plan",
            "req/s",
            "req/s a/x 95%",
            "p50 ms",
            "p95 ms",
            "p95 a/x 95%",
            "p99 ms",
            "local",
            "per server",
            "server util %",
            "failed/req",
            "moved",
            "load 1m",
        ],
        rows,
    )
    v = result["verdict"]
    tail = "acceptance: " + ("PASS" if v["pass"] else "FAIL: " + "; ".join(v["reasons"]))
    return head + "\n" + table + "\n" + tail
