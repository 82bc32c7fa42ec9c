"""Fused pairs: the tensors onnxruntime fuses away (e.g. a Conv output its Relu consumes in the same
kernel), and what a cut that separates such a pair pays: the consumer run unfused in the tail."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from splitrt.errors import ModelError, SplitrtError
from splitrt.graph import model as graph_mod
from splitrt.graph.ort_errors import onnxruntime_errors
from splitrt.profile.timing import Progress, p90, session, time_runs, warm

# A tensor that disappears when onnxruntime optimises the model counts as fused only between these (a
# Dropout or Identity that is simply removed costs nothing to split at).
_FUSABLE_PRODUCERS = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "Add", "Sum", "Mul", "Sub", "Div"}
)
_FUSABLE_CONSUMERS = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "Clip",
        "Sigmoid",
        "Tanh",
        "HardSigmoid",
        "HardSwish",
        "BatchNormalization",
        "Add",
        "Sum",
        "Mul",
        "Sub",
        "Div",
    }
)


def fused_tensors(g: graph_mod.ModelGraph, *, threads: int, providers: Sequence[str]) -> frozenset[str]:
    """Tensors onnxruntime never materialises at its default optimisation level: fused into a kernel.

    A cut crossing one separates a fused producer/consumer pair (e.g. Conv|Relu): the head then ends on
    the unfused producer and the tail runs the consumer as its own kernel, which the whole model never
    pays. Found by optimising the model as the runtime does and listing the node outputs that are gone:
    once without the NchwcTransformer (it renames every tensor), then, from the NCHWc graph, the Conv
    nodes that absorbed a residual Add/Sum (an extra input; named ``<conv output>_nchwc``).
    """
    import onnxruntime as ort

    def optimised(disabled: list[str]) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(prefix="splitrt-opt-") as tmp:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.log_severity_level = 3
            so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
            with onnxruntime_errors(f"{g.path.name} (optimised to find its fused tensors)", stage="build"):
                ort.InferenceSession(
                    g.model.SerializeToString(), so, providers=list(providers), disabled_optimizers=disabled
                )
            try:
                return onnx.load(so.optimized_model_filepath, load_external_data=False)
            except Exception as exc:  # optimised-model export is best effort (e.g. some EPs cannot save)
                raise ModelError(f"onnxruntime cannot optimise {g.path.name}: {exc}") from exc

    produced = {t for n in g.nodes for t in n.output if t}
    graph_outputs = {o.name for o in g.outputs}
    try:
        plain = optimised(["NchwcTransformer"])
    except ModelError:
        return frozenset()
    alive = {t for n in plain.graph.node for t in (*n.input, *n.output)} | graph_outputs
    fused = {
        t
        for t in produced - alive
        if g.nodes[g.producer[t]].op_type in _FUSABLE_PRODUCERS
        and any(g.nodes[i].op_type in _FUSABLE_CONSUMERS for i in g.consumers.get(t, []))
    }
    try:
        nchwc = optimised([])
    except ModelError:
        return frozenset(fused)
    for n in nchwc.graph.node:
        if n.domain != "com.microsoft.nchwc" or n.op_type != "Conv" or len(n.input) < 4:
            continue
        if not n.name.endswith("_nchwc"):
            continue
        conv_out = n.name[: -len("_nchwc")]
        cons = g.consumers.get(conv_out, [])
        if conv_out not in produced or len(cons) != 1:
            continue
        add = g.nodes[cons[0]]
        if add.op_type not in ("Add", "Sum"):
            continue
        fused.add(conv_out)
        has_act = any(a.name == "activation" for a in n.attribute)
        after = g.consumers.get(add.output[0], [])
        if has_act and len(after) == 1 and add.output[0] not in graph_outputs:
            fused.add(add.output[0])
    return frozenset(fused)


def unfused_tail_nodes(g: graph_mod.ModelGraph, c: graph_mod.Cut, fused: frozenset[str]) -> list[int]:
    """Tail nodes that run as their own kernels only because cut ``c`` separates them from a fused
    producer: consumers of fused crossing tensors, and onward along fused tensors they produce."""
    head = c.head_mask
    todo = [t.name for t in c.tensors if t.name in fused]
    out: set[int] = set()
    while todo:
        name = todo.pop()
        for i in g.consumers.get(name, []):
            if head >> i & 1 or i in out or g.nodes[i].op_type not in _FUSABLE_CONSUMERS:
                continue
            out.add(i)
            todo.extend(t for t in g.nodes[i].output if t in fused)
    return sorted(out)


def _nodes_model(g: graph_mod.ModelGraph, idx: Sequence[int]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of just the nodes ``idx`` (topological order), fed random tensors of the right shapes."""
    nodes = [g.nodes[i] for i in idx]
    inits = {t.name: t for t in g.model.graph.initializer}
    made = {t for n in nodes for t in n.output if t}
    in_names: list[str] = []
    used_inits: list[onnx.TensorProto] = []
    for n in nodes:
        for t in n.input:
            if not t or t in made or t in in_names:
                continue
            if t in inits:
                if all(u.name != t for u in used_inits):
                    used_inits.append(inits[t])
            else:
                in_names.append(t)
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    vi_in = []
    for t in in_names:
        info = g.tensor(t)
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (info.shape or ()))
        dt = np.dtype(info.dtype)
        feeds[t] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
        vi_in.append(onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(dt), shape))
    outs = [t for t in nodes[-1].output if t]
    vi_out = [
        onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(g.tensor(t).dtype)), None)
        for t in outs
    ]
    graph = onnx.helper.make_graph(nodes, "splitrt_unfused", vi_in, vi_out, initializer=used_inits)
    m = onnx.helper.make_model(graph, opset_imports=list(g.model.opset_import))
    m.ir_version = g.model.ir_version
    return m, feeds


def split_costs(
    g: graph_mod.ModelGraph,
    cuts: Sequence[graph_mod.Cut],
    fused: frozenset[str],
    *,
    threads: int,
    providers: Sequence[str],
    runs: int,
    warmup: int,
    overhead: float,
    progress: Progress,
) -> dict[str, tuple[float, float]]:
    """(median, p90) ms of the consumer kernels a cut separates from their fused producer, per cut."""
    split_ms: dict[str, tuple[float, float]] = {}
    cache: dict[tuple[Any, ...], tuple[float, float]] = {}
    for c in cuts[1:-1]:
        idx = unfused_tail_nodes(g, c, fused)
        if not idx:
            continue
        key = tuple(
            (g.nodes[i].op_type, tuple(tuple(g.tensor(t).shape or ()) for t in g.nodes[i].input if t)) for i in idx
        )
        if key not in cache:
            try:
                m, f = _nodes_model(g, idx)
                sess = session(m, threads, providers)
                warm(sess, f, warmup)
                ts = time_runs(sess, f, runs)
                cache[key] = (max(float(np.median(ts)) - overhead, 0.0), max(p90(ts) - overhead, 0.0))
            except (ModelError, SplitrtError, ValueError) as exc:
                progress(f"cannot time the unfused nodes of {c.id} ({exc}); no split cost")
                cache[key] = (0.0, 0.0)
        split_ms[c.id] = cache[key]
    progress(f"{len(split_ms)} cuts separate a fused pair; {len(cache)} unfused kernels timed")
    return split_ms
