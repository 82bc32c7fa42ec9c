"""Python function calls the server makes per Infer request: a deterministic, load-independent measure of its
per-request CPU (timings on a shared host move by more than the differences sought).

    .venv/bin/python bench/bench_calls.py [--size 10KB] [--requests 200] [--b-pythonpath DIR] [--by-function] [--json]

A real ``splitrt serve`` on 127.0.0.1 (``start_server``), with a profile hook (``threading.setprofile``)
counting every ``call`` (Python functions, generator resumptions included) and ``c_call`` (builtins) on the
server's threads, grouped by thread name. A device of this tree sends ``bench_transport``'s synthetic model
cut at ``a`` (``--size`` of payload) one request at a time: warm-up, then SIGUSR1 starts the count,
``--requests`` requests, SIGUSR2 writes it. ``per_request`` = the request threads' calls (gRPC's poller,
the worker pool, onnxruntime's niced pool) / requests; background threads that tick on a clock (watchdog,
advertiser, the canceller's RSS watch, ...) and the main thread are listed but not counted there. With
``--b-pythonpath DIR`` (e.g. ``git archive 545808c | tar -x -C DIR``) a second server runs that tree's
splitrt, measured the same way. ``--by-function``: the counts per function (builtins named with their
caller) in ``--json``, to see where they go.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

SERVER_FLAG = "--counted-server"
# Threads that run on a clock, not per request: listed, not counted per request.
BACKGROUND = (
    "MainThread",
    "splitrt-watchdog",
    "splitrt-canceller",
    "splitrt-advertise",
    "splitrt-upload-pace",
    "splitrt-warm",
)


def _counted_server(argv: list[str]) -> int:
    """``splitrt serve`` with every thread's calls counted between SIGUSR1 and SIGUSR2 (written as JSON to
    the file named by ``SPLITRT_CALLS_OUT``)."""
    counts: Counter[tuple[str, str]] = Counter()
    funcs: Counter[str] = Counter()  # with SPLITRT_CALLS_BY_FUNCTION: per function, request threads only
    by_function = bool(os.environ.get("SPLITRT_CALLS_BY_FUNCTION"))
    armed = [False]
    names: dict[int, str] = {}

    def hook(frame: Any, event: str, arg: Any) -> None:
        if armed[0] and (event == "call" or event == "c_call"):
            ident = threading.get_ident()
            name = names.get(ident)
            if name is None:
                name = names[ident] = re.sub(r"[-_]?\d+", "", threading.current_thread().name)
            counts[(name, event)] += 1
            if by_function and not name.startswith(BACKGROUND):
                if event == "call":
                    code = frame.f_code
                    where = code.co_filename.rpartition("site-packages/")[2]
                    funcs[f"{where}:{code.co_firstlineno}:{code.co_name}"] += 1
                else:  # a builtin, named with its caller
                    caller = frame.f_code
                    where = f"{caller.co_filename.rpartition('/')[2]}:{caller.co_name}"
                    funcs[f"{getattr(arg, '__qualname__', arg)} <- {where}"] += 1

    def arm(*_: object) -> None:
        counts.clear()
        funcs.clear()
        armed[0] = True
        Path(os.environ["SPLITRT_CALLS_OUT"] + ".armed").touch()

    def dump(*_: object) -> None:
        armed[0] = False
        out: dict[str, dict[str, int]] = {}
        for (name, event), n in counts.items():
            out.setdefault(name, {})[event] = n
        if by_function:
            out["functions"] = dict(funcs.most_common())
        Path(os.environ["SPLITRT_CALLS_OUT"]).write_text(json.dumps(out))

    signal.signal(signal.SIGUSR1, arm)
    signal.signal(signal.SIGUSR2, dump)
    threading.setprofile(hook)
    sys.setprofile(hook)
    from splitrt.cli.app import main as cli_main

    return cli_main(argv)


def _wait_file(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"expected {path} within {timeout_s:g} s, got none")
        time.sleep(0.05)


def measure(models: Path, model: Path, args: argparse.Namespace, pythonpath: str | None) -> dict[str, Any]:
    from splitrt.device.client import Device, DeviceConfig
    from splitrt.graph import model as graph
    from splitrt.rig.cloudserver import start_server

    out = models.parent / f"calls-{os.getpid()}-{'b' if pythonpath else 'a'}.json"
    env = dict(os.environ, SPLITRT_CALLS_OUT=str(out))
    if args.by_function:
        env["SPLITRT_CALLS_BY_FUNCTION"] = "1"
    server = start_server(
        models,
        "--host",
        "127.0.0.1",
        "--workers",
        str(args.workers),
        port=0,
        command=(sys.executable, str(Path(__file__).resolve()), SERVER_FLAG),
        env=env,
        pythonpath=pythonpath,
        cwd=pythonpath or Path(__file__).resolve().parents[1],
    )
    try:
        g = graph.load(model)
        cut = next(c.id for c in g.cuts() if [t.name for t in c.tensors] == ["a"])
        devices = [Device(g, server.address, config=DeviceConfig(timeout_s=30)) for _ in range(args.devices)]
        try:
            x = devices[0].random_inputs()
            for _ in range(args.warmup):
                devices[0].run_detailed(x, cut=cut)
            server.proc.send_signal(signal.SIGUSR1)
            _wait_file(Path(str(out) + ".armed"))
            each = args.requests // args.devices
            threads = [
                threading.Thread(target=lambda d=d: [d.run_detailed(x, cut=cut) for _ in range(each)]) for d in devices
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.2)  # the last call's end-of-call callbacks
            server.proc.send_signal(signal.SIGUSR2)
            _wait_file(out)
        finally:
            for d in devices:
                d.close()
    finally:
        server.stop(15)
    threads = json.loads(out.read_text())
    functions = threads.pop("functions", {})
    request = {k: v for k, v in threads.items() if not k.startswith(BACKGROUND)}
    py = sum(v.get("call", 0) for v in request.values())
    c = sum(v.get("c_call", 0) for v in request.values())
    sent = args.requests // args.devices * args.devices
    return {
        "tree": pythonpath or "this",
        "requests": sent,
        "python_calls_per_request": round(py / sent, 1),
        "c_calls_per_request": round(c / sent, 1),
        "per_request": round((py + c) / sent, 1),
        "threads": threads,
        "functions": {k: v / sent for k, v in functions.items()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SERVER_FLAG]:
        return _counted_server(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="10KB", help="payload: one of bench_transport's SIZES")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--devices", type=int, default=1, help="devices sending at once (a thread and channel each)")
    p.add_argument("--workers", type=int, default=1, help="the server's --workers")
    p.add_argument("--b-pythonpath", help="another tree's splitrt, measured the same way")
    p.add_argument("--by-function", action="store_true", help="count per function too (in --json, per request)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    args = p.parse_args(argv)
    from bench_transport import SIZES, synthetic

    from splitrt.cli.tables import render

    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        model = synthetic(models / f"t{args.size}.onnx", SIZES[args.size])
        rows = [measure(models, model, args, None)]
        if args.b_pythonpath:
            rows.append(measure(models, model, args, args.b_pythonpath))
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"size": args.size, "load_avg": load, "rows": rows}, indent=1))
        return 0
    cols = ["tree", "requests", "python_calls_per_request", "c_calls_per_request", "per_request"]
    print(render(cols, [[r[k] for k in cols] for r in rows]))
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (counts do not depend on it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
