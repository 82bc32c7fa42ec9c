"""Specialising a model on its binding's sample: top-level ``If`` nodes whose condition the sample fixes
are replaced by their taken branch, inlined, so the branch's nodes become cuts.

Some exporters put a whole network inside the branches of an ``If`` on a small input (silero-vad: the
sample-rate scalar ``sr`` picks the 16 kHz or the 8 kHz network). Unspecialised, the ``If`` is one node
and the model offers a handful of cuts; with ``--sample`` saying ``sr = 16000`` the taken branch is the
model, and every node in it can be a cut.

Which ``If`` nodes: a top-level one whose condition is computed from graph inputs by a small cone of
cheap nodes (no subgraphs, no Conv/MatMul/...), where every input it reads by value is in the sample
and small (a scalar, a flag), and any other input is read only through ``Shape``/``Size``. Inlining one
can expose more (an ``If`` nested in the branch, on the shape of the recurrent state); they are
specialised in turn, each step recorded as ``(index among the graph's If nodes, branch)``.

The specialised model is a model of its own: its id is ``<file sha256>~<steps>`` (``~0t0e``: the first
If, then branch; then the first If of the result, else branch), which a server derives from the file it
holds (``cloud.models.store``), the steps being deterministic. The guard (``Specialisation.holds``) evaluates
every specialised condition on a request's inputs: a request that would take another branch must run
the whole original model (``Specialisation.original``), never a split of this one.

- ``load(path, binding)`` with a ``sample``: every top-level ``If`` whose condition comes from graph inputs
  through a small cone of cheap nodes (inputs read by value in the sample and <= 64 elements, others only
  through ``Shape``/``Size``) is replaced by its taken branch, inlined, repeatedly (inlining exposes nested
  ones). ``ModelGraph.specialisation`` (``Specialisation(base_sha256, steps, original, guard)``, ``.key`` like
  ``0t1t``, ``.as_dict()`` in ``binding.as_dict()["specialised"]``, ``.holds(feeds) -> reason | None``);
  ``ModelGraph.sha256`` is then ``<file sha256>~<key>`` and ``.file_sha256`` the file's. ``model.derived(base,
  key)`` rebuilds it from the file alone: ``cloud.models.store.ModelStore.graph("<sha>~<key>")`` does (NOT_FOUND for
  steps that do not apply), so servers need nothing new. ``Device.diverges(feeds)`` / ``.run_original(inputs)``:
  ``run_head`` raises ``CutError`` for a request of another branch, ``run_detailed``, ``AdaptiveDevice.infer``
  (``stats["diverged"]``, ``last_diverged``; not logged) and ``ChainDevice.infer`` run the whole original model
  locally; ``run_local`` and cut ``device`` always run the original.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from cachetools import FIFOCache
from onnx import helper

from splitrt.errors import ModelError
from splitrt.graph.ort_errors import onnxruntime_errors

#: Ops a guard cone may not hold: they compute (the condition would cost what the model costs).
HEAVY = {
    "Conv",
    "ConvTranspose",
    "ConvInteger",
    "MatMul",
    "MatMulInteger",
    "Gemm",
    "Einsum",
    "LSTM",
    "GRU",
    "RNN",
    "QLinearConv",
    "QLinearMatMul",
    "Attention",
    "MultiHeadAttention",
}
MAX_CONE_NODES = 64
MAX_VALUE_ELEMENTS = 64
MAX_STEPS = 16
MEMO_SIZE = 64
_SHAPE_OPS = {"Shape", "Size"}
_KEY = re.compile(r"^(?:\d+[te])+$")


@dataclass(frozen=True, kw_only=True)
class Step:
    """One specialised ``If``: its position among the graph's If nodes then, the branch taken, and
    what decided it (the condition tensor, the inputs it reads, their sample values if small)."""

    index: int
    branch: str  # then | else
    node: str  # the If's first output: a name that is unique
    condition: str
    inputs: tuple[str, ...]
    values: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "if": self.node,
            "branch": self.branch,
            "condition": self.condition,
            "inputs": list(self.inputs),
            "values": dict(self.values),
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class Specialisation:
    """How a graph was specialised, and the guard that tells whether a request follows it."""

    base_sha256: str
    steps: tuple[Step, ...]
    original: onnx.ModelProto  # the normalised, unspecialised model: what a request that does not follow runs
    guard: onnx.ModelProto  # graph inputs -> one bool per step's condition
    _session: list[Any] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # verdicts by what decides them (the small inputs' values, the others' shapes): a session run costs
    # ~50-100 us, as much as a small model's head; the oldest of MEMO_SIZE is forgotten first
    _memo: FIFOCache[tuple[Any, ...], str | None] = field(
        default_factory=lambda: FIFOCache(maxsize=MEMO_SIZE), repr=False
    )

    @property
    def key(self) -> str:
        return "".join(f"{s.index}{s.branch[0]}" for s in self.steps)

    @property
    def sha256(self) -> str:
        return f"{self.base_sha256}~{self.key}"

    @property
    def guard_inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.guard.graph.input)

    def as_dict(self) -> dict[str, Any]:
        return {"base_sha256": self.base_sha256, "key": self.key, "steps": [s.as_dict() for s in self.steps]}

    def holds(self, feeds: Mapping[str, np.ndarray]) -> str | None:
        """None when ``feeds`` take every specialised branch; else why not (naming the If, the branch
        specialised and the inputs that decided it)."""
        key = self._key(feeds)
        with self._lock:
            if key is not None and key in self._memo:
                return self._memo[key]
            if not self._session:
                self._session.append(_session(self.guard))
            sess = self._session[0]
        guard_feeds = {n: np.asarray(feeds[n]) for n in self.guard_inputs}
        with onnxruntime_errors("the specialisation guard", stage="run", feeds=guard_feeds):
            values = sess.run(None, guard_feeds)
        verdict = None
        for step, v in zip(self.steps, values, strict=True):
            taken = "then" if bool(np.asarray(v).reshape(-1)[0]) else "else"
            if taken != step.branch:
                shown = ", ".join(f"{n}={_show(feeds[n])}" for n in step.inputs)
                verdict = (
                    f"this request takes the {taken} branch of If {step.node!r} ({shown}); the model was "
                    f"specialised for its {step.branch} branch ({_values(step)})"
                )
                break
        if key is not None:
            with self._lock:
                self._memo[key] = verdict
        return verdict

    def _key(self, feeds: Mapping[str, np.ndarray]) -> tuple[Any, ...] | None:
        """What the guard's verdict depends on, or None when an input read by value is not small."""
        by_value = {k for s in self.steps for k in s.values}
        key: list[Any] = []
        for name in self.guard_inputs:
            arr = np.asarray(feeds[name])
            if name in by_value:
                if arr.size > MAX_VALUE_ELEMENTS:
                    return None
                key.append((name, arr.dtype.str, arr.shape, arr.tobytes()))
            else:
                key.append((name, arr.shape))
        return tuple(key)


def _show(a: Any) -> str:
    arr = np.asarray(a)
    return str(arr.tolist()) if arr.size <= 4 else f"shape {list(arr.shape)}"


def _values(step: Step) -> str:
    return ", ".join(f"{k}={v}" for k, v in step.values.items()) or "the sample's shapes"


def _session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    with onnxruntime_errors("the specialisation guard", stage="build"):
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


# -- finding ----------------------------------------------------------------------------------------


def _has_subgraph(n: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)


def _cone(g: onnx.GraphProto, tensor: str) -> list[onnx.NodeProto] | None:
    """The nodes ``tensor`` is computed by, in graph order, if cheap enough to be a guard; else None."""
    producer = {o: n for n in g.node for o in n.output if o}
    seen: set[int] = set()
    stack = [tensor]
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in seen:
            continue
        if n.op_type in HEAVY or _has_subgraph(n) or n.domain not in ("", "ai.onnx"):
            return None
        seen.add(id(n))
        if len(seen) > MAX_CONE_NODES:
            return None
        stack.extend(i for i in n.input if i)
    return [n for n in g.node if id(n) in seen]


def _reads(cone: Sequence[onnx.NodeProto], inputs: set[str]) -> tuple[set[str], set[str]]:
    """(inputs the cone reads by value, inputs it reads only through Shape/Size)."""
    by_value: set[str] = set()
    by_shape: set[str] = set()
    for n in cone:
        for i in n.input:
            if i in inputs:
                (by_shape if n.op_type in _SHAPE_OPS else by_value).add(i)
    return by_value, by_shape - by_value


def _candidate(
    m: onnx.ModelProto, sample: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]
) -> tuple[int, onnx.NodeProto, list[onnx.NodeProto], dict[str, np.ndarray], set[str]] | None:
    """The first top-level If the sample decides: (its index among the Ifs, node, cone, feeds, value inputs)."""
    g = m.graph
    inputs = {i.name for i in g.input}
    ifs = [n for n in g.node if n.op_type == "If"]
    for index, node in enumerate(ifs):
        cone = _cone(g, node.input[0])
        if cone is None:
            continue
        by_value, by_shape = _reads(cone, inputs)
        if node.input[0] in inputs:  # the condition is a graph input itself
            by_value.add(node.input[0])
        if any(i not in sample or np.asarray(sample[i]).size > MAX_VALUE_ELEMENTS for i in by_value):
            continue
        if any(i not in shapes and i not in sample for i in by_shape):
            continue
        feeds = {i: np.asarray(sample[i]) for i in by_value}
        for i in by_shape:
            feeds[i] = np.asarray(sample[i]) if i in sample else np.zeros(tuple(shapes[i]), dtype=_dtype(g, i))
        return index, node, cone, feeds, by_value
    return None


def _dtype(g: onnx.GraphProto, name: str) -> Any:
    vi = next(i for i in g.input if i.name == name)
    return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)


def _guard_model(m: onnx.ModelProto, cone: Sequence[onnx.NodeProto], condition: str, ir: int) -> onnx.ModelProto:
    g = m.graph
    used = {i for n in cone for i in n.input if i} | {condition}
    inputs = [vi for vi in g.input if vi.name in used]
    inits = [t for t in g.initializer if t.name in used]
    out = helper.make_tensor_value_info(condition, onnx.TensorProto.BOOL, None)
    gm = helper.make_graph(list(cone), "splitrt_guard", inputs, [out], inits)
    model = helper.make_model(gm, opset_imports=list(m.opset_import))
    model.ir_version = ir
    return model


def _merge_guards(guards: Sequence[onnx.ModelProto]) -> onnx.ModelProto:
    """One model computing every step's condition (names are unique across steps: each step's graph
    keeps every earlier name or drops it, and inlined names never reuse one)."""
    first = guards[0]
    nodes: list[onnx.NodeProto] = []
    inputs: dict[str, onnx.ValueInfoProto] = {}
    inits: dict[str, onnx.TensorProto] = {}
    names: set[str] = set()
    for gm in guards:
        for n in gm.graph.node:
            if not any(o in names for o in n.output):
                nodes.append(n)
                names.update(n.output)
        inputs.update({i.name: i for i in gm.graph.input})
        inits.update({t.name: t for t in gm.graph.initializer})
    graph = helper.make_graph(
        nodes, "splitrt_guard", list(inputs.values()), [gm.graph.output[0] for gm in guards], list(inits.values())
    )
    model = helper.make_model(graph, opset_imports=list(first.opset_import))
    model.ir_version = first.ir_version
    return model


# -- inlining ---------------------------------------------------------------------------------------


def _all_names(g: onnx.GraphProto, into: set[str], skip: int = -1) -> set[str]:
    """Every tensor name ``g`` holds, its subgraphs' too (but those of node ``skip``)."""
    into.update(i.name for i in g.input)
    into.update(o.name for o in g.output)
    into.update(t.name for t in g.initializer)
    for k, n in enumerate(g.node):
        into.update(o for o in n.output if o)
        if k == skip:
            continue
        for a in n.attribute:
            for sg in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _all_names(sg, into)
    return into


def _rename(g: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename tensors everywhere in ``g`` (nested subgraphs too, which may read them)."""
    for t in g.initializer:
        t.name = mapping.get(t.name, t.name)
    for vi in list(g.output) + list(g.value_info) + list(g.input):
        vi.name = mapping.get(vi.name, vi.name)
    for n in g.node:
        n.input[:] = [mapping.get(i, i) for i in n.input]
        n.output[:] = [mapping.get(o, o) for o in n.output]
        for a in n.attribute:
            for sg in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                _rename(sg, mapping)


def inline(
    m: onnx.ModelProto, index: int, branch: str, normalise: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> onnx.ModelProto:
    """``m`` with its ``index``-th top-level If replaced by its ``branch`` (``then``/``else``), normalised."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    g = out.graph
    ifs = [k for k, n in enumerate(g.node) if n.op_type == "If"]
    if not 0 <= index < len(ifs) or branch not in ("then", "else"):
        raise ModelError(
            f"specialisation step {index}{branch[:1]}: expected an If index < {len(ifs)} and a branch then|else"
        )
    pos = ifs[index]
    node = g.node[pos]
    body = onnx.GraphProto()
    body.CopyFrom(next(a.g for a in node.attribute if a.name == f"{branch}_branch"))
    outer = _all_names(g, set(), skip=pos)
    local = {t.name for t in body.initializer} | {o for n in body.node for o in n.output if o}
    clash = sorted(local & (outer | set(node.output)))
    _rename(body, {name: f"{name}__{node.output[0]}__{branch}" for name in clash})
    new_nodes = list(body.node) + [
        helper.make_node("Identity", [src.name], [dst]) for src, dst in zip(body.output, node.output, strict=True)
    ]
    nodes = list(g.node[:pos]) + new_nodes + list(g.node[pos + 1 :])
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(body.initializer)
    g.sparse_initializer.extend(body.sparse_initializer)
    return normalise(out)


# -- the two entry points ---------------------------------------------------------------------------


def specialise(
    m: onnx.ModelProto,
    *,
    base_sha256: str,
    sample: Mapping[str, np.ndarray],
    shapes: Mapping[str, Sequence[int]],
    normalise: Callable[[onnx.ModelProto], onnx.ModelProto],
) -> tuple[onnx.ModelProto, Specialisation | None]:
    """Inline every top-level If the sample decides (repeatedly: inlining exposes nested ones)."""
    current = m
    steps: list[Step] = []
    guards: list[onnx.ModelProto] = []
    while len(steps) < MAX_STEPS:
        found = _candidate(current, sample, shapes)
        if found is None:
            break
        index, node, cone, feeds, by_value = found
        guard = _guard_model(current, cone, node.input[0], current.ir_version)
        guard_feeds = {i.name: feeds[i.name] for i in guard.graph.input}
        what = f"the condition of If {node.output[0]!r} on the sample"
        with onnxruntime_errors(what, stage="run", feeds=guard_feeds, error=ModelError):
            value = _session(guard).run(None, guard_feeds)[0]
        branch = "then" if bool(np.asarray(value).reshape(-1)[0]) else "else"
        steps.append(
            Step(
                index=index,
                branch=branch,
                node=node.output[0],
                condition=node.input[0],
                inputs=tuple(i.name for i in guard.graph.input),
                values={i: np.asarray(sample[i]).tolist() for i in sorted(by_value)},
            )
        )
        guards.append(guard)
        current = inline(current, index, branch, normalise)
    if not steps:
        return m, None
    return current, Specialisation(base_sha256=base_sha256, steps=tuple(steps), original=m, guard=_merge_guards(guards))


def derive(m: onnx.ModelProto, key: str, normalise: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """The model ``specialise`` made with steps ``key`` (``0t0e``), without the sample: what a server
    holding only the original file builds for a request naming ``<sha256>~<key>``."""
    if not _KEY.match(key):
        raise ModelError(f"specialisation {key!r}: expected steps like 0t or 0t1e (If index, then|else)")
    current = m
    for idx, br in re.findall(r"(\d+)([te])", key):
        current = inline(current, int(idx), "then" if br == "t" else "else", normalise)
    return current
