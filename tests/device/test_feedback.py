"""device.runtime.feedback: what one request's reply becomes (pure values, no server)."""

from __future__ import annotations

import numpy as np
import pytest

from splitrt.device.client.messages import HeadResult, SplitResult
from splitrt.device.runtime import feedback
from splitrt.plan.costmodel import CostTable

TABLE = CostTable(
    ids=["cloud", "device"], head_ms=[0.0, 100.0], tail_ms=[20.0, 0.0], bytes=[50_000, 0], codecs={"fp32": 1.0}
)


def test_a_replys_wait_behind_our_own_probe_reaches_the_link_sample() -> None:
    head = HeadResult(cut_id="cloud", crossing={}, head_ms=0.0)
    res = SplitResult(
        outputs={"y": np.zeros(1)},
        cut_id="cloud",
        codec="fp32",
        where="cloud",
        request_id="r",
        rpc_ms=300.0,
        tail_ms=20.0,
        bytes_up=50_000,
        probe_wait_ms=150.0,
    )
    obs = feedback.observation([TABLE], "cloud", head, res, tier=1)
    (reply,) = obs.replies
    assert reply.reply.net_s == pytest.approx(0.28) and reply.reply.probe_wait_s == pytest.approx(0.15)
