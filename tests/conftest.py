"""Shared fixtures: zoo models (built once per run), onnxruntime helpers, the root marker."""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


# xdist workers share one zoo cache (below): a model two workers want at once is built by one while the
# other waits on its lock (vgg16 is half a gigabyte of seeded weights: built twice, it was minutes at load).
_zoo_get = zoo.get


def _zoo_get_locked(name: str, out_path: str | Path | None = None) -> Path:
    if out_path is not None or name not in zoo.names():
        return _zoo_get(name, out_path)  # no cache to share (or the error an unknown name gets)
    cache = zoo.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _zoo_get(name)


zoo.get = _zoo_get_locked


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces, tc qdiscs, cgroups); CI runs as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


# How long a test's threads get to finish after it (joins in teardowns that return before the thread
# has quite ended, gRPC's executor shutting down): a thread still running after this is a leak.
THREAD_GRACE_S = 5.0


# Every ThreadPoolExecutor made in this process (a pool grows its workers on demand: see _pool_of).
_POOLS: weakref.WeakSet[ThreadPoolExecutor] = weakref.WeakSet()
_pool_init = ThreadPoolExecutor.__init__


def _tracked_pool_init(self: ThreadPoolExecutor, *args: Any, **kwargs: Any) -> None:
    _pool_init(self, *args, **kwargs)
    _POOLS.add(self)


ThreadPoolExecutor.__init__ = _tracked_pool_init  # type: ignore[method-assign]


def _pool_of(t: threading.Thread) -> object | None:
    """The ``ThreadPoolExecutor`` a worker thread serves (None for other threads). A pool grows on
    demand: a new worker of a pool made before a test belongs to the pool's owner (a module or session
    fixture's server), not to the test that happened to submit the work that grew it."""
    args = getattr(t, "_args", ())
    if args and isinstance(args[0], weakref.ref):  # concurrent.futures.thread._worker(executor_ref, ...)
        return args[0]()
    return None


def _checker_thread() -> threading.Thread | None:
    """The upload checker's executor manager thread, if its child runs. The child is process-wide and
    idles for minutes by design, like a server's: the tests share it (starting a fresh interpreter per
    upload test was a third of the upload tests' time) and the session stops it at the end."""
    upload = sys.modules.get("splitrt.cloud.models.upload")
    pool = upload.CHECKER._pool if upload is not None else None
    return getattr(pool, "_executor_manager_thread", None)


@pytest.fixture(scope="session", autouse=True)
def _checker_warm() -> None:
    # Start the child in the background now, as a server that accepts uploads does at start: the first
    # upload test need not wait for a fresh interpreter's imports (20 s at load 19, past its deadline).
    from splitrt.cloud.models.upload import CHECKER

    # Idle for the session, not 5 minutes: upload modules minutes apart would each wait for a new child.
    CHECKER.idle_s = 24 * 3600.0
    CHECKER.warm()


@pytest.fixture(scope="session")
def checker_child(_checker_warm: None) -> None:
    """The upload checker's child, answering: for modules whose uploads have a deadline
    (``pytestmark = pytest.mark.usefixtures("checker_child")``)."""
    from splitrt.cloud.models.children import noop
    from splitrt.cloud.models.upload import CHECKER

    CHECKER.run(noop)


def pytest_sessionfinish(session: pytest.Session) -> None:
    upload = sys.modules.get("splitrt.cloud.models.upload")
    if upload is not None:
        upload.CHECKER.stop()


@pytest.fixture(autouse=True)
def _no_leaked_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves non-daemon threads running (they keep the interpreter alive at exit and
    leak into later tests). Set up after the wider-scoped fixtures a test uses, so their threads do
    not count; daemon threads do not either."""
    before = set(threading.enumerate())
    pools = {id(p) for p in _POOLS}  # ids: holding the pools would keep them (and their workers) alive
    yield

    def leaked() -> list[threading.Thread]:
        shared = _checker_thread()
        return [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon and id(_pool_of(t)) not in pools and t is not shared
        ]

    end = time.monotonic() + THREAD_GRACE_S
    for t in leaked():
        t.join(timeout=max(0.0, end - time.monotonic()))
    left = leaked()
    if left:
        names = ", ".join(sorted(f"{t.name} ({getattr(t, '_target', None)})" for t in left))
        pytest.fail(f"{request.node.nodeid} left {len(left)} non-daemon thread(s) running: {names}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _zoo_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep test runs away from the user's ~/.cache unless they asked for a cache dir.
    # Under xdist the workers share one (the parent of their base temp dirs): zoo.get writes
    # atomically, so a model is built once per run rather than once per worker.
    if "SPLITRT_CACHE" not in os.environ:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            shared = tmp_path_factory.getbasetemp().parent / "splitrt-cache"
            shared.mkdir(exist_ok=True)
            os.environ["SPLITRT_CACHE"] = str(shared)
        else:
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


@pytest.fixture(scope="session")
def dead_address() -> Iterator[str]:
    """An address whose connects are refused: bound but never listening, and held for the session, so no
    parallel test's server can take the port (a freed port can be reused at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"
