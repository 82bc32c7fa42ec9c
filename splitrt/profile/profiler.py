"""Measure what a model's segments cost on this machine with onnxruntime; read and write profiles.

Fast profiling ("anchored" method). Timing the head and the tail of every cut directly needs two sessions
per cut (350 for resnet50). Instead the profiler

1. runs the whole model once in a profiling session (``enable_profiling``, NchwcTransformer disabled so
   kernel events keep node names; every node is renamed ``splitrt_n<index>`` so fused kernels map back
   to the first node they contain) to get each node's kernel time;
2. lists the tensors onnxruntime fuses away (``fused_tensors``: e.g. a Conv output its Relu consumes in
   the same kernel) and picks ~``segments`` - 1 anchor cuts: prefix cuts of equal kernel time that cross
   none of them;
3. times each anchor's head and tail directly, each as its own session on the real tensors after a
   warm-up, exactly as a deployment runs them (so the per-``run()`` cost, thread-pool wake-ups and the
   write-out of the crossing tensors are in the figure), plus the whole model and an empty ``run()``;
4. between two neighbouring anchors shares the head's growth (and the tail's shrink) out to the nodes by
   kernel time. A cut's head is one run() call plus its nodes' shares; its tail one run() call plus the
   rest, plus, for a cut that separates a fused pair (a candidate all the same), the consumer run unfused
   (timed once per shape as a small session: ``CutProfile.split_ms``).

The profile reproduces the anchors' measurements exactly and interpolates by kernel time between them.
An earlier "chain" method (time the segments between anchors and add them up) was 2x cheaper but each
segment pays its own run() call and boundary layout conversions: at 2 intra-op threads the chain summed
to 22-100 % more than the whole model and cut errors reached p90 32-54 %. ``measure_direct`` times a
cut's head and tail as their own sessions, which ``bench/bench_profiler.py`` uses to report the error.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil

from splitrt.errors import ModelError, ProfileError, SplitrtError
from splitrt.graph import model as graph_mod
from splitrt.graph import partition
from splitrt.plan.costmodel import CostTable
from splitrt.plan.mincut import Dag, DagTensor

SCHEMA = "splitrt.profile/1"
PROVIDER_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
_NODE_RE = re.compile(r"splitrt_n(\d+)")

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"[profile] {message}", file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    del message


# ---- data --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CutProfile:
    cut: str
    head_ms: float
    tail_ms: float
    head_p90_ms: float
    tail_p90_ms: float
    bytes: int
    float_bytes: int  # the float32 part of ``bytes``
    head_mask: str  # hex bitset of head node indices
    # what splitting here costs beyond one more run() call (head_ms + tail_ms = total_ms + run overhead +
    # split_ms): writing out and reading back the crossing tensors, and, at a cut that separates a producer
    # from the consumer onnxruntime fuses into it (e.g. Conv | Relu), the consumer run unfused in the tail
    split_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class NodeProfile:
    index: int
    name: str
    op: str
    kernel_ms: float  # median kernel time in the profiling run (0 when fused into another node)
    ms: float  # effective time: segment wall time × kernel share


@dataclass(frozen=True, kw_only=True)
class SegmentProfile:
    start: str  # cut id the segment starts at
    end: str  # cut id it ends at
    median_ms: float
    p90_ms: float
    rss_mb: float  # RSS growth when its session was created and first run


@dataclass(frozen=True, kw_only=True)
class Profile:
    schema: str
    model: dict[str, Any]  # name, sha256, nodes, flops
    host: dict[str, Any]
    runtime: dict[str, Any]  # onnxruntime version, provider, threads, runs, warmup, method
    total_ms: float
    total_p90_ms: float
    peak_rss_mb: float
    reply_bytes: int
    cuts: tuple[CutProfile, ...]
    nodes: tuple[NodeProfile, ...]
    segments: tuple[SegmentProfile, ...]
    created: str = ""
    notes: str = ""
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        return str(self.model["sha256"])

    @property
    def cut_ids(self) -> tuple[str, ...]:
        return tuple(c.cut for c in self.cuts)

    def cut(self, cut_id: str) -> CutProfile:
        if not self._index:
            self._index.update({c.cut: i for i, c in enumerate(self.cuts)})
        try:
            return self.cuts[self._index[cut_id]]
        except KeyError:
            raise ProfileError(f"profile of {self.model.get('name')!r} has no cut {cut_id!r}") from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_index", None)
        return d


# ---- host and runtime facts ----------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, Any]:
    freq = psutil.cpu_freq()
    return {
        "class": host_class(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_model": _cpu_model(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        "freq_mhz": round(freq.max or freq.current, 1) if freq else None,
        "memory_mb": psutil.virtual_memory().total // (1 << 20),
        "python": platform.python_version(),
    }


def host_class() -> str:
    """``<machine>-<n>core``, e.g. ``x86_64-2core``: the prefix of shipped profile names."""
    return f"{platform.machine()}-{psutil.cpu_count(logical=True)}core"


def pick_providers(preferred: Sequence[str] | None = None) -> list[str]:
    """The best available execution provider first (TensorRT, CUDA, then CPU), CPU always last."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    order = list(preferred) if preferred else list(PROVIDER_PREFERENCE)
    chosen = [p for p in order if p in available and p != "CPUExecutionProvider"]
    return [*chosen, "CPUExecutionProvider"]


def _session(model: onnx.ModelProto | bytes, threads: int, providers: Sequence[str], **kw: Any) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    profiling_prefix = kw.pop("profile_prefix", None)
    if profiling_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profiling_prefix
    data = model if isinstance(model, bytes) else model.SerializeToString()
    try:
        return ort.InferenceSession(data, so, providers=list(providers), **kw)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ModelError(f"onnxruntime cannot load the segment: {exc}") from exc


def _time_runs(sess: Any, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, dict(feeds))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


# A fresh session's first runs are slow and erratic (arena growth, page faults, thread-pool start): on this
# 2-vCPU host the first 5-8 runs of a 3 ms model take 2-3x the steady time. Warm up for a minimum wall time
# as well as a minimum count, so that small and large segments are both timed in steady state.
WARMUP_MIN_S = 0.25
WARMUP_MAX_RUNS = 200


def _warm(sess: Any, feeds: Mapping[str, np.ndarray], warmup: int) -> None:
    """Run ``sess`` at least ``warmup`` times and for at least ``WARMUP_MIN_S`` (when ``warmup`` > 0)."""
    if warmup <= 0:
        return
    t0 = time.perf_counter()
    n = 0
    while n < warmup or (time.perf_counter() - t0 < WARMUP_MIN_S and n < WARMUP_MAX_RUNS):
        sess.run(None, dict(feeds))
        n += 1


def _p90(xs: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(xs), 90))


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / (1 << 20)


def default_threads() -> int:
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


# ---- measurement ---------------------------------------------------------------------------------


def node_kernel_ms(
    g: graph_mod.ModelGraph,
    feeds: Mapping[str, np.ndarray],
    *,
    threads: int,
    providers: Sequence[str],
    runs: int = 3,
) -> list[float]:
    """Median kernel time per node (ORT profiling); fused kernels count for the first node they hold."""
    m = copy.deepcopy(g.model)
    for i, node in enumerate(m.graph.node):
        node.name = f"splitrt_n{i}"
    with tempfile.TemporaryDirectory(prefix="splitrt-prof-") as tmp:
        sess = _session(
            m, threads, providers, profile_prefix=str(Path(tmp) / "p"), disabled_optimizers=["NchwcTransformer"]
        )
        sess.run(None, dict(feeds))  # warm-up: its events are dropped below
        for _ in range(runs):
            sess.run(None, dict(feeds))
        path = sess.end_profiling()
        events = json.loads(Path(path).read_text())
    per_node: dict[int, list[float]] = {}
    run_no = -1
    for ev in events:
        if ev.get("cat") == "Session" and ev.get("name") == "model_run":
            run_no += 1
        if ev.get("cat") != "Node" or not str(ev.get("name", "")).endswith("_kernel_time"):
            continue
        match = _NODE_RE.search(ev["name"])
        if match:
            per_node.setdefault(int(match.group(1)), []).append(float(ev["dur"]) / 1e3)
    out = []
    for i in range(len(g.nodes)):
        durs = per_node.get(i, [])
        # each run contributes one event per kernel; drop the warm-up run when there are enough
        if len(durs) > runs:
            durs = durs[len(durs) - runs :]
        out.append(float(np.median(durs)) if durs else 0.0)
    return out


# A tensor that disappears when onnxruntime optimises the model counts as fused only between these (a
# Dropout or Identity that is simply removed costs nothing to split at).
_FUSABLE_PRODUCERS = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "Add", "Sum", "Mul", "Sub", "Div"}
)
_FUSABLE_CONSUMERS = frozenset(
    {"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "BatchNormalization", "Add",
     "Sum", "Mul", "Sub", "Div"}
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
            try:
                ort.InferenceSession(
                    g.model.SerializeToString(), so, providers=list(providers), disabled_optimizers=disabled
                )
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


def _unfused_tail_nodes(g: graph_mod.ModelGraph, c: graph_mod.Cut, fused: frozenset[str]) -> list[int]:
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


def run_overhead_ms(*, threads: int, providers: Sequence[str], runs: int, warmup: int) -> float:
    """The fixed cost of one ``run()`` call (bind a feed, return an output): an Identity on 1 float."""
    vi = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    vo = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "splitrt_overhead", [vi], [vo])
    sess = _session(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]), threads, providers)
    feeds = {"x": np.zeros(1, np.float32)}
    _warm(sess, feeds, max(warmup, 5))
    return float(np.median(_time_runs(sess, feeds, max(runs, 50))))


def _prefix_cuts(g: graph_mod.ModelGraph) -> list[tuple[int, graph_mod.Cut]]:
    """(number of head nodes, cut) for every cut that is a prefix of the topological order."""
    out = []
    for c in g.cuts():
        m = c.head_mask
        if m & (m + 1) == 0:
            out.append((m.bit_count(), c))
    return out


def choose_boundaries(
    g: graph_mod.ModelGraph, kernel_ms: Sequence[float], segments: int, avoid: frozenset[str] = frozenset()
) -> list[str]:
    """Interior prefix cut ids splitting the model into ~``segments`` pieces of equal kernel time, never
    at a cut crossing a tensor of ``avoid`` (fused away: the chain would pay an unfused kernel there)."""
    prefixes = [
        (k, c)
        for k, c in _prefix_cuts(g)
        if c.id not in ("cloud", "device") and not any(t.name in avoid for t in c.tensors)
    ]
    if segments <= 1 or not prefixes:
        return []
    w = np.asarray(kernel_ms, dtype=np.float64)
    if w.sum() <= 0:
        w = np.ones_like(w)
    cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
    chosen: list[str] = []
    last_k = 0
    targets = [j / segments for j in range(1, segments)]
    for target in targets:
        best = min(prefixes, key=lambda kc: abs(cum[kc[0]] - target))
        if best[0] > last_k and best[1].id not in chosen:
            chosen.append(best[1].id)
            last_k = best[0]
    return chosen


def _float_bytes(c: graph_mod.Cut) -> int:
    return sum(max(t.bytes, 0) for t in c.tensors if t.dtype == "float32")


def measure(
    model_path: str | Path,
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
    segments: int = 16,
    feeds: Mapping[str, np.ndarray] | None = None,
    progress: Progress = stderr_progress,
    name: str | None = None,
) -> Profile:
    """Profile every candidate cut of ``model_path`` on this machine (anchored method, see module doc)."""
    from splitrt.graph import zoo

    if runs < 1 or warmup < 0:
        raise ProfileError(f"expected runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    import onnxruntime as ort

    t_start = time.perf_counter()
    threads = threads or default_threads()
    provs = pick_providers(providers)
    g = graph_mod.load(model_path)
    cuts = g.cuts()
    inputs = dict(feeds) if feeds is not None else zoo.random_inputs(model_path)
    rss0 = _rss_mb()
    peak = rss0
    progress(f"{Path(model_path).name}: {len(g.nodes)} nodes, {len(cuts)} cuts, provider {provs[0]}, {threads} threads")

    kernel = node_kernel_ms(g, inputs, threads=threads, providers=provs, runs=min(max(runs, 1), 5))
    peak = max(peak, _rss_mb())
    fused = fused_tensors(g, threads=threads, providers=provs)
    anchors = choose_boundaries(g, kernel, segments, avoid=fused)
    progress(f"per-node kernel times done; {len(fused)} fused-away tensors; {len(anchors)} anchor cuts")

    # The whole model as one session, timed before and after the anchors (the lower median is kept: a
    # burst of load from other jobs during one of them would otherwise scale every cut).
    full = _session(g.model, threads, provs)
    _warm(full, inputs, warmup)
    full_first = _time_runs(full, inputs, max(runs, 10))
    # Each anchor's head and tail, timed directly as they run in deployment: one session each, timed back
    # to back (two live sessions' intra-op thread pools spin against each other) and then dropped.
    head_t: list[list[float]] = []
    tail_t: list[list[float]] = []
    seg_rss: list[float] = []
    for n_a, a in enumerate(anchors):
        head_seg, tail_seg = partition.head_tail(g, a)
        before = _rss_mb()
        h_sess = _session(head_seg.model, threads, provs)
        h_feeds = {n: inputs[n] for n in head_seg.inputs}
        h_out = dict(zip(head_seg.outputs, h_sess.run(list(head_seg.outputs), h_feeds), strict=True))
        _warm(h_sess, h_feeds, warmup)
        head_t.append(_time_runs(h_sess, h_feeds, runs))
        seg_rss.append(max(_rss_mb() - before, 0.0))
        del h_sess
        t_sess = _session(tail_seg.model, threads, provs)
        avail = {**inputs, **h_out}
        t_feeds = {n: avail[n] for n in tail_seg.inputs}
        _warm(t_sess, t_feeds, warmup)
        tail_t.append(_time_runs(t_sess, t_feeds, runs))
        peak = max(peak, _rss_mb())
        del t_sess
        progress(
            f"anchor {n_a + 1}/{len(anchors)} ({a}): head {np.median(head_t[-1]):.2f} ms, "
            f"tail {np.median(tail_t[-1]):.2f} ms"
        )
    # The fixed cost of one run() call (feeding inputs, returning outputs): what the smallest head pays.
    overhead = run_overhead_ms(threads=threads, providers=provs, runs=runs, warmup=warmup)
    _warm(full, inputs, warmup)
    full_times = _time_runs(full, inputs, max(runs, 10))
    if np.median(full_first) < np.median(full_times):
        full_times = full_first
    del full
    full_ms = float(np.median(full_times))
    full90 = max(_p90(full_times), full_ms)

    # Anchor values along the topological order: a head grows from one run() call (cloud) to the whole
    # model (device); a tail shrinks from the whole model to one run() call.
    ids = ["cloud", *anchors, "device"]
    h_med = np.array([overhead, *(float(np.median(t)) for t in head_t), full_ms])
    h_p90 = np.array([overhead, *(_p90(t) for t in head_t), full90])
    t_med = np.array([full_ms, *(float(np.median(t)) for t in tail_t), overhead])
    t_p90 = np.array([full90, *(_p90(t) for t in tail_t), overhead])
    h_p90, t_p90 = np.maximum(h_p90, h_med), np.maximum(t_p90, t_med)
    # Between two anchors, a span's wall time (the head's growth, the tail's shrink) is shared out to its
    # nodes by kernel time; a cut's head is then one run() call plus its head nodes, its tail one run()
    # call plus the rest: exact at the anchors, interpolated by kernel time between them.
    bounds = [0] + [g.cut(a).head_mask.bit_count() for a in anchors] + [len(g.nodes)]
    eff_h, eff_h90 = np.zeros(len(g.nodes)), np.zeros(len(g.nodes))
    eff_t, eff_t90 = np.zeros(len(g.nodes)), np.zeros(len(g.nodes))
    seg_profiles = []
    for s in range(len(ids) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        k = np.asarray(kernel[lo:hi], dtype=np.float64)
        share = k / k.sum() if k.sum() > 0 else np.full(hi - lo, 1.0 / max(hi - lo, 1))
        # a span may "cost" less than nothing (a head ending on a smaller tensor can be faster): kept, so
        # that every anchor's own measurement is reproduced exactly; per-node times are clipped at 0
        dh, dh90 = h_med[s + 1] - h_med[s], h_p90[s + 1] - h_p90[s]
        dt, dt90 = t_med[s] - t_med[s + 1], t_p90[s] - t_p90[s + 1]
        eff_h[lo:hi], eff_h90[lo:hi] = dh * share, dh90 * share
        eff_t[lo:hi], eff_t90[lo:hi] = dt * share, dt90 * share
        seg_profiles.append(
            SegmentProfile(
                start=ids[s],
                end=ids[s + 1],
                median_ms=round(max(dh, 0.0), 5),
                p90_ms=round(max(dh90, dh, 0.0), 5),
                rss_mb=round(seg_rss[s], 2) if s < len(seg_rss) else 0.0,
            )
        )
    # Cuts that separate a fused pair: the tail runs the consumer(s) unfused; time them once per shape.
    split_ms = _split_costs(g, cuts, fused, threads=threads, providers=provs, runs=runs, warmup=warmup,
                            overhead=overhead, progress=progress)
    cut_profiles = []
    for c in cuts:
        mask = graph_mod._mask_to_bool(c.head_mask, len(g.nodes))
        if c.id == "cloud":
            head = head90 = 0.0
        else:
            head = max(overhead + float(eff_h[mask].sum()), overhead)
            head90 = max(overhead + float(eff_h90[mask].sum()), overhead)
        if c.id == "device":
            tail = tail90 = 0.0
        else:
            extra, extra90 = split_ms.get(c.id, (0.0, 0.0))
            tail = max(overhead + float(eff_t[~mask].sum()), overhead) + extra
            tail90 = max(overhead + float(eff_t90[~mask].sum()), overhead) + extra90
        cut_profiles.append(
            CutProfile(
                cut=c.id,
                head_ms=round(head, 5),
                tail_ms=round(tail, 5),
                head_p90_ms=round(max(head90, head), 5),
                tail_p90_ms=round(max(tail90, tail), 5),
                bytes=c.bytes if c.id != "device" else 0,
                float_bytes=_float_bytes(c) if c.id != "device" else 0,
                head_mask=format(c.head_mask, "x"),
                split_ms=round(split_ms.get(c.id, (0.0, 0.0))[0], 5),
            )
        )
    nodes = tuple(
        NodeProfile(
            index=i, name=n.name, op=n.op_type, kernel_ms=round(kernel[i], 5), ms=round(max(float(eff_h[i]), 0.0), 5)
        )
        for i, n in enumerate(g.nodes)
    )
    elapsed = time.perf_counter() - t_start
    progress(f"done in {elapsed:.1f} s: full model {full_ms:.2f} ms (median), peak RSS +{peak - rss0:.0f} MB")
    return Profile(
        schema=SCHEMA,
        model={
            "name": name or Path(model_path).stem,
            "sha256": g.sha256,
            "nodes": len(g.nodes),
            "flops": g.flops,
        },
        host=host_facts(),
        runtime={
            "onnxruntime": ort.__version__,
            "provider": provs[0],
            "providers": provs,
            "intra_op_threads": threads,
            "runs": runs,
            "warmup": warmup,
            "method": "anchored",
            "segments": len(ids) - 1,
            "anchors": list(anchors),
            # each anchor's directly measured (head, tail) medians: the profile reproduces them
            "anchor_ms": {a: [round(float(h_med[k + 1]), 5), round(float(t_med[k + 1]), 5)]
                          for k, a in enumerate(anchors)},
            "run_overhead_ms": round(overhead, 5),
            "whole_model_ms": round(full_ms, 5),
            "fused_tensors": len(fused),
            "split_cost_cuts": len(split_ms),
            "profiling_s": round(elapsed, 2),
        },
        total_ms=round(full_ms, 5),
        total_p90_ms=round(full90, 5),
        peak_rss_mb=round(peak - rss0, 2),
        reply_bytes=sum(max(o.bytes, 0) for o in g.outputs),
        cuts=tuple(cut_profiles),
        nodes=nodes,
        segments=tuple(seg_profiles),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def _split_costs(
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
        idx = _unfused_tail_nodes(g, c, fused)
        if not idx:
            continue
        key = tuple(
            (g.nodes[i].op_type, tuple(tuple(g.tensor(t).shape or ()) for t in g.nodes[i].input if t)) for i in idx
        )
        if key not in cache:
            try:
                m, f = _nodes_model(g, idx)
                sess = _session(m, threads, providers)
                _warm(sess, f, warmup)
                ts = _time_runs(sess, f, runs)
                cache[key] = (max(float(np.median(ts)) - overhead, 0.0), max(_p90(ts) - overhead, 0.0))
            except (ModelError, SplitrtError, ValueError) as exc:
                progress(f"cannot time the unfused nodes of {c.id} ({exc}); no split cost")
                cache[key] = (0.0, 0.0)
        split_ms[c.id] = cache[key]
    progress(f"{len(split_ms)} cuts separate a fused pair; {len(cache)} unfused kernels timed")
    return split_ms


def measure_direct(
    g: graph_mod.ModelGraph,
    cut_id: str,
    feeds: Mapping[str, np.ndarray],
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> tuple[float, float]:
    """Median head and tail time (ms) of one cut, each run as its own session (for validation)."""
    threads = threads or default_threads()
    provs = pick_providers(providers)
    head, tail = partition.head_tail(g, cut_id)
    out: list[float] = []
    h_feeds = {k: feeds[k] for k in head.inputs}
    h_sess = _session(head.model, threads, provs)
    h_out = dict(zip(head.outputs, h_sess.run(list(head.outputs), h_feeds), strict=True))
    t_sess = _session(tail.model, threads, provs)
    avail = {**feeds, **h_out}
    t_feeds = {k: avail[k] for k in tail.inputs}
    for sess, f in ((h_sess, h_feeds), (t_sess, t_feeds)):
        _warm(sess, f, warmup)
        out.append(float(np.median(_time_runs(sess, f, runs))))
    if cut_id == "cloud":
        out[0] = 0.0
    if cut_id == "device":
        out[1] = 0.0
    return out[0], out[1]


# ---- files ---------------------------------------------------------------------------------------


def save_profile(profile: Profile, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(p)


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ProfileError(f"{where}: missing key {key!r}")
    return d[key]


def load_profile(path: str | Path, *, sha256: str | None = None) -> Profile:
    """Read a profile; ``ProfileError`` if corrupt, of another schema, or (given ``sha256``) of another
    model."""
    p = Path(path)
    data: dict[str, Any]
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such profile") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{p}: not a JSON profile ({exc})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{p}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ProfileError(f"{p}: expected schema {SCHEMA!r}, got {schema!r}")
    where = str(p)
    try:
        model = _req(data, "model", where)
        got_sha = str(_req(model, "sha256", where))
        if sha256 is not None and got_sha != sha256:
            raise ProfileError(
                f"{p}: profile is for model {model.get('name')!r} with sha256 {got_sha[:12]}..., "
                f"expected sha256 {sha256[:12]}... (profile the model you plan for)"
            )
        cuts = tuple(
            CutProfile(
                cut=str(c["cut"]),
                head_ms=float(c["head_ms"]),
                tail_ms=float(c["tail_ms"]),
                head_p90_ms=float(c.get("head_p90_ms", c["head_ms"])),
                tail_p90_ms=float(c.get("tail_p90_ms", c["tail_ms"])),
                bytes=int(c["bytes"]),
                float_bytes=int(c.get("float_bytes", c["bytes"])),
                head_mask=str(c.get("head_mask", "")),
                split_ms=float(c.get("split_ms", 0.0)),
            )
            for c in _req(data, "cuts", where)
        )
        nodes = tuple(NodeProfile(**n) for n in data.get("nodes", []))
        segments = tuple(SegmentProfile(**s) for s in data.get("segments", []))
        prof = Profile(
            schema=SCHEMA,
            model=dict(model),
            host=dict(_req(data, "host", where)),
            runtime=dict(_req(data, "runtime", where)),
            total_ms=float(_req(data, "total_ms", where)),
            total_p90_ms=float(data.get("total_p90_ms") or data["total_ms"]),
            peak_rss_mb=float(data.get("peak_rss_mb", 0.0)),
            reply_bytes=int(data.get("reply_bytes", 0)),
            cuts=cuts,
            nodes=nodes,
            segments=segments,
            created=str(data.get("created", "")),
            notes=str(data.get("notes", "")),
        )
    except ProfileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"{p}: corrupt profile ({type(exc).__name__}: {exc})") from exc
    if not cuts:
        raise ProfileError(f"{p}: profile lists no cuts")
    for c in cuts:
        values = (c.head_ms, c.tail_ms, c.bytes)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ProfileError(f"{p}: cut {c.cut!r} has a negative or non-finite cost: {values}")
    return prof


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- from profiles to the pure planner's inputs --------------------------------------------------


def cost_table(
    device: Profile,
    cloud: Profile,
    *,
    device_speed_factor: float = 1.0,
    cloud_speed_factor: float = 1.0,
    codecs: Mapping[str, float] | None = None,
) -> CostTable:
    """Per-cut costs for planning: head times from ``device``, tail times from ``cloud``.

    ``*_speed_factor`` scale measured times (e.g. a board's ``cpu_speed_factor`` to emulate it from a
    host profile). Both profiles must be of the same model (sha256) and list the same cuts.
    """
    if device.sha256 != cloud.sha256:
        raise ProfileError(
            f"device profile is for sha256 {device.sha256[:12]}... ({device.model.get('name')}), cloud profile "
            f"for {cloud.sha256[:12]}... ({cloud.model.get('name')}): expected the same model"
        )
    if device.cut_ids != cloud.cut_ids:
        raise ProfileError(
            f"device and cloud profiles list different cuts ({len(device.cuts)} vs {len(cloud.cuts)}): "
            "re-profile both with the same splitrt version"
        )
    return CostTable(
        ids=device.cut_ids,
        head_ms=np.array([c.head_ms for c in device.cuts]) * device_speed_factor,
        tail_ms=np.array([c.tail_ms for c in cloud.cuts]) * cloud_speed_factor,
        bytes=[c.bytes for c in device.cuts],
        float_bytes=[c.float_bytes for c in device.cuts],
        reply_bytes=device.reply_bytes,
        codecs=codecs,
    )


def nested_matrix(profile: Profile) -> np.ndarray:
    """``m[i, j]`` is True when cut i's head is inside cut j's head (pairs usable in a chain)."""
    masks = [int(c.head_mask or "0", 16) for c in profile.cuts]
    n = len(masks)
    m = np.zeros((n, n), dtype=bool)
    for i, a in enumerate(masks):
        for j, b in enumerate(masks):
            m[i, j] = a & ~b == 0
    return m


def dag(
    g: graph_mod.ModelGraph,
    device: Profile,
    cloud: Profile,
    *,
    device_speed_factor: float = 1.0,
    cloud_speed_factor: float = 1.0,
) -> Dag:
    """The node-level DAG with effective per-node times for the DADS min-cut (``splitrt.plan.mincut``)."""
    for prof in (device, cloud):
        if prof.sha256 != g.sha256:
            raise ProfileError(
                f"profile of {prof.model.get('name')!r} has sha256 {prof.sha256[:12]}..., the model "
                f"{g.path.name} has {g.sha256[:12]}...: expected the same model"
            )
        if len(prof.nodes) != len(g.nodes):
            raise ProfileError(f"profile has {len(prof.nodes)} per-node costs, the model {len(g.nodes)} nodes")
    outputs = {o.name for o in g.outputs}
    tensors: list[DagTensor] = []
    seen: set[str] = set()
    for t in g.inputs:
        cons = tuple(sorted(set(g.consumers.get(t.name, []))))
        if cons or t.name in outputs:
            tensors.append(
                DagTensor(name=t.name, bytes=max(t.bytes, 0), producer=-1, consumers=cons, is_output=t.name in outputs)
            )
        seen.add(t.name)
    for i, node in enumerate(g.nodes):
        for name in node.output:
            if not name or name in seen:
                continue
            seen.add(name)
            cons = tuple(sorted(set(g.consumers.get(name, []))))
            if not cons and name not in outputs:
                continue
            tensors.append(
                DagTensor(
                    name=name,
                    bytes=max(g.tensor(name).bytes, 0),
                    producer=i,
                    consumers=cons,
                    is_output=name in outputs,
                )
            )
    return Dag(
        device_ms=tuple(n.ms * device_speed_factor for n in device.nodes),
        cloud_ms=tuple(n.ms * cloud_speed_factor for n in cloud.nodes),
        tensors=tuple(tensors),
    )


__all__ = [
    "SCHEMA",
    "CutProfile",
    "NodeProfile",
    "Profile",
    "SegmentProfile",
    "SplitrtError",
    "cost_table",
    "dag",
    "host_class",
    "host_facts",
    "load_profile",
    "measure",
    "measure_direct",
    "nested_matrix",
    "save_profile",
]
