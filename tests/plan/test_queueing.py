"""The cloud's queue as a plan term (pure): the M/M/c wait given the reported state, the estimator's
smoothing, fading and refusals, and the term in the solver (a queueing cloud moves the plan to the
device)."""

from __future__ import annotations

import math

import pytest

from splitrt.errors import PlanError
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.queueing import QueueConfig, QueueEstimator, expected_wait_ms
from splitrt.plan.solver import evaluate, solve


@pytest.mark.parametrize(
    "depth,workers,service,want",
    [
        (0, 1, 10.0, 0.0),
        (1, 2, 10.0, 0.0),  # a free slot: no wait
        (1, 1, 10.0, 10.0),
        (3, 1, 10.0, 30.0),  # one worker: everyone ahead, one service each
        (2, 2, 10.0, 5.0),
        (5, 2, 8.0, 16.0),  # c workers: a departure every service / c
    ],
)
def test_expected_wait_is_mmc_given_the_state(depth: int, workers: int, service: float, want: float) -> None:
    assert math.isclose(expected_wait_ms(queue_depth=depth, workers=workers, service_ms=service), want)


@pytest.mark.parametrize(
    "kw",
    [
        {"queue_depth": 1, "workers": 0, "service_ms": 1.0},
        {"queue_depth": -1, "workers": 1, "service_ms": 1.0},
        {"queue_depth": 1, "workers": 1, "service_ms": math.nan},
    ],
)
def test_expected_wait_refuses_nonsense(kw: dict[str, float]) -> None:
    with pytest.raises(PlanError, match="expected workers >= 1"):
        expected_wait_ms(**kw)  # type: ignore[arg-type]


def test_estimator_smooths_and_fades() -> None:
    q = QueueEstimator(QueueConfig(alpha=0.5, half_life_s=2.0))
    assert q.estimate(0.0) == 0.0
    assert q.add_load(0.0, queue_depth=4, workers=1, service_ms=10.0) == 40.0
    assert q.estimate(0.0) == 40.0  # the first sample is taken as is
    q.add_wait(0.0, 20.0)
    assert q.estimate(0.0) == 30.0
    assert math.isclose(q.estimate(2.0), 15.0) and math.isclose(q.estimate(4.0), 7.5)  # drains unobserved
    # A report without a service time keeps the last one known; an older server (no workers) is ignored.
    assert q.add_load(4.0, queue_depth=2, workers=1, service_ms=0.0) == 20.0
    assert q.add_load(4.0, queue_depth=9, workers=0, service_ms=5.0) == 0.0


def test_a_refusal_keeps_the_server_out_until_its_hint_and_prices_the_wait() -> None:
    q = QueueEstimator(QueueConfig(default_retry_after_ms=100.0))
    q.add_refusal(10.0, retry_after_ms=250.0)
    assert q.refused(10.0) and q.refused(10.249) and not q.refused(10.25)
    assert q.estimate(10.0) == 250.0 and q.refusals == 1
    q.add_refusal(20.0, retry_after_ms=None)  # no hint: the default
    assert q.refused(20.05) and not q.refused(20.1)


def _table() -> CostTable:
    # A slow device (head 40 ms for the whole model), a fast cloud.
    return CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0.0, 10.0, 40.0],
        tail_ms=[4.0, 3.0, 0.0],
        bytes=[4000, 2000, 0],
        reply_bytes=40,
        codecs={"fp32": 1.0},
    )


def test_the_queue_term_is_its_own_and_moves_the_plan_to_the_device() -> None:
    link = Link(bandwidth_mbps=100.0, rtt_ms=2.0)
    idle, busy = Conditions(link=link), Conditions(link=link, queue_ms=50.0)
    assert solve(_table(), idle).cut == "cloud"
    assert solve(_table(), busy).cut == "device"
    for cut in ("cloud", "c1", "device"):
        p0, p1 = evaluate(_table(), (cut, "fp32"), idle), evaluate(_table(), (cut, "fp32"), busy)
        assert p1.queue_ms == (0.0 if cut == "device" else 50.0)
        assert math.isclose(p1.predicted_ms - p0.predicted_ms, p1.queue_ms)
    with pytest.raises(PlanError, match="queue_ms"):
        Conditions(link=link, queue_ms=-1.0)
