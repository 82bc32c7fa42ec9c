"""Running onnxruntime sessions and timing them: session setup, warm-up, timed runs, the fixed cost of
one ``run()`` call, and per-node kernel times from onnxruntime's own profiling events."""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil

from splitrt.graph import model as graph_mod
from splitrt.graph.ort_errors import onnxruntime_errors
from splitrt.profile.host import default_threads

_NODE_RE = re.compile(r"splitrt_n(\d+)")

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"[profile] {message}", file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    del message


def session(
    model: onnx.ModelProto | bytes, threads: int, providers: Sequence[str], what: str = "the segment", **kw: Any
) -> Any:
    """A profiling session (sequential, ``threads`` intra-op); ``ModelError`` when it does not build."""
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
    with onnxruntime_errors(what, stage="build"):
        return ort.InferenceSession(data, so, providers=list(providers), **kw)


def untimed_options(*, optimise: bool = True) -> Any:
    """``SessionOptions`` for runs whose results count, not their time (the accuracy guard, codec sizes):
    ``default_threads()`` intra-op threads that do not spin while they wait, which on a busy host burns
    the CPU the other threads need (squeezenet's tails at load 12: 10x slower spinning); ``optimise``
    False: no graph optimisation (nothing fused away)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = default_threads()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not optimise:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def run(
    sess: Any, outputs: Sequence[str] | None, feeds: Mapping[str, np.ndarray], what: str = "the segment"
) -> list[Any]:
    """One ``sess.run`` with onnxruntime's errors mapped (``graph.ort_errors``)."""
    with onnxruntime_errors(what, stage="run", feeds=feeds):
        return list(sess.run(list(outputs) if outputs is not None else None, dict(feeds)))


def time_runs(sess: Any, feeds: Mapping[str, np.ndarray], runs: int) -> list[float]:
    out = []
    with onnxruntime_errors("the segment", stage="run", feeds=feeds):  # outside the timed span
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


def warm(sess: Any, feeds: Mapping[str, np.ndarray], warmup: int) -> None:
    """Run ``sess`` at least ``warmup`` times and for at least ``WARMUP_MIN_S`` (when ``warmup`` > 0)."""
    if warmup <= 0:
        return
    t0 = time.perf_counter()
    n = 0
    with onnxruntime_errors("the segment", stage="run", feeds=feeds):
        while n < warmup or (time.perf_counter() - t0 < WARMUP_MIN_S and n < WARMUP_MAX_RUNS):
            sess.run(None, dict(feeds))
            n += 1


def p90(xs: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(xs), 90))


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / (1 << 20)


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
        sess = session(
            m, threads, providers, profile_prefix=str(Path(tmp) / "p"), disabled_optimizers=["NchwcTransformer"]
        )
        with onnxruntime_errors(g.path.name, stage="run", feeds=feeds):
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


def run_overhead_ms(*, threads: int, providers: Sequence[str], runs: int, warmup: int) -> float:
    """The fixed cost of one ``run()`` call (bind a feed, return an output): an Identity on 1 float."""
    vi = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    vo = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "splitrt_overhead", [vi], [vo])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    # IR 7 is opset 13's; make_model's default is the onnx package's newest IR, which an older onnxruntime
    # (the newest for Python 3.10 is 1.23: IR <= 11) refuses to load
    model.ir_version = 7
    sess = session(model, threads, providers)
    feeds = {"x": np.zeros(1, np.float32)}
    warm(sess, feeds, max(warmup, 5))
    return float(np.median(time_runs(sess, feeds, max(runs, 50))))
