"""Cut enumeration: every place a normalised model can be cut, and the bytes crossing each.

A *cut* splits the nodes into a head (run on the device) closed under predecessors and a tail (run in
the cloud). The tensors produced in the head (or graph inputs) that the tail needs *cross* the cut and
are what the device sends. Because every node of a normalised graph feeds some output, the crossing set
determines the head (it is exactly the set of ancestors of the crossing tensors), so a cut is identified
by its crossing tensors; ids are short deterministic names (``cloud``, ``c1`` ... ``device``), the same
for the same model bytes, so device and cloud agree without a binding.

Heads are Python ints used as bitsets over node indices, made on demand: enumerating every cut of a
~900-node DenseNet is a few thousand big-int operations instead of set algebra, and memory stays linear
in the node count (a 60 000-node chain: 276 MB, not 1.4 GB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from splitrt.errors import CutError
from splitrt.graph.tensors import TensorInfo


class ModelGraph(Protocol):
    """What cuts read of a ``graph.model.ModelGraph`` (which imports this module to enumerate its cuts)."""

    @property
    def nodes(self) -> Sequence[Any]: ...  # onnx.NodeProto, in topological order
    @property
    def inputs(self) -> Sequence[TensorInfo]: ...
    @property
    def outputs(self) -> Sequence[TensorInfo]: ...
    @property
    def node_flops(self) -> Sequence[float]: ...
    @property
    def node_inputs(self) -> Sequence[tuple[str, ...]]: ...
    @property
    def producer(self) -> Mapping[str, int]: ...
    @property
    def consumers(self) -> Mapping[str, list[int]]: ...
    def tensor(self, name: str) -> TensorInfo: ...


@dataclass(frozen=True)
class Cut:
    """A valid cut: ``head_mask`` is an int bitset of node indices (into ``ModelGraph.nodes``) closed
    under predecessors (``.head`` gives it as a frozenset).

    ``tensors`` are the crossing tensors in a stable order: what the tail reads (graph inputs the tail
    needs cross too; initializers live on both sides and never cross). ``kept``: the graph outputs
    already on the device after the head (made by it, or graph inputs): never sent unless a tail node
    reads them, never replied; ``reply_bytes``: the graph outputs the tail makes (the reply). Ids:
    ``cloud`` (empty head: the graph inputs cross), ``c1``, ``c2``, ... in topological order, ``device``
    (everything on the device: nothing crosses, every output kept).

    The mask is made on demand (``mask_of``: a prefix of the topological order, or a node's ancestors):
    held for every cut of an n-node chain, masks would take O(n^2) bits (1.4 GB at 60 000 nodes)."""

    id: str
    # What the tail needs from the device (sent); ``bytes`` is their size.
    tensors: tuple[TensorInfo, ...]
    bytes: int
    head_nodes: int
    head_flops_fraction: float
    mask_of: Callable[[], int] = field(compare=False, repr=False)
    # Graph outputs already on the device after the head (it produced them, or they are graph inputs):
    # never sent, never replied (``kept``, made on demand like the mask: held for every cut of a model with
    # many outputs they would take O(cuts x outputs)). The reply carries the others, ``reply_bytes`` of them.
    kept_of: Callable[[], tuple[str, ...]] = field(default=tuple, compare=False, repr=False)
    reply_bytes: int = 0

    @property
    def head_mask(self) -> int:
        return self.mask_of()

    @property
    def kept(self) -> tuple[str, ...]:
        return self.kept_of()

    @property
    def head(self) -> frozenset[int]:
        return frozenset(bits(self.head_mask))

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    @property
    def codec_bytes(self) -> int:
        """The part of ``bytes`` a codec may shrink (a cost table's ``float_bytes``): see ``codec_tensor``."""
        return sum(max(t.bytes, 0) for t in self.tensors if codec_tensor(t.dtype, t.shape))

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "tensors": [t.as_dict() for t in self.tensors],
            "bytes": self.bytes,
            "kept": list(self.kept),
            "reply_bytes": self.reply_bytes,
            "head_nodes": self.head_nodes,
            "head_flops_fraction": round(self.head_flops_fraction, 6),
        }


def codec_tensor(dtype: str, shape: Sequence[int | str] | None) -> bool:
    """A tensor a codec may send in fewer bytes: float32, or uint8 of rank 4 (a frame: an image codec
    sends it as an image, every other codec raw, which the profile's measured ratios say)."""
    return dtype == "float32" or (dtype == "uint8" and shape is not None and len(shape) == 4)


def bits(mask: int) -> Iterable[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def mask_to_bool(mask: int, n: int) -> np.ndarray:
    raw = np.frombuffer(mask.to_bytes((n + 8) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def enumerate_cuts(mg: ModelGraph) -> list[Cut]:
    """Every prefix of the topological order (frontier cuts) plus every single-tensor cut.

    Prefix cuts are found incrementally in O(edges). A node p's ancestor set anc(p) is a single-tensor
    cut iff no edge leaves anc(p) except from p, which one pass of bitset unions decides: with
    S(p) = union over predecessors r of (S(r) | succ(r)), the condition is S(p) within anc(p).
    Memory stays linear in practice: a node's bitsets are dropped once its last successor has used
    them, and prefixes and heads are kept as (length | node), not as masks.
    """
    n = len(mg.nodes)
    sink = n  # a virtual consumer of every graph output
    out_names = [o.name for o in mg.outputs]
    # Graph outputs and graph inputs both count as "consumers outside the head" for crossing purposes.
    consumers: dict[str, list[int]] = {k: sorted(set(v)) for k, v in mg.consumers.items()}
    for o in out_names:
        consumers.setdefault(o, []).append(sink)
    input_names = [i.name for i in mg.inputs if i.name in consumers]
    pred_nodes = [sorted({mg.producer[i] for i in ins if i in mg.producer}) for ins in mg.node_inputs]
    prefix_heads = _prefix_heads(mg)
    singles = _single_tensor_heads(mg, consumers, input_names, pred_nodes)

    flops = np.asarray(mg.node_flops, dtype=np.float64)
    total_flops = float(flops.sum()) or 1.0
    prefix_flops = np.concatenate([[0.0], np.cumsum(flops)])
    outputs = {o.name: o for o in mg.outputs}
    names = list(outputs)
    # A graph output the head made (or a graph input) stays on the device; the reply carries the others.
    # Their bytes per making node (-1: a graph input), summed per head from these, never by a pass over
    # every output per cut (a model of 4000 outputs took 16 M steps and its cuts' kept lists O(n^2) memory).
    out_nodes = [mg.producer.get(o, -1) for o in names]
    made_by: dict[int, int] = {}
    for o, p in zip(names, out_nodes, strict=True):
        made_by[p] = made_by.get(p, 0) + max(outputs[o].bytes, 0)
    total_out = sum(made_by.values())
    made_before = np.cumsum([made_by.get(-1, 0), *(made_by.get(k, 0) for k in range(n))])  # per prefix length
    out_mask = _mask_from([p for p in made_by if p >= 0], n)
    # Heads sorted by (size, lowest node not in the head), prefixes before single-tensor heads on a tie.
    order: list[tuple[int, int, int, int]] = [(k, k + 1, 0, k) for k in range(n + 1)]
    order += [(count, low, 1, p) for p, (count, low, _) in singles.items()]
    order.sort()
    cuts: list[Cut] = []
    counter = 0
    for count, _, kind, idx in order:
        # Every structural cut is a candidate, sized or not: ids depend on the model's bytes alone, so a
        # device that bound shapes and a cloud that did not agree on them. A bound graph sizes every
        # tensor (``_bind``); an unbound one may leave data-dependent sizes at -1 (``ModelGraph.sized``).
        if kind == 0:
            infos = tuple(mg.tensor(t) for t in prefix_heads[idx])  # what a tail node reads, in order
            mask_of, head_flops = _prefix_mask(idx), float(prefix_flops[idx])
            kept_of = _kept(names, out_nodes, idx.__gt__)
            reply = total_out - int(made_before[idx])
        else:
            mask_of = _ancestors_mask(pred_nodes, idx)
            mask = mask_of()
            in_mask = mask_to_bool(mask, n)
            head_flops = float(flops[in_mask].sum())
            t = singles[idx][2]
            read = t not in outputs or any(not in_mask[c] for c in mg.consumers.get(t, ()))
            infos = (mg.tensor(t),) if read else ()
            kept_of = _kept(names, out_nodes, _in(mask))
            made = made_by.get(-1, 0) + sum(made_by[p] for p in bits_of(mask & out_mask))
            reply = total_out - made
        if count == 0:
            cid = "cloud"
        elif count == n and kind == 0:
            cid = "device"
        else:
            counter += 1
            cid = f"c{counter}"
        cuts.append(
            Cut(
                id=cid,
                tensors=infos,
                bytes=sum(max(t.bytes, 0) for t in infos),
                head_nodes=count,
                head_flops_fraction=head_flops / total_flops,
                mask_of=mask_of,
                kept_of=kept_of,
                reply_bytes=reply,
            )
        )
    return cuts


def _prefix_heads(mg: ModelGraph) -> list[list[str]]:
    """The crossing tensors of every prefix of the topological order (index = prefix length): the tensors
    available in the head (graph inputs, or made by it) that a node of the tail reads, in the order they
    became available. A graph output no tail node reads is not listed (it is kept, not sent): listing
    every live output made the lists, and the cuts' filtering of them, O(nodes x outputs)."""
    remaining = {t: len(set(cs)) for t, cs in mg.consumers.items()}
    live: dict[str, None] = dict.fromkeys(i.name for i in mg.inputs if remaining.get(i.name, 0) > 0)
    heads = [list(live)]
    for p in range(len(mg.nodes)):
        for t in dict.fromkeys(mg.node_inputs[p]):
            if t in live:
                remaining[t] -= 1
                if remaining[t] == 0:
                    del live[t]
        for o in mg.nodes[p].output:
            if remaining.get(o, 0) > 0:
                live[o] = None
        heads.append(list(live))
    return heads


def _single_tensor_heads(
    mg: ModelGraph, consumers: dict[str, list[int]], input_names: list[str], pred_nodes: list[list[int]]
) -> dict[int, tuple[int, int, str]]:
    """Nodes p whose ancestors form a single-tensor cut that is not a prefix: p -> (head size, lowest
    node not in the head, the crossing tensor). Bitsets anc(p) (inclusive), S(p) (successors of strict
    ancestors) and succ(p) live from p until p's last successor."""
    n = len(mg.nodes)
    last_use = list(range(n))
    for p, ps in enumerate(pred_nodes):
        for r in ps:
            last_use[r] = max(last_use[r], p)
    outs = [[o for o in node.output if o in consumers] for node in mg.nodes]
    anc: dict[int, int] = {}
    S: dict[int, int] = {}
    succ: dict[int, int] = {}
    found: dict[int, tuple[int, int, str]] = {}
    for p in range(n):
        a = 1 << p
        s = 0
        for r in pred_nodes[p]:
            a |= anc[r]
            s |= S[r] | succ[r]
        anc[p], S[p] = a, s
        succ[p] = sum(1 << c for c in {c for o in outs[p] for c in consumers[o]})
        # Not a prefix (those are cuts already), nothing leaves the head but p's one live output, and no
        # graph input used outside the head (it would cross too).
        if (
            (a & (a + 1)) != 0
            and not (s & ~a)
            and len(outs[p]) == 1
            and not any(not (a >> c) & 1 for i in input_names for c in consumers[i])
        ):
            found[p] = (a.bit_count(), _lowest_missing(a), outs[p][0])
        for r in [*pred_nodes[p], p]:
            if last_use[r] == p:
                del anc[r], S[r], succ[r]
    return found


def bits_of(mask: int) -> Iterable[int]:
    """The set bits of ``mask``, one step per set bit (``bits`` steps through every bit)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _kept(names: list[str], nodes: list[int], in_head: Callable[[int], bool]) -> Callable[[], tuple[str, ...]]:
    """The graph outputs a head holds, made on demand: graph inputs (node -1) and what its nodes made."""
    return lambda: tuple(o for o, p in zip(names, nodes, strict=True) if p < 0 or in_head(p))


def _in(mask: int) -> Callable[[int], bool]:
    return lambda p: bool((mask >> p) & 1)


def _prefix_mask(k: int) -> Callable[[], int]:
    return lambda: (1 << k) - 1


def _ancestors_mask(pred_nodes: list[list[int]], p: int) -> Callable[[], int]:
    def mask() -> int:
        seen = {p}
        stack = [p]
        while stack:
            for r in pred_nodes[stack.pop()]:
                if r not in seen:
                    seen.add(r)
                    stack.append(r)
        return _mask_from(list(seen), len(pred_nodes))

    return mask


def _mask_from(indices: list[int], n: int) -> int:
    """The int bitset of ``indices`` (< ``n``), in O(n) (not a sum of shifted ints: O(n^2) bits)."""
    bits = np.zeros(n + 1, dtype=np.uint8)
    bits[indices] = 1
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def _lowest_missing(h: int) -> int:
    return (~h & (h + 1)).bit_length()


def parse_cut_ids(text: str) -> list[str]:
    """``"c3,c9"`` -> ``["c3", "c9"]`` (the CLI and plans use comma-joined ids for chains)."""
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if not ids:
        raise CutError(f"expected one or more cut ids separated by commas, got {text!r}")
    return ids
