"""A model's per-cut FLOPs and crossing bytes at another input-shape signature, by re-binding the graph.

A graph is sized at one binding (``model.load(path, binding)``); a request of another shape (an OCR
crop of another width, a longer sentence) needs the same facts at its own shapes. ``cut_costs_at``
binds the normalised model again at those shapes (``model.from_proto`` with a ``ShapeBinding``) and
reads every cut's head/tail FLOPs and crossing bytes. Cut ids do not depend on the binding, so the
result lines up with any cost table of the model (checked). Results are cached per model and
signature: the runtime asks once per new request shape.

- ``cut_costs_at(graph, input_shapes) -> CutCosts(ids, head_flops, tail_flops, bytes, float_bytes, reply_bytes,
  flops, head_nodes, tail_nodes)``: the graph re-bound at other shapes (cached; same ids).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

from splitrt.errors import ModelError
from splitrt.graph import model as graph_mod
from splitrt.graph.shapes import Shape, ShapeBinding, Signature, signature

#: Signatures kept per process (all models together); an evicted one is re-bound when asked again.
CACHE_SIZE = 64

_cache: LRUCache[tuple[str, Signature], CutCosts] = LRUCache(maxsize=CACHE_SIZE)
_cache_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class CutCosts:
    """Per cut (in the graph's cut order): FLOPs of the head and of the tail, the bytes sent across it
    and their float32 part (0 for ``device``, which sends nothing), at ``input_shapes``."""

    input_shapes: Mapping[str, Shape]
    ids: tuple[str, ...]
    head_flops: tuple[float, ...]
    tail_flops: tuple[float, ...]
    bytes: tuple[int, ...]
    float_bytes: tuple[int, ...]
    reply_bytes: tuple[int, ...]  # per cut: the graph outputs its tail makes (sent back; 0 for ``device``)
    flops: float  # the whole model
    head_nodes: tuple[int, ...] = ()  # nodes run on each side: each costs a fixed dispatch time too
    tail_nodes: tuple[int, ...] = ()

    @property
    def signature(self) -> Signature:
        return signature(self.input_shapes)


def cut_costs(graph: graph_mod.ModelGraph) -> CutCosts:
    """The costs of a bound graph at the shapes it is bound at (``ModelError`` if it is unbound)."""
    if graph.input_shapes is None:
        raise ModelError(
            f"{graph.path.name}: expected a graph bound at input shapes (load(path, binding)), "
            "got an unbound one: its free dims count as 1"
        )
    cuts = graph.cuts()
    total = graph.flops
    head = np.array([c.head_flops_fraction for c in cuts], dtype=np.float64) * total
    sent = [c.id != "device" for c in cuts]
    return CutCosts(
        input_shapes=dict(graph.input_shapes),
        ids=tuple(c.id for c in cuts),
        head_flops=tuple(float(h) for h in head),
        tail_flops=tuple(float(max(total - h, 0.0)) for h in head),
        bytes=tuple(c.bytes if s else 0 for c, s in zip(cuts, sent, strict=True)),
        float_bytes=tuple(c.codec_bytes if s else 0 for c, s in zip(cuts, sent, strict=True)),
        reply_bytes=tuple(c.reply_bytes for c in cuts),
        head_nodes=tuple(c.head_nodes for c in cuts),
        tail_nodes=tuple(len(graph.nodes) - c.head_nodes for c in cuts),
        flops=total,
    )


def cut_costs_at(
    graph: graph_mod.ModelGraph,
    input_shapes: Mapping[str, Sequence[int]],
    *,
    sample: Mapping[str, np.ndarray] | None = None,
) -> CutCosts:
    """``graph``'s per-cut costs at ``input_shapes`` (one shape per graph input), cached per model and
    signature. ``sample``: arrays of those shapes whose values size data-dependent tensors (a Reshape
    to a computed shape, NonZero); without one, valid random inputs do. The first call for a signature
    decides: a later sample of the same shapes is not looked at."""
    sig = signature(input_shapes)
    key = (graph.sha256, sig)
    with _cache_lock:
        hit = _cache.get(key)  # (a hit is the most recent again)
        if hit is not None:
            return hit
    if graph.input_shapes is not None and signature(graph.input_shapes) == sig:
        costs = cut_costs(graph)  # already bound there: nothing to re-bind
    else:
        binding = ShapeBinding(
            shapes=dict(sig),
            sample=dict(sample) if sample is not None else None,
            sample_path="(request)" if sample is not None else None,
        )
        bound = graph_mod.from_proto(graph.model, path=graph.path, sha256=graph.sha256, binding=binding)
        costs = cut_costs(bound)
        want = [c.id for c in graph.cuts()]
        if list(costs.ids) != want:  # ids are binding-independent by design: a mismatch is a bug
            raise ModelError(
                f"{graph.path.name}: re-bound at {dict(sig)} it lists {len(costs.ids)} cuts, "
                f"expected the same {len(want)} cut ids as at any other binding"
            )
    with _cache_lock:
        _cache[key] = costs  # the least recently used goes beyond CACHE_SIZE
    return costs


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
