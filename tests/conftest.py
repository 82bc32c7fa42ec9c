"""Shared fixtures: zoo models (built once per run), onnxruntime helpers, the root marker."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import settings

from splitrt.graph import partition, zoo

IS_ROOT = os.geteuid() == 0

# Hypothesis's per-example deadline is a timed assert: on a shared 2-core host it fails on load, not on
# a bug (seen: test_netmon at load 13). Properties are checked without it; speed lives in bench/.
settings.register_profile("splitrt", deadline=None)
settings.load_profile("splitrt")

# Models the tests build with onnx.helper take the onnx package's newest IR version by default, which
# Python 3.10's newest onnxruntime (1.23, IR <= 11) refuses to load. Tests build at IR 10 (opsets <= 21)
# unless they say otherwise, so the suite runs on every supported Python.
_make_model = onnx.helper.make_model


def _make_model_readable(graph: onnx.GraphProto, **kwargs: object) -> onnx.ModelProto:
    m = _make_model(graph, **kwargs)
    if "ir_version" not in kwargs:
        m.ir_version = min(m.ir_version, 10)
    return m


onnx.helper.make_model = _make_model_readable  # type: ignore[assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces, tc qdiscs, cgroups); CI runs as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _zoo_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep test runs away from the user's ~/.cache unless they asked for a cache dir.
    if "SPLITRT_CACHE" not in os.environ:
        os.environ["SPLITRT_CACHE"] = str(tmp_path_factory.mktemp("splitrt-cache"))


@pytest.fixture(scope="session")
def zoo_path(_zoo_cache: None):  # type: ignore[no-untyped-def]
    def get(name: str) -> Path:
        return zoo.get(name)

    return get


def session(model: onnx.ModelProto | str | Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a-b| / max |a|: relative to the output's scale, robust to near-zero elements."""
    scale = float(np.max(np.abs(a))) or 1.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale


def run_segments(segments: Sequence[object], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run segments one after another, passing every produced tensor along by name."""
    env = dict(feeds)
    for seg in segments:
        if not seg.outputs:  # type: ignore[attr-defined]
            continue  # e.g. the tail of ``device``: nothing left to compute, nothing to load
        s = session(seg.model)  # type: ignore[attr-defined]
        feeds_ = {k: env[k] for k in seg.inputs}  # type: ignore[attr-defined]
        outs = partition.pass_through(seg.outputs, feeds_, s.run(list(seg.outputs), feeds_))  # type: ignore[attr-defined]
        env.update(zip(seg.outputs, outs, strict=True))  # type: ignore[attr-defined]
    return env
