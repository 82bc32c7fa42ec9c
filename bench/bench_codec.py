"""Cut codecs per cut of zoo models: bytes vs fp32, output agreement with fp32, encode+decode time.

    .venv/bin/python bench/bench_codec.py [--models squeezenet,mobilenetv2] [--max-cuts 6] [--samples 3]
                                          [--codecs fp32,fp16,int8,int8c,int8+zstd,...] [--per-cut] [--json]

For every cut (evenly sampled down to ``--max-cuts``) and each of ``--samples`` random inputs, the head
runs once; its crossing tensors are encoded with each codec, decoded, and the tail runs locally on the
decoded tensors. Reported per (model, codec), over cuts and samples:

- ``x fp32``: payload bytes over the raw float32 bytes (median and smallest over the cuts), and the
  ratio the profile priced for the plan (``priced``: the shipped profile's per-cut ratios, measured on
  one random input; ``-`` when the model has no shipped profile);
- ``top-1``: the share of (cut, sample) pairs whose argmax of the first output equals the fp32 split
  run's (the models have random weights: logits are close together, so this is a hard test);
- ``rel err``: max |a - b| / max |a| over every graph output (median and largest);
- ``enc+dec ms``: encode + decode of the cut's tensors, median of 3 (one thread, on this host).

The load average is printed with the table: times are of a shared host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from splitrt.cli.tables import render
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import ProfileError
from splitrt.graph import zoo
from splitrt.profile import profiler
from splitrt.transport import codec

DEFAULT_CODECS = "fp32,fp32+zstd,fp16,int8,int8c,int8+zstd,int8c+zstd,int8+zlib,int8c+zlib"


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(a))) or 1.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale


def sample(ids: list[str], k: int) -> list[str]:
    if len(ids) <= k:
        return ids
    idx = sorted({round(i * (len(ids) - 1) / (k - 1)) for i in range(k)})
    return [ids[i] for i in idx]


def priced_ratios(name: str) -> dict[str, dict[str, float]]:
    """``{cut: {codec: ratio}}`` from the shipped profile (what plans price), or {} without one."""
    try:
        prof = profiler.load_profile(f"x86_64-2core__{name}.json")
    except ProfileError:
        return {}
    table = profiler.cost_table(prof, prof, min_agreement=0.0)
    return {
        cut: {k: float(table.codec_ratio_matrix[i, j]) for j, k in enumerate(table.codecs)}
        for i, cut in enumerate(table.ids)
    }


def _codec_ms(crossing: dict[str, np.ndarray], spec: str) -> tuple[list[codec.Encoded], dict[str, np.ndarray], float]:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        encoded = [codec.encode(n, a, spec) for n, a in crossing.items()]
        decoded = {e.name: codec.decode(e) for e in encoded}
        times.append((time.perf_counter() - t0) * 1e3)
    return encoded, decoded, statistics.median(times)


def bench_model(name: str, max_cuts: int, samples: int, specs: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    priced = priced_ratios(name)
    with Device(zoo.get(name), config=DeviceConfig(intra_op_threads=1)) as dev:
        xs = [dev.random_inputs(seed=s) for s in range(samples)]
        first = dev.output_names[0]
        cuts = [c.id for c in dev.graph.cuts() if c.id != "device"]
        chosen = sample(cuts, max_cuts)
        for i, cut in enumerate(chosen):
            print(f"{name}: cut {cut} ({i + 1}/{len(chosen)})", file=sys.stderr, flush=True)
            for s, x in enumerate(xs):
                head = dev.run_head(x, cut)
                ref = dev.finish_locally(head).outputs
                floats = {n: a for n, a in head.crossing.items() if a.dtype.kind == "f"}
                raw = sum(int(a.nbytes) for a in floats.values())
                for spec in specs:
                    encoded, decoded, ms = _codec_ms(head.crossing, spec)
                    out = dev.finish_locally(dataclasses.replace(head, crossing=decoded)).outputs
                    sent = sum(e.nbytes for e in encoded if e.name in floats)
                    rows.append(
                        {
                            "model": name,
                            "cut": cut,
                            "sample": s,
                            "codec": spec,
                            "raw_bytes": raw,
                            "sent_bytes": sent,
                            "ratio": sent / raw if raw else 1.0,
                            "priced": priced.get(cut, {}).get(spec),
                            "codec_ms": ms,
                            "top1_equal": bool(np.argmax(ref[first]) == np.argmax(out[first])),
                            "rel_err": max(rel_err(ref[k], out[k]) for k in ref),
                        }
                    )
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    order = {k: i for i, k in enumerate(codec.names())}
    keys = sorted({(r["model"], r["codec"]) for r in rows}, key=lambda k: (k[0], order.get(k[1], 99)))
    for model, spec in keys:
        sel = [r for r in rows if r["model"] == model and r["codec"] == spec]
        by_cut: dict[str, list[float]] = {}
        for r in sel:
            by_cut.setdefault(r["cut"], []).append(r["ratio"])
        ratios = [statistics.median(v) for v in by_cut.values()]
        priced = [r["priced"] for r in sel if r["sample"] == 0 and r["priced"] is not None]
        errs = [r["rel_err"] for r in sel]
        out.append(
            {
                "model": model,
                "codec": spec,
                "cuts": len(by_cut),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "priced_median": statistics.median(priced) if priced else None,
                "top1_agree": sum(r["top1_equal"] for r in sel) / len(sel),
                "rel_err_median": statistics.median(errs),
                "rel_err_max": max(errs),
                "codec_ms_median": statistics.median(r["codec_ms"] for r in sel),
            }
        )
    return out


def _fmt(v: Any) -> Any:
    return "-" if v is None else round(v, 4) if isinstance(v, float) else v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="squeezenet,mobilenetv2")
    p.add_argument("--codecs", default=DEFAULT_CODECS)
    p.add_argument("--max-cuts", type=int, default=6, help="cuts per model, evenly sampled (default 6)")
    p.add_argument("--samples", type=int, default=2, help="random inputs per cut (default 2)")
    p.add_argument("--per-cut", action="store_true", help="table: one row per (model, cut, codec)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    specs = [str(codec.Codec.parse(s)) for s in args.codecs.split(",")]
    load0 = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += bench_model(name, args.max_cuts, args.samples, specs)
    load = [round(max(a, b), 2) for a, b in zip(load0, os.getloadavg(), strict=True)]
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"load_average": load, "summary": summary, "per_cut": rows}, indent=1))
        return 0
    cols = [
        "model",
        "codec",
        "cuts",
        "ratio_median",
        "ratio_min",
        "priced_median",
        "top1_agree",
        "rel_err_median",
        "rel_err_max",
        "codec_ms_median",
    ]
    print(f"Per codec over cuts x {args.samples} inputs vs the fp32 split run (load average 1/5/15 min {load})")
    print(render(cols, [[_fmt(r[c]) for c in cols] for r in summary]))
    if args.per_cut:
        cols = ["model", "cut", "codec", "raw_bytes", "ratio", "priced", "top1_equal", "rel_err", "codec_ms"]
        print()
        print(render(cols, [[_fmt(r[c]) for c in cols] for r in rows if r["sample"] == 0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
