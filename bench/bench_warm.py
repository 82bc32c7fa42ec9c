"""The first request after a restart, with and without the warm start (``splitrt.cloud.models.warm``).

    .venv/bin/python bench/bench_warm.py [--model M] [--cut C] [--runs 3] [--delays-s 0,2] [--logs D] [--json]

Set-up: a models directory holding the zoo model; ``splitrt serve`` serves one request at ``--cut`` and
gets SIGTERM, so its ``.splitrt-warm.json`` names that cut. Then ``--runs`` rounds; in each, for each of
``--delays-s``, ``splitrt serve`` (defaults: builder child, workers = CPUs) is restarted on that
directory twice, the order alternating round by round: ``warm`` (the remembered pair made at start) and
``cold`` (``--no-warm``). Each restart: wait until the port accepts a TCP connection, then the delay (0:
a device that was waiting; 2: one that comes back a little later; squeezenet's warm-up took 1.2-2.0 s at
load 3), then one request over a new channel (its connection included; the head was run before the
server started). Reported: that request's end to end time and the ``build_ms`` the server put in its
reply (how long it waited for its tail), median and range over the runs, the time from the server's
``listening`` to its ``warm_done`` event, and the load average before and after. Default run: about 55 s
on 2 vCPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import free_port, progress

from splitrt.device.client import Device
from splitrt.graph import zoo
from splitrt.rig.cloudserver import start_server
from splitrt.transport import codec, wire
from splitrt.transport.grpc_transport import GrpcTransport


def _first_request(port: int, request: wire.Framed) -> tuple[float, float]:
    """(end to end ms over a new channel, the reply's build_ms)."""
    t0 = time.perf_counter()
    t = GrpcTransport(f"127.0.0.1:{port}")
    try:
        reply = t.infer(request, timeout_s=120)
    finally:
        t.close()
    ms = (time.perf_counter() - t0) * 1e3
    return ms, float(reply.header.build_ms)


def _warm_done_ms(log: Path) -> float | None:
    """From a server's log: ms from its ``listening`` event to its ``warm_done`` (None: no warm-up ran)."""
    ts: dict[str, float] = {}
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in ("listening", "warm_done"):
            ts.setdefault(str(event["event"]), float(event["ts"]))
    if "warm_done" not in ts or "listening" not in ts:
        return None
    return (ts["warm_done"] - ts["listening"]) * 1e3


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def _measure(args: argparse.Namespace, delays: list[float], work: Path) -> dict[str, dict[str, list[float]]]:
    models = work / "models"
    models.mkdir()
    model = models / f"{args.model}.onnx"
    shutil.copyfile(zoo.get(args.model), model)
    with Device(model, "127.0.0.1:1") as device:  # the head, run before any server starts
        head = device.run_head(device.random_inputs(0), args.cut)
        request = device._request(head, codec.Codec.parse("fp32"))[0]
    port = free_port()
    server = start_server(models, port=port, log_path=work / "serve-setup.log")
    try:
        _first_request(port, request)
    finally:
        server.stop()
    remembered = json.loads((models / ".splitrt-warm.json").read_text())["pairs"]
    progress("warm", f"remembered {remembered[0][0][:12]}@{remembered[0][1]}; {args.runs} rounds")
    rows: dict[str, dict[str, list[float]]] = {
        f"{d:g}/{v}": {"ms": [], "build_ms": [], "warm_ms": []} for d in delays for v in ("warm", "cold")
    }
    for i in range(args.runs):
        for delay in delays:
            for variant in ("warm", "cold") if i % 2 == 0 else ("cold", "warm"):
                log = work / f"serve-{i + 1}-{delay:g}s-{variant}.log"
                server = start_server(models, *([] if variant == "warm" else ["--no-warm"]), port=port, log_path=log)
                try:
                    time.sleep(delay)
                    ms, build_ms = _first_request(port, request)
                finally:
                    server.stop()
                row = rows[f"{delay:g}/{variant}"]
                row["ms"].append(ms)
                row["build_ms"].append(build_ms)
                warm_ms = _warm_done_ms(log)
                if warm_ms is not None:
                    row["warm_ms"].append(warm_ms)
                done = "-" if warm_ms is None else f"{warm_ms:.0f} ms"
                progress(
                    "warm",
                    f"round {i + 1}, {delay:g} s, {variant}: first request {ms:.0f} ms (waited {build_ms:.0f} ms for "
                    f"its tail; warm-up done {done} after listening)",
                )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet", help="zoo model (default squeezenet)")
    p.add_argument("--cut", default="c33", help="the cut served before the restarts (default c33)")
    p.add_argument("--runs", type=int, default=3, help="rounds, each one warm and one cold restart (default 3)")
    p.add_argument("--delays-s", default="0,2", help="comma-separated waits after the port listens, s (default 0,2)")
    p.add_argument("--logs", type=Path, metavar="DIR", help="keep each server's log there")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    delays = [float(x) for x in args.delays_s.split(",")]

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    try:
        rows = _measure(args, delays, work)
    finally:
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copyfile(log, args.logs / log.name)
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    out: dict[str, Any] = {
        "model": args.model,
        "cut": args.cut,
        "runs": args.runs,
        "delays_s": delays,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "variants": rows,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"first request after a restart: {args.model} at {args.cut}, {args.runs} runs each, alternating")
    head = ["sent after listening", "variant", "first request ms", "waited for its tail ms", "warm-up done ms"]
    table = [head]
    names = {"warm": "warm (remembered pair)", "cold": "cold (--no-warm)"}
    for key, r in rows.items():
        delay, variant = key.split("/")
        table.append([f"{delay} s", names[variant], _spread(r["ms"]), _spread(r["build_ms"]), _spread(r["warm_ms"])])
    widths = [max(len(row[c]) for row in table) for c in range(len(head))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("(median (range) over the runs; warm-up done: from the server's listening event to its warm_done)")
    la = " / ".join(" ".join(f"{x:.2f}" for x in la) for la in (load_before, load_after))
    print(f"load average before / after: {la}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
