"""Issue 4 figures: per codec and per cut of zoo models, bytes sent and output error vs fp32.

    .venv/bin/python bench/bench_codec.py [--models squeezenet,branchy,multi_io] [--max-cuts 24]
                                          [--per-cut] [--json]

For every cut (evenly sampled down to ``--max-cuts``), the head runs once; its crossing tensors are
encoded with each codec, decoded, and the tail runs locally on the decoded tensors. Reported: payload
bytes (and the ratio to fp32), encode+decode time, and the output error relative to the fp32 split run
(max |a - b| / max |a| over every graph output). Models use the zoo's seeded random weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from splitrt.cli.tables import render
from splitrt.device.client import Device, DeviceConfig, HeadResult
from splitrt.graph import zoo
from splitrt.transport import codec


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(a))) or 1.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale


def sample(ids: list[str], k: int) -> list[str]:
    if len(ids) <= k:
        return ids
    idx = sorted({round(i * (len(ids) - 1) / (k - 1)) for i in range(k)})
    return [ids[i] for i in idx]


def bench_model(name: str, max_cuts: int, specs: list[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with Device(zoo.get(name), config=DeviceConfig(intra_op_threads=1)) as dev:
        x = dev.random_inputs(seed=0)
        cuts = [c.id for c in dev.graph.cuts() if c.id != "device"]
        for i, cut in enumerate(sample(cuts, max_cuts)):
            print(f"{name}: cut {cut} ({i + 1}/{min(len(cuts), max_cuts)})", file=sys.stderr, flush=True)
            head = dev.run_head(x, cut)
            ref = dev.finish_locally(head).outputs
            raw = sum(int(a.nbytes) for a in head.crossing.values())
            for spec in specs:
                t0 = time.perf_counter()
                encoded = [codec.encode(n, a, spec) for n, a in head.crossing.items()]
                decoded = {e.name: codec.decode(e) for e in encoded}
                codec_ms = (time.perf_counter() - t0) * 1e3
                out = dev.finish_locally(HeadResult(cut_id=cut, crossing=decoded, head_ms=0.0)).outputs
                sent = sum(e.nbytes for e in encoded)
                rows.append(
                    {
                        "model": name,
                        "cut": cut,
                        "codec": spec,
                        "raw_bytes": raw,
                        "sent_bytes": sent,
                        "ratio": sent / raw if raw else 1.0,
                        "codec_ms": codec_ms,
                        "rel_err": max(rel_err(ref[k], out[k]) for k in ref),
                    }
                )
    return rows


def summarise(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    out = []
    keys = sorted({(str(r["model"]), str(r["codec"])) for r in rows}, key=lambda k: (k[0], codec.names().index(k[1])))
    for model, spec in keys:
        sel = [r for r in rows if r["model"] == model and r["codec"] == spec]
        ratios = [float(r["ratio"]) for r in sel]  # type: ignore[arg-type]
        errs = [float(r["rel_err"]) for r in sel]  # type: ignore[arg-type]
        out.append(
            {
                "model": model,
                "codec": spec,
                "cuts": len(sel),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "rel_err_median": statistics.median(errs),
                "rel_err_max": max(errs),
                "codec_ms_median": statistics.median(float(r["codec_ms"]) for r in sel),
            }
        )  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,branchy,multi_io")
    p.add_argument("--codecs", default=",".join(codec.names()))
    p.add_argument("--max-cuts", type=int, default=24, help="cuts per model, evenly sampled")
    p.add_argument("--per-cut", action="store_true", help="table: one row per (model, cut, codec)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    specs = [str(codec.Codec.parse(s)) for s in args.codecs.split(",")]
    rows: list[dict[str, object]] = []
    for name in args.models.split(","):
        rows += bench_model(name, args.max_cuts, specs)
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"summary": summary, "per_cut": rows}, indent=2))
        return 0
    cols = ["model", "codec", "cuts", "ratio_median", "ratio_min", "rel_err_median", "rel_err_max", "codec_ms_median"]
    print("Bytes sent (ratio to fp32) and output error relative to the fp32 split run")
    print(render(cols, [[r[c] for c in cols] for r in summary]))
    if args.per_cut:
        cols = ["model", "cut", "codec", "raw_bytes", "sent_bytes", "ratio", "rel_err", "codec_ms"]
        print()
        print(render(cols, [[r[c] for c in cols] for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
