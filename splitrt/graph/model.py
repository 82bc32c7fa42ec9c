"""Load and normalise any ONNX model, and enumerate the places it can be cut.

A *cut* splits the nodes into a head (run on the device) closed under predecessors and a tail (run in
the cloud). The tensors produced in the head (or graph inputs) that the tail needs *cross* the cut and
are what the device sends. Because every node of a normalised graph feeds some output, the crossing set
determines the head (it is exactly the set of ancestors of the crossing tensors), so a cut is identified
by its crossing tensors; ids are short deterministic names (``cloud``, ``c1`` ... ``device``).

Heads are kept as Python ints used as bitsets over node indices: enumerating every cut of a
~900-node DenseNet is then a few thousand big-int operations instead of set algebra.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from splitrt.errors import CutError, ModelError
from splitrt.graph import shapes
from splitrt.graph.flops import node_flops
from splitrt.graph.shapes import ShapeBinding

MIN_OPSET = 9
# Nodes never folded even when every input is constant: their result is not a function of the inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
# Folding a node whose output is bigger than this would bloat every segment that needs it.
_FOLD_MAX_ELEMENTS = 1 << 24
# Initializers whose bytes shape inference does without (``_infer``).
_STRIP_BYTES = 1024


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: numpy dtype name, shape (symbolic dims count as 1 for ``bytes``), size in bytes.

    ``shape`` is ``None`` when shape inference could not tell; then ``bytes`` is -1. ``source`` says
    how the size was obtained (``static``, ``bound``, ``measured``: see ``splitrt.graph.shapes``).
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None
    bytes: int
    source: str = "static"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape or ()),
            "bytes": self.bytes,
            "sized_by": self.source if self.bytes >= 0 else "unknown",
        }


@dataclass(frozen=True)
class Cut:
    """A valid cut: ``head_mask`` is a bitset of node indices closed under predecessors.

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
    # never sent, never replied. The reply carries the other graph outputs, ``reply_bytes`` of them.
    kept: tuple[str, ...] = ()
    reply_bytes: int = 0

    @property
    def head_mask(self) -> int:
        return self.mask_of()

    @property
    def head(self) -> frozenset[int]:
        return frozenset(_bits(self.head_mask))

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

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


@dataclass
class ModelGraph:
    """A normalised model with its DAG, tensor facts and (lazily) its candidate cuts."""

    path: Path
    sha256: str
    model: onnx.ModelProto
    nodes: list[onnx.NodeProto]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    node_flops: list[float]
    # For each node, the activation tensors it reads (including outer tensors its subgraphs capture).
    node_inputs: list[tuple[str, ...]]
    producer: dict[str, int]
    consumers: dict[str, list[int]]
    _tensors: dict[str, TensorInfo]
    _cuts: list[Cut] | None = field(default=None, repr=False)
    # Cuts left out of the candidates, with why (a crossing tensor of data-dependent size).
    excluded: list[str] = field(default_factory=list, repr=False)
    _by_id: dict[str, Cut] = field(default_factory=dict, repr=False)
    # The shapes every size was computed at (None: unbound, free dims count as 1, data-dependent sizes
    # unknown) and the binding they came from; and each tensor's shape as the model declares it
    # (symbolic dims kept), which segments use so they stay shape-generic.
    input_shapes: dict[str, tuple[int, ...]] | None = field(default=None, repr=False)
    binding: ShapeBinding | None = field(default=None, repr=False)
    generic: dict[str, tuple[int | str | None, ...] | None] = field(default_factory=dict, repr=False)
    # Set when the binding's sample fixed top-level Ifs and their taken branches were inlined
    # (``graph.specialise``): ``sha256`` is then ``<file sha256>~<steps>``, and the guard says which
    # requests may be split.
    specialisation: Any = field(default=None, repr=False)

    @property
    def file_sha256(self) -> str:
        """The model file's id (what a server stores and an upload declares)."""
        return str(self.specialisation.base_sha256) if self.specialisation is not None else self.sha256

    @property
    def flops(self) -> float:
        return float(sum(self.node_flops))

    @property
    def initializer_names(self) -> set[str]:
        return {i.name for i in self.model.graph.initializer}

    @property
    def sized(self) -> bool:
        """Every tensor a cut can send has a known size."""
        return all(t.bytes >= 0 for c in self.cuts() for t in c.tensors)

    def generic_shape(self, name: str) -> tuple[int | str | None, ...] | None:
        return self.generic.get(name, self.tensor(name).shape)

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(f"{self.path}: no tensor named {name!r}") from None

    def cuts(self) -> list[Cut]:
        if self._cuts is None:
            self.excluded.clear()
            self._cuts = _enumerate_cuts(self)
            self._by_id = {c.id: c for c in self._cuts}
        return self._cuts

    def cut(self, cut_id: str) -> Cut:
        self.cuts()
        try:
            return self._by_id[cut_id]
        except KeyError:
            ids = [c.id for c in self._cuts or []]
            shown = ", ".join([*ids[:3], "...", *ids[-2:]]) if len(ids) > 6 else ", ".join(ids)
            raise CutError(
                f"{self.path.name}: no cut {cut_id!r}; expected one of {len(ids)} cut ids ({shown})"
            ) from None


def _bits(mask: int) -> Iterable[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


def _mask_to_bool(mask: int, n: int) -> np.ndarray:
    raw = np.frombuffer(mask.to_bytes((n + 8) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


# ----------------------------------------------------------------------------------------------------
# Loading and normalisation


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def external_data_files(model: onnx.ModelProto, base: Path) -> list[Path]:
    """The external-data files a model's initializers point at, in first-use order."""
    seen: dict[str, None] = {}
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for kv in t.external_data:
                if kv.key == "location":
                    seen.setdefault(kv.value, None)
    return [base / name for name in seen]


def model_sha256(path: Path, model: onnx.ModelProto | None = None) -> str:
    """The model's identity: sha256 of the .onnx bytes, and of its external-data files when it has
    any (so two models that differ only in their weights file never share an id)."""
    own = file_sha256(path)
    if model is None:
        model = onnx.load(str(path), load_external_data=False)
    files = external_data_files(model, path.parent)
    if not files:
        return own
    h = hashlib.sha256(own.encode())
    for f in files:
        h.update(file_sha256(f).encode())
    return h.hexdigest()


def load(
    path: str | Path, binding: ShapeBinding | None = None, *, notice: Callable[[str], None] | None = None
) -> ModelGraph:
    """Load ``path``, normalise it and build its DAG. Raises ``ModelError`` naming file and cause.

    With a ``binding`` (``--shape/--dim/--sample``; an empty one binds only a leading free dim, to 1,
    said through ``notice``) every tensor is sized at the bound input shapes; without one, free dims
    count as 1 and data-dependent sizes stay unknown (enough for serving, not for planning)."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file (expected an .onnx model file)")
    if not p.is_file():
        raise ModelError(f"{p}: not a regular file (expected an .onnx model file)")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: empty file (expected an ONNX model)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(f"{p}: not a valid ONNX model (truncated or not ONNX): {_short(exc)}") from exc
    for f in external_data_files(model, p.parent):
        if not f.is_file():
            raise ModelError(f"{p}: external data file missing: expected {f}, found no such file")
    sha = model_sha256(p, model)  # before loading the data: it needs the external references
    try:
        onnx.load_external_data_for_model(model, str(p.parent))
    except Exception as exc:
        raise ModelError(f"{p}: external data does not load: {_short(exc)}") from exc
    return from_proto(model, path=p, sha256=sha, binding=binding, notice=notice, own=True)


def from_proto(
    model: onnx.ModelProto,
    *,
    path: Path,
    sha256: str,
    binding: ShapeBinding | None = None,
    notice: Callable[[str], None] | None = None,
    own: bool = False,
) -> ModelGraph:
    """``own``: the caller gives ``model`` away (normalised in place: one copy of the weights less)."""
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph nodes or outputs; truncated or other file?)")
    opset = _default_opset(model)
    if opset < MIN_OPSET:
        raise ModelError(f"{path}: opset {opset} is not supported (expected opset >= {MIN_OPSET})")
    model = normalise(model, in_place=own)
    model = _infer(model, path)
    spec = None
    if binding is not None and binding.sample is not None and any(n.op_type == "If" for n in model.graph.node):
        from splitrt.graph import specialise

        at = shapes.resolve(path.name, list(model.graph.input), binding)
        specialised, spec = specialise.specialise(
            model, base_sha256=sha256, sample=binding.sample, shapes=at, normalise=normalise
        )
        if spec is not None:
            model, sha256 = _infer(normalise(specialised), path), spec.sha256
    mg = _build(model, path=path, sha256=sha256)
    mg.specialisation = spec
    if binding is not None:
        _bind(mg, binding, notice)
    return mg


def derived(base: ModelGraph, key: str) -> ModelGraph:
    """``base`` specialised by steps ``key`` (``graph.specialise.derive``): what a server builds for a
    request naming ``<sha256>~<key>``; ``ModelError`` when the steps do not apply to this model."""
    from splitrt.graph import specialise

    model = specialise.derive(base.model, key, normalise)
    return _build(_infer(normalise(model), base.path), path=base.path, sha256=f"{base.sha256}~{key}")


def _infer(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{path}: fails the ONNX checker: {_short(exc)}") from exc
    # Without the large weights' bytes (their types and dims stay; small ones, shapes among them, keep
    # their values for data propagation): shape inference copies the model several times over.
    stash = {}
    for t in model.graph.initializer:
        if len(t.raw_data) > _STRIP_BYTES:
            stash[t.name] = t.raw_data
            t.raw_data = b""
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ModelError(f"{path}: shape inference failed: {_short(exc)}") from exc
    finally:
        for t in model.graph.initializer:
            if t.name in stash:
                t.raw_data = stash[t.name]
    for t in inferred.graph.initializer:
        if t.name in stash:
            t.raw_data = stash.pop(t.name)
    return inferred


def _bind(mg: ModelGraph, binding: ShapeBinding, notice: Callable[[str], None] | None) -> None:
    """Size every tensor at the bound input shapes; the model and its cuts do not change."""
    g = mg.model.graph
    name = mg.path.name
    mg.input_shapes, defaults = shapes.resolve_with_defaults(name, list(g.input), binding, notice=notice)
    spec = mg.specialisation.as_dict() if mg.specialisation is not None else None
    mg.binding = dataclasses.replace(binding, defaults=defaults, specialised=spec) if defaults or spec else binding
    fully_static = all(
        t.bytes >= 0 and t.shape is not None and all(isinstance(d, int) for d in t.shape) for t in mg._tensors.values()
    )
    if fully_static and binding.sample is None:
        return
    generic = {k: (v if v is not None and all(isinstance(d, int) for d in v) else None) for k, v in mg.generic.items()}
    sized = shapes.size_tensors(
        mg.model,
        generic,  # type: ignore[arg-type]
        mg.input_shapes,
        binding.sample,
        model_name=name,
    )
    for t, info in sized.items():
        if t in mg._tensors and t not in mg.initializer_names:
            itemsize = np.dtype(info.dtype).itemsize if info.dtype not in ("unknown", "object") else -1
            count = int(np.prod(info.shape, dtype=np.int64))
            mg._tensors[t] = TensorInfo(
                t, info.dtype, info.shape, count * itemsize if itemsize > 0 else -1, info.source
            )
            # Segments declare what crosses with its rank (no declaration reads as rank 0 in onnxruntime),
            # and a graph output's declaration the measurement contradicts is corrected.
            mg.generic[t] = shapes.declaration(t, mg.generic.get(t), info.shape)
    mg.inputs = [mg._tensors[i.name] for i in g.input]
    mg.outputs = [mg._tensors[o.name] for o in g.output]
    mg.node_flops = [_flops(n, mg._tensors) for n in mg.nodes]
    mg._cuts = None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0 if not model.opset_import else MIN_OPSET


def normalise(model: onnx.ModelProto, *, in_place: bool = False) -> onnx.ModelProto:
    """Make a model safe to cut: deterministic, IR >= 4, constants as initializers, sorted nodes.

    - IR < 4 lists every initializer as a graph input too; those are weights, not inputs: drop them
      (``onnx.utils.extract_model`` and our partitioner need IR >= 4 semantics).
    - ``Constant`` nodes and nodes whose inputs are all constant are folded into initializers, so
      weights never "cross" a cut: initializers live on every side that needs them.
    """
    if in_place:
        m = model
    else:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    g = m.graph
    init_names = {i.name for i in g.initializer}
    if any(i.name in init_names for i in g.input):
        keep = [i for i in g.input if i.name not in init_names]
        del g.input[:]
        g.input.extend(keep)
    m.ir_version = max(m.ir_version, 4)
    _fold_constants(m)
    _outputs_from_nodes(m)
    _prune_dead(m)
    _toposort(m)
    return m


def _outputs_from_nodes(m: onnx.ModelProto) -> None:
    """A graph output that is an initializer is produced by no node, so no segment could yield it:
    give it an Identity node (from a renamed copy of the initializer)."""
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    for o in g.output:
        if o.name in inits:
            src_name = f"{o.name}__splitrt_const"
            inits[o.name].name = src_name
            for n in g.node:
                for k, i in enumerate(n.input):
                    if i == o.name:
                        n.input[k] = src_name
            g.node.append(helper.make_node("Identity", [src_name], [o.name]))


def _prune_dead(m: onnx.ModelProto) -> None:
    """Drop nodes no graph output depends on: they cost compute and would make two cuts with the
    same crossing set."""
    g = m.graph
    producer = {o: n for n in g.node for o in n.output if o}
    needed: set[str] = {o.name for o in g.output}
    live: set[int] = set()
    stack = list(needed)
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        stack.extend(i for i in _all_inputs(n) if i)
    if len(live) != len(g.node):
        keep = [n for n in g.node if id(n) in live]
        del g.node[:]
        g.node.extend(keep)


def _fold_constants(m: onnx.ModelProto) -> None:
    g = m.graph
    consts: dict[str, onnx.TensorProto] = {i.name: i for i in g.initializer}
    graph_outputs = {o.name for o in g.output}
    kept: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for node in g.node:
        folded = None
        if node.domain in ("", "ai.onnx") and not any(o in graph_outputs for o in node.output):
            if node.op_type == "Constant":
                folded = _constant_value(node)
            elif (
                node.input
                and all(i == "" or i in consts for i in node.input)
                and node.op_type not in _NONDETERMINISTIC
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
            ):
                folded = _evaluate(node, consts, m)
        if folded is None:
            kept.append(node)
            continue
        for name, arr in folded.items():
            t = numpy_helper.from_array(arr, name)
            consts[name] = t
            new_inits.append(t)
    if new_inits:
        used = {i for n in kept for i in _all_inputs(n)} | graph_outputs
        old = [i for i in g.initializer if i.name in used]
        del g.initializer[:]
        g.initializer.extend(old + [t for t in new_inits if t.name in used])
        del g.node[:]
        g.node.extend(kept)


def _constant_value(node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
    for a in node.attribute:
        if a.name == "value":
            return {node.output[0]: numpy_helper.to_array(a.t)}
        if a.name == "value_float":
            return {node.output[0]: np.array(a.f, dtype=np.float32)}
        if a.name == "value_floats":
            return {node.output[0]: np.array(list(a.floats), dtype=np.float32)}
        if a.name == "value_int":
            return {node.output[0]: np.array(a.i, dtype=np.int64)}
        if a.name == "value_ints":
            return {node.output[0]: np.array(list(a.ints), dtype=np.int64)}
    return None  # sparse_value / strings: leave the node in place


def _evaluate(
    node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], m: onnx.ModelProto
) -> dict[str, np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    try:
        if sum(int(np.prod(consts[i].dims, dtype=np.int64)) for i in node.input if i) > _FOLD_MAX_ELEMENTS:
            return None
        # Bounded before computing: a 181-byte ConstantOfShape asking for 2 GB must not be evaluated.
        size = _output_elements(node, consts, m)
        if size is None or size > _FOLD_MAX_ELEMENTS:
            return None
        feeds = {i: numpy_helper.to_array(consts[i]) for i in node.input if i}
        inputs = [helper.make_tensor_value_info(k, consts[k].data_type, None) for k in feeds]
        outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
        g = helper.make_graph([node], "fold", inputs, outputs)
        single = helper.make_model(g, opset_imports=list(m.opset_import))
        results = ReferenceEvaluator(single).run(None, feeds)
    except Exception:
        return None  # not foldable here (custom op, reference gap): keep the node, it is still correct
    out = {o: np.asarray(r) for o, r in zip([o for o in node.output if o], results, strict=True)}
    if any(v.size > _FOLD_MAX_ELEMENTS for v in out.values()):
        return None
    return out


def _output_elements(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], m: onnx.ModelProto) -> int | None:
    """Elements of the node's outputs as shape inference (with its constant inputs' values) tells them,
    or None when it cannot (then the node is not folded: nothing computes an unbounded size)."""
    names = [i for i in node.input if i]
    outs = [o for o in node.output if o]
    g = helper.make_graph(
        [node],
        "bound",
        [],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
        [consts[i] for i in dict.fromkeys(names)],
    )
    single = helper.make_model(g, opset_imports=list(m.opset_import))
    single.ir_version = max(m.ir_version, 4)
    inferred = shape_inference.infer_shapes(single, strict_mode=False, data_prop=True)
    shapes = {vi.name: vi.type.tensor_type for vi in list(inferred.graph.output) + list(inferred.graph.value_info)}
    total = 0
    for o in outs:
        tt = shapes.get(o)
        if tt is None or not tt.HasField("shape"):
            return None
        n = 1
        for d in tt.shape.dim:
            if not d.HasField("dim_value") or d.dim_value < 0:
                return None
            n *= int(d.dim_value)
        total += n
    return total


def _subgraph_captures(node: onnx.NodeProto) -> set[str]:
    """Outer-scope tensors a node's subgraphs (If/Loop/Scan bodies) read."""
    captured: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for sg in graphs:
            local = {i.name for i in sg.input} | {i.name for i in sg.initializer}
            for n in sg.node:
                for i in list(n.input) + sorted(_subgraph_captures(n)):
                    if i and i not in local:
                        captured.add(i)
                local.update(o for o in n.output if o)
    return captured


def _all_inputs(node: onnx.NodeProto) -> list[str]:
    extra = sorted(_subgraph_captures(node) - set(node.input))
    return [i for i in list(node.input) + extra if i]


def _toposort(m: onnx.ModelProto) -> None:
    """Stable topological sort (Kahn, ties by original position); rejects cycles."""
    g = m.graph
    nodes = list(g.node)
    produced_by: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                produced_by[o] = idx
    preds = [{produced_by[i] for i in _all_inputs(n) if i in produced_by} - {idx} for idx, n in enumerate(nodes)]
    succs: list[list[int]] = [[] for _ in nodes]
    for idx, ps in enumerate(preds):
        for p in ps:
            succs[p].append(idx)
    indeg = [len(ps) for ps in preds]
    import heapq

    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != len(nodes):
        raise ModelError("graph has a cycle (expected a DAG)")
    if order != list(range(len(nodes))):
        del g.node[:]
        g.node.extend(nodes[i] for i in order)


# ----------------------------------------------------------------------------------------------------
# DAG and tensor facts


def _tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
    except Exception:
        dtype = "unknown"
    if not tt.HasField("shape"):
        return TensorInfo(vi.name, dtype, None, -1)
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # paddle2onnx writes -1 for "free"
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            return TensorInfo(vi.name, dtype, None, -1)
    count = int(np.prod([d if isinstance(d, int) else 1 for d in dims], dtype=np.int64))
    itemsize = np.dtype(dtype).itemsize if dtype not in ("unknown", "object") else -1
    return TensorInfo(vi.name, dtype, tuple(dims), count * itemsize if itemsize > 0 else -1)


def _declared(vi: onnx.ValueInfoProto) -> tuple[int | str | None, ...] | None:
    """The shape as declared, rank kept: ints, symbols, None for an anonymous free dim."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
        for d in tt.shape.dim
    )


def _build(model: onnx.ModelProto, *, path: Path, sha256: str) -> ModelGraph:
    g = model.graph
    tensors: dict[str, TensorInfo] = {}
    # A symbolic dim named by a graph input (a batch size) is a size the caller chooses: count it as
    # 1. Any other symbolic dim (NonZero's count, shape inference's unk__N) depends on the data.
    input_dims = {d.dim_param for i in g.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        info = _tensor_info(vi)
        if info.shape is not None and any(isinstance(d, str) and d not in input_dims for d in info.shape):
            info = TensorInfo(info.name, info.dtype, info.shape, -1)
        tensors[vi.name] = info
    inits = {i.name for i in g.initializer}
    for init in g.initializer:  # weights: shapes for FLOPs; never cross, so bytes stay informative only
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        tensors[init.name] = TensorInfo(
            init.name, dt.name, tuple(int(d) for d in init.dims), int(np.prod(init.dims, dtype=np.int64)) * dt.itemsize
        )
    nodes = list(g.node)
    producer: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = idx
    node_inputs = [tuple(i for i in _all_inputs(n) if i not in inits) for n in nodes]
    consumers: dict[str, list[int]] = {}
    for idx, ins in enumerate(node_inputs):
        for i in dict.fromkeys(ins):
            consumers.setdefault(i, []).append(idx)
    for name in list(consumers) + list(producer):
        tensors.setdefault(name, TensorInfo(name, "unknown", None, -1))
    generic: dict[str, tuple[int | str | None, ...] | None] = {k: t.shape for k, t in tensors.items()}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        generic[vi.name] = _declared(vi)
    return ModelGraph(
        generic=generic,
        path=path,
        sha256=sha256,
        model=model,
        nodes=nodes,
        inputs=[tensors[i.name] for i in g.input],
        outputs=[tensors[o.name] for o in g.output],
        node_flops=[_flops(n, tensors) for n in nodes],
        node_inputs=node_inputs,
        producer=producer,
        consumers=consumers,
        _tensors=tensors,
    )


def _numel(t: TensorInfo | None) -> int:
    if t is None or t.shape is None:
        return 0
    return int(np.prod([d if isinstance(d, int) else 1 for d in t.shape], dtype=np.int64))


def _flops(node: onnx.NodeProto, tensors: dict[str, TensorInfo]) -> float:
    """The node's FLOPs (``splitrt.graph.flops``) at the tensors' current shapes."""
    return node_flops(node, lambda name: t.shape if (t := tensors.get(name)) is not None else None)


# ----------------------------------------------------------------------------------------------------
# Cut enumeration


def _enumerate_cuts(mg: ModelGraph) -> list[Cut]:
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
    prefix_heads = _prefix_heads(mg, consumers, input_names, out_names)
    singles = _single_tensor_heads(mg, consumers, input_names, pred_nodes)

    flops = np.asarray(mg.node_flops, dtype=np.float64)
    total_flops = float(flops.sum()) or 1.0
    outputs = {o.name: o for o in mg.outputs}
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
            names, mask_of = prefix_heads[idx], _prefix_mask(idx)
            head_flops = float(flops[:idx].sum()) if idx else 0.0
            in_head: Callable[[int], bool] = idx.__gt__
        else:
            names, mask_of = [singles[idx][2]], _ancestors_mask(pred_nodes, idx)
            in_mask = _mask_to_bool(mask_of(), n)
            head_flops = float(flops[in_mask].sum())
            in_head = in_mask.__getitem__
        # A graph output the head made (or a graph input) stays on the device unless a tail node reads it.
        kept = tuple(o for o in outputs if o not in mg.producer or in_head(mg.producer[o]))
        infos = tuple(
            mg.tensor(t) for t in names if t not in outputs or any(not in_head(c) for c in mg.consumers.get(t, ()))
        )
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
                kept=kept,
                reply_bytes=sum(max(t.bytes, 0) for name, t in outputs.items() if name not in kept),
            )
        )
    return cuts


def _prefix_heads(
    mg: ModelGraph, consumers: dict[str, list[int]], input_names: list[str], out_names: list[str]
) -> list[list[str]]:
    """The crossing tensors of every prefix of the topological order (index = prefix length): ``live``
    holds the tensors available in the head that still have a consumer in the tail (or are outputs)."""
    remaining: dict[str, int] = {t: len(cs) for t, cs in consumers.items()}
    live: dict[str, None] = dict.fromkeys(input_names)
    graph_inputs = {i.name for i in mg.inputs}
    for o in out_names:  # a graph output that is also a graph input passes straight through
        if o not in mg.producer and o in graph_inputs:
            live[o] = None
    heads = [list(live)]
    for p in range(len(mg.nodes)):
        for t in dict.fromkeys(mg.node_inputs[p]):
            if t in live:
                remaining[t] -= 1
                if remaining[t] == 0:
                    del live[t]
        for o in mg.nodes[p].output:
            if o in remaining and remaining[o] > 0:
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
        bits = np.zeros(len(pred_nodes) + 1, dtype=np.uint8)
        bits[list(seen)] = 1
        return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")

    return mask


def _lowest_missing(h: int) -> int:
    return (~h & (h + 1)).bit_length()


def parse_cut_ids(text: str) -> list[str]:
    """``"c3,c9"`` -> ``["c3", "c9"]`` (the CLI and plans use comma-joined ids for chains)."""
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if not ids:
        raise CutError(f"expected one or more cut ids separated by commas, got {text!r}")
    return ids
