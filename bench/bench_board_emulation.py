"""What the rig's emulated board adds to one remote call: the waits of a woken thread under a CPU quota.

The rig emulates a board with a CPU quota (``splitrt.rig.cgroup``: a fraction of one CPU in short CFS periods,
pinned to one CPU). Busy-loops in the same cgroup (``loops``, the rig's busy board until 2026-12-07) take a
period's quota first; a thread that wakes once it is spent waits for the next period. A remote call wakes the
device's threads several times (the caller, gRPC's poller, the reply), so each call may wait periods that a
board's own scheduler, which runs a woken thread at once, would not make it wait; the link estimator then
reads those waits as a slow link. The rig now shrinks the board's quota to the device's share instead and
keeps the busy-loops aside (``share``, ``cgroup.share_with``). This measures both: a process in the board's
cgroup calls a gRPC echo server outside it (127.0.0.1, 64 B) every 50 ms, per CFS period, number of
busy-loops and emulation, in rounds that alternate the configurations; the unthrottled call is the baseline.
Root only (cgroups).

    sudo .venv/bin/python bench/bench_board_emulation.py [--cpu-fraction 0.17] [--periods-ms 20,6]
        [--busy 0,1,3] [--emulation loops,share] [--calls 40] [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from _common import run_commit

from splitrt.cli.tables import render
from splitrt.rig.cgroup import MIN_FRACTION, CpuThrottle, share_with

# The device side: N echo calls 50 ms apart, their round trips (ms) as JSON on stdout. It waits for a line
# on stdin first, so that it is in its cgroup (and its busy-loops beside it) before the first call.
CALLER = """
import json, sys, time, grpc
ch = grpc.insecure_channel(sys.argv[1])
echo = ch.unary_unary("/bench.Echo/Echo", request_serializer=None, response_deserializer=None)
echo(b"x" * 64, timeout=10)
print("ready", flush=True)
sys.stdin.readline()
out = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    echo(b"x" * 64, timeout=10)
    out.append((time.perf_counter() - t) * 1e3)
    time.sleep(0.05)
print(json.dumps(out), flush=True)
"""
BUSY = "while True: pass"


def echo_server() -> tuple[grpc.Server, int]:
    """A gRPC server on 127.0.0.1 whose one method returns its request (no proto: bytes in, bytes out)."""
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def calls(port: int, n: int, period_us: int | None, fraction: float, busy: int, share: bool) -> list[float]:
    """Round trips (ms) of ``n`` calls from a process in a board cgroup (None: no cgroup) with ``busy``
    busy-loops beside it, all pinned to CPU 0 as the rig pins a board; ``share``: the busy-loops wait
    aside and the board's quota shrinks to the caller's share (``cgroup.share_with``, the rig's loads)."""
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, f"127.0.0.1:{port}", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    loops: list[subprocess.Popen[str]] = []
    try:
        assert caller.stdout is not None and caller.stdin is not None
        if caller.stdout.readline().strip() != "ready":
            raise RuntimeError("the caller did not reach the server")
        name = f"spl-bench-board-{os.getpid()}"
        with (
            CpuThrottle(name, None if period_us is None else fraction, period_us=period_us or 100_000) as g,
            CpuThrottle(f"{name}-aside", MIN_FRACTION, period_us=period_us or 100_000) as aside,
        ):
            loops = [subprocess.Popen([sys.executable, "-c", BUSY], text=True) for _ in range(busy)]
            for p in (caller, *loops):
                os.sched_setaffinity(p.pid, {0})
                if period_us is not None:
                    g.add_pid(p.pid)
            with share_with(g, aside, [p.pid for p in loops]) if share else contextlib.nullcontext():
                time.sleep(0.5)  # the busy-loops take their share before the first call
                caller.stdin.write("go\n")
                caller.stdin.flush()
                line = caller.stdout.readline()
            for p in loops:
                p.kill()
                p.wait()
        return [float(x) for x in json.loads(line)]
    finally:
        for p in (*loops, caller):
            if p.poll() is None:
                p.kill()
                p.wait()


def median_ci(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median."""
    rng = np.random.default_rng(seed)
    a = np.asarray(xs)
    meds = np.median(rng.choice(a, size=(n, len(a))), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-fraction", type=float, default=0.17, help="the board's quota (rpi4 on this host: ~0.17)")
    p.add_argument("--periods-ms", default="20,6", help="CFS periods to compare (the rig's: 20)")
    p.add_argument("--busy", default="0,1,3", help="busy-loops beside the caller (device-burst: 1, device-busy: 3)")
    p.add_argument(
        "--emulation",
        default="loops,share",
        help="how busy-loops hold the board: loops (under its quota), share (aside, its quota shrunk: the rig's)",
    )
    p.add_argument("--calls", type=int, default=40, help="calls per configuration per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None, metavar="FILE", help="FILE '-': stdout")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_board_emulation: needs root (cgroups)", file=sys.stderr)
        return 2
    periods = [round(float(x) * 1000) for x in a.periods_ms.split(",")]
    modes = a.emulation.split(",")
    if not set(modes) <= {"loops", "share"}:
        p.error(f"--emulation: expected loops and/or share, got {a.emulation!r}")
    configs: list[tuple[int | None, int, str]] = [(None, 0, "-")] + [
        (per, b, m) for per in periods for b in map(int, a.busy.split(",")) for m in modes if b or m == modes[0]
    ]
    load_start = list(os.getloadavg())
    server, port = echo_server()
    got: dict[tuple[int | None, int, str], list[float]] = {c: [] for c in configs}
    try:
        for r in range(a.rounds):
            for c in configs if r % 2 == 0 else configs[::-1]:
                print(
                    f"[board] round {r + 1}/{a.rounds}: period {c[0]} us, {c[1]} busy-loops ({c[2]})",
                    file=sys.stderr,
                    flush=True,
                )
                got[c] += calls(port, a.calls, c[0], a.cpu_fraction, c[1], c[2] == "share")
    finally:
        server.stop(None)
    base = statistics.median(got[(None, 0, "-")])
    rows: list[dict[str, Any]] = []
    for (per, busy, mode), xs in got.items():
        lo, hi = median_ci(xs)
        rows.append(
            {
                "board": "unthrottled" if per is None else f"{a.cpu_fraction:g} CPU",
                "period_ms": None if per is None else per / 1000,
                "busy_loops": busy,
                "emulation": mode if busy else "-",
                "calls": len(xs),
                "median_ms": round(statistics.median(xs), 2),
                "median_95ci_ms": [round(lo, 2), round(hi, 2)],
                "p90_ms": round(float(np.percentile(xs, 90)), 2),
                "median_over_unthrottled_ms": round(statistics.median(xs) - base, 2),
            }
        )
    doc = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": run_commit(),
        "cpu_fraction": a.cpu_fraction,
        "rows": rows,
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
    }
    print(
        render(
            [
                "board",
                "period ms",
                "busy-loops",
                "emulation",
                "calls",
                "median ms [95 % CI]",
                "p90 ms",
                "median - unthrottled",
            ],
            [
                [
                    r["board"],
                    "-" if r["period_ms"] is None else f"{r['period_ms']:g}",
                    r["busy_loops"],
                    r["emulation"],
                    r["calls"],
                    f"{r['median_ms']:.1f} [{r['median_95ci_ms'][0]:.1f}, {r['median_95ci_ms'][1]:.1f}]",
                    f"{r['p90_ms']:.1f}",
                    f"{r['median_over_unthrottled_ms']:+.1f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        "load average (1/5/15 min) at start "
        + "/".join(f"{x:.2f}" for x in load_start)
        + ", at end "
        + "/".join(f"{x:.2f}" for x in doc["load_average_end"])
        + " (a shared host: read the figures beside it)"
    )
    if a.json:
        text = json.dumps(doc, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
