"""Every term of a plan's predicted latency is its own field, and they add up to it, for every cut and
codec of a measured table, in the solver's Plan, the CLI's JSON and the controller's decisions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from splitrt.cli import app as cli
from splitrt.plan.controller import Controller
from splitrt.plan.costmodel import Conditions, CostTable, Link
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.solver import evaluate

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]


def _table() -> CostTable:
    return CostTable.from_dict(json.loads((DATA / "decisions_resnet50.table.json").read_text()))


@pytest.mark.parametrize(
    "bw,rtt,dl,cl,q",
    [
        (1.0, 80.0, 1.0, 1.0, 0.0),
        (20.0, 20.0, 2.5, 1.0, 0.0),
        (300.0, 2.0, 1.0, 3.0, 0.0),
        (20.0, 20.0, 1.0, 1.0, 35.0),
    ],
)
def test_plan_terms_add_up_for_every_cut_and_codec(bw: float, rtt: float, dl: float, cl: float, q: float) -> None:
    table = _table()
    cond = Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=rtt), device_load=dl, cloud_load=cl, queue_ms=q)
    for cut in table.ids:
        for codec in table.codecs:
            p = evaluate(table, (cut, codec), cond)
            assert math.isclose(
                p.device_ms + p.transfer_ms + p.download_ms + p.rtt_ms + p.queue_ms + p.cloud_ms,
                p.predicted_ms,
                rel_tol=1e-12,
                abs_tol=1e-9,
            ), (cut, codec)
            # each transfer term prices its own bytes: the upload after the codec, the reply of this cut
            assert math.isclose(p.transfer_ms, p.sent_bytes * 8e-3 / bw, rel_tol=1e-12, abs_tol=1e-12)
            assert math.isclose(p.download_ms, p.reply_bytes * 8e-3 / bw, rel_tol=1e-12, abs_tol=1e-12)
            assert (p.reply_bytes == 0) == (cut == "device")
            assert (p.rtt_ms == 0.0) == (cut == "device")
            assert p.queue_ms == (0.0 if cut == "device" else q)


def test_decision_terms_add_up() -> None:
    ctl = Controller(_table())
    for t, (bw, q) in enumerate([(50.0, 0.0), (2.0, 0.0), (400.0, 0.0), (400.0, 20.0), (50.0, 500.0)]):
        d = ctl.decide(
            float(t),
            LinkEstimate(bandwidth_mbps=bw, rtt_ms=30.0, confidence=1.0),
            LoadEstimate(device_factor=1.0, cloud_factor=1.0, queue_ms=q),
        )
        assert math.isclose(
            d.device_ms + d.transfer_ms + d.download_ms + d.round_trip_ms + d.queue_ms + d.cloud_ms,
            d.predicted_ms,
            rel_tol=1e-12,
            abs_tol=1e-9,
        )
        assert (d.reply_bytes > 0) == (d.plan != "device")
        assert d.cloud_queue_ms == q and d.queue_ms == (0.0 if d.plan == "device" else q)


def test_plan_json_terms_add_up(capsys: pytest.CaptureFixture[str]) -> None:
    prof = str(REPO / "profiles" / "x86_64-2core__squeezenet.json")
    assert (
        cli.main(
            [
                "plan",
                "zoo:squeezenet",
                "--device",
                prof,
                "--cloud",
                prof,
                "--bandwidth-mbps",
                "8",
                "--rtt-ms",
                "40",
                "--board",
                "rpi4",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for row in [*out["cuts"], out["best"]]:
        total = row.get("total_ms", row.get("predicted_ms"))
        terms = (
            row["device_ms"]
            + row["transfer_ms"]
            + row["download_ms"]
            + row["rtt_ms"]
            + row.get("queue_ms", 0.0)
            + row["cloud_ms"]
            + row.get("encode_ms", 0.0)
            + row.get("call_ms", 0.0)
            + row.get("decode_ms", 0.0)
        )
        assert abs(terms - total) < 1e-3, row


def _priced() -> CostTable:
    """The resnet50 table with the device's encode and call and the cloud's decode priced."""
    t = _table()
    n, k = len(t.ids), len(t.codecs)
    grid = [[0.5 + 0.01 * i + 0.3 * j for j in range(k)] for i in range(n)]
    return CostTable(
        ids=t.ids,
        head_ms=t.head_ms,
        tail_ms=t.tail_ms,
        bytes=t.bytes.astype("int64"),
        float_bytes=t.float_bytes.astype("int64"),
        reply_bytes=t.reply_bytes,
        codecs=t.codec_map(),
        encode_ms={c: [row[j] for row in grid] for j, c in enumerate(t.codecs)},
        decode_ms={c: [0.5 * row[j] for row in grid] for j, c in enumerate(t.codecs)},
        call_ms=2.0,
    )


@pytest.mark.parametrize("dl,cl", [(1.0, 1.0), (3.0, 1.0), (1.0, 2.0)])
def test_encode_call_and_decode_are_terms_of_their_own_scaled_by_each_side_load(dl: float, cl: float) -> None:
    table = _priced()
    cond = Conditions(link=Link(bandwidth_mbps=20.0, rtt_ms=20.0), device_load=dl, cloud_load=cl)
    lat = table.latency_ms(cond)
    for i, cut in enumerate(table.ids):
        for k, codec in enumerate(table.codecs):
            p = evaluate(table, (cut, codec), cond)
            terms = p.device_ms + p.transfer_ms + p.download_ms + p.rtt_ms + p.queue_ms + p.cloud_ms
            assert math.isclose(terms + p.encode_ms + p.call_ms + p.decode_ms, p.predicted_ms, rel_tol=1e-12)
            assert math.isclose(p.predicted_ms, lat[i, k], rel_tol=1e-12)
            sends = cut != "device"
            assert p.encode_ms == pytest.approx(float(table.encode_ms[i, k]) * dl if sends else 0.0)
            assert p.call_ms == pytest.approx(2.0 * dl if sends else 0.0)
            assert p.decode_ms == pytest.approx(float(table.decode_ms[i, k]) * cl if sends else 0.0)
    # logged and read back, a table keeps its prices
    again = CostTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert np.array_equal(again.latency_ms(cond), lat)


def test_the_path_solver_prices_encode_call_and_decode_as_the_two_tier_one() -> None:
    from splitrt.plan.path import PathConditions, evaluate_path, solve_path
    from splitrt.plan.solver import solve

    table = _priced()
    for bw in (0.5, 5.0, 50.0, 500.0):
        cond = Conditions(link=Link(bandwidth_mbps=bw, rtt_ms=20.0), device_load=2.0)
        two = solve(table, cond, codecs=list(table.codecs))
        pc = PathConditions(hops=(cond.link,), loads=(2.0, 1.0))
        path = solve_path([table, table], pc)
        assert path.key == two.key and math.isclose(path.predicted_ms, two.predicted_ms, rel_tol=1e-12)
        for objective in ("energy", "throughput"):
            a = evaluate(table, two.key, cond, objective=objective)
            b = evaluate_path([table, table], two.key, pc, objective=objective)
            assert math.isclose(a.value, b.value, rel_tol=1e-12), (objective, a.value, b.value)
