"""The memory watch picks its victim: over the RSS limit, the newest run whose sizes no shape tells (a
``suspect``) is terminated, not the newest run, and its message gives the peak sampled while it ran.
Real onnxruntime sessions (a Loop that runs until terminated); the process's RSS is the watch's ``rss``
seam, set here above and below the limit."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from splitrt.cloud.capacity.cancel import MAX_PERIOD_S, Canceller, sample_wait_s
from splitrt.cloud.common import RpcFailure
from tests.hostilemodels import loop_model


def test_over_the_limit_the_suspect_run_goes_first_and_says_its_peak() -> None:
    session = ort.InferenceSession(loop_model().SerializeToString(), providers=["CPUExecutionProvider"])
    level = [0]
    # The memory is the grower's: once a run has been terminated and left, it is freed (before, the seam stayed
    # high until the test lowered it, and the watch rightly took the bystander next, 1 run in ~3 under load).
    canceller = Canceller(
        rss_limit_bytes=1000, rss=lambda: level[0] if canceller.terminated == 0 else 0, period_s=0.005
    )
    results: dict[str, BaseException | None] = {}

    def run(name: str, suspect: bool, deadline_s: float) -> None:
        try:
            canceller.run(
                session,
                ["y"],
                {"x": np.zeros(1, np.float32)},
                what=name,
                deadline=time.monotonic() + deadline_s,
                suspect=suspect,
            )
            results[name] = None
        except RpcFailure as exc:
            results[name] = exc

    grower = threading.Thread(target=run, args=("grower", True, 60.0))
    grower.start()
    end = time.monotonic() + 30
    while canceller.running() < 1:
        assert time.monotonic() < end
        time.sleep(0.01)
    bystander = threading.Thread(target=run, args=("bystander", False, 3.0))  # the newest run
    bystander.start()
    while canceller.running() < 2:
        assert time.monotonic() < end
        time.sleep(0.01)
    level[0] = 5 * 2**20  # over the limit: one run must go
    grower.join(30)
    level[0] = 0
    bystander.join(30)
    got = results["grower"]
    assert isinstance(got, RpcFailure) and got.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "(peak 5 MB while it ran)" in got.message, got.message
    other = results["bystander"]  # not terminated for memory: it ran on to its own deadline
    assert isinstance(other, RpcFailure) and other.code == grpc.StatusCode.DEADLINE_EXCEEDED, other


def test_the_watch_outlives_an_rss_it_cannot_read() -> None:
    """With no file descriptor left (a connection flood at the process's limit), reading the RSS fails
    (EMFILE): the watch skips that sample and still ends later runs at their deadline (before, the
    exception ended its thread, and no deadline, run limit or memory check held again)."""
    import errno

    session = ort.InferenceSession(loop_model().SerializeToString(), providers=["CPUExecutionProvider"])
    fail = [True]

    def rss() -> int:
        if fail[0]:
            raise OSError(errno.EMFILE, "Too many open files")
        return 0

    canceller = Canceller(rss_limit_bytes=1 << 30, rss=rss, period_s=0.005)
    for _ in range(2):  # the first run meets the unreadable RSS; the second runs after it
        ended: list[BaseException] = []

        def run(into: list[BaseException]) -> None:
            try:
                feeds = {"x": np.zeros(1, np.float32)}
                canceller.run(session, ["y"], feeds, what="loop", deadline=time.monotonic() + 0.5)
            except RpcFailure as exc:
                into.append(exc)

        t = threading.Thread(target=run, args=(ended,), daemon=True)
        t.start()
        t.join(30)  # a guard against hanging, not a timing: the deadline is 0.5 s
        if t.is_alive():  # the watch is gone: end the Loop here, and fail
            canceller.cancel_all(grpc.StatusCode.UNAVAILABLE, "the test gave up")
            t.join(30)
        assert ended and isinstance(ended[0], RpcFailure) and ended[0].code == grpc.StatusCode.DEADLINE_EXCEEDED, ended
        fail[0] = False


def test_far_below_the_limit_the_rss_is_sampled_as_late_as_its_growth_allows() -> None:
    """Growing at most ``growth`` per period, the RSS cannot pass the budget (limit + growth) before the
    next sample; at the limit, with no growth given or after an unreadable sample, every period."""
    mb, period = 2**20, 0.01
    limit, growth = 1728 * mb, 64 * mb
    assert sample_wait_s(limit, limit, growth, period) == period
    assert sample_wait_s(limit + mb, limit, growth, period) == period
    assert sample_wait_s(100 * mb, limit, None, period) == period
    assert sample_wait_s(200 * mb, limit, growth, period) == MAX_PERIOD_S
    for rss_mb in (1000, 1500, 1700, 1720):
        wait = sample_wait_s(rss_mb * mb, limit, growth, period)
        assert period <= wait <= MAX_PERIOD_S
        assert rss_mb * mb + growth * wait / period <= limit + growth + 1, rss_mb
    assert sample_wait_s(1500 * mb, limit, growth, period) > sample_wait_s(1700 * mb, limit, growth, period)


def test_sampled_less_often_the_watch_still_ends_a_run_over_the_limit() -> None:
    session = ort.InferenceSession(loop_model().SerializeToString(), providers=["CPUExecutionProvider"])
    level = [100]
    canceller = Canceller(rss_limit_bytes=10_000, rss=lambda: level[0], period_s=0.001, growth_bytes=100)
    got: list[BaseException] = []

    def run() -> None:
        try:
            canceller.run(session, ["y"], {"x": np.zeros(1, np.float32)}, what="loop", deadline=time.monotonic() + 60)
        except RpcFailure as exc:
            got.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    end = time.monotonic() + 30
    while canceller.every_s < MAX_PERIOD_S:  # far below the limit: sampled as rarely as allowed
        assert time.monotonic() < end and t.is_alive()
        time.sleep(0.01)
    level[0] = 20_000
    t.join(30)
    if t.is_alive():
        canceller.cancel_all(grpc.StatusCode.UNAVAILABLE, "the test gave up")
        t.join(30)
    assert got and isinstance(got[0], RpcFailure) and got[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED, got
    assert canceller.every_s == 0.001  # over the limit: back to every period


def test_the_cpu_figure_outlives_a_process_out_of_descriptors() -> None:
    """Out of file descriptors, psutil cannot read /proc/stat: the load report keeps its last figure
    instead of failing the reply that carries it (every legit Infer answered UNKNOWN beside 1100 idle
    connections at a limit of 1024)."""

    from splitrt.cloud.capacity.admission import CpuMeter

    meter = CpuMeter(period_s=0.0)
    first = meter.percent()
    with _no_descriptor_left():
        assert meter.percent() >= 0.0 and isinstance(first, float)


def test_the_rss_is_read_without_a_new_descriptor() -> None:
    """The watch's RSS comes through a descriptor kept open: it is read at the file limit too, and agrees
    with psutil's figure."""

    import psutil

    from splitrt.cloud.capacity.memory import rss_bytes

    assert abs(rss_bytes() - psutil.Process().memory_info().rss) < 8 * 2**20
    with _no_descriptor_left():
        before = rss_bytes()
        grown = np.ones(64 * 2**20 // 8)  # 64 MiB touched: the figure is read afresh, not cached
        assert rss_bytes() - before > 32 * 2**20 and grown.sum() == grown.size
        with pytest.raises(OSError):
            psutil.Process().memory_info()  # what the watch read before: a new descriptor each time


@contextlib.contextmanager
def _no_descriptor_left() -> Iterator[None]:
    """Inside: the process's file-descriptor limit is reached (every descriptor left is taken)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with pytest.raises(OSError):
            while True:  # take every descriptor left
                held.append(open(os.devnull))  # noqa: SIM115
        yield
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
