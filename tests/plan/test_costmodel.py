"""Cost model: the formulas on hand-computed examples, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from splitrt.errors import PlanError
from splitrt.plan.costmodel import Conditions, CostTable, CutCost, Link, Power


def table() -> CostTable:
    return CostTable.from_cuts(
        [
            CutCost(cut="cloud", head_ms=5.0, tail_ms=40.0, bytes=1_000_000),  # head forced to 0
            CutCost(cut="c1", head_ms=10.0, tail_ms=30.0, bytes=500_000, float_bytes=400_000),
            CutCost(cut="device", head_ms=50.0, tail_ms=7.0, bytes=4000),  # tail, bytes forced to 0
        ],
        reply_bytes=4000,
    )


COND = Conditions(link=Link(bandwidth_mbps=8.0, rtt_ms=20.0), device_load=2.0, cloud_load=1.5)
POWER = Power(idle_w=2.0, active_w=5.0, radio_w=1.0)


def test_latency_components_by_hand() -> None:
    t = table()
    e = t.estimate("c1", "fp32", COND, POWER)
    # 8 Mbit/s = 1 byte per µs = 1000 bytes per ms
    assert e.device_ms == pytest.approx(20.0)
    assert e.transfer_ms == pytest.approx(500.0)  # the upload
    assert e.download_ms == pytest.approx(4.0) and e.reply_bytes == 4000  # the reply
    assert e.cloud_ms == pytest.approx(45.0)
    assert e.latency_ms == pytest.approx(20 + 504 + 20 + 45)
    # active while computing, idle + radio while sending (radio_w is the increment), idle while waiting
    assert e.energy_mj == pytest.approx(5 * 20 + (2 + 1) * 500 + 2 * (20 + 45 + 4))
    assert e.period_ms == pytest.approx(504.0)
    assert t.latency_ms(COND)[1, 0] == pytest.approx(e.latency_ms)
    assert t.energy_mj(COND, POWER)[1, 0] == pytest.approx(e.energy_mj)
    assert t.period_ms(COND)[1, 0] == pytest.approx(e.period_ms)


def test_codec_shrinks_only_float_part() -> None:
    t = table()
    assert t.estimate("c1", "fp16", COND).sent_bytes == 200_000 + 100_000
    assert t.estimate("c1", "int8", COND).sent_bytes == 100_000 + 100_000
    assert t.estimate("c1", "int8", COND).bytes == 500_000


def test_device_and_cloud_cuts_are_special() -> None:
    t = table()
    dev = t.estimate("device", "fp32", COND, POWER)
    assert (dev.transfer_ms, dev.rtt_ms, dev.cloud_ms, dev.sent_bytes) == (0.0, 0.0, 0.0, 0)
    assert dev.latency_ms == pytest.approx(100.0)
    assert dev.energy_mj == pytest.approx(500.0)
    cloud = t.estimate("cloud", "fp32", COND, POWER)
    assert cloud.device_ms == 0.0
    assert cloud.rtt_ms == 20.0
    assert cloud.latency_ms == pytest.approx(1000 + 4 + 20 + 60)


def test_matrices_match_estimates_everywhere() -> None:
    t = table()
    lat, en, per = t.latency_ms(COND), t.energy_mj(COND, POWER), t.period_ms(COND)
    for i, cut in enumerate(t.ids):
        for k, codec in enumerate(t.codecs):
            e = t.estimate(cut, codec, COND, POWER)
            assert lat[i, k] == e.latency_ms
            assert math.isclose(en[i, k], e.energy_mj, rel_tol=1e-12)
            assert per[i, k] == e.period_ms


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bandwidth_mbps": 0.0, "rtt_ms": 1.0},
        {"bandwidth_mbps": math.inf, "rtt_ms": 1.0},
        {"bandwidth_mbps": 1.0, "rtt_ms": -1.0},
    ],
)
def test_bad_link_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(PlanError, match="got"):
        Link(**kwargs)


def test_bad_tables_are_refused() -> None:
    link = Link(bandwidth_mbps=1, rtt_ms=1)
    with pytest.raises(PlanError, match="> 0"):
        Conditions(link=link, device_load=0.0)
    assert Conditions(link=link, device_load=0.5).device_load == 0.5  # faster than profiled
    with pytest.raises(PlanError, match="expected 2 values"):
        CostTable(ids=["a", "b"], head_ms=[1, 2], tail_ms=[1], bytes=[1, 2])
    with pytest.raises(PlanError, match="unique"):
        CostTable(ids=["a", "a"], head_ms=[1, 2], tail_ms=[1, 2], bytes=[1, 2])
    with pytest.raises(PlanError, match="finite"):
        CostTable(ids=["a"], head_ms=[np.nan], tail_ms=[1], bytes=[1])
    with pytest.raises(PlanError, match="unknown cut 'zz'"):
        table().index("zz")
    with pytest.raises(PlanError, match="unknown codec 'zip'"):
        table().codec_index("zip")


def test_reply_is_priced_per_cut_and_a_single_number_still_loads() -> None:
    """A late cut of a multi-output model replies less (the head made some outputs); a table from before
    the reply was per cut (one number) applies it to every cut but ``device``."""
    per_cut = CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0, 10, 20],
        tail_ms=[20, 10, 0],
        bytes=[100, 50, 0],
        reply_bytes=[4000, 1000, 0],
        codecs={"fp32": 1.0},
    )
    cond = Conditions(link=Link(bandwidth_mbps=8.0, rtt_ms=0.0))
    assert [per_cut.estimate(c, "fp32", cond).download_ms for c in per_cut.ids] == pytest.approx([4.0, 1.0, 0.0])
    old = CostTable.from_dict(per_cut.to_dict() | {"reply_bytes": 4000})
    assert old.reply_bytes.tolist() == [4000, 4000, 0]
    assert CostTable.from_dict(per_cut.to_dict()).reply_bytes.tolist() == [4000, 1000, 0]
    with pytest.raises(PlanError, match="reply_bytes: expected 3 values"):
        CostTable(
            ids=["cloud", "c1", "device"], head_ms=[0, 1, 2], tail_ms=[2, 1, 0], bytes=[1, 1, 0], reply_bytes=[1, 2]
        )


def test_a_codec_priced_per_cut_sends_its_own_ratio_at_each_cut_and_old_tables_still_load() -> None:
    """A compressed codec's size depends on the values: its ratio is one per cut (measured when the model
    was profiled), while fixed-ratio codecs keep one number; a table saved before still loads."""
    t = CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0, 10, 20],
        tail_ms=[20, 10, 0],
        bytes=[1000, 1000, 0],
        codecs={"fp32": 1.0, "int8": 0.25, "int8+zstd": [0.22, 0.12, 1.0]},
    )
    assert t.sent_bytes[:, t.codec_index("int8+zstd")].tolist() == [220, 120, 0]
    assert t.sent_bytes[:, t.codec_index("int8")].tolist() == [250, 250, 0]
    assert t.per_cut_codecs() == ("int8+zstd",)
    cond = Conditions(link=Link(bandwidth_mbps=1.0, rtt_ms=0.0))
    assert t.estimate("c1", "int8+zstd", cond).transfer_ms == pytest.approx(0.96)
    again = CostTable.from_dict(t.to_dict())
    np.testing.assert_array_equal(again.sent_bytes, t.sent_bytes)
    assert again.codec_map() == t.codec_map()
    old = CostTable.from_dict(t.to_dict() | {"codecs": {"fp32": 1.0, "int8": 0.25}})
    assert old.codecs == ("fp32", "int8") and old.per_cut_codecs() == ()
    with pytest.raises(PlanError, match=r"codec 'int8\+zstd': expected one ratio or 3 \(one per cut\), got 2"):
        CostTable(ids=t.ids, head_ms=[0, 1, 2], tail_ms=[2, 1, 0], bytes=[1, 1, 0], codecs={"int8+zstd": [0.2, 0.1]})
    with pytest.raises(PlanError, match=r"ratio must be in \(0, 1\], got 1.5"):
        CostTable(ids=t.ids, head_ms=[0, 1, 2], tail_ms=[2, 1, 0], bytes=[1, 1, 0], codecs={"int8": 1.5})


def test_a_ratio_cap_at_one_cut_prices_only_that_cut_lower() -> None:
    t = CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0, 10, 20],
        tail_ms=[20, 10, 0],
        bytes=[1000, 1000, 0],
        codecs={"fp32": 1.0, "int8+zstd": [0.22, 0.12, 1.0]},
    )
    capped = t.with_ratio_cap("cloud", 0.03)
    assert capped.sent_bytes[0].tolist() == [30, 30] and capped.sent_bytes[1].tolist() == t.sent_bytes[1].tolist()
    assert capped.codecs == t.codecs
