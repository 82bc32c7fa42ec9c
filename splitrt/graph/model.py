"""Load a model: normalise it (``graph.normalise``), build its DAG and tensor facts, bind and size it
(``graph.shapes``), and hand out its cuts (``graph.cuts``).

Contracts (re-exported by ``splitrt.graph``):

- ``load(path, binding=None, *, notice=None) -> ModelGraph`` normalises any ONNX file and raises
  ``ModelError`` naming the file and the cause.
- ``ModelGraph``: ``.path``, ``.sha256`` (``model_sha256(path)``: the file's bytes, plus its external-data
  files if any), ``.model`` (the normalised ``onnx.ModelProto``), ``.nodes`` (topological order),
  ``.inputs`` / ``.outputs`` (``TensorInfo``), ``.flops``, ``.node_flops`` (per node),
  ``.tensor(name)``, ``.cuts()`` (topological order, first ``cloud``, last ``device``), ``.cut(id)``
  (``CutError``). Every structural cut is a candidate; unbound, a tensor of data-dependent size has
  bytes -1 (``.sized`` is False): bind the graph to plan with it. Cuts never depend on the binding.
- Bound (``load(path, binding)``): every tensor is sized ``static`` | ``bound`` | ``measured``
  (``TensorInfo.source``); ``.input_shapes``, ``.binding``, ``.generic_shape(name)`` (the declared
  shape: segments use it and stay shape-generic).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from splitrt.errors import CutError, ModelError
from splitrt.graph import shapes
from splitrt.graph.cuts import Cut, enumerate_cuts
from splitrt.graph.flops import nodes_flops
from splitrt.graph.normalise import (
    MIN_OPSET,
    all_inputs,
    check_and_infer,
    default_opset,
    normalise,
    producers,
    short_error,
)
from splitrt.graph.shapes import ShapeBinding
from splitrt.graph.tensors import TensorInfo

__all__ = ["Cut", "ModelGraph", "TensorInfo", "derived", "from_proto", "load", "model_sha256", "normalise"]


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
            self._cuts = enumerate_cuts(self)
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


# ----------------------------------------------------------------------------------------------------
# Loading and normalisation


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def external_data_files(model: onnx.ModelProto, base: Path) -> list[Path]:
    """The external-data files any of the model's tensors point at (``walk``), in first-use order."""
    from splitrt.graph.walk import external_locations

    return [base / name for name in external_locations(model) if name]


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
        raise ModelError(f"{p}: not a valid ONNX model (truncated or not ONNX): {short_error(exc)}") from exc
    for f in external_data_files(model, p.parent):
        if not f.is_file():
            raise ModelError(f"{p}: external data file missing: expected {f}, found no such file")
    sha = model_sha256(p, model)  # before loading the data: it needs the external references
    try:
        onnx.load_external_data_for_model(model, str(p.parent))
    except Exception as exc:
        raise ModelError(f"{p}: external data does not load: {short_error(exc)}") from exc
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
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise ModelError(f"{path}: opset {opset} is not supported (expected opset >= {MIN_OPSET})")
    model = normalise(model, in_place=own)
    model = check_and_infer(model, path)
    spec = None
    if binding is not None and binding.sample is not None and any(n.op_type == "If" for n in model.graph.node):
        from splitrt.graph import specialise

        at = shapes.resolve(path.name, list(model.graph.input), binding)
        specialised, spec = specialise.specialise(
            model, base_sha256=sha256, sample=binding.sample, shapes=at, normalise=normalise
        )
        if spec is not None:
            model, sha256 = check_and_infer(normalise(specialised), path), spec.sha256
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
    return _build(check_and_infer(normalise(model), base.path), path=base.path, sha256=f"{base.sha256}~{key}")


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
    mg.node_flops = _flops(mg.nodes, mg._tensors)
    mg._cuts = None


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
    producer = producers(nodes)
    node_inputs = [tuple(i for i in all_inputs(n) if i not in inits) for n in nodes]
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
        node_flops=_flops(nodes, tensors),
        node_inputs=node_inputs,
        producer=producer,
        consumers=consumers,
        _tensors=tensors,
    )


def _flops(nodes: list[onnx.NodeProto], tensors: dict[str, TensorInfo]) -> list[float]:
    """Each node's FLOPs (``splitrt.graph.flops``) at the tensors' current shapes."""
    return nodes_flops(nodes, {name: t.shape for name, t in tensors.items()})
