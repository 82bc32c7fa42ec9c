"""Which library encodes and decodes the image codecs: Pillow vs simplejpeg vs OpenCV, side by side.

    .venv/bin/python bench/bench_imagelib.py [--repeats 30] [--json]

Two images, both what ``splitrt.transport.imagecodec`` hands a library: a real photograph as a 224 x 224
RGB uint8 image (matplotlib's ``grace_hopper.jpg``, resized) and a feature map tiled into one grey image
(squeezenet-sized: 64 channels of 55 x 55 from the same photo's pixels, quantised per channel, 8 x 8
tiles: 440 x 440). For each library and codec (JPEG q90/q75/q50, WebP q75 where the library has it):
encode and decode time (median over ``--repeats`` alternating runs, with a 95 % bootstrap interval of the
median) and the bytes. Libraries missing from the environment are skipped with a note. One thread each
(OpenCV's own pool set to 1). The load average is printed beside the table: the host is shared.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splitrt.cli.tables import render

Coder = tuple[Callable[[np.ndarray, int], bytes], Callable[[bytes], np.ndarray]]


def _photo() -> np.ndarray:
    import matplotlib.cbook
    from PIL import Image

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((224, 224))
    return np.asarray(img)


def _tiled(photo: np.ndarray) -> np.ndarray:
    # 64 "channels": the photo's colour planes shifted and scaled, quantised per channel, tiled 8 x 8.
    rng = np.random.default_rng(0)
    base = photo[:220:4, :220:4].astype(np.float32)  # 55 x 55 x 3
    chans = [base[..., i % 3] * rng.uniform(0.2, 2) + rng.uniform(-50, 50) for i in range(64)]
    q = [np.rint((c - c.min()) / max(np.ptp(c), 1e-6) * 255).astype(np.uint8) for c in chans]
    rows = [np.concatenate(q[r * 8 : r * 8 + 8], axis=1) for r in range(8)]
    return np.ascontiguousarray(np.concatenate(rows, axis=0))


def _pillow(fmt: str) -> Coder:
    from PIL import Image

    def enc(img: np.ndarray, quality: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format=fmt, quality=quality)
        return buf.getvalue()

    def dec(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im)

    return enc, dec


def _simplejpeg() -> Coder:
    import simplejpeg

    def enc(img: np.ndarray, quality: int) -> bytes:
        if img.ndim == 2:
            return bytes(simplejpeg.encode_jpeg(img[:, :, None], quality=quality, colorspace="GRAY"))
        return bytes(simplejpeg.encode_jpeg(img, quality=quality, colorspace="RGB"))

    def dec(data: bytes) -> np.ndarray:
        _h, _w, _cs, sub = simplejpeg.decode_jpeg_header(data)
        return np.asarray(simplejpeg.decode_jpeg(data, colorspace="GRAY" if sub == "Gray" else "RGB"))

    return enc, dec


def _opencv(ext: str) -> Coder:
    import cv2

    cv2.setNumThreads(1)
    flag = cv2.IMWRITE_WEBP_QUALITY if ext == ".webp" else cv2.IMWRITE_JPEG_QUALITY

    def enc(img: np.ndarray, quality: int) -> bytes:
        ok, buf = cv2.imencode(ext, img, [flag, quality])
        assert ok
        return bytes(buf)

    def dec(data: bytes) -> np.ndarray:
        return np.asarray(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED))

    return enc, dec


LIBS: dict[str, Callable[[str], Coder]] = {
    "pillow": lambda f: _pillow("JPEG" if f == "jpeg" else "WEBP"),
    "simplejpeg": lambda f: _simplejpeg() if f == "jpeg" else (_ for _ in ()).throw(ImportError("no webp")),
    "opencv": lambda f: _opencv(".jpg" if f == "jpeg" else ".webp"),
}
CODECS = (("jpeg", 90), ("jpeg", 75), ("jpeg", 50), ("webp", 75))


def _ci(xs: list[float]) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    arr = np.asarray(xs)
    meds = np.median(rng.choice(arr, (2000, arr.size)), axis=1)
    return round(float(np.percentile(meds, 2.5)), 3), round(float(np.percentile(meds, 97.5)), 3)


def run(repeats: int) -> list[dict[str, Any]]:
    photo = _photo()
    images = {"photo 224x224x3": photo, "tiled 440x440 grey": _tiled(photo)}
    rows: list[dict[str, Any]] = []
    for fmt, quality in CODECS:
        coders: dict[str, Coder] = {}
        for lib, make in LIBS.items():
            try:
                coders[lib] = make(fmt)
            except ImportError as exc:
                print(f"# {lib} {fmt}: skipped ({exc})", file=sys.stderr)
        for what, img in images.items():
            times: dict[str, tuple[list[float], list[float]]] = {lib: ([], []) for lib in coders}
            sizes: dict[str, int] = {}
            for _ in range(repeats):  # libraries alternate within each repeat: the same load for all
                for lib, (enc, dec) in coders.items():
                    t0 = time.perf_counter()
                    data = enc(img, quality)
                    t1 = time.perf_counter()
                    back = dec(data)
                    t2 = time.perf_counter()
                    assert back.shape[:2] == img.shape[:2], (lib, back.shape, img.shape)
                    times[lib][0].append((t1 - t0) * 1e3)
                    times[lib][1].append((t2 - t1) * 1e3)
                    sizes[lib] = len(data)
            for lib, (enc_ms, dec_ms) in times.items():
                rows.append(
                    {
                        "codec": f"{fmt}{quality}",
                        "image": what,
                        "library": lib,
                        "encode_ms": round(statistics.median(enc_ms), 3),
                        "encode_ci95_ms": _ci(enc_ms),
                        "decode_ms": round(statistics.median(dec_ms), 3),
                        "decode_ci95_ms": _ci(dec_ms),
                        "bytes": sizes[lib],
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = os.getloadavg()[0]
    rows = run(args.repeats)
    load = (load_before, os.getloadavg()[0])
    if args.json:
        print(json.dumps({"load_average_1m": load, "rows": rows}, indent=1))
        return 0

    def ci(r: dict[str, Any], key: str) -> str:
        lo, hi = r[f"{key}_ci95_ms"]
        return f"{r[f'{key}_ms']:.2f} [{lo:.2f}, {hi:.2f}]"

    print(
        render(
            ["codec", "image", "library", "encode ms [95% CI]", "decode ms [95% CI]", "bytes"],
            [[r["codec"], r["image"], r["library"], ci(r, "encode"), ci(r, "decode"), r["bytes"]] for r in rows],
        )
    )
    print(f"load average (1 min) before/after: {load[0]:.2f} / {load[1]:.2f} on {os.cpu_count()} cores (shared host)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
