"""Issue 4 figures: transport overhead on loopback and cloud server throughput.

    .venv/bin/python bench/bench_transport.py [--requests 200] [--throughput-requests 10000] [--json]

1. Overhead: a synthetic model ``x[n] -> Relu -> a -> ReduceSum -> y`` cut at ``a``, so the crossing
   payload is ``4n`` bytes and the reply a few bytes. Overhead = end to end minus head and tail compute
   (device ``total_ms - head_ms - tail_ms``, ``tail_ms`` as measured by the server): codec, protobuf,
   gRPC, loopback TCP, queueing. Median (and p90) of ``--requests`` after warm-up, per payload size.
   Target: <= 1 ms + 0.5 ms per MB. ``raw_grpc_ms`` is the floor: the same payload as bare bytes
   (identity serializers, a reply of 2 bytes) to an echo server in another process, with the same channel
   and server options, its round trips taken in turn with splitrt's requests (one each per round, order
   alternating: on a busy host both see the same load); ``over_raw_ms`` is the median of the paired
   differences, ``beats_raw`` says whether splitrt's median is at or below raw grpcio's. ``tail_ms`` is
   listed too, as a copy the tail session makes (e.g. of an unaligned input) counts there, not in the
   overhead. The host's load average is printed with the table.
   Tried and not applied (2026-12, 2 vCPUs, load 3-13, interleaved like this table): HTTP/2 window and
   frame options (``grpc.http2.lookahead_bytes`` 16-64 MiB, ``max_frame_size`` 16 MiB, ``bdp_probe`` 0,
   TCP read chunk sizes) moved raw grpcio by -15 %..+10 % at 2-16 MB, within the noise, no set ahead at
   every size; a 16 MB payload as a stream of 1 MiB (256 KiB) messages was as fast (1.7x slower), as 4
   parallel calls on one or four channels was slower. A bare TCP socket moved 16 MB in about half raw
   grpcio's time: what is left is gRPC's own cost, not splitrt's (one copy to join the message: about
   0.17 ms/MB, plus ~0.5-1 ms of Python per request on both ends).
   Per-request CPU, counted rather than timed (2026-12; device and a ``CloudServer`` in one process on
   127.0.0.1, cProfile on both ends, callgrind instructions per request without onnxruntime's, tracemalloc):
   Python calls per 10 KB request went from 396 to 289 on the device (head included; raw grpcio: 131) and
   from 389 to 307 on the server (raw echo: 75), interpreter instructions 1.28 M -> 1.02 M (raw: 0.38 M),
   process CPU 1.7-1.9 -> 1.3-1.5 ms (raw: 1.05); at 1 and 16 MB the copies dominate and CPU is unchanged.
   Gone: codec strings and dtypes parsed per tensor and ``dtype.name`` (numpy's, in Python) on every
   encode/decode (cached, bounded), the per-field slices and joins of the hand parser,
   ``findCaller`` and a new JSON encoder per request log line, a 13-bucket loop per histogram
   observation, a context manager and a uuid4 per request. Copies at 16 MB: 3 x the payload per request
   (the head's output, the serializer's join, gRPC's received bytes) against raw grpcio's 2 x; the join is
   the one copy splitrt adds, and it stays while grpcio (1.85) accepts only ``bytes`` messages and copies
   them (a grpcio that takes a list or memoryview would let ``wire.serialize`` hand over the parts).
   Received payloads are 16-byte aligned views, used in place (checked at 10 KB-16 MB).
2. Throughput: ``--devices`` concurrent devices (one channel each, threads in this process) send the
   squeezenet zoo model's middle cut (head computed once per device, so the server is what is measured)
   for ``--throughput-requests`` requests in total, in ``--throughput-rounds`` rounds; requests/s (each
   round's and their median), p50/p99 latency, errors, the server's largest RSS after a round.

With ``--b-pythonpath DIR`` (another tree, e.g. ``git archive 545808c | tar -x -C DIR``) a second server B
runs that tree's splitrt: its overhead requests are taken in turn with A's and raw grpcio's (``b_*`` columns,
``a_minus_b_ms``: the median of paired differences with a 95 % bootstrap interval; ``a_minus_b_total_ms`` the
same end to end, which a server counting more of its work in ``tail_ms`` cannot shift), and its throughput
rounds alternate with A's. The devices are this tree's in both cases: what differs is the server.

The server runs as a subprocess (``splitrt serve``) so it does not share this process's GIL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import onnx
import psutil
from onnx import TensorProto, helper

from splitrt.cli.tables import render
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.rig.cloudserver import ServerProcess, start_server
from splitrt.rig.processes import end

REPO = Path(__file__).resolve().parents[1]
SIZES = {"10KB": 10_000, "100KB": 100_000, "1MB": 1_000_000, "4MB": 4_000_000, "16MB": 16_000_000}


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def synthetic(path: Path, nbytes: int) -> Path:
    n = nbytes // 4
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("ReduceSum", ["a"], ["y"], keepdims=1)]
    model = helper.make_model(
        helper.make_graph(nodes, "transport", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _identity(data: bytes) -> bytes:
    return data


def raw_echo_server() -> None:
    """Bare gRPC server (``--raw-echo-server``): ``/raw.Echo/Up`` takes bytes, answers 2 bytes."""
    from concurrent import futures

    import grpc

    from splitrt.transport import wire

    server = grpc.server(futures.ThreadPoolExecutor(4), options=wire.server_options(64 * 2**20))
    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"ok", request_deserializer=_identity, response_serializer=_identity
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("raw.Echo", {"Up": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"port": port}), file=sys.stderr, flush=True)
    server.wait_for_termination()


class RawEcho:
    """The floor: the same payload as bare bytes to an echo server in another process."""

    def __init__(self) -> None:
        import grpc

        from splitrt.transport import wire

        self.proc = subprocess.Popen([sys.executable, __file__, "--raw-echo-server"], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        port = json.loads(self.proc.stderr.readline())["port"]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", wire.channel_options(64 * 2**20, 30.0))
        self.up = self.channel.unary_unary(
            "/raw.Echo/Up", request_serializer=_identity, response_deserializer=_identity
        )

    def ms(self, data: bytes) -> float:
        t0 = time.perf_counter()
        self.up(data, timeout=30)
        return (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.channel.close()
        end(self.proc)


def _serve(models: Path, *extra: str, pythonpath: str | None = None) -> ServerProcess:
    """``splitrt serve`` on a port of its choosing; ``pythonpath``: the splitrt of another tree (e.g. an old
    commit's ``git archive``), run with this interpreter from that tree (``start_server``: else a server started
    from a checkout runs the checkout's splitrt; before 2026-12-06, B ran this tree's code)."""
    return start_server(models, "--host", "127.0.0.1", *extra, port=0, pythonpath=pythonpath, cwd=pythonpath or REPO)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def bench_overhead(args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    """Per payload size, splitrt requests and raw grpcio round trips taken in turn (one of each per
    round, the order alternating), so both see the same host load: a busy host moves both."""
    models = tmp / "transport"
    models.mkdir()
    sizes = {k: v for k, v in SIZES.items() if not args.sizes or k in args.sizes.split(",")}
    paths = {label: synthetic(models / f"t{label}.onnx", n) for label, n in sizes.items()}
    raw = RawEcho()
    a_server = _serve(models, "--workers", "1", *args.serve_arg)
    b_server = (
        _serve(models, "--workers", "1", *args.b_serve_arg, pythonpath=args.b_pythonpath)
        if args.b_pythonpath or args.b_serve_arg
        else None
    )
    rows = []
    try:
        for label, nbytes in sizes.items():
            g = graph.load(paths[label])
            cut = next(c.id for c in g.cuts() if [t.name for t in c.tensors] == ["a"])
            data = bytes(nbytes)
            raw_ms, res, b_res = [], [], []
            with contextlib.ExitStack() as stack:
                dev = stack.enter_context(Device(g, a_server.address, config=DeviceConfig(timeout_s=30)))
                b_dev = (
                    stack.enter_context(Device(g, b_server.address, config=DeviceConfig(timeout_s=30)))
                    if b_server is not None
                    else None
                )
                x = dev.random_inputs()
                for i in range(10 + args.requests):
                    # One of each per round, the order rotating: A, B and raw see the same host load.
                    kinds = ["a", "raw", "b"] if b_dev is not None else ["a", "raw"]
                    for k in range(len(kinds)):
                        kind = kinds[(i + k) % len(kinds)]
                        if kind == "a":
                            res.append(dev.run_detailed(x, cut=cut))
                        elif kind == "raw":
                            raw_ms.append(raw.ms(data))
                        elif b_dev is not None:
                            b_res.append(b_dev.run_detailed(x, cut=cut))
                    if i < 10:  # warm-up
                        for xs in (res, raw_ms, b_res):
                            xs.clear()
            over = [r.overhead_ms for r in res]
            mb = nbytes / 1e6
            target = 1.0 + 0.5 * mb
            med = statistics.median(over)
            raw_med = statistics.median(raw_ms)
            rows.append(
                {
                    "payload": label,
                    "bytes_up": res[0].bytes_up,
                    "overhead_median_ms": med,
                    "overhead_p90_ms": pct(over, 0.9),
                    "raw_grpc_ms": raw_med,
                    "over_raw_ms": statistics.median(o - m for o, m in zip(over, raw_ms, strict=True)),
                    "encode_ms": statistics.median(r.encode_ms for r in res),
                    "decode_ms": statistics.median(r.decode_ms for r in res),
                    "network_ms": statistics.median(r.network_ms for r in res),
                    "head_ms": statistics.median(r.head_ms for r in res),
                    "tail_ms": statistics.median(r.tail_ms for r in res),
                    "total_ms": statistics.median(r.total_ms for r in res),
                    "target_ms": target,
                    "ok": med <= target,
                    "beats_raw": med <= raw_med,
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                }
            )
            if b_res:
                b_over = [r.overhead_ms for r in b_res]
                diffs = [a - b for a, b in zip(over, b_over, strict=True)]
                # End to end too: a server that counts more of its work in tail_ms shows less overhead.
                totals = [a.total_ms - b.total_ms for a, b in zip(res, b_res, strict=True)]
                rows[-1].update(
                    {
                        "b_overhead_median_ms": statistics.median(b_over),
                        "b_over_raw_ms": statistics.median(o - m for o, m in zip(b_over, raw_ms, strict=True)),
                        "b_tail_ms": statistics.median(r.tail_ms for r in b_res),
                        "a_minus_b_ms": statistics.median(diffs),
                        "a_minus_b_ci95": _median_ci(diffs),
                        "a_minus_b_total_ms": statistics.median(totals),
                        "a_minus_b_total_ci95": _median_ci(totals),
                    }
                )
            _progress(f"overhead {label}: median {med:.3f} ms, raw grpcio {raw_med:.3f} ms (target {target:.2f})")
    finally:
        a_server.stop(15)
        if b_server is not None:
            b_server.stop(15)
        raw.close()
    return rows


def _median_ci(xs: list[float], n: int = 2000) -> list[float]:
    """A 95 % bootstrap interval of the median of ``xs``."""
    import random

    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return [round(meds[int(0.025 * n)], 3), round(meds[int(0.975 * n)], 3)]


def _throughput_round(g: graph.ModelGraph, cut: str, address: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """``n`` requests from ``--devices`` concurrent devices (threads, a channel each) to ``address``."""
    lat: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    counter = iter(range(n))
    devices = [Device(g, address, config=DeviceConfig(timeout_s=30)) for _ in range(args.devices)]
    try:
        heads = [d.run_head(d.random_inputs(seed=i), cut) for i, d in enumerate(devices)]
        for d, h in zip(devices, heads, strict=True):
            for _ in range(5):
                d.send(h)

        def worker(dev: Device, head: object) -> None:
            mine: list[float] = []
            while True:
                with lock:
                    if next(counter, None) is None:
                        break
                t0 = time.perf_counter()
                try:
                    dev.send(head)  # type: ignore[arg-type]
                    mine.append((time.perf_counter() - t0) * 1e3)
                except Exception as exc:  # counted, reported
                    key = getattr(exc, "code", type(exc).__name__)
                    with lock:
                        errors[key] = errors.get(key, 0) + 1
            with lock:
                lat.extend(mine)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(d, h)) for d, h in zip(devices, heads, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        for d in devices:
            d.close()
    return {"latency_ms": lat, "errors": errors, "requests_per_s": len(lat) / wall}


def bench_throughput(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """Server A (this tree) and, with ``--b-pythonpath``, server B, in ``--throughput-rounds`` rounds that
    alternate A and B (the order rotating), each round ``--throughput-requests / rounds`` requests: a
    busy host moves both. Per server: requests/s of each round, their median, pooled p50/p99, RSS."""
    models = tmp / "squeeze"
    models.mkdir()
    shutil.copyfile(zoo.get("squeezenet"), models / "squeezenet.onnx")
    g = graph.load(models / "squeezenet.onnx")
    cuts = g.cuts()
    cut = cuts[len(cuts) // 2].id
    flags = ("--workers", str(args.workers), "--intra-op-threads", "1", "--max-queue", "64")
    servers = {"a": _serve(models, *flags)}
    if args.b_pythonpath:
        servers["b"] = _serve(models, *flags, pythonpath=args.b_pythonpath)
    names = list(servers)
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    rss: dict[str, list[float]] = {k: [] for k in names}
    try:
        for r in range(args.throughput_rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                server = servers[k]
                one = _throughput_round(
                    g, cut, server.address, args.throughput_requests // args.throughput_rounds, args
                )
                rounds[k].append(one)
                rss[k].append(psutil.Process(server.proc.pid).memory_info().rss / 2**20)
                _progress(f"throughput {k} round {r}: {one['requests_per_s']:.1f} req/s")
    finally:
        for server in servers.values():
            server.stop(15)
    result: dict[str, object] = {
        "model": "squeezenet",
        "cut": cut,
        "crossing_bytes": next(c.bytes for c in cuts if c.id == cut),
        "devices": args.devices,
        "server_workers": args.workers,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    for k in names:
        lat = [x for one in rounds[k] for x in one["latency_ms"]]
        errors: dict[str, int] = {}
        for one in rounds[k]:
            for code, n in one["errors"].items():
                errors[code] = errors.get(code, 0) + n
        rps = [one["requests_per_s"] for one in rounds[k]]
        prefix = "" if k == "a" else "b_"
        result.update(
            {
                f"{prefix}requests": len(lat) + sum(errors.values()),
                f"{prefix}ok": len(lat),
                f"{prefix}errors": errors,
                f"{prefix}requests_per_s": statistics.median(rps),
                f"{prefix}rounds_requests_per_s": [round(x, 1) for x in rps],
                f"{prefix}p50_ms": pct(lat, 0.5),
                f"{prefix}p99_ms": pct(lat, 0.99),
                f"{prefix}rss_after_mb": max(rss[k]),
            }
        )
    if "b" in servers:
        diffs = [a["requests_per_s"] - b["requests_per_s"] for a, b in zip(rounds["a"], rounds["b"], strict=True)]
        result["a_minus_b_requests_per_s"] = [round(x, 1) for x in diffs]
    _progress(f"throughput: {result['requests_per_s']:.1f} req/s, p99 {result['p99_ms']:.1f} ms")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="requests per payload size (overhead)")
    p.add_argument("--throughput-requests", type=int, default=10_000)
    p.add_argument("--throughput-rounds", type=int, default=4, help="throughput rounds (A and B alternate)")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="server tail workers")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--raw-echo-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="", help=f"overhead: comma-separated payload sizes (default: {','.join(SIZES)})")
    p.add_argument("--serve-arg", action="append", default=[], help="one more splitrt serve argument (repeatable)")
    p.add_argument(
        "--b-pythonpath",
        help="a second server B from this tree (e.g. `git archive 545808c | tar -x -C DIR`), its "
        "requests taken in turn with A's and raw grpcio's; columns b_* and a_minus_b_ms (median of paired "
        "differences, 95 %% CI)",
    )
    p.add_argument("--b-serve-arg", action="append", default=[], help="a splitrt serve argument for server B")
    args = p.parse_args(argv)
    if args.raw_echo_server:
        raw_echo_server()
        return 0
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        overhead = [] if args.skip_overhead else bench_overhead(args, tmp)
        throughput = None if args.skip_throughput else bench_throughput(args, tmp)
    if args.json:
        loads = {"load_avg_before": load_before, "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps({"overhead": overhead, "throughput": throughput, **loads}, indent=2))
        return 0
    if overhead:
        cols = [
            "payload",
            "bytes_up",
            "overhead_median_ms",
            "overhead_p90_ms",
            "raw_grpc_ms",
            "over_raw_ms",
            "encode_ms",
            "decode_ms",
            "network_ms",
            "tail_ms",
            "total_ms",
            "target_ms",
            "ok",
            "beats_raw",
            "load_avg_1m",
        ]
        if "a_minus_b_ms" in overhead[0]:
            cols += ["b_overhead_median_ms", "b_over_raw_ms", "b_tail_ms", "a_minus_b_ms", "a_minus_b_ci95"]
            cols += ["a_minus_b_total_ms", "a_minus_b_total_ci95"]
        print(
            f"Loopback overhead (median of {args.requests} requests; end-to-end minus head and tail; raw grpcio "
            f"round trips of the same bytes taken in turn with them; {os.cpu_count()} CPUs, load average "
            f"{' '.join(f'{v:.2f}' for v in os.getloadavg())})"
        )
        print(render(cols, [[r[c] for c in cols] for r in overhead]))
    if throughput:
        print()
        print(
            f"Server throughput: {throughput['devices']} devices, squeezenet @ {throughput['cut']} "
            f"({throughput['crossing_bytes']} B crossing), {throughput['server_workers']} workers, "
            f"{throughput['cpus']} CPUs, {args.throughput_rounds} rounds (A and B alternating), load average "
            f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
        )
        cols = ["requests", "ok", "requests_per_s", "rounds_requests_per_s", "p50_ms", "p99_ms", "rss_after_mb"]
        rows = [["a", *(throughput[c] for c in cols), json.dumps(throughput["errors"])]]
        if "b_requests" in throughput:
            rows.append(["b", *(throughput[f"b_{c}"] for c in cols), json.dumps(throughput["b_errors"])])
        print(render(["server", *cols, "errors"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
