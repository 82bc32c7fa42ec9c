"""rigstats: the rig benchmark's pure arithmetic (ideal transfer times over a trace, the device-burst schedule,
run statistics, device energy, costs measured from request records, and the hindsight oracle).

Cost tables are either tiny hand-built ``CostTable``s (so expected latencies can be worked out by hand) or
the shipped squeezenet profile (a real 67-cut table, no onnxruntime needed)."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.plan.costmodel import CostTable, Power
from splitrt.profile import profiler
from splitrt.rig import models, traces, tracespec
from splitrt.rig import stats as rigstats
from splitrt.rig.protocol import Record
from splitrt.rig.stats import MeasuredCosts

FEW = settings(max_examples=40, deadline=None)


# ------------------------------------------------------------------------------------------- helpers


def exact_transfer_ms(trace: traces.Trace, start_s: float, nbytes: float, min_mbps: float = 0.05) -> float:
    """Independent reference for ``transfer_ms``: walk the looping trace in exact rational arithmetic."""
    d = Fraction(trace.duration_s)
    segs = [(Fraction(a), Fraction(b), Fraction(max(r, min_mbps)) * 10**6) for a, b, r in trace.segments()]
    left = Fraction(nbytes) * 8
    t = Fraction(start_s)
    while True:
        k = math.floor(t / d)
        pos = t - k * d
        _, b, rate = next(s for s in segs if s[0] <= pos < s[1])
        can = rate * (k * d + b - t)
        if can >= left:
            return float((t + left / rate - Fraction(start_s)) * 1000)
        left -= can
        t = k * d + b


@cache
def squeezenet(speed_factor: float = 1.0) -> CostTable:
    """The real cost table of the shipped squeezenet host profile."""
    path = models.shipped_profile("squeezenet")
    assert path is not None, "profiles/*__squeezenet.json is shipped with the repo"
    sha = profiler.load_profile(path).sha256  # the profile's own model; building the zoo model costs ~2 s
    table = models.cost_table_for(path, sha, speed_factor)
    assert isinstance(table, CostTable)
    return table


def all_plans(table: CostTable) -> list[str]:
    plans: list[str] = []
    for cut in table.ids:
        plans += ["device"] if cut == "device" else [f"{cut}@{k}" for k in table.codecs]
    return plans


def sent_bytes(table: CostTable, plan: str) -> float:
    cut, _, codec = plan.partition("@")
    return float(table.sent_bytes[table.index(cut), table.codec_index(codec)]) if codec else 0.0


def costs(
    ratio: float = 1.0, burst: float | None = None, cloud: float = 1.0, net: float = 50.0, local: float = 0.0
) -> MeasuredCosts:
    return MeasuredCosts(
        device_ratio_idle=ratio,
        device_ratio_burst=ratio if burst is None else burst,
        cloud_ratio=cloud,
        net_overhead_ms=net,
        local_overhead_ms=local,
    )


def tiny_table() -> CostTable:
    """cloud / c1 / device; every byte is float32 (fp32 sends all, int8 a quarter); 100 reply bytes."""
    return CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0.0, 10.0, 40.0],
        tail_ms=[40.0, 8.0, 0.0],
        bytes=[1000, 500, 0],
        reply_bytes=100,
        codecs={"fp32": 1.0, "int8": 0.25},
    )


# --------------------------------------------------------------------------------------- transfer_ms


@pytest.mark.parametrize("start_s", [0.0, 17.3, 59.9, 61.0, 1234.5])
def test_transfer_ms_on_a_constant_trace_is_bits_over_rate(start_s: float) -> None:
    trace = traces.constant(8.0)  # 8 Mbit/s = 1000 bytes per ms
    assert rigstats.transfer_ms(trace, start_s, 1000) == pytest.approx(1.0)
    assert rigstats.transfer_ms(trace, start_s, 250_000) == pytest.approx(250.0)


def test_transfer_ms_inside_one_step() -> None:
    trace = tracespec.load_trace("step:30,2/1.5")  # 30 Mbit/s on [0, 1.5), 2 Mbit/s on [1.5, 3), looping
    assert rigstats.transfer_ms(trace, 0.0, 30_000) == pytest.approx(240_000 / 30e6 * 1e3)  # 8 ms
    assert rigstats.transfer_ms(trace, 2.0, 25_000) == pytest.approx(200_000 / 2e6 * 1e3)  # 100 ms
    assert rigstats.transfer_ms(trace, 3.2, 30_000) == pytest.approx(8.0)  # wrapped: 30 Mbit/s again


def test_transfer_ms_crossing_a_step_boundary() -> None:
    trace = tracespec.load_trace("step:30,2/1.5")
    # 0.1 s at 30 Mbit/s carries 3 Mbit, the other 0.2 Mbit take 0.1 s at 2 Mbit/s
    assert rigstats.transfer_ms(trace, 1.4, 400_000) == pytest.approx(200.0)
    # across the loop: 0.1 s at 2 Mbit/s (0.2 Mbit), then 0.3 Mbit at 30 Mbit/s (10 ms)
    assert rigstats.transfer_ms(trace, 2.9, 62_500) == pytest.approx(110.0)
    # several whole periods: each 3 s delivers 45 + 3 Mbit
    assert rigstats.transfer_ms(trace, 0.0, 2 * 48e6 / 8) == pytest.approx(6000.0)


def test_transfer_ms_zero_bytes_and_the_rate_floor() -> None:
    trace = traces.step([0.0, 10.0], 1.0)
    assert rigstats.transfer_ms(trace, 0.3, 0) == 0.0
    assert rigstats.transfer_ms(trace, 0.3, -5) == 0.0
    # a dead link still moves min_mbps (0.05 Mbit/s by default): 8000 bits take 160 ms
    assert rigstats.transfer_ms(trace, 0.0, 1000) == pytest.approx(160.0)
    assert rigstats.transfer_ms(trace, 0.0, 1000, min_mbps=1.0) == pytest.approx(8.0)


step_traces = st.builds(
    traces.step,
    st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=4).filter(lambda ls: max(ls) > 0.5),
    st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 10.0]),
)


@FEW
@given(trace=step_traces, start=st.floats(0.0, 30.0), a=st.floats(0.0, 2e6), b=st.floats(0.0, 2e6))
def test_transfer_ms_is_monotone_in_bytes(trace: traces.Trace, start: float, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    t_lo, t_hi = rigstats.transfer_ms(trace, start, lo), rigstats.transfer_ms(trace, start, hi)
    assert 0.0 <= t_lo <= t_hi
    # never faster than the trace's best rate
    assert t_hi >= hi * 8 / (max(trace.rates_mbps) * 1e6) * 1e3 - 1e-9  # (float: t + x - t)


@FEW
@given(
    levels=st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=4).filter(lambda ls: len(ls) != 3),
    step_s=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    start=st.floats(0.0, 30.0),
    nbytes=st.floats(1.0, 1e6),
)
def test_transfer_ms_matches_an_exact_walk_of_the_trace(
    levels: list[float], step_s: float, start: float, nbytes: float
) -> None:
    # power-of-two periods: the float period arithmetic is exact (the test below covers the others)
    trace = traces.step(levels, step_s)
    assert rigstats.transfer_ms(trace, start, nbytes) == pytest.approx(
        exact_transfer_ms(trace, start, nbytes), rel=1e-9, abs=1e-9
    )


def test_transfer_ms_across_many_wraps_of_a_non_dyadic_period() -> None:
    trace = traces.step([1.0, 100.0], 0.1)  # period 0.2 s (not exact in binary), 10.1 Mbit per period
    # 80 Mbit: 7 periods (70.7 Mbit, 1.4 s) + 0.1 Mbit at 1 Mbit/s (0.1 s) + 9.2 Mbit at 100 Mbit/s (0.092 s)
    assert exact_transfer_ms(trace, 0.0, 10_000_000) == pytest.approx(1592.0)
    assert rigstats.transfer_ms(trace, 0.0, 10_000_000) == pytest.approx(1592.0)  # was 1394.0: a period credited twice


# ------------------------------------------------------------------------------ bursts and intervals


def test_burst_schedule() -> None:
    assert rigstats.burst_intervals("device-burst", 30) == [(10.0, 20.0)]  # short run: the middle third
    assert rigstats.burst_intervals("device-burst", 45) == [(15.0, 30.0)]
    assert rigstats.burst_intervals("device-burst", 60) == [(20.0, 40.0)]
    assert rigstats.burst_intervals("device-burst", 150) == [(20.0, 40.0), (80.0, 100.0), (140.0, 150.0)]
    for other in ("none", "cloud-busy", ""):
        assert rigstats.burst_intervals(other, 150) == []
    assert rigstats.burst_intervals("device-busy", 12) == [(0.0, 12.0)]  # loaded throughout
    assert rigstats.DEVICE_HOGS["device-busy"] > rigstats.DEVICE_HOGS["device-burst"]


@FEW
@given(duration=st.floats(60.0, 2000.0))
def test_burst_schedule_is_20_s_on_every_60_s_from_20_s(duration: float) -> None:
    ivs = rigstats.burst_intervals("device-burst", duration)
    assert ivs
    for k, (a, b) in enumerate(ivs):
        assert a == 20.0 + 60.0 * k
        assert a < b <= duration
        assert b == min(a + 20.0, duration)
    assert ivs[-1][0] + 60.0 >= duration  # nothing left out at the end


def test_in_intervals_is_half_open() -> None:
    ivs = [(20.0, 40.0), (80.0, 100.0)]
    assert rigstats.in_intervals(20.0, ivs)
    assert rigstats.in_intervals(39.999, ivs)
    assert not rigstats.in_intervals(40.0, ivs)
    assert not rigstats.in_intervals(19.999, ivs)
    assert rigstats.in_intervals(80.0, ivs)
    assert not rigstats.in_intervals(100.0, ivs)
    assert not rigstats.in_intervals(50.0, [])


def test_plan_cut() -> None:
    assert rigstats.plan_cut("c12@int8c") == "c12"
    assert rigstats.plan_cut("cloud@fp32") == "cloud"
    assert rigstats.plan_cut("device") == "device"


# ----------------------------------------------------------------------------------------- summarize


def test_summarize_example() -> None:
    s = rigstats.summarize([10.0, 20.0, 30.0, 40.0], ["a", "a", "b", "a"], failed=2, energies=[1.0, 3.0], fallbacks=1)
    assert s["mean_ms"] == pytest.approx(25.0)
    assert s["p50_ms"] == pytest.approx(25.0)
    assert s["p99_ms"] == pytest.approx(39.7)
    assert s["completed"] == 4
    assert s["failed"] == 2
    assert s["fallbacks"] == 1
    assert s["switches"] == 2  # a→b, b→a
    assert s["plans"] == {"a": 3, "b": 1}
    assert list(s["plans"]) == ["a", "b"]
    assert s["energy_mj"] == pytest.approx(2.0)


def test_summarize_empty_run() -> None:
    s = rigstats.summarize([], [], failed=3, energies=[])
    assert math.isnan(s["mean_ms"]) and math.isnan(s["p50_ms"]) and math.isnan(s["p99_ms"])
    assert math.isnan(s["energy_mj"])
    assert (s["completed"], s["failed"], s["switches"], s["fallbacks"], s["plans"]) == (0, 3, 0, 0, {})


@FEW
@given(
    runs=st.lists(
        st.tuples(st.floats(0.0, 1e4), st.sampled_from(["device", "c3@fp16", "cloud@int8"])), min_size=1, max_size=50
    ),
    failed=st.integers(0, 10),
)
def test_summarize_properties(runs: list[tuple[float, str]], failed: int) -> None:
    lat = [ms for ms, _ in runs]
    plans = [p for _, p in runs]
    s = rigstats.summarize(lat, plans, failed, energies=lat)
    assert min(lat) - 1e-9 <= s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= max(lat) + 1e-9
    assert min(lat) - 1e-9 <= s["mean_ms"] <= max(lat) + 1e-9
    assert s["completed"] == len(lat)
    assert s["failed"] == failed
    assert sum(s["plans"].values()) == len(plans)
    assert set(s["plans"]) == set(plans)
    changes = [i for i in range(1, len(plans)) if plans[i] != plans[i - 1]]
    assert s["switches"] == len(changes)
    assert (s["switches"] == 0) == (len(set(plans)) == 1)


# ------------------------------------------------------------------------------------------- energy


def test_energy_of_a_local_and_a_cloud_request() -> None:
    power = Power(idle_w=2.0, active_w=5.0, radio_w=1.0)
    link = traces.constant(8.0)  # 1000 bytes per ms
    local = Record(i=0, t_s=3.0, plan="device", where="local", head_ms=10.0, tail_ms=5.0, latency_ms=20.0)
    assert rigstats.energy_mj(local, link, power) == pytest.approx(5.0 * 15 + 2.0 * 5)
    cloud = Record(
        i=1,
        t_s=0.0,
        plan="c1@fp32",
        where="cloud",
        head_ms=10.0,
        tail_ms=30.0,
        rpc_ms=100.0,
        bytes_up=1000,
        latency_ms=150.0,
    )
    # 10 ms active, 1 ms sending (idle + radio), the remaining 139 ms idle
    assert rigstats.energy_mj(cloud, link, power) == pytest.approx(5.0 * 10 + (2.0 + 1.0) * 1 + 2.0 * 139)
    # sending never counts for more than the RPC took
    assert rigstats.energy_mj(replace(cloud, rpc_ms=0.5), link, power) == pytest.approx(50 + 3.0 * 0.5 + 2.0 * 139.5)


# ------------------------------------------------------------------------------------ measured_costs


def _cost_records_table() -> CostTable:
    # c2 is too cheap to give ratios (head < 20 ms, tail < 5 ms): it only feeds the network overhead
    return CostTable(
        ids=["cloud", "c1", "c2", "device"],
        head_ms=[0.0, 40.0, 10.0, 100.0],
        tail_ms=[50.0, 30.0, 2.0, 0.0],
        bytes=[4000, 3000, 1000, 0],
        reply_bytes=1000,
    )


def _cloud_rec(
    t_s: float,
    plan: str,
    head: float,
    tail: float,
    queue: float,
    up: float,
    down: float,
    net: float,
    enc: float = 0.0,
    dec: float = 0.0,
) -> Record:
    """A cloud record whose network overhead (rpc - tail - queue - ideal + enc + dec) is ``net`` on 8 Mbit/s."""
    ideal = (up + down) / 1000.0
    rpc = net + tail + queue + ideal - enc - dec
    return Record(
        i=0,
        t_s=t_s,
        plan=plan,
        where="cloud",
        head_ms=head,
        tail_ms=tail,
        queue_ms=queue,
        rpc_ms=rpc,
        bytes_up=up,
        bytes_down=down,
        encode_ms=enc,
        decode_ms=dec,
        latency_ms=head + enc + rpc + dec,
    )


def _local_rec(t_s: float, head: float, latency: float) -> Record:
    return Record(i=0, t_s=t_s, plan="device", where="local", head_ms=head, latency_ms=latency)


def test_measured_costs_are_the_means_of_the_records() -> None:
    table = _cost_records_table()
    records = [
        _cloud_rec(5.0, "c1@fp32", 80.0, 45.0, 15.0, 3000, 1000, net=23.0, enc=1.0, dec=2.0),
        _cloud_rec(25.0, "c1@fp16", 160.0, 50.0, 10.0, 1500, 1000, net=17.0),  # in the burst: head ratio 4
        _local_rec(6.0, 300.0, 310.0),
        Record(i=0, t_s=10.0, plan="c1@fp32", error="DEADLINE_EXCEEDED", head_ms=1e6, latency_ms=1e6),
        _cloud_rec(7.0, "cloud@fp32", 0.0, 75.0, 0.0, 4000, 1000, net=20.0, enc=0.5, dec=0.5),
        _cloud_rec(8.0, "c2@int8", 30.0, 4.0, 0.0, 250, 1000, net=24.0),
        _local_rec(9.0, 200.0, 220.0),
        Record(i=0, t_s=11.0, plan="device", error="boom", latency_ms=0.0),
    ]
    got = rigstats.measured_costs(table, records, traces.constant(8.0), [(20.0, 40.0)], rtt_ms=50.0)
    assert got.device_ratio_idle == pytest.approx((80 / 40 + 300 / 100 + 200 / 100) / 3)
    assert got.device_ratio_burst == pytest.approx(160 / 40)
    assert got.cloud_ratio == pytest.approx(((45 + 15) / 30 + (50 + 10) / 30 + 75 / 50) / 3)
    assert got.net_overhead_ms == pytest.approx((23 + 17 + 20 + 24) / 4)
    assert got.local_overhead_ms == pytest.approx((10 + 20) / 2)


def test_measured_costs_defaults() -> None:
    table = _cost_records_table()
    link = traces.constant(8.0)
    unknown = replace(costs(1.0, 1.0, 1.0, 42.0, 0.0), device_ratio_idle=None, device_ratio_burst=None)
    assert rigstats.measured_costs(table, [], link, [], rtt_ms=42.0) == unknown
    only_errors = [Record(i=0, t_s=1.0, plan="c1@fp32", error="x", latency_ms=0.0)]
    assert rigstats.measured_costs(table, only_errors, link, [], rtt_ms=7.0) == replace(unknown, net_overhead_ms=7.0)
    # no request in a burst: the burst ratio falls back to the idle one
    idle_only = [_local_rec(1.0, 250.0, 260.0)]
    got = rigstats.measured_costs(table, idle_only, link, [(20.0, 40.0)], rtt_ms=7.0)
    assert got == costs(2.5, 2.5, 1.0, 7.0, 10.0)


def test_without_a_long_head_the_device_speed_comes_from_the_short_ones_or_stays_unknown() -> None:
    """Regression: a busy board's cell where only the input's JPEG and squeezenet's short heads ran left the
    device at the table's idle speed (ratio 1), and the oracle ran everything there at 47 ms: 2.4x better
    than anything measured, a quarter of the RTT."""
    table = _cost_records_table()
    link = traces.constant(8.0)
    sent = [_cloud_rec(1.0, "cloud@fp32", 0.0, 75.0, 0.0, 4000, 1000, net=20.0)]
    split = [*sent, _cloud_rec(2.0, "c2@int8", 30.0, 4.0, 0.0, 250, 1000, net=24.0)]  # c2's head: 10 ms priced
    assert rigstats.measured_costs(table, split, link, [], rtt_ms=7.0).device_ratio_idle == pytest.approx(3.0)
    only_cloud = rigstats.measured_costs(table, sent, link, [], rtt_ms=7.0)
    assert only_cloud.device_ratio_idle is None and only_cloud.device_ratio_burst is None
    picks = rigstats.oracle(table, only_cloud, [0.0, 1.0], traces.constant(0.05), [], None)
    assert {p.partition("@")[0] for p, _ in picks} == {"cloud"}  # never a plan that computes on the device


def test_measured_costs_take_the_codec_times_out_of_the_network_overhead_when_the_table_prices_them() -> None:
    base = _cost_records_table()
    table = CostTable(
        ids=base.ids,
        head_ms=base.head_ms,
        tail_ms=base.tail_ms,
        bytes=[4000, 3000, 1000, 0],
        reply_bytes=1000,
        codecs={"fp32": 1.0, "int8": 0.25},
        encode_ms={"fp32": [1.0, 2.0, 1.0, 0.0], "int8": [4.0, 4.0, 4.0, 0.0]},
        decode_ms={"fp32": [0.5, 0.5, 0.5, 0.0], "int8": [1.0, 1.0, 1.0, 0.0]},
    )
    records = [
        _cloud_rec(5.0, "c1@fp32", 80.0, 45.0, 15.0, 3000, 1000, net=23.0, enc=6.0, dec=1.0),
        _cloud_rec(7.0, "cloud@int8", 0.0, 75.0, 0.0, 1000, 1000, net=20.0, enc=12.0, dec=2.0),
    ]
    got = rigstats.measured_costs(table, records, traces.constant(8.0), [], rtt_ms=50.0)
    assert got.encode_ratio == pytest.approx((6 + 12) / (2 + 4))
    assert got.decode_ratio == pytest.approx((1 + 2) / (0.5 + 1))
    # what is left is the wire's: rpc - tail - queue - ideal, the codec times out
    assert got.net_overhead_ms == pytest.approx(((23 - 7) + (20 - 14)) / 2)


# -------------------------------------------------------------------------------------------- oracle


def test_oracle_costs_every_plan_with_the_measured_costs() -> None:
    table = tiny_table()
    c = costs(ratio=2.0, burst=5.0, cloud=1.5, net=3.0, local=1.0)
    link = traces.constant(1.0)  # 1 byte = 8 µs
    # cloud@fp32 0+8.8+3+60, cloud@int8 0+2.8+3+60, c1@fp32 20+4.8+3+12, c1@int8 20+1.8+3+12, device 80+1
    assert rigstats.oracle(table, c, [0.0], link, [], None) == [("c1@int8", pytest.approx(36.8))]
    assert rigstats.oracle(table, c, [0.0], link, [], ["fp32"]) == [("c1@fp32", pytest.approx(39.8))]
    # in a burst the head costs 5x: c1@int8 50+1.8+3+12 = 66.8 loses to cloud@int8 (65.8)
    assert rigstats.oracle(table, c, [1.0, 25.0], link, [(20.0, 40.0)], None) == [
        ("c1@int8", pytest.approx(36.8)),
        ("cloud@int8", pytest.approx(65.8)),
    ]


def test_oracle_prices_each_codecs_own_encode_and_decode() -> None:
    # the same bytes under two codecs: the one slower to encode loses, at the measured encode ratio
    table = CostTable(
        ids=["cloud", "device"],
        head_ms=[0.0, 400.0],
        tail_ms=[10.0, 0.0],
        bytes=[1000, 0],
        reply_bytes=100,
        codecs={"fast": 0.1, "slow": 0.09},
        encode_ms={"fast": [1.0, 0.0], "slow": [30.0, 0.0]},
        decode_ms={"fast": [1.0, 0.0], "slow": [2.0, 0.0]},
    )
    link = traces.constant(1.0)  # 1 byte = 8 µs: "slow" saves 10 of 200 bytes, 0.08 ms
    c = replace(costs(net=3.0), encode_ratio=2.0, decode_ratio=1.0)
    # cloud@fast: 2 x 1 + 1 + 1.6 + 3 + 10 against cloud@slow: 2 x 30 + 2 + 1.52 + 3 + 10
    assert rigstats.oracle(table, c, [0.0], link, [], None) == [("cloud@fast", pytest.approx(17.6))]
    assert rigstats.oracle(table, c, [0.0], link, [], ["slow"]) == [("cloud@slow", pytest.approx(76.52))]


def test_oracle_meets_the_bandwidth_after_the_head() -> None:
    table = CostTable(ids=["c1"], head_ms=[125.0], tail_ms=[8.0], bytes=[500], reply_bytes=100, codecs={"fp32": 1.0})
    link = traces.step([1000.0, 1.0], 0.25)  # the fast link is gone when the 250 ms head ends
    [(plan, ms)] = rigstats.oracle(table, costs(ratio=2.0, net=3.0), [0.0], link, [], None)
    assert plan == "c1@fp32"
    assert ms == pytest.approx(250.0 + 600 * 8 / 1e6 * 1e3 + 3.0 + 8.0)


def test_oracle_on_a_dead_link_runs_on_the_device() -> None:
    table = squeezenet()
    picks = rigstats.oracle(table, costs(), [0.0, 10.0, 30.0], traces.constant(0.05), [], None)
    assert [p for p, _ in picks] == ["device"] * 3
    assert all(ms == pytest.approx(float(table.head_ms[table.index("device")])) for _, ms in picks)


def test_oracle_on_a_fast_link_with_a_slow_device_offloads_everything() -> None:
    table = squeezenet()
    picks = rigstats.oracle(table, costs(ratio=50.0, net=5.0), [0.0, 10.0, 30.0], traces.constant(1000.0), [], None)
    i = table.index("cloud")
    # at 1 Gbit/s the bytes weigh little: the codec whose encode and decode (profiled) cost least wins
    coding = {k: float(table.encode_ms[i, j] + table.decode_ms[i, j]) for j, k in enumerate(table.codecs)}
    for plan, ms in picks:
        cut, codec = plan.split("@")
        assert cut == "cloud" and coding[codec] <= min(coding.values()) + 0.05, (plan, coding)
        assert ms < 50.0 * float(table.head_ms[table.index("device")])
    only_fp16 = rigstats.oracle(table, costs(ratio=50.0, net=5.0), [0.0], traces.constant(1000.0), [], ["fp16"])
    assert only_fp16[0][0] == "cloud@fp16"


def test_oracle_device_bursts_move_the_choice() -> None:
    table = squeezenet()
    c = costs(ratio=1.0, burst=20.0, net=20.0)
    picks = rigstats.oracle(table, c, [5.0, 25.0, 45.0], traces.constant(1000.0), [(20.0, 40.0)], None)
    assert picks[0][0] == picks[2][0] == "device"
    assert rigstats.plan_cut(picks[1][0]) == "cloud"


def test_oracle_keeps_a_realized_plan_that_is_the_cheapest_with_its_measured_latency() -> None:
    table = squeezenet(3.0)
    link, c, t = tracespec.load_trace("step:30,2/1.5"), costs(ratio=1.5, net=20.0), [0.7]
    [(free_plan, free_ms)] = rigstats.oracle(table, c, t, link, [], None)
    # the model's pick ran, slower or faster than the model says (noise): the measurement stands
    for measured in (free_ms + 30.0, free_ms - 5.0, 1e6):
        assert rigstats.oracle(table, c, t, link, [], None, [(free_plan, measured)]) == [(free_plan, measured)]


def test_oracle_moves_a_realized_latency_by_the_modelled_difference() -> None:
    table = tiny_table()
    c = costs(ratio=2.0, burst=5.0, cloud=1.5, net=3.0, local=1.0)
    link = traces.constant(1.0)
    # model (see test_oracle_costs_every_plan_with_the_measured_costs): c1@int8 36.8, c1@fp32 39.8, device 81
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("c1@int8", 50.0)]) == [("c1@int8", 50.0)]
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("c1@fp32", 50.0)]) == [
        ("c1@int8", pytest.approx(50.0 - 3.0))
    ]
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("device", 100.0)]) == [
        ("c1@int8", pytest.approx(100.0 - 44.2))
    ]
    # never below zero
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("device", 10.0)]) == [("c1@int8", 0.0)]
    # a plan the table cannot cost: the lesser of its measurement and the model's pick
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("c9@fp32", 20.0)]) == [("c9@fp32", 20.0)]
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("c1@zstd", 50.0)]) == [("c1@int8", pytest.approx(36.8))]
    # requests without a measurement get the model's pick
    assert rigstats.oracle(table, c, [0.0, 0.0], link, [], None, [None, ("c1@int8", 40.0)]) == [
        ("c1@int8", pytest.approx(36.8)),
        ("c1@int8", 40.0),
    ]


def test_oracle_treats_a_plan_sending_the_same_bytes_as_the_realized_one() -> None:
    table = CostTable(
        ids=["cloud", "c1", "device"],
        head_ms=[0.0, 10.0, 400.0],
        tail_ms=[900.0, 8.0, 0.0],
        bytes=[1000, 500, 0],
        codecs={"int8": 0.25, "int8c": 0.25},
    )
    link, c = traces.constant(1.0), costs(net=3.0)
    [(plan, ms)] = rigstats.oracle(table, c, [0.0], link, [], None)
    assert (plan, ms) == ("c1@int8", pytest.approx(10.0 + 1.0 + 3.0 + 8.0))
    # c1@int8c ran (measured 300 ms): c1@int8 sends the same bytes, it would not have done better
    assert rigstats.oracle(table, c, [0.0], link, [], None, [("c1@int8c", 300.0)]) == [("c1@int8c", 300.0)]
    # ... also when the codecs the oracle may pick leave out the one that ran
    assert rigstats.oracle(table, c, [0.0], link, [], ["int8"], [("c1@int8c", 300.0)]) == [("c1@int8c", 300.0)]


def _equivalent(table: CostTable, a: str, b: str) -> bool:
    """Same plan, or the same cut sending the same bytes (the oracle cannot tell them apart)."""
    return a == b or (
        rigstats.plan_cut(a) == rigstats.plan_cut(b)
        and "@" in a
        and "@" in b
        and sent_bytes(table, a) == sent_bytes(table, b)
    )


@settings(max_examples=25, deadline=None)
@given(data=st.data(), ratio=st.floats(1.0, 30.0), n=st.integers(1, 5), shift=st.floats(1.0, 500.0))
def test_oracle_is_never_above_the_realized_run(data: st.DataObject, ratio: float, n: int, shift: float) -> None:
    table = squeezenet()
    times = data.draw(st.lists(st.floats(0.0, 60.0), min_size=n, max_size=n))
    realized = data.draw(
        st.lists(
            st.none() | st.tuples(st.sampled_from(all_plans(table)), st.floats(0.0, 2000.0)), min_size=n, max_size=n
        )
    )
    link, bursts = tracespec.load_trace("step:30,2/1.5"), [(20.0, 40.0)]
    c = costs(ratio=ratio, burst=3 * ratio, cloud=1.2, net=15.0, local=2.0)
    free = rigstats.oracle(table, c, times, link, bursts, None)
    got = rigstats.oracle(table, c, times, link, bursts, None, realized)
    slower = [None if r is None else (r[0], r[1] + shift) for r in realized]
    got_slower = rigstats.oracle(table, c, times, link, bursts, None, slower)
    assert len(got) == len(free) == len(got_slower) == n
    for real, pick, model, pick_slower in zip(realized, got, free, got_slower, strict=True):
        if real is None:
            assert pick == model  # nothing measured: the model's pick
            continue
        assert pick[1] <= real[1]
        if _equivalent(table, model[0], real[0]):
            assert pick == real  # the cheapest plan ran: its measured latency, noise included
            continue
        assert pick[0] == model[0]
        assert pick[1] < real[1] or pick[1] == 0.0
        # the realized latency's luck carries over: a slower measurement gives a slower oracle
        assert pick_slower[0] == model[0]
        if pick[1] > 0.0:
            assert pick_slower[1] == pytest.approx(pick[1] + shift)
        else:
            assert 0.0 <= pick_slower[1] <= shift


def test_oracle_restricted_to_routing_picks_only_device_or_cloud() -> None:
    table = tiny_table()
    c = costs(ratio=2.0, burst=5.0, cloud=1.5, net=3.0, local=1.0)
    link = traces.constant(1.0)
    # unrestricted the inner cut c1@int8 wins (36.8); routing's best is cloud@int8 (0+2.8+3+60)
    assert rigstats.oracle(table, c, [0.0], link, [], None, cuts=["cloud", "device"]) == [
        ("cloud@int8", pytest.approx(65.8))
    ]
    assert rigstats.oracle(table, c, [0.0], link, [], None, cuts=["device"]) == [("device", pytest.approx(81.0))]
