"""The runtime's own CPU per request, per policy: what ``AdaptiveDevice.infer`` spends besides the head, the
encode, the call and the tail (issue 34: adaptive against the routers when both use the same plan).

One process, a real ``splitrt serve`` on 127.0.0.1, the zoo model with a real photograph as its input, one
runtime per policy (the rig's settings: every codec of the guarded table, ``warm_sessions=False``, no
prober thread) sharing one device session. The policies take turns request by request (the order shuffled
per round) so the host's load hits all of them alike. Per request, the calling thread's CPU time
(``time.thread_time``) split into: ``decide`` (``_decide``: estimates + ``Policy.decide``), ``observe``
(estimators), ``correct`` (corrections) and the rest of ``infer``'s bookkeeping (balancer, path parsing,
the decision record, the log line), all excluding ``run_head`` and ``Dispatcher.finish`` (head, encode,
RPC, tail), which are reported apart. Means with 95 % intervals (normal, over requests); the load
average beside them (this host is shared: read the columns against each other, not alone).

    .venv/bin/python bench/bench_overhead.py [--model resnet50] [--requests 200] [--log] [--json]

``--log``: every runtime writes its decision log (to /dev/null), as a daemon with ``--decision-log`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import progress

from splitrt.cli.tables import render
from splitrt.rig import models as rigmodels
from splitrt.rig.cloudserver import start_server

POLICIES = ("adaptive", "route", "route-codec")
PARTS = ("decide", "observe", "correct", "other", "head+finish")


class Timed:
    """Thread CPU ms spent inside wrapped callables, per part, for the request in progress."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.ms[part] = self.ms.get(part, 0.0) + (time.thread_time() - c0) * 1e3

        return timed


def ci95(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    h = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, m - h, m + h


def runtimes(args: argparse.Namespace, address: str, timed: Timed, log: Any) -> dict[str, Any]:
    from splitrt.device.client import Device, DeviceConfig
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.graph import model as graph
    from splitrt.plan.controller import ControllerConfig

    model_file = rigmodels.model_path_for(args.model)
    mg = graph.load(model_file)
    prof = rigmodels.profile_for(args.model, model_file, Path(tempfile.gettempdir()), lambda m: progress("overhead", m))
    prof = rigmodels.guarded_profile(prof, model_file, lambda m: progress("overhead", m))
    table = rigmodels.cost_table_for(prof, mg.sha256, 1.0)
    dcfg = DeviceConfig(intra_op_threads=1, timeout_s=30.0)
    local = Device(mg, None, config=dcfg)
    local.run_head = timed.wrap("head+finish", local.run_head)  # type: ignore[method-assign]
    devs = {}
    for policy in POLICIES:
        rc = RuntimeConfig(policy=policy, warm_sessions=False, controller=ControllerConfig(codecs=None))
        dev = AdaptiveDevice(mg, table, [address], config=rc, device_config=dcfg, start_prober=False, log=log)
        dev.local = local
        dev._dispatch.local = local
        dev._dispatch.finish = timed.wrap("head+finish", dev._dispatch.finish)  # type: ignore[method-assign]
        for name, part in (("_decide", "decide"), ("_observe", "observe"), ("_correct", "correct")):
            setattr(dev, name, timed.wrap(part, getattr(dev, name)))
        if args.mbps > 0:  # the rig's slow link, so every policy plans the input as a JPEG (one plan for all)
            est = dev.link.estimate
            dev.link.estimate = lambda now, est=est: replace(est(now), bandwidth_mbps=args.mbps)  # type: ignore[method-assign]
        for c in dev._clouds.all():
            c.link.probe = count_probes(policy, c.link.probe)
        devs[policy] = dev
    return devs


PROBES: dict[str, list[int]] = {}


def count_probes(policy: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``Transport.probe`` counting calls and bytes (up + down) per policy."""

    def counted(up: int, down: int, **kw: Any) -> Any:
        got = PROBES.setdefault(policy, [0, 0])
        got[0] += 1
        got[1] += up + down
        return fn(up, down, **kw)

    return counted


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from splitrt.graph import photos

    models = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    shutil.copyfile(rigmodels.model_path_for(args.model), models / f"{args.model}.onnx")
    server = start_server(models, "--workers", "1", "--intra-op-threads", "1", port=0, timeout_s=300)
    timed = Timed()
    log = open(os.devnull, "w") if args.log else None  # noqa: SIM115 (closed below)
    rows: dict[str, dict[str, list[float]]] = {p: {k: [] for k in (*PARTS, "total")} for p in POLICIES}
    plans: dict[str, dict[str, int]] = {p: {} for p in POLICIES}
    load_start = os.getloadavg()
    try:
        devs = runtimes(args, server.address, timed, log)
        inputs = photos.photo_inputs(next(iter(devs.values())).graph.inputs)
        if inputs is None:
            raise SystemExit(f"{args.model}: no photograph fits its input")
        for dev in devs.values():  # warm: channels, the server's tail, the estimators
            for _ in range(args.warmup):
                dev.probe_once()
                dev.infer(inputs)
        rng = random.Random(0)
        for i in range(args.requests):
            order = list(POLICIES)
            rng.shuffle(order)
            for policy in order:
                devs[policy].probe_once()  # outside the measured request, as the rig's prober thread
                timed.ms = {}
                c0 = time.thread_time()
                out = devs[policy].infer(inputs)
                total = (time.thread_time() - c0) * 1e3
                own = {k: timed.ms.get(k, 0.0) for k in PARTS[:-2]} | {"head+finish": timed.ms.get("head+finish", 0.0)}
                own["other"] = total - sum(own.values())
                for k, v in own.items():
                    rows[policy][k].append(v)
                rows[policy]["total"].append(total - own["head+finish"])
                plans[policy][out.plan] = plans[policy].get(out.plan, 0) + 1
            if (i + 1) % 50 == 0:
                progress("overhead", f"{i + 1}/{args.requests} rounds")
        elapsed = {p: PROBES.get(p, [0, 0]) for p in POLICIES}
        for dev in devs.values():
            dev.close()
    finally:
        server.stop()
        shutil.rmtree(models, ignore_errors=True)
        if log is not None:
            log.close()
    summary = {p: {k: ci95(v) for k, v in rows[p].items()} for p in POLICIES}
    diffs = {}
    for p in POLICIES[1:]:
        d = [a - b for a, b in zip(rows["adaptive"]["total"], rows[p]["total"], strict=True)]
        diffs[f"adaptive - {p}"] = ci95(d)
    return {
        "model": args.model,
        "requests": args.requests,
        "log": args.log,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "plans": plans,
        "own_cpu_ms": summary,
        "diff_ms": diffs,
        "mbps": args.mbps,
        "probes": {
            p: {"calls": n, "bytes": b, "bytes_per_request": b / max(1, args.requests + args.warmup)}
            for p, (n, b) in elapsed.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--requests", type=int, default=200, help="rounds (one request per policy each)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mbps", type=float, default=2.0, help="the link estimate's bandwidth (0: as measured)")
    ap.add_argument("--log", action="store_true", help="write decision logs (to /dev/null)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    doc = measure(args)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
        return 0

    def fmt(t: tuple[float, float, float]) -> str:
        return f"{t[0]:.3f} ({t[1]:.3f}-{t[2]:.3f})"

    own = doc["own_cpu_ms"]
    header = ["policy", "plans", *[f"{k} ms" for k in PARTS], "own total ms (95 % CI)"]
    body = [
        [
            p,
            ", ".join(f"{k} x{n}" for k, n in doc["plans"][p].items()),
            *[fmt(own[p][k]) for k in PARTS],
            fmt(own[p]["total"]),
        ]
        for p in POLICIES
    ]
    print(
        f"thread CPU per request, {doc['model']}, {doc['requests']} rounds, link estimate {doc['mbps']:g} Mbit/s, "
        f"decision log {'on' if doc['log'] else 'off'}"
    )
    print(render(header, body))
    print(render(["paired difference", "ms CPU (95 % CI)"], [[k, fmt(v)] for k, v in doc["diff_ms"].items()]))
    print(
        render(
            ["policy", "probes", "probe bytes", "probe bytes / request"],
            [[p, str(v["calls"]), str(v["bytes"]), f"{v['bytes_per_request']:.0f}"] for p, v in doc["probes"].items()],
        )
    )
    la0, la1 = doc["load_average_start"], doc["load_average_end"]
    start, end = ("/".join(f"{x:.2f}" for x in la) for la in (la0, la1))
    print(f"load average: start {start}, end {end} (a shared host: read the policies against each other)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
