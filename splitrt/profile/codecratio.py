"""What each codec does to the bytes of every cut: measured on the cut tensors of one run.

A compressed codec's size depends on the values (ReLU outputs are about half zeros; a network input is
not), so one ratio per codec misprices it by 2x across the cuts of one model. ``measure`` runs the
model once on the profile's inputs with every crossing tensor exposed, encodes each float tensor once
per codec (cuts share tensors: each is encoded once) and gives, per codec and cut, the encoded size of
the cut's float tensors over their raw size: the ``ratio[c, k]`` the cost table prices
(``plan.costmodel``). Uncompressed codecs are exact from dtype and shape (``codec.expected_bytes``: the
int8c headers, 8 bytes a channel, outweigh a [1, 1000] tensor), so they are sized, not encoded; image
codecs (``jpeg75``, ...) are encoded like the compressed ones.

The ratios are those of the inputs used (random normal by default; real samples with ``--sample``):
real images compress better at the cut ``cloud`` than noise does, inner ReLU activations about alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.transport import codec

#: The codecs a profile prices per cut: every lossy quantisation and +zstd (fp32's ratio is 1). Not +zlib:
#: the same bytes as +zstd at 5-15x the CPU time, which the cost model does not price.
MEASURED: tuple[str, ...] = tuple(c for c in codec.names() if c != "fp32" and not c.endswith("+zlib"))
#: A cut tensor's relative RMS error that is large (for tests and benches: the stored errors are facts,
#: not a guard; plans are guarded by the model's output on samples, ``profile.accuracy``). Per-tensor int8
#: at densenet121's c2 (one channel's range dwarfs the others): 0.051; every other zoo cut sampled <= 0.012.
MAX_CODEC_ERROR = 0.02
#: The error stored where decoding overflows (fp16 of values past 65504): JSON has no infinity.
OVERFLOW = 1e6
#: Ratios are stored rounded: four digits are far below the run-to-run spread of the values.
DIGITS = 4


def _run_exposed(
    g: graph_mod.ModelGraph, names: Sequence[str], feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every tensor in ``names`` from one onnxruntime run (graph optimisations off: nothing fused away)."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(g.model)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    wanted = [n for n in names if n not in inputs]
    for name in wanted:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))  # untyped: onnxruntime infers it
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        outs = sess.run(wanted, dict(feeds))
    except Exception as exc:
        raise ProfileError(f"{g.path.name}: running the model to size the codecs failed: {exc}") from exc
    got = {n: np.asarray(v) for n, v in zip(wanted, outs, strict=True)}
    got.update({n: np.asarray(feeds[n]) for n in names if n in inputs})
    return got


@dataclass(frozen=True)
class CodecFacts:
    """Per codec, per cut of ``g.cuts()``: the size ratio, and (lossy codecs) the relative RMS error of the
    decoded cut tensors, ``sqrt(sum (x - x')^2 / sum x^2)`` (``OVERFLOW`` where fp16 overflows)."""

    ratios: dict[str, list[float]]
    errors: dict[str, list[float]]


def measure(
    g: graph_mod.ModelGraph,
    feeds: Mapping[str, np.ndarray],
    *,
    codecs: Sequence[str] = MEASURED,
    progress: Callable[[str], None] | None = None,
) -> CodecFacts:
    """Ratios and errors of every codec at every cut; a cut that sends no float tensor: ratio 1, error 0
    (the ratio then multiplies zero bytes)."""
    cuts = g.cuts()
    names = sorted({t.name for c in cuts for t in c.tensors})
    values = _run_exposed(g, names, feeds)
    specs = [str(codec.Codec.parse(k)) for k in codecs]
    sizes: dict[tuple[str, str], int] = {}
    sq: dict[tuple[str, str], tuple[float, float]] = {}  # (tensor, quant): (sum sq error, sum sq value)
    for i, name in enumerate(names):
        arr = values[name]
        if arr.dtype.kind != "f":
            continue
        for spec in specs:
            quant = spec.split("+")[0]
            with np.errstate(over="ignore", invalid="ignore"):  # fp16 past 65504: inf (an error, below)
                if "+" in spec or codec.Codec.parse(spec).image is not None:  # sizes depend on the values
                    sizes[name, spec] = codec.encode(name, arr, spec, copy=False).nbytes
                else:
                    sizes[name, spec] = codec.expected_bytes(arr.dtype.name, tuple(arr.shape), spec, name=name)
                if quant != "fp32" and (name, quant) not in sq:
                    x = arr.astype(np.float64)
                    back = codec.decode(codec.encode(name, arr, quant)).astype(np.float64)
                    err = float(np.sum((back - x) ** 2)) if np.all(np.isfinite(back)) else math.inf
                    sq[name, quant] = (err, float(np.sum(x**2)))
        if progress is not None and (i + 1) % 50 == 0:
            progress(f"codec ratios: {i + 1}/{len(names)} tensors encoded")
    ratios: dict[str, list[float]] = {s: [] for s in specs}
    errors: dict[str, list[float]] = {s: [] for s in specs if not s.startswith("fp32")}
    for c in cuts:
        floats = [t.name for t in c.tensors if values[t.name].dtype.kind == "f"]
        raw = sum(int(values[t].nbytes) for t in floats)
        for spec in specs:
            ratio = sum(sizes[t, spec] for t in floats) / raw if raw else 1.0
            ratios[spec].append(max(round(ratio, DIGITS), 10.0**-DIGITS))  # an all-zero tensor: > 0 still
            if spec in errors:
                quant = spec.split("+")[0]
                e = sum(sq[t, quant][0] for t in floats)
                v = sum(sq[t, quant][1] for t in floats)
                rel = math.sqrt(e / v) if v > 0 and math.isfinite(e) else (0.0 if e == 0 else OVERFLOW)
                errors[spec].append(round(min(rel, OVERFLOW), 6))
    return CodecFacts(ratios=ratios, errors=errors)
