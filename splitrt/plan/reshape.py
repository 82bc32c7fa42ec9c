"""A cost table at another input shape, scaled from the one profiled (pure: no I/O, no clocks).

A profile is measured at one input-shape signature A (``--dim height=320 --dim width=320``); requests
come at others (OCR crops of every width, sentences of every length). Re-profiling per shape costs
seconds to minutes; the graph, re-bound at the request's shapes B (``splitrt.graph.rebind``), gives
every cut's exact crossing bytes and head/tail FLOPs at B in milliseconds. The scaled table for B:

- ``bytes`` and ``float_bytes`` (and ``reply_bytes``) are B's own: exact, not scaled;
- ``head_ms[c] = head_ms_A[c] × head_flops_B[c] / head_flops_A[c]``, ``tail_ms`` likewise with the
  tail's FLOPs: time taken as proportional to FLOPs, per side of each cut;
- a side with no FLOPs at A (a head of only elementwise ops before the first Conv, the empty tail of
  ``device``) scales by the whole model's FLOPs ratio instead; a model with no counted FLOPs at all
  (no Conv/Gemm/MatMul) by the ratio of its input bytes, the ``cloud`` cut's;
- ``fixed_ms`` (default 0) is held out of the scaling on each side: the per-``run()`` cost of a
  session, which does not grow with the tensors.

Limits. FLOPs count only Conv/Gemm/MatMul (``graph.model._flops``): elementwise ops, softmax, resizes
and memory traffic are assumed to grow like them, which holds for CNNs on spatial dims but not exactly
for attention (softmax grows with seq², layer norms with seq). Per-op efficiency changes with the shape:
small tensors under-use the cores and vector units, large ones fall out of cache, so time is not linear
in FLOPs. The fixed per-run overhead does not scale, and neither does each node's own fixed cost (kernel
dispatch, allocation), which ``fixed_ms`` cannot hold out: it is per node, not per side. What that
means in practice (``bench/bench_shapes.py``, 2-core x86): a CNN whose time is in its convolutions
scales well (yolo_tiny 320² -> 640², 4x the FLOPs: whole-model time within ~10 %, plans as the real
profile's), while a model small enough to be dominated by per-node costs does not (bert_tiny seq 16 ->
128: 11x the FLOPs, ~6x the time; about half its seq-16 time does not grow, so the scaled table is
~2x too slow). The result is a prior for the controller, as good as the shapes are close and the model
compute-bound; re-profile at a shape that matters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from splitrt.errors import PlanError
from splitrt.plan.controller import ControllerConfig, Decision, replay
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, CostTable, FloatArray, Power

#: ``((input name, shape), ...)`` sorted by name: the key of one set of request shapes.
Signature = tuple[tuple[str, tuple[int, ...]], ...]


class ShapeCosts(Protocol):
    """Per-cut facts at one shape signature (``splitrt.graph.rebind.CutCosts`` is one)."""

    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def head_flops(self) -> Sequence[float]: ...
    @property
    def tail_flops(self) -> Sequence[float]: ...
    @property
    def bytes(self) -> Sequence[int]: ...
    @property
    def float_bytes(self) -> Sequence[int]: ...
    @property
    def reply_bytes(self) -> int: ...


def signature(shapes: Mapping[str, Sequence[int]]) -> Signature:
    """The key of a set of input shapes, whatever order they come in."""
    return tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items()))


def signature_json(sig: Signature) -> dict[str, list[int]]:
    """A signature as a JSON value (a decision's ``extra["shape"]``): ``{name: [dims]}``."""
    return {name: list(shape) for name, shape in sig}


def _vector(name: str, values: Sequence[float], ids: Sequence[str]) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.shape != (len(ids),):
        raise PlanError(f"{name}: expected {len(ids)} values (one per cut), got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise PlanError(f"{name}: every value must be finite and >= 0")
    return arr


def _ratio(new: float, old: float) -> float | None:
    return new / old if old > 0 else None


def flops_ratios(table: CostTable, at_a: ShapeCosts, at_b: ShapeCosts) -> tuple[FloatArray, FloatArray]:
    """Per cut, the (head, tail) time multipliers from A to B (see the module docstring)."""
    for which, costs in (("A", at_a), ("B", at_b)):
        if tuple(costs.ids) != table.ids:
            raise PlanError(f"shape costs at {which}: expected the table's {len(table.ids)} cut ids "
                            f"({table.ids[0]}..{table.ids[-1]}), got {len(costs.ids)} ids "
                            f"({', '.join(list(costs.ids)[:3])}...)")
    ha, ta = (_vector(f"{side} at A", getattr(at_a, side), table.ids) for side in ("head_flops", "tail_flops"))
    hb, tb = (_vector(f"{side} at B", getattr(at_b, side), table.ids) for side in ("head_flops", "tail_flops"))
    whole = _ratio(float(np.max(hb + tb)), float(np.max(ha + ta)))
    if whole is None:
        cloud = table.ids.index(CLOUD_CUT) if CLOUD_CUT in table.ids else None
        whole = (_ratio(float(at_b.bytes[cloud]), float(at_a.bytes[cloud])) if cloud is not None else None) or 1.0
    head = np.array([_ratio(b, a) or whole for a, b in zip(ha, hb, strict=True)], dtype=np.float64)
    tail = np.array([_ratio(b, a) or whole for a, b in zip(ta, tb, strict=True)], dtype=np.float64)
    # A side with FLOPs at A and none at B (a dim bound to 0) really does shrink to nothing.
    head[(ha > 0) & (hb == 0)] = 0.0
    tail[(ta > 0) & (tb == 0)] = 0.0
    return head, tail


def scale_table(table: CostTable, at_a: ShapeCosts, at_b: ShapeCosts, *, fixed_ms: float = 0.0) -> CostTable:
    """``table`` (profiled at A) as it would be at B: times scaled per side by FLOPs, bytes from B.

    ``PlanError`` when the cut ids of either side differ from the table's or a vector is malformed."""
    if not (fixed_ms >= 0 and np.isfinite(fixed_ms)):
        raise PlanError(f"fixed_ms: expected a finite number >= 0, got {fixed_ms!r}")
    head_r, tail_r = flops_ratios(table, at_a, at_b)

    def scaled(ms: FloatArray, ratio: FloatArray) -> FloatArray:
        fixed = np.minimum(ms, fixed_ms)
        return fixed + (ms - fixed) * ratio

    bytes_b = _vector("bytes at B", at_b.bytes, table.ids)
    float_b = _vector("float_bytes at B", at_b.float_bytes, table.ids)
    return CostTable(ids=table.ids, head_ms=scaled(table.head_ms, head_r), tail_ms=scaled(table.tail_ms, tail_r),
                     bytes=bytes_b.astype(np.int64), float_bytes=float_b.astype(np.int64),
                     reply_bytes=int(at_b.reply_bytes),
                     codecs=dict(zip(table.codecs, table.codec_ratios.tolist(), strict=True)))


def replay_by_shape(lines: Iterable[str], table_for: Callable[[Signature | None], CostTable],
                    config: ControllerConfig | None = None, *, power: Power = DEFAULT_POWER,
                    model: str | None = None) -> list[tuple[Decision, Decision]]:
    """``controller.replay`` for a runtime that keeps one controller per request shape: the lines are
    grouped by their ``extra["shape"]`` and each group replays through a fresh controller on
    ``table_for(signature)`` (``None`` for lines without one: logs of before per-shape plans).
    Pairs come group by group, in the order the groups first appear."""
    groups: dict[Signature | None, list[str]] = {}
    for line in lines:
        if not line.strip():
            continue
        shape = json.loads(line).get("extra", {}).get("shape")
        key = signature(shape) if isinstance(shape, dict) else None
        groups.setdefault(key, []).append(line)
    pairs: list[tuple[Decision, Decision]] = []
    for key, group in groups.items():
        pairs += replay(group, table_for(key), config, power=power, model=model)
    return pairs
