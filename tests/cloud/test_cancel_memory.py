"""The memory watch picks its victim: over the RSS limit, the newest run whose sizes no shape tells (a
``suspect``) is terminated, not the newest run, and its message gives the peak sampled while it ran.
Real onnxruntime sessions (a Loop that runs until terminated); the process's RSS is the watch's ``rss``
seam, set here above and below the limit."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import onnxruntime as ort

from splitrt.cloud.capacity.cancel import Canceller
from splitrt.cloud.common import RpcFailure
from tests.cloud.test_hostile import loop_model


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
