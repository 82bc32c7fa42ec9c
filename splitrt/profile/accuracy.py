"""What each lossy codec at each cut does to the model's OUTPUT, measured on samples (the accuracy guard).

A codec's error on a cut tensor says little about the answer (a JPEG of the input moves every pixel and
usually leaves the class alone; int8 of one bad tensor flips it), so plans are guarded by the model's
final output: ``measure`` runs, for every sample, the whole model uncompressed (graph optimisations off,
every tensor of the measured cuts exposed), then for each measured cut and each lossy codec the cut's
tail (``graph.partition``) on the cut's tensors encoded and decoded with that codec (outputs the head
made itself come from the reference), and scores the output against the reference:

- ``top1`` (a classifier: its first output, rows of the last axis): the share of rows whose argmax agrees;
- ``boxes`` (a YOLO-style detector: first output ``[N, 4 + classes, anchors]`` or ``[N, anchors, 4 +
  classes]``, boxes as centre x, centre y, width, height): boxes scoring >= ``BOX_SCORE``, greedy NMS at
  ``NMS_IOU`` per class, then the F1 of a greedy one-to-one match of same-class boxes at IoU >=
  ``BOX_IOU`` (1 when both runs find nothing);
- ``rel_err`` (anything else): 1 when the relative RMS error over every float output, ``sqrt(sum (a -
  b)^2 / sum a^2)``, is <= ``rel_tol`` (default ``REL_TOL``), else 0.

A sample's scores average into ``Agreement.shares[codec][cut]`` in [0, 1]; a cut not measured is None,
``device`` is 1 (nothing crosses). Codecs that decode alike share one measurement (``int8+zstd`` is
``int8``'s). ``auto_metric(g)``: ``top1`` for one float output ``[N, classes]`` (or ``[N, classes, 1,
1]``), else ``rel_err`` (``boxes`` is never guessed). ``spread_cuts(g, n)``: ``cloud`` and ``n`` inner cuts
spread evenly.
``profile.costs.measured_codecs`` prices a lossy (cut, codec) below ``min_agreement`` (or unmeasured) out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.graph import partition
from splitrt.graph.ort_errors import onnxruntime_errors
from splitrt.profile.store import Profile
from splitrt.profile.timing import untimed_options
from splitrt.transport import codec

METRICS: tuple[str, ...] = ("top1", "boxes", "rel_err")
#: Plans use a lossy (cut, codec) only where at least this share of the samples agree (``plan
#: --min-agreement``): on 50 samples, every one of them.
MIN_AGREEMENT = 0.99
#: ``rel_err``: a sample agrees when the outputs' relative RMS error is at most this.
REL_TOL = 0.02
BOX_SCORE = 0.25
NMS_IOU = 0.45
BOX_IOU = 0.5
#: Inner cuts measured besides ``cloud`` by default (each costs a tail run per sample and codec).
DEFAULT_CUTS = 8
#: Agreement is stored rounded: four digits are below one sample in 50.
DIGITS = 4


@dataclass(frozen=True, kw_only=True)
class Agreement:
    shares: dict[str, list[float | None]]  # per lossy codec, per cut of ``g.cuts()``
    metric: str
    samples: int
    output: str  # the graph output scored (``rel_err``: every float output; this names the first)
    rel_tol: float
    # per codec (every one given, lossless too), per measured cut id: the mean encoded bytes of the cut's
    # tensors over the samples, and (lossy codecs) each sample's score; for benches, not stored in profiles
    sent_bytes: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    scores: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)

    def facts(self, source: str) -> dict[str, Any]:
        """The profile's ``accuracy`` record."""
        out: dict[str, Any] = {"metric": self.metric, "samples": self.samples, "source": source}
        out["output"] = self.output
        if self.metric == "rel_err":
            out["rel_tol"] = self.rel_tol
        if self.metric == "boxes":
            out.update(box_score=BOX_SCORE, nms_iou=NMS_IOU, box_iou=BOX_IOU)
        return out


def auto_metric(g: graph_mod.ModelGraph) -> str:
    outs = g.outputs
    shape = outs[0].shape if len(outs) == 1 and outs[0].dtype.startswith("float") else None
    if shape is not None and len(shape) >= 2 and all(d == 1 for d in shape[2:]):
        k = shape[1]
        if not isinstance(k, int) or k >= 2:  # [N, classes] or [N, classes, 1, 1]
            return "top1"
    return "rel_err"


def spread_cuts(g: graph_mod.ModelGraph, n: int = DEFAULT_CUTS) -> list[str]:
    """``cloud`` and ``n`` inner cuts evenly spread (every inner cut if there are no more than ``n``)."""
    inner = [c.id for c in g.cuts() if c.id not in ("cloud", "device")]
    if len(inner) > n:
        inner = [inner[round(i * (len(inner) - 1) / max(n - 1, 1))] for i in range(n)] if n > 0 else []
    return ["cloud", *dict.fromkeys(inner)]


# ---- metrics (pure) -----------------------------------------------------------------------------------


def top1(ref: np.ndarray, out: np.ndarray) -> float:
    a = ref.reshape(ref.shape[0] if ref.ndim > 1 else 1, -1)
    b = out.reshape(a.shape)
    return float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))


def _detections(raw: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per batch item: (xyxy boxes, classes, scores) after the score threshold and NMS per class."""
    x = raw.astype(np.float64)
    if x.ndim != 3 or min(x.shape[1], x.shape[2]) < 5:
        raise ProfileError(f"boxes metric: expected a YOLO output [N, 4 + classes, anchors], got {list(raw.shape)}")
    if x.shape[1] > x.shape[2]:
        x = x.transpose(0, 2, 1)  # [N, anchors, 4 + classes] -> [N, 4 + classes, anchors]
    out = []
    for item in x:
        cls_scores = item[4:]
        cls = np.argmax(cls_scores, axis=0)
        score = cls_scores[cls, np.arange(cls.size)]
        keep = score >= BOX_SCORE
        cx, cy, w, h = item[:4, keep]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        cls, score = cls[keep], score[keep]
        chosen: list[int] = []
        for i in np.argsort(-score, kind="stable"):
            if all(cls[j] != cls[i] or _iou(boxes[i], boxes[j]) < NMS_IOU for j in chosen):
                chosen.append(int(i))
        out.append((boxes[chosen], cls[chosen], score[chosen]))
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def box_agreement(ref: np.ndarray, out: np.ndarray) -> float:
    """Mean over the batch of the F1 of IoU-matched same-class boxes (1 when neither finds any)."""
    scores = []
    for (rb, rc, _), (ob, oc, _) in zip(_detections(ref), _detections(out), strict=True):
        if len(rb) == 0 and len(ob) == 0:
            scores.append(1.0)
            continue
        used: set[int] = set()
        matched = 0
        for i in range(len(rb)):
            best, best_j = BOX_IOU, -1
            for j in range(len(ob)):
                if j not in used and oc[j] == rc[i]:
                    iou = _iou(rb[i], ob[j])
                    if iou >= best:
                        best, best_j = iou, j
            if best_j >= 0:
                used.add(best_j)
                matched += 1
        scores.append(2 * matched / (len(rb) + len(ob)))
    return float(np.mean(scores))


def relative_error(ref: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray]) -> float:
    err = norm = 0.0
    for name, a in ref.items():
        if a.dtype.kind != "f":
            continue
        d = a.astype(np.float64) - out[name].astype(np.float64)
        err += float(np.sum(d * d))
        norm += float(np.sum(a.astype(np.float64) ** 2))
    if not math.isfinite(err):
        return math.inf
    return math.sqrt(err / norm) if norm > 0 else (0.0 if err == 0 else math.inf)


def score(
    metric: str, ref: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], *, output: str, rel_tol: float
) -> float:
    """One sample's agreement in [0, 1] under ``metric``."""
    if metric == "top1":
        return top1(ref[output], out[output])
    if metric == "boxes":
        return box_agreement(ref[output], out[output])
    if metric == "rel_err":
        return 1.0 if relative_error(ref, out) <= rel_tol else 0.0
    raise ProfileError(f"accuracy metric: expected one of {', '.join(METRICS)}, got {metric!r}")


# ---- measurement (runs onnxruntime) -------------------------------------------------------------------


def _session(model: Any, what: str) -> Any:
    import onnxruntime as ort

    opts = untimed_options()
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    with onnxruntime_errors(what, stage="build"):
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _exposed(g: graph_mod.ModelGraph, names: Sequence[str]) -> tuple[Any, list[str]]:
    """A session of the whole model (optimisations off: nothing fused away) with ``names`` as outputs,
    and the names it computes (graph inputs are fed, not computed)."""
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(g.model)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    wanted = [n for n in names if n not in inputs]
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in wanted if n not in have)  # onnxruntime types them
    opts = untimed_options(optimise=False)
    with onnxruntime_errors(f"{g.path.name} with its cut tensors exposed", stage="build"):
        return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]), wanted


def _lossy_keys(codecs: Sequence[str]) -> dict[str, list[str]]:
    """Codecs that decode alike, by their quantisation (``int8+zstd`` decodes as ``int8``)."""
    keys: dict[str, list[str]] = {}
    for c in codecs:
        spec = codec.Codec.parse(c)
        if not spec.lossless:
            keys.setdefault(spec.quant, []).append(str(spec))
    return keys


def measure(
    g: graph_mod.ModelGraph,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    codecs: Sequence[str],
    cuts: Sequence[str] | None = None,
    metric: str = "auto",
    rel_tol: float = REL_TOL,
    progress: Callable[[str], None] | None = None,
    sizes: bool = False,
) -> Agreement:
    """Agreement of every lossy codec in ``codecs`` at ``cuts`` (default ``spread_cuts(g)``) over ``feeds``;
    ``sizes``: also ``Agreement.sent_bytes`` (every codec encoded once more per sample and cut)."""
    if not feeds:
        raise ProfileError(f"{g.path.name}: accuracy needs at least one sample, got none")
    metric = auto_metric(g) if metric == "auto" else metric
    if metric not in METRICS:
        raise ProfileError(f"accuracy metric: expected auto or one of {', '.join(METRICS)}, got {metric!r}")
    ids = [c.id for c in g.cuts()]
    chosen = [c for c in (spread_cuts(g) if cuts is None else cuts) if c != "device"]
    unknown = [c for c in chosen if c not in ids]
    if unknown:
        raise ProfileError(f"{g.path.name}: accuracy cuts {unknown} are not cuts of the model")
    outputs = [o.name for o in g.outputs]
    tails = {c: partition.head_tail(g, c)[1] for c in chosen}
    sessions = {c: _session(t.model, f"the tail of cut {c!r}") for c, t in tails.items()}
    keys = _lossy_keys(codecs)
    specs = [str(codec.Codec.parse(c)) for c in codecs]
    per: dict[tuple[str, str], list[float]] = {(k, c): [] for k in keys for c in chosen}
    sent = {(s, c): 0.0 for s in specs for c in chosen}
    whole, computed = _exposed(g, sorted({n for t in tails.values() for n in t.inputs} | set(outputs)))
    for i, sample in enumerate(feeds):
        with onnxruntime_errors(f"{g.path.name} on sample {i}", stage="run", feeds=sample):
            got_all = whole.run(computed, dict(sample))
        values = {**{n: np.asarray(v) for n, v in sample.items()}, **dict(zip(computed, got_all, strict=True))}
        ref = {o: values[o] for o in outputs}
        for c in chosen:
            tail = tails[c]
            for spec in specs if sizes else ():
                sent[spec, c] += sum(codec.encode(n, values[n], spec, copy=False).nbytes for n in tail.inputs)
            for k in keys:
                fed = {n: codec.decode(codec.encode(n, values[n], k)) for n in tail.inputs}
                with onnxruntime_errors(f"the tail of cut {c!r} under {k}", stage="run", feeds=fed):
                    got = sessions[c].run(list(tail.outputs), fed)
                out = {**ref, **dict(zip(tail.outputs, got, strict=True))}
                per[k, c].append(score(metric, ref, out, output=outputs[0], rel_tol=rel_tol))
        if progress is not None:
            progress(f"accuracy: sample {i + 1}/{len(feeds)} ({len(chosen)} cuts x {len(keys)} codecs)")
    shares: dict[str, list[float | None]] = {}
    scores: dict[str, dict[str, list[float]]] = {}
    for k, alike in keys.items():
        row: list[float | None] = [
            1.0 if cid == "device" else (round(float(np.mean(per[k, cid])), DIGITS) if cid in chosen else None)
            for cid in ids
        ]
        for s in alike:
            shares[s] = list(row)
            scores[s] = {c: per[k, c] for c in chosen}
    return Agreement(
        shares=shares,
        metric=metric,
        samples=len(feeds),
        output=outputs[0],
        rel_tol=rel_tol,
        sent_bytes={s: {c: sent[s, c] / len(feeds) for c in chosen} for s in specs} if sizes else {},
        scores=scores,
    )


#: Samples whose codec ratios are averaged into a profile's (real images compress unlike random input).
RATIO_SAMPLES = 3


def with_accuracy(
    profile: Profile,
    g: graph_mod.ModelGraph,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    source: str,
    cuts: Sequence[str] | None = None,
    metric: str = "auto",
    rel_tol: float = REL_TOL,
    progress: Callable[[str], None] | None = None,
    ratios: bool = True,
) -> Profile:
    """``profile`` with ``codec_agreement`` and ``accuracy`` measured on ``feeds`` (every codec the profile
    prices per cut, and the fixed ones), and (``ratios``) its codec ratios re-measured as the mean over the
    first ``RATIO_SAMPLES`` samples, its codec errors on the first (``ratios=False``: the profile measured
    its codecs on them already, ``profiler.measure(codec_feeds=...)``). Timings stay as they are.
    ``ProfileError`` if ``g`` is another model."""
    from splitrt.profile import codecratio

    if g.sha256 != profile.sha256 or tuple(c.id for c in g.cuts()) != profile.cut_ids:
        raise ProfileError(
            f"{g.path.name} (sha256 {g.sha256[:12]}..., {len(g.cuts())} cuts) is not the profile's model "
            f"({profile.sha256[:12]}..., {len(profile.cuts)} cuts): expected the same model"
        )
    if not feeds:
        raise ProfileError(f"{g.path.name}: accuracy needs at least one sample, got none")
    if ratios:
        facts = codecratio.measure_pass(g, feeds[:RATIO_SAMPLES], codecs=codecratio.MEASURED, timed=False).facts
        profile = dataclasses.replace(profile, codec_ratios=facts.ratios, codec_errors=facts.errors)
    codecs = list(dict.fromkeys([*codecratio.MEASURED, "fp16", "int8", "int8c"]))
    agreement = measure(g, feeds, codecs=codecs, cuts=cuts, metric=metric, rel_tol=rel_tol, progress=progress)
    return dataclasses.replace(profile, codec_agreement=agreement.shares, accuracy=agreement.facts(source))
