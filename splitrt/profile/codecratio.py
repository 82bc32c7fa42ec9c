"""What each codec does to the bytes of every cut: measured on the cut tensors of one run.

A compressed codec's size depends on the values (ReLU outputs are about half zeros; a network input is
not), so one ratio per codec misprices it by 2x across the cuts of one model. ``measure`` runs the
model once on the profile's inputs with every crossing tensor exposed, encodes each float tensor once
per codec (cuts share tensors: each is encoded once) and gives, per codec and cut, the encoded size of
the cut's float32 tensors and uint8 frames (``graph.cuts.codec_tensor``: what the table's
``float_bytes`` counts; a frame goes raw but under an image codec) over their raw size: the
``ratio[c, k]`` the cost table prices
(``plan.costmodel``). Uncompressed codecs are exact from dtype and shape (``codec.expected_bytes``: the
int8c headers, 8 bytes a channel, outweigh a [1, 1000] tensor), so they are sized, not encoded; image
codecs (``jpeg75``, ...) are encoded like the compressed ones.

The ratios are those of the inputs used (random normal by default; real samples with ``--sample``):
real images compress better at the cut ``cloud`` than noise does, inner ReLU activations about alike.

``measure_pass(g, feeds, *, codecs, timed=True)`` is the one pass a profile makes: per feed one run and one
encode per (tensor, codec), ratios the mean over the feeds, errors and (``timed``) the encode and decode
times (``profile.codectime``) on the first feed, whose sizing encode is also the first timing. On
squeezenet it replaced four ratio passes and a timing pass (``bench/bench_profiler.py --cli-before``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.graph.cuts import codec_tensor
from splitrt.profile.timing import untimed_options
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
#: ms are stored to the microsecond: far below their run-to-run spread.
TIME_DIGITS = 3
#: An encode or decode is timed at most this many times (its fastest is kept) ...
TIMINGS = 3
#: ... and fewer once the two fastest agree within this share, or once this many seconds are spent on it: a
#: 15-40 ms WebP encode of a feature map is timed twice (the pass's own encode is the first timing), a
#: 0.1 ms fp16 cast up to three times.
AGREE = 0.1
BUDGET_S = 0.02


Values = dict[str, np.ndarray]


def _exposed(g: graph_mod.ModelGraph, names: Sequence[str]) -> Callable[[Mapping[str, np.ndarray]], Values]:
    """A function from feeds to every tensor in ``names``, from one onnxruntime session of the whole model
    (graph optimisations off: nothing fused away) built once."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(g.model)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    wanted = [n for n in names if n not in inputs]
    for name in wanted:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))  # untyped: onnxruntime infers it
    opts = untimed_options(optimise=False)
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ProfileError(f"{g.path.name}: building the model to size the codecs failed: {exc}") from exc

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            outs = sess.run(wanted, dict(feeds))
        except Exception as exc:
            raise ProfileError(f"{g.path.name}: running the model to size the codecs failed: {exc}") from exc
        got = {n: np.asarray(v) for n, v in zip(wanted, outs, strict=True)}
        got.update({n: np.asarray(feeds[n]) for n in names if n in inputs})
        return got

    return run


def _sized(arr: np.ndarray) -> bool:
    """A tensor a codec may shrink (``graph.cuts.codec_tensor``: what the cost table's ``float_bytes``
    counts): float32, or a uint8 frame of rank 4. The ratios are over these tensors' bytes."""
    return codec_tensor(arr.dtype.name, arr.shape)


@dataclass(frozen=True)
class CodecFacts:
    """Per codec, per cut of ``g.cuts()``: the size ratio, and (lossy codecs) the relative RMS error of the
    decoded cut tensors, ``sqrt(sum (x - x')^2 / sum x^2)`` (``OVERFLOW`` where fp16 overflows)."""

    ratios: dict[str, list[float]]
    errors: dict[str, list[float]]


@dataclass(frozen=True)
class CodecPass:
    """``facts``, and per codec (fp32 included) per cut the encode and decode ms (empty when not timed)."""

    facts: CodecFacts
    encode_ms: dict[str, list[float]]
    decode_ms: dict[str, list[float]]


def measure(
    g: graph_mod.ModelGraph,
    feeds: Mapping[str, np.ndarray],
    *,
    codecs: Sequence[str] = MEASURED,
    progress: Callable[[str], None] | None = None,
) -> CodecFacts:
    """Ratios and errors of every codec at every cut; a cut that sends no float tensor: ratio 1, error 0
    (the ratio then multiplies zero bytes)."""
    return measure_pass(g, [feeds], codecs=codecs, timed=False, progress=progress).facts


def _fastest(fn: Callable[[], object], first_s: float, repeats: int) -> float:
    """ms: the fastest of ``first_s`` and further timings of ``fn``: two at least, ``repeats`` at most, fewer
    once the two fastest agree within ``AGREE`` or ``BUDGET_S`` is spent."""
    got = [first_s]
    while len(got) < min(2, repeats) or (
        len(got) < repeats and sorted(got)[1] > sorted(got)[0] * (1 + AGREE) and sum(got) < BUDGET_S
    ):
        t0 = time.perf_counter()
        fn()
        got.append(time.perf_counter() - t0)
    return min(got) * 1e3


def _sq_error(arr: np.ndarray, back: np.ndarray) -> tuple[float, float]:
    x = arr.astype(np.float64)
    b = back.astype(np.float64)
    err = float(np.sum((b - x) ** 2)) if np.all(np.isfinite(b)) else math.inf
    return err, float(np.sum(x**2))


class _FirstFeed:
    """The first feed's encodes: each one's size, its time and its decode's (``timed``), the errors."""

    def __init__(self, timed: bool, repeats: int) -> None:
        self.timed, self.repeats = timed, repeats
        self.sq: dict[tuple[str, str], tuple[float, float]] = {}  # (tensor, quant): (sum sq error, sum sq value)
        self.enc: dict[tuple[str, str], float] = {}
        self.dec: dict[tuple[str, str], float] = {}

    def size(self, name: str, arr: np.ndarray, spec: str) -> int:
        quant = spec.split("+")[0]
        image = codec.Codec.parse(spec).image is not None
        exact = "+" not in spec and not image  # sized by dtype and shape
        want_error = quant != "fp32" and (name, quant) not in self.sq
        if arr.dtype.kind != "f" and not image:  # a uint8 frame under a tensor codec: sent raw, as it is
            if want_error:
                self.sq[name, quant] = (0.0, float(np.sum(arr.astype(np.float64) ** 2)))
            if self.timed:
                self.enc[name, spec] = self.dec[name, spec] = 0.0
            return int(arr.nbytes)
        if exact and not self.timed and not want_error:
            return codec.expected_bytes(arr.dtype.name, tuple(arr.shape), spec, name=name)
        t0 = time.perf_counter()
        enc = codec.encode(name, arr, spec, copy=False)
        enc_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = codec.decode(enc)  # decodes as its quant does (compression is lossless): the quant's error
        dec_s = time.perf_counter() - t0
        if want_error:
            self.sq[name, quant] = _sq_error(arr, back)
        if self.timed:
            self.enc[name, spec] = _fastest(lambda: codec.encode(name, arr, spec, copy=False), enc_s, self.repeats)
            self.dec[name, spec] = _fastest(lambda: codec.decode(enc), dec_s, self.repeats)
        return codec.expected_bytes(arr.dtype.name, tuple(arr.shape), spec, name=name) if exact else enc.nbytes


def measure_pass(
    g: graph_mod.ModelGraph,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    codecs: Sequence[str] = ("fp32", *MEASURED),
    timed: bool = True,
    repeats: int = TIMINGS,
    progress: Callable[[str], None] | None = None,
) -> CodecPass:
    """Every codec at every cut in one pass over the cut tensors: the ratio (each feed's, rounded, then their
    mean; plain ``fp32`` has none), the error (on ``feeds[0]``) and, when ``timed``, the encode and decode
    times (on ``feeds[0]``: ``codectime``). Each (tensor, codec) is encoded once per feed, the first
    feed's encode being the first timing."""
    if not feeds:
        raise ProfileError(f"{g.path.name}: measuring the codecs needs at least one input, got none")
    cuts = g.cuts()
    names = sorted({t.name for c in cuts for t in c.tensors})
    run = _exposed(g, names)
    specs = list(dict.fromkeys(str(codec.Codec.parse(k)) for k in codecs))
    first = _FirstFeed(timed, repeats)
    per_feed: list[tuple[dict[str, np.ndarray], dict[tuple[str, str], int]]] = []
    for f, feed in enumerate(feeds):
        values = run(feed)
        sizes: dict[tuple[str, str], int] = {}
        floats = [n for n in names if _sized(values[n])]
        for i, name in enumerate(floats):
            arr = values[name]
            for spec in specs:
                with np.errstate(over="ignore", invalid="ignore"):  # fp16 past 65504: inf (an error, below)
                    if f == 0:
                        sizes[name, spec] = first.size(name, arr, spec)
                    elif codec.Codec.parse(spec).image is not None or ("+" in spec and arr.dtype.kind == "f"):
                        sizes[name, spec] = codec.encode(name, arr, spec, copy=False).nbytes  # the values decide
                    else:
                        sizes[name, spec] = per_feed[0][1][name, spec]
            if progress is not None and (i + 1) % 50 == 0:
                progress(f"codecs, input {f + 1}/{len(feeds)}: {i + 1}/{len(floats)} tensors encoded")
        per_feed.append((values, sizes))
    return _per_cut(cuts, specs, per_feed, first)


def _per_cut(
    cuts: Sequence[graph_mod.Cut],
    specs: Sequence[str],
    per_feed: Sequence[tuple[dict[str, np.ndarray], dict[tuple[str, str], int]]],
    first: _FirstFeed,
) -> CodecPass:
    """The per-tensor figures summed over each cut's float tensors."""
    ratios: dict[str, list[float]] = {s: [] for s in specs if s != "fp32"}
    errors: dict[str, list[float]] = {s: [] for s in specs if not s.startswith("fp32")}
    enc: dict[str, list[float]] = {s: [] for s in specs} if first.timed else {}
    dec: dict[str, list[float]] = {s: [] for s in specs} if first.timed else {}
    for c in cuts:
        floats = [t.name for t in c.tensors if _sized(per_feed[0][0][t.name])]
        raw = sum(int(per_feed[0][0][t].nbytes) for t in floats)
        for spec in ratios:
            each = [sum(sizes[t, spec] for t in floats) / raw if raw else 1.0 for _, sizes in per_feed]
            # an all-zero tensor: > 0 still
            rounded = [max(round(r, DIGITS), 10.0**-DIGITS) for r in each]
            ratios[spec].append(round(float(np.mean(rounded)), DIGITS) if len(rounded) > 1 else rounded[0])
        for spec in errors:
            quant = spec.split("+")[0]
            e = sum(first.sq[t, quant][0] for t in floats)
            v = sum(first.sq[t, quant][1] for t in floats)
            rel = math.sqrt(e / v) if v > 0 and math.isfinite(e) else (0.0 if e == 0 else OVERFLOW)
            errors[spec].append(round(min(rel, OVERFLOW), 6))
        for spec in enc:
            enc[spec].append(round(sum(first.enc[t, spec] for t in floats), TIME_DIGITS))
            dec[spec].append(round(sum(first.dec[t, spec] for t in floats), TIME_DIGITS))
    return CodecPass(facts=CodecFacts(ratios=ratios, errors=errors), encode_ms=enc, decode_ms=dec)
