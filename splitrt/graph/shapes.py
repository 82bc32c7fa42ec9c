"""Binding a model's free dims and sizing every tensor, without ever changing the model.

Models people export carry free dims (batch, height, width, sequence) and data-dependent shapes
(Reshape to a computed shape, If/Loop outputs, NonZero). To price a cut we need the bytes that
really cross it, so the user binds the inputs once -- ``--shape NAME=1x3x640x640``, ``--dim SYMBOL=N``
or ``--sample FILE.npz`` (shapes *and values*, for inputs whose values steer the graph) -- and every
tensor is then sized in three steps, each recorded as the tensor's ``source``:

- ``static``: onnx shape inference on the model as it is (no free dim involved);
- ``bound``: onnx shape inference (with data propagation) on a copy whose inputs carry the bound shapes;
- ``measured``: whatever is still unknown is measured by running the copy once in onnxruntime (on the
  sample, or on valid random inputs of the bound shapes) with those intermediates exposed as outputs.

The model itself keeps its free dims: segments stay shape-generic (``partition.split``), and the
binding is only what the costs were computed at (recorded in profiles and ``plan.json``).

- ``ShapeBinding(shapes={input: shape}, dims={symbol: n}, sample={input: array} | None)``; ``binding_from(
  shapes=["x=1x3x640x640"], dims=["height=640"], sample="s.npz")`` parses the CLI flags (``ConfigError``).
- ``resolve(model_name, graph_inputs, binding, notice=) -> {input: shape}``: sample, then ``--shape``, then
  ``--dim``; a leading free dim defaults to 1 (via ``notice``); anything else unbound is ONE ``ModelError`` that
  lists every free dim by input and the flags that bind them; a shape the model rejects is ``InputError``.
- ``size_tensors(...)``: every node output sized ``static`` | ``bound`` | ``measured`` (one onnxruntime run,
  intermediates exposed). ``load(path, binding)`` applies it: ``ModelGraph.input_shapes``, ``.binding``,
  ``.sized``, ``.generic_shape(name)`` (the declared shape: segments use it and stay shape-generic);
  ``TensorInfo.source``. Cuts never depend on the binding (no cut is excluded for an unknown size).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, shape_inference

from splitrt.errors import ConfigError, InputError, ModelError
from splitrt.graph.ort_errors import onnxruntime_errors

Dim = int | str | None
Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ShapeBinding:
    """What the user bound: whole input shapes, named dims, and/or a sample (arrays by input name)."""

    shapes: Mapping[str, Shape] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)
    sample: Mapping[str, np.ndarray] | None = None
    sample_path: str | None = None
    # What ``resolve`` filled in unasked ({"images[0]": 1}: a leading free dim), recorded with the rest so a
    # binding of only defaults does not read as ``{}``.
    defaults: Mapping[str, int] = field(default_factory=dict)
    # The top-level Ifs the sample fixed and the branches inlined (``graph.specialise``), when any.
    specialised: Mapping[str, object] | None = None

    @property
    def empty(self) -> bool:
        return not self.shapes and not self.dims and self.sample is None

    def as_dict(self) -> dict[str, object]:
        return {
            "shapes": {k: list(v) for k, v in sorted(self.shapes.items())},
            "dims": dict(sorted(self.dims.items())),
            "sample": self.sample_path,
            "defaults": dict(sorted(self.defaults.items())),
            **({"specialised": dict(self.specialised)} if self.specialised is not None else {}),
        }


def parse_shape(text: str) -> tuple[str, Shape]:
    """``"images=1x3x640x640"`` -> ``("images", (1, 3, 640, 640))``; a scalar is ``"sr="``."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise ConfigError(f"--shape: expected NAME=D1xD2x... (e.g. images=1x3x640x640), got {text!r}")
    if dims.strip() == "":
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--shape {name}: expected integer dims joined by 'x', got {dims!r}") from None
    if any(d < 0 for d in shape):
        raise ConfigError(f"--shape {name}: expected dims >= 0, got {dims!r}")
    return name, shape


def parse_dim(text: str) -> tuple[str, int]:
    """``"height=640"`` -> ``("height", 640)``."""
    name, sep, value = text.partition("=")
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not sep or not name or n < 0:
        raise ConfigError(f"--dim: expected SYMBOL=N with N >= 0 (e.g. height=640), got {text!r}")
    return name, n


def load_sample(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays keyed by input name from an ``.npz`` file."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ConfigError(f"--sample {p}: expected an .npz file of arrays keyed by input name, got one array")
            return {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--sample {p}: expected an .npz file of arrays keyed by input name ({exc})") from exc


def binding_from(
    shapes: Sequence[str] = (), dims: Sequence[str] = (), sample: str | Path | None = None
) -> ShapeBinding:
    """The binding the CLI flags say (``--shape`` / ``--dim`` repeatable, ``--sample``)."""
    return ShapeBinding(
        shapes=dict(parse_shape(s) for s in shapes),
        dims=dict(parse_dim(d) for d in dims),
        sample=load_sample(sample) if sample is not None else None,
        sample_path=str(sample) if sample is not None else None,
    )


# -- binding ----------------------------------------------------------------------------------------


def declared_dims(vi: onnx.ValueInfoProto) -> list[Dim] | None:
    """An input's declared dims: ints, symbol names, None for an anonymous free dim; None for no rank."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    out: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param and d.dim_param != "?":
            out.append(d.dim_param)
        else:  # -1, 0, '?', or nothing: free and anonymous (paddle2onnx, tf2onnx)
            out.append(None)
    return out


def _fmt(dims: Sequence[Dim] | None) -> str:
    return "unknown rank" if dims is None else "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def _check(name: str, dims: list[Dim] | None, shape: Shape, where: str) -> None:
    if dims is None:
        return
    if len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=False)):
        raise InputError(
            f"input {name!r}: the model expects shape {_fmt(dims)}, {where} gives "
            f"{'x'.join(map(str, shape)) or 'a scalar'}"
        )


def resolve(
    model_name: str,
    inputs: Sequence[onnx.ValueInfoProto],
    binding: ShapeBinding,
    *,
    notice: Callable[[str], None] | None = None,
) -> dict[str, Shape]:
    """Concrete shapes for every graph input. A leading free dim with no value defaults to 1 (said
    through ``notice``); any other unbound dim is one ``ModelError`` listing them all with the flags."""
    return resolve_with_defaults(model_name, inputs, binding, notice=notice)[0]


def resolve_with_defaults(
    model_name: str,
    inputs: Sequence[onnx.ValueInfoProto],
    binding: ShapeBinding,
    *,
    notice: Callable[[str], None] | None = None,
) -> tuple[dict[str, Shape], dict[str, int]]:
    """``resolve``, and the dims it defaulted (``{"images[0]": 1}``)."""
    names = [vi.name for vi in inputs]
    for name in binding.shapes:
        if name not in names:
            raise ConfigError(f"--shape {name}: the model has no input {name!r}; expected one of {names}")
    symbols = {d for vi in inputs for d in (declared_dims(vi) or []) if isinstance(d, str)}
    for sym in binding.dims:
        if sym not in symbols:
            raise ConfigError(
                f"--dim {sym}: no input dim is named {sym!r}; the named free dims are {sorted(symbols) or 'none'}"
            )
    out: dict[str, Shape] = {}
    unbound: list[tuple[str, int, Dim]] = []
    defaulted: list[str] = []
    defaults: dict[str, int] = {}
    for vi in inputs:
        dims = declared_dims(vi)
        if binding.sample is not None and vi.name in binding.sample:
            shape = tuple(int(s) for s in binding.sample[vi.name].shape)
            _check(vi.name, dims, shape, f"the sample {binding.sample_path or ''}".rstrip())
        elif vi.name in binding.shapes:
            shape = tuple(binding.shapes[vi.name])
            _check(vi.name, dims, shape, "--shape")
        elif dims is None:
            unbound.append((vi.name, -1, None))
            continue
        else:
            concrete: list[int] = []
            for k, d in enumerate(dims):
                if isinstance(d, int):
                    concrete.append(d)
                elif isinstance(d, str) and d in binding.dims:
                    concrete.append(binding.dims[d])
                elif k == 0:
                    concrete.append(1)
                    defaulted.append(f"{vi.name}[0]" + (f" {d!r}" if d else ""))
                    defaults[f"{vi.name}[0]"] = 1
                else:
                    unbound.append((vi.name, k, d))
                    concrete.append(-1)
            shape = tuple(concrete)
        out[vi.name] = shape
    if unbound:
        raise ModelError(_unbound_message(model_name, inputs, unbound, binding))
    if defaulted and notice is not None:
        notice(f"{model_name}: leading free dim {', '.join(defaulted)} set to 1 (bind it with --dim or --shape)")
    return out, defaults


def _unbound_message(
    model_name: str, inputs: Sequence[onnx.ValueInfoProto], unbound: list[tuple[str, int, Dim]], binding: ShapeBinding
) -> str:
    listed = ", ".join(
        f"{name}[{k}]" + (f" {d!r}" if d else "") if k >= 0 else f"{name} (unknown rank)" for name, k, d in unbound
    )
    named = sorted({d for _, _, d in unbound if isinstance(d, str)})
    dim_flags = " ".join(f"--dim {d}=N" for d in named)
    shape_flags = []
    for vi in inputs:
        if any(name == vi.name for name, _, _ in unbound):
            dims = declared_dims(vi) or []
            shape_flags.append(
                f"--shape {vi.name}="
                + (
                    "x".join(str(d) if isinstance(d, int) else ("1" if k == 0 else "N") for k, d in enumerate(dims))
                    or "D1xD2"
                )
            )
    ways = [w for w in (dim_flags, " ".join(shape_flags)) if w]
    missing = ""
    if binding.sample is not None:
        absent = sorted({name for name, _, _ in unbound if name not in binding.sample})
        missing = f"; the sample has no array for {', '.join(absent)}" if absent else ""
    return (
        f"{model_name}: free dims without a value: {listed}{missing}. Bind them: {', or '.join(ways)}, "
        "or --sample FILE.npz (one array per input)"
    )


# -- sizing -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sized:
    dtype: str
    shape: Shape
    source: str  # static | bound | measured


def _np_dtype(elem: int) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
    except Exception:
        return "unknown"


def _concrete(vi: onnx.ValueInfoProto) -> Shape | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def with_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Shape]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs carry ``shapes`` (the model itself is never changed)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for s in shapes[vi.name]:
                shape.dim.add().dim_value = s
    return m


def size_tensors(
    model: onnx.ModelProto,
    generic: Mapping[str, Shape | None],
    shapes: Mapping[str, Shape],
    sample: Mapping[str, np.ndarray] | None,
    *,
    model_name: str,
) -> dict[str, Sized]:
    """Concrete dtype and shape of every graph input, node output and graph output at ``shapes``.
    ``generic``: what inference gave on the model as it is (a concrete shape there is ``static``)."""
    bound = with_input_shapes(model, shapes)
    # Infer afresh: exporters leave stale value_info (paddle2onnx's -1 dims) that inference would keep,
    # and graph outputs may declare a shape their producer contradicts (an OCR model's [1, seqlen] for a
    # [T, 1, C] tensor): clear both, keep the element types.
    del bound.graph.value_info[:]
    for vi in bound.graph.output:
        vi.type.tensor_type.ClearField("shape")
    try:
        bound = shape_inference.infer_shapes(bound, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise ModelError(f"{model_name}: shape inference at the bound shapes failed: {str(exc)[:300]}") from exc
    g = bound.graph
    out: dict[str, Sized] = {}
    dtypes: dict[str, int] = {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        dtypes[vi.name] = vi.type.tensor_type.elem_type
        shape = _concrete(vi)
        if shape is not None and dtypes[vi.name]:
            out[vi.name] = Sized(
                _np_dtype(dtypes[vi.name]), shape, "static" if generic.get(vi.name) == shape else "bound"
            )
    wanted = [o for n in g.node for o in n.output if o] + [o.name for o in g.output]
    unknown = [t for t in dict.fromkeys(wanted) if t not in out]
    if unknown:
        out.update(_measure(bound, unknown, shapes, sample, model_name=model_name))
    return out


def declaration(name: str, declared: Sequence[Dim] | None, measured: Shape) -> tuple[Dim, ...]:
    """What a segment declares for tensor ``name``: the model's declaration where the measured shape
    agrees with it, else the measured rank with a generated symbol per dim the declaration does not
    give or contradicts. A measured size stands for one binding only, so it never becomes a fixed dim:
    the segment keeps serving every shape the model does."""
    if declared is not None and len(declared) == len(measured):
        return tuple(
            f"{name}:{i}" if isinstance(d, int) and d != m else d
            for i, (d, m) in enumerate(zip(declared, measured, strict=True))
        )
    return tuple(f"{name}:{i}" for i in range(len(measured)))


def valid_inputs(
    inputs: Sequence[onnx.ValueInfoProto],
    shapes: Mapping[str, Shape],
    sample: Mapping[str, np.ndarray] | None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The sample's arrays where it has them, else valid random arrays of the bound shapes (floats
    normal, integers and booleans ones: a valid token id, mask value or count in any model)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in inputs:
        if sample is not None and vi.name in sample:
            feeds[vi.name] = np.asarray(sample[vi.name])
            continue
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        shape = shapes[vi.name]
        feeds[vi.name] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.ones(shape, dtype=dt)
    return feeds


def _measure(
    bound: onnx.ModelProto,
    names: list[str],
    shapes: Mapping[str, Shape],
    sample: Mapping[str, np.ndarray] | None,
    *,
    model_name: str,
) -> dict[str, Sized]:
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(bound)
    have = {o.name for o in m.graph.output}
    for name in names:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))  # untyped: onnxruntime infers it
    feeds = valid_inputs(list(m.graph.input), shapes, sample)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node's output
    opts.log_severity_level = 3
    on = "the sample" if sample else "random inputs of the bound shapes"
    try:
        with onnxruntime_errors(model_name, stage="build"):
            sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        with onnxruntime_errors(f"{model_name} on {on}", stage="run", feeds=feeds):
            outs = sess.run(names, feeds)
    except (ModelError, InputError) as exc:
        raise ModelError(
            f"measuring tensor sizes failed: {exc}; pass --sample FILE.npz with real inputs (values can steer "
            "the graph)"
        ) from exc
    return {
        n: Sized(np.asarray(v).dtype.name, tuple(int(s) for s in np.asarray(v).shape), "measured")
        for n, v in zip(names, outs, strict=True)
    }


# -- signatures -------------------------------------------------------------------------------------

Signature = tuple[tuple[str, Shape], ...]


def signature(input_shapes: Mapping[str, Sequence[int]]) -> Signature:
    """A hashable key for one set of input shapes: ``((name, shape), ...)`` sorted by name, so the
    same shapes give the same key whatever order they came in."""
    return tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in input_shapes.items()))
