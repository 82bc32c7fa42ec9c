"""Does the shaped link deliver the trace's bandwidth? Per-step table: target vs measured goodput.

A bulk TCP flow runs through the link while a trace plays on it; for every step of the trace the
goodput the receiver got (after the first ``--skip`` seconds of the step) is compared with the trace.
Links: ``kernel`` (root: ``shaper.PortShaper`` on a bridge port, both directions, as the rig shapes a
device) and ``userspace`` (the shaping relay on 127.0.0.1, with a one-way delay). Also measures the
request/response RTT through the relay against ``2 * delay``.

The bottleneck queue (the switch port, or its ifb) is not local to the sending TCP, so TCP Small Queues
do not hold it back: drop-tail losses there (no AQM qdisc in this kernel) release out-of-order data in
bursts and a step right after a rate decrease can read high.

    .venv/bin/python bench/bench_link.py [--trace hsdpa/bus --window 30] [--links kernel,userspace] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time

from splitrt.rig import netns, shaper, traces


def _trace(args: argparse.Namespace) -> traces.Trace:
    if args.trace:
        t = traces.load_shipped(args.trace).window(args.start, args.window).scaled(args.scale)
        return t.clipped(min_mbps=0.2)
    return traces.step([float(x) for x in args.steps.split(",")], args.step_s)


def _kernel_runs(tr: traces.Trace, skip_s: float) -> list[tuple[str, list[shaper.StepResult]]]:
    """Host 0's port of a bridge shaped both ways, as the rig shapes a device's link."""
    out = []
    with netns.make_lan(f"spl-bl{os.getpid()}", 2) as lan:
        a, b = lan.hosts
        ks = shaper.PortShaper(lan.switch_ns, 1)
        for name, src, dst in (("kernel port up", a, b), ("kernel port down", b, a)):
            print(f"[bench_link] {name} ...", file=sys.stderr)
            rx = shaper.BulkReceiver(dst.ip, 0, dst.ns)
            try:
                out.append(
                    (name, shaper.measure_steps(ks, tr, rx, (dst.ip, rx.port), send_netns=src.ns, skip_s=skip_s))
                )
            finally:
                rx.close()
    return out


def _userspace_run(tr: traces.Trace, skip_s: float, delay_ms: float) -> list[shaper.StepResult]:
    print("[bench_link] userspace relay ...", file=sys.stderr)
    rx = shaper.BulkReceiver("127.0.0.1", 0)
    try:
        with shaper.UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", rx.port), delay_ms=delay_ms) as ul:
            return shaper.measure_steps(ul, tr, rx, ("127.0.0.1", ul.port), skip_s=skip_s)
    finally:
        rx.close()


def relay_rtt_ms(delay_ms: float, n: int = 20) -> list[float]:
    """Round trips of a 100-byte request/response through the relay (echo server on 127.0.0.1)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    th = threading.Thread(target=echo, daemon=True)
    th.start()
    rtts = []
    with (
        shaper.UserspaceLink(("127.0.0.1", 0), srv.getsockname()[:2], rate_mbps=10, delay_ms=delay_ms) as ul,
        socket.create_connection(("127.0.0.1", ul.port)) as c,
    ):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            c.sendall(b"x" * 100)
            got = 0
            while got < 100:
                got += len(c.recv(4096))
            rtts.append((time.perf_counter() - t0) * 1000)
    srv.close()
    return rtts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="8,2,5,1,10,3", help="synthetic step trace levels, Mbit/s")
    ap.add_argument("--step-s", type=float, default=2.0)
    ap.add_argument("--trace", help="shipped trace name instead of steps (e.g. hsdpa/bus)")
    ap.add_argument("--start", type=float, default=0.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--skip", type=float, default=0.4, help="seconds skipped at the start of each step")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay of the userspace relay")
    ap.add_argument("--links", default="kernel,userspace")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tr = _trace(args)
    runs: list[tuple[str, list[shaper.StepResult]]] = []
    links = args.links.split(",")
    notes = []
    if "kernel" in links:
        if os.geteuid() == 0:
            runs += _kernel_runs(tr, args.skip)
        else:
            notes.append("kernel link skipped: needs root")
    if "userspace" in links:
        runs.append((f"userspace relay +{args.delay_ms:g}ms", _userspace_run(tr, args.skip, args.delay_ms)))
    rtts = relay_rtt_ms(args.delay_ms)
    result = {
        "trace": tr.name,
        "skip_s": args.skip,
        "links": {
            name: [
                {
                    "start_s": r.start_s,
                    "end_s": r.end_s,
                    "target_mbps": r.target_mbps,
                    "measured_mbps": round(r.measured_mbps, 4),
                    "error_pct": round(r.error_pct, 2),
                }
                for r in res
            ]
            for name, res in runs
        },
        "max_abs_error_pct": {name: round(max(abs(r.error_pct) for r in res), 2) for name, res in runs},
        "relay_rtt_ms": {
            "delay_ms": args.delay_ms,
            "expected_min_ms": 2 * args.delay_ms,
            "median_ms": round(statistics.median(rtts), 2),
            "max_ms": round(max(rtts), 2),
        },
        "notes": notes,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"trace {tr.name}, first {args.skip:g} s of each step skipped")
    print(f"{'link':<26} {'step':>11} {'target':>8} {'measured':>9} {'error':>7}")
    for name, res in runs:
        for r in res:
            print(
                f"{name:<26} {r.start_s:5.1f}-{r.end_s:<5.1f} {r.target_mbps:8.2f} {r.measured_mbps:9.2f} "
                f"{r.error_pct:+6.1f}%"
            )
    for name, err in result["max_abs_error_pct"].items():  # type: ignore[attr-defined]
        print(f"max |error| {name}: {err:.1f}%")
    rr = result["relay_rtt_ms"]
    print(
        f"relay RTT with {args.delay_ms:g} ms one-way delay: median {rr['median_ms']:.1f} ms, "  # type: ignore[index]
        f"max {rr['max_ms']:.1f} ms (>= {2 * args.delay_ms:g} expected)"
    )  # type: ignore[index]
    for n in notes:
        print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
