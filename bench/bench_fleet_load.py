"""Issue 15, item 7: a fleet's load on one cloud server, with the server's memory sampled over time.

    .venv/bin/python bench/bench_fleet_load.py [--devices 8] [--requests 10000] [--quick] [--json]

``--devices`` device processes (each its own gRPC channel and Python interpreter, so the devices do not
share a GIL) send the squeezenet zoo model's middle cut to one ``splitrt serve`` on 127.0.0.1
(``--workers`` tail workers, one onnxruntime thread each) as fast as it answers, ``--requests`` in all
(the issue's figure: 8 devices sharing 10 000 requests). Each device computes its head once (the
server is what is measured) and checks the outputs of its first request and of every 1000th against
its own run of the tail (zoo weights are random: a wrong split does not match).

Printed: throughput, latency p50/p99 (send to reply), errors by status code, wrong outputs, the
server's RSS at the start (after warm-up), its maximum and at the end, sampled every
``--sample-s`` seconds (the series is in ``--json``), and the load average of the host beside it.
``--quick``: 8 devices, 1000 requests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from splitrt.cli.tables import render
from splitrt.rig.cloudserver import ServerProcess, start_server


def _progress(msg: str) -> None:
    print(f"[fleet-load] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def device_worker(address: str, model: str, cut: str, seed: int, count: int) -> None:
    """One device (``--device-worker``): warm up, print ``ready``, wait for a line on stdin, send
    ``count`` requests, print one JSON line of results."""
    from splitrt.device.client import Device, DeviceConfig

    with Device(model, address, config=DeviceConfig(timeout_s=30, intra_op_threads=1, upload=False)) as dev:
        head = dev.run_head(dev.random_inputs(seed=seed), cut)
        ref = dev.finish_locally(head).outputs
        for _ in range(5):
            dev.send(head)
        print("ready", flush=True)
        sys.stdin.readline()
        lat: list[float] = []
        errors: dict[str, int] = {}
        wrong = 0
        t0 = time.perf_counter()
        for i in range(count):
            t = time.perf_counter()
            try:
                res = dev.send(head)
            except Exception as exc:  # counted by code, reported
                key = str(getattr(exc, "code", type(exc).__name__))
                errors[key] = errors.get(key, 0) + 1
                continue
            lat.append((time.perf_counter() - t) * 1e3)
            if i % 1000 == 0:
                wrong += int(any(not np.allclose(res.outputs[k], v, rtol=1e-4, atol=1e-6) for k, v in ref.items()))
        print(
            json.dumps({"latency_ms": lat, "errors": errors, "wrong": wrong, "seconds": time.perf_counter() - t0}),
            flush=True,
        )


def _serve(models: Path, workers: int) -> ServerProcess:
    flags = ("--host", "127.0.0.1", "--workers", str(workers), "--intra-op-threads", "1", "--max-queue", "64")
    return start_server(models, *flags, port=0, env={**os.environ, "OMP_NUM_THREADS": "1"})


class Sampler:
    """The server's RSS (MiB) and the host's 1-minute load average every ``period_s``, on a thread."""

    def __init__(self, pid: int, period_s: float) -> None:
        self.proc, self.period_s = psutil.Process(pid), period_s
        self.samples: list[tuple[float, float, float]] = []  # (t_s, rss_mb, load_1m)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss / 2**20
            except psutil.Error:
                rss = -1.0  # the server is gone: shows in the series
            self.samples.append((round(time.monotonic() - self._t0, 2), round(rss, 1), os.getloadavg()[0]))
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    from splitrt.graph import model as graph
    from splitrt.graph import zoo

    models = tmp / "models"
    models.mkdir()
    model = models / "squeezenet.onnx"
    shutil.copyfile(zoo.get("squeezenet"), model)
    g = graph.load(model)
    cuts = g.cuts()
    cut = cuts[len(cuts) // 2]
    served = _serve(models, args.workers)
    proc, address = served.proc, served.address
    load_start = os.getloadavg()
    share = [args.requests // args.devices + (i < args.requests % args.devices) for i in range(args.devices)]
    devices = [
        subprocess.Popen(
            [sys.executable, __file__, "--device-worker", address, str(model), cut.id, str(i), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for i, n in enumerate(share)
    ]
    try:
        for d in devices:
            assert d.stdout is not None
            if d.stdout.readline().strip() != "ready":
                raise SystemExit("a device worker failed to warm up")
        _progress(f"{args.devices} devices ready; {args.requests} requests to {address}")
        server = psutil.Process(proc.pid)
        rss_start = server.memory_info().rss / 2**20
        with Sampler(proc.pid, args.sample_s) as sampler:
            t0 = time.perf_counter()
            for d in devices:
                assert d.stdin is not None
                d.stdin.write("go\n")
                d.stdin.flush()
            outs = []
            for d in devices:
                assert d.stdout is not None
                outs.append(json.loads(d.stdout.readline()))
                d.wait(60)
            wall = time.perf_counter() - t0
        rss_end = server.memory_info().rss / 2**20
    finally:
        for d in devices:
            if d.poll() is None:
                d.kill()
        served.stop(15)
    lat = [x for o in outs for x in o["latency_ms"]]
    errors: dict[str, int] = {}
    for o in outs:
        for k, v in o["errors"].items():
            errors[k] = errors.get(k, 0) + v
    series = sampler.samples
    rss = [s[1] for s in series if s[1] >= 0] or [rss_end]
    return {
        "model": "squeezenet",
        "cut": cut.id,
        "crossing_bytes": cut.bytes,
        "devices": args.devices,
        "server_workers": args.workers,
        "cpus": os.cpu_count(),
        "requests": len(lat) + sum(errors.values()),
        "ok": len(lat),
        "errors": errors,
        "wrong_outputs": sum(o["wrong"] for o in outs),
        "seconds": round(wall, 2),
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(pct(lat, 0.5), 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "rss_start_mb": round(rss_start, 1),
        "rss_max_mb": max(rss),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 1),
        "load_avg_start": [round(v, 2) for v in load_start],
        "load_avg_end": [round(v, 2) for v in os.getloadavg()],
        "rss_series": [{"t_s": t, "rss_mb": r, "load_1m": round(la, 2)} for t, r, la in series],
    }


def print_table(r: dict[str, object]) -> None:
    print(
        f"Fleet load: {r['devices']} device processes -> 1 server ({r['server_workers']} workers, "
        f"{r['cpus']} CPUs), squeezenet @ {r['cut']} ({r['crossing_bytes']} B crossing); load average "
        f"{r['load_avg_start'][0]} -> {r['load_avg_end'][0]} (1 min)"
    )  # type: ignore[index]
    cols = [
        "requests",
        "ok",
        "wrong_outputs",
        "requests_per_s",
        "p50_ms",
        "p99_ms",
        "rss_start_mb",
        "rss_max_mb",
        "rss_end_mb",
        "rss_growth_pct",
    ]
    print(render([*cols, "errors"], [[r[c] for c in cols] + [json.dumps(r["errors"])]]))
    series = r["rss_series"]
    assert isinstance(series, list)
    if series:
        step = max(1, len(series) // 10)
        picked = series[::step] + ([series[-1]] if (len(series) - 1) % step else [])
        print(f"\nserver RSS over time (every ~{step} samples)")
        print(render(["t_s", "rss_mb", "load_1m"], [[s["t_s"], s["rss_mb"], s["load_1m"]] for s in picked]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--requests", type=int, default=10_000, help="requests in all, shared by the devices")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="server tail workers")
    p.add_argument("--sample-s", type=float, default=0.5, help="RSS sampling period")
    p.add_argument("--quick", action="store_true", help="a short run: 8 devices, 1000 requests")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--device-worker", nargs=5, metavar=("ADDRESS", "MODEL", "CUT", "SEED", "COUNT"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.device_worker:
        address, model, cut, seed, count = args.device_worker
        device_worker(address, model, cut, int(seed), int(count))
        return 0
    if args.quick:
        args.devices, args.requests = 8, 1000
    with tempfile.TemporaryDirectory(prefix="splitrt-fleet-load-") as d:
        result = run(args, Path(d))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    errors = result["errors"]
    return 0 if not errors and not result["wrong_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
