"""A cost table at another input shape, scaled from the one profiled (pure: no I/O, no clocks).

A profile is measured at one input-shape signature A (``--dim height=320 --dim width=320``); requests
come at others (OCR crops of every width, sentences of every length). Re-profiling per shape costs
seconds to minutes; the graph, re-bound at the request's shapes B (``splitrt.graph.rebind``), gives
every cut's exact crossing bytes and head/tail FLOPs at B in milliseconds. The scaled table for B:

- ``bytes`` and ``float_bytes`` (and ``reply_bytes``) are B's own: exact, not scaled;
- ``head_ms[c] = head_ms_A[c] × head_flops_B[c] / head_flops_A[c]``, ``tail_ms`` likewise with the
  tail's FLOPs: time taken as proportional to FLOPs, per side of each cut;
- a side with no FLOPs at A (a head of only data movement, the empty tail of
  ``device``) scales by the whole model's FLOPs ratio instead; a model with no counted FLOPs at all
  (only data movement) by the ratio of its input bytes, the ``cloud`` cut's;
- ``fixed_ms`` (default 0) is held out of the scaling on each side: the per-``run()`` cost of a
  session, which does not grow with the tensors.

Limits. FLOPs (``splitrt.graph.flops``) count arithmetic, not memory traffic, which is assumed to grow
like them: it holds for CNNs on spatial dims, less exactly for attention. Per-op efficiency changes with
the shape: small tensors under-use the cores and vector units, large ones fall out of cache, so time is
not linear in FLOPs. The fixed per-run overhead does not scale, and neither does each node's own fixed
cost (kernel dispatch, allocation): when the shape costs carry node counts, ``scale_table`` fits ``ms ≈
node_ms × nodes + ms_per_flop × FLOPs`` per side over the profile's cuts and scales only the second
term. ``bench/bench_shapes.py`` measures the error against a real profile at the other shape (a few % for a
CNN's spatial dims, tens of % for an encoder's sequence length). The result is a prior for the controller,
as good as the shapes are close and the profile steady; re-profile at a shape that matters.

- ``scale_table(table, at_a, at_b) -> CostTable``: bytes from B; each side's time split into a per-node part and
  a FLOPs part fitted over the profile's cuts (``fit_node_ms``); only the FLOPs part scales.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from splitrt.errors import PlanError
from splitrt.plan.controller import ControllerConfig, Decision
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, CostTable, FloatArray, Power
from splitrt.plan.replay import replay

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
    def reply_bytes(self) -> int | Sequence[int]: ...


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
            raise PlanError(
                f"shape costs at {which}: expected the table's {len(table.ids)} cut ids "
                f"({table.ids[0]}..{table.ids[-1]}), got {len(costs.ids)} ids "
                f"({', '.join(list(costs.ids)[:3])}...)"
            )
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


def fit_node_ms(ms: FloatArray, nodes: FloatArray, flops: FloatArray) -> tuple[float, float]:
    """Least-squares ``ms ≈ node_ms × nodes + ms_per_flop × flops`` over a profile's cuts, both >= 0:
    the part of a side's time every node costs whatever its tensors (dispatch, allocation), and the
    part that grows with the work. (0, 0) when the profile cannot tell them apart."""
    keep = (nodes > 0) & np.isfinite(ms)
    if int(np.count_nonzero(keep)) < 3:
        return 0.0, 0.0
    x = np.stack([nodes[keep], flops[keep]], axis=1)
    y = ms[keep]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    a, b = float(coef[0]), float(coef[1])
    if a < 0 or b < 0:  # clamp one term at 0 and refit the other alone
        a, b = (
            (0.0, float(y @ x[:, 1] / (x[:, 1] @ x[:, 1] or 1.0)))
            if a < 0
            else (float(y @ x[:, 0] / (x[:, 0] @ x[:, 0] or 1.0)), 0.0)
        )
    return max(a, 0.0), max(b, 0.0)


def _node_aware(
    ms: FloatArray, nodes_seq: Sequence[int], f_a: FloatArray, f_b: FloatArray, flops_ratio: FloatArray
) -> FloatArray:
    """Per cut, the multiplier from A to B when each node costs a fixed time on top of its FLOPs."""
    nodes = np.asarray(nodes_seq, dtype=np.float64)
    node_ms, per_flop = fit_node_ms(ms, nodes, f_a)
    if node_ms == 0.0 or per_flop == 0.0:
        return flops_ratio
    at_a = node_ms * nodes + per_flop * f_a
    at_b = node_ms * nodes + per_flop * f_b
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(at_a > 0, at_b / at_a, flops_ratio)
    return np.asarray(ratio, dtype=np.float64)


def scale_table(table: CostTable, at_a: ShapeCosts, at_b: ShapeCosts, *, fixed_ms: float = 0.0) -> CostTable:
    """``table`` (profiled at A) as it would be at B: times scaled per side by FLOPs, bytes from B.

    When the shape costs carry node counts (``head_nodes``/``tail_nodes``), each side's time is split
    into a per-node part that does not grow with the tensors and a FLOPs part, fitted by least squares
    over the profile's cuts (``fit_node_ms``), and only the second scales: small, dispatch-bound models
    (bert_tiny) would otherwise be scaled as if all their time were arithmetic.

    ``PlanError`` when the cut ids of either side differ from the table's or a vector is malformed."""
    if not (fixed_ms >= 0 and np.isfinite(fixed_ms)):
        raise PlanError(f"fixed_ms: expected a finite number >= 0, got {fixed_ms!r}")
    head_r, tail_r = flops_ratios(table, at_a, at_b)
    head_nodes = getattr(at_a, "head_nodes", ())
    tail_nodes = getattr(at_a, "tail_nodes", ())
    if len(head_nodes) == len(table.ids) and len(tail_nodes) == len(table.ids):
        ha, hb = (np.asarray(c.head_flops, dtype=np.float64) for c in (at_a, at_b))
        ta, tb = (np.asarray(c.tail_flops, dtype=np.float64) for c in (at_a, at_b))
        head_r = _node_aware(table.head_ms, head_nodes, ha, hb, head_r)
        tail_r = _node_aware(table.tail_ms, tail_nodes, ta, tb, tail_r)

    def scaled(ms: FloatArray, ratio: FloatArray) -> FloatArray:
        fixed = np.minimum(ms, fixed_ms)
        return fixed + (ms - fixed) * ratio

    bytes_b = _vector("bytes at B", at_b.bytes, table.ids)
    float_b = _vector("float_bytes at B", at_b.float_bytes, table.ids)
    return CostTable(
        ids=table.ids,
        head_ms=scaled(table.head_ms, head_r),
        tail_ms=scaled(table.tail_ms, tail_r),
        bytes=bytes_b.astype(np.int64),
        float_bytes=float_b.astype(np.int64),
        reply_bytes=np.asarray(at_b.reply_bytes, dtype=np.float64),
        codecs=table.codec_map(),
        encode_ms=table.codec_time_map(table.encode_ms),
        decode_ms=table.codec_time_map(table.decode_ms),
        call_ms=table.call_ms,
    )


def replay_by_shape(
    lines: Iterable[str],
    table_for: Callable[[Signature | None], CostTable],
    config: ControllerConfig | None = None,
    *,
    power: Power = DEFAULT_POWER,
    model: str | None = None,
) -> list[tuple[Decision, Decision]]:
    """``plan.replay.replay`` for a runtime that keeps one controller per request shape: the lines are
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
