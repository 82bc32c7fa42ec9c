"""The fleet rig (issue 15, item 5): 24 emulated devices (own namespace, own shaped link from a real
trace, own CPU quota) against 2 real `splitrt serve` processes with CPU quotas, the second server
killed in the middle of every strategy's run. Prints throughput, p50/p95/p99 latency, local
completions, requests and utilisation per server, failures, and what the kill moved, for adaptive vs
device-only, cloud-only and the best static plan, with 95 % bootstrap intervals of adaptive / other
and the host's load average beside every segment. Needs root (prints why and exits 0 without it).

    .venv/bin/python bench/bench_fleet.py [--devices 24] [--servers 2] [--segment 15] [--rounds 2] [--codecs all]
        [--json fleet.json]

Acceptance: adaptive has the best throughput at equal or better p95 than every fixed strategy, with 0
failed requests including the server kill. About 8 minutes at the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from splitrt.cli import fleet as fleetcli
from splitrt.rig import bench as fleet


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = fleet.FleetConfig()
    p.add_argument("--devices", type=int, default=d.devices)
    p.add_argument("--servers", type=int, default=d.servers)
    p.add_argument("--segment", type=float, default=d.segment_s, help="seconds per strategy per round")
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--bandwidth-scale", type=float, default=d.bandwidth_scale)
    p.add_argument(
        "--codecs",
        default=",".join(d.codecs or ()),
        help="codecs adaptive and the fixed plans may use ('' or all: every codec the guard allows, so adaptive's "
        "plans include route-codec's JPEG of the input); route-codec sends the input as an image whatever this is",
    )
    p.add_argument("--json", default=None, metavar="FILE")
    a = p.parse_args(argv)
    codecs = None if a.codecs in ("", "all") else tuple(a.codecs.split(","))
    if os.geteuid() != 0:
        print("bench_fleet: skipped: the fleet rig needs root (network namespaces, tc, cgroups)")
        return 0
    cfg = fleet.FleetConfig(
        devices=a.devices,
        servers=a.servers,
        segment_s=a.segment,
        rounds=a.rounds,
        bandwidth_scale=a.bandwidth_scale,
        codecs=codecs,
    )
    workdir = Path(tempfile.mkdtemp(prefix="splitrt-fleet-"))
    try:
        result = fleet.run_fleet(cfg, workdir, progress=lambda s: print(s, file=sys.stderr, flush=True))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(fleetcli.table_text(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, default=float))
    return 1 if result["verdict"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
