"""Link and load estimators: pure, so driven with synthetic samples and a fake clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.errors import ConfigError, PlanError
from splitrt.plan.netmon import LinkConfig, LinkEstimate, LinkEstimator, LoadConfig, LoadEstimator

RTT_MS = 20.0
BYTES = 250_000  # 2 Mbit: 100 ms at 20 Mbit/s, 2 s at 1 Mbit/s


def transfer_s(mbps: float, nbytes: int = BYTES, rtt_ms: float = RTT_MS) -> float:
    return nbytes * 8 / (mbps * 1e6) + rtt_ms / 1000


def fed(rates: list[float], *, rtt_ms: float = RTT_MS, config: LinkConfig | None = None) -> LinkEstimator:
    est = LinkEstimator(config)
    est.add_rtt(0.0, rtt_ms)
    for i, r in enumerate(rates):
        nbytes = max(BYTES, int(r * 1e6 / 8 * 0.5))  # at least 0.5 s of transfer: not RTT-dominated
        assert est.add_transfer(float(i), nbytes, transfer_s(r, nbytes, rtt_ms=rtt_ms))
    return est


rate = st.floats(min_value=0.05, max_value=1000.0, allow_nan=False, allow_infinity=False)


@given(st.lists(rate, min_size=1, max_size=40))
def test_estimate_lies_within_the_samples(rates: list[float]) -> None:
    est = fed(rates)
    bw = est.estimate(len(rates)).bandwidth_mbps
    assert min(rates) * (1 - 1e-6) <= bw <= max(rates) * (1 + 1e-6)
    kept = fed(rates, config=LinkConfig(forgive_slow_s=None))  # every sample stays: the window is the last ones
    bw = kept.estimate(len(rates)).bandwidth_mbps
    window = rates[-kept.samples :]
    assert min(window) * (1 - 1e-6) <= bw <= max(window) * (1 + 1e-6)


def test_a_lone_slow_sample_the_next_contradicts_is_dropped() -> None:
    est = fed([5.0] * 4)
    est.add_transfer(4.0, BYTES, transfer_s(0.4))  # one stalled transfer
    assert est.estimate(4.0).bandwidth_mbps < 2.0  # news at once: the plan may leave the link
    est.add_transfer(4.5, BYTES, transfer_s(4.0))  # the next one (a probe) says the link is as before
    assert est.estimate(4.5).bandwidth_mbps > 4.0 and est.forgiven == 1
    kept = fed([5.0] * 4, config=LinkConfig(forgive_slow_s=None))
    kept.add_transfer(4.0, BYTES, transfer_s(0.4))
    kept.add_transfer(4.5, BYTES, transfer_s(4.0))
    # kept, the stall still weighs (less as it ages: recency weighting)
    assert kept.estimate(4.5).bandwidth_mbps < 0.6 * est.estimate(4.5).bandwidth_mbps and kept.forgiven == 0


def test_a_lone_slow_sample_weighs_as_one_of_the_window_until_the_next_confirms_it() -> None:
    """The rig's hsdpa/bus inception_v1 cell: ~5 Mbit/s at 4 requests a second, then one stalled upload
    (453 ms among ~200 ms ones). At the newest sample's recency weight it set the estimate alone (5.0 ->
    0.85 Mbit/s) and adaptive left cloud@jpeg90 for ``device`` for 11 requests; as one sample of the window's
    eight it halves it, and only the next slow sample (a step) takes it in full."""
    est, news = LinkEstimator(), LinkEstimator(LinkConfig(confirm_slow=False))
    for e in (est, news):
        for k in range(8):
            e.add_rate(0.25 * k, 5.0)
        e.add_rate(2.0, 0.6)
    assert news.bandwidth_mbps() < 0.9  # before: the stall all but alone (0.83; the log: 0.85)
    assert est.bandwidth_mbps() == pytest.approx(8 / (7 / 5.0 + 1 / 0.6))  # 2.6: news, one of eight
    est.add_rate(2.25, 0.6)  # the next one says the link did fall: a step, in full
    assert est.bandwidth_mbps() == pytest.approx(0.6) and est.steps == 1


@given(
    st.lists(st.floats(min_value=0.8, max_value=1.2), min_size=2, max_size=12),
    st.floats(min_value=0.5, max_value=100.0),
    st.floats(min_value=0.01, max_value=0.4),
)
def test_a_lone_slow_sample_never_outweighs_the_window(noise: list[float], mbps: float, slow: float) -> None:
    """Whatever the window, one unconfirmed slow sample moves the estimate by at most its share of it
    (the harmonic mean's: 1/n), never to the sample itself."""
    est = LinkEstimator()
    for k, f in enumerate(noise):
        est.add_rate(0.25 * k, mbps * f)
    est.add_rate(0.25 * len(noise), mbps * slow)
    n = est.samples  # the slow one and the n - 1 before it
    lowest = min(noise[-(n - 1) :]) * mbps
    assert est.bandwidth_mbps() >= n / ((n - 1) / lowest + 1 / (mbps * slow)) * (1 - 1e-9)
    assert est.bandwidth_mbps() > mbps * slow


def test_slow_samples_that_recur_are_kept() -> None:
    """Alternating stalls are the link, not an accident: only one is forgiven per forgive_slow_s."""
    est = fed([5.0] * 4)
    for t in (4.0, 4.5, 5.0, 5.5, 6.0, 6.5):
        est.add_transfer(t, BYTES, transfer_s(0.4 if t % 1 == 0 else 5.0))
    assert est.forgiven == 1
    assert est.estimate(6.5).bandwidth_mbps < 0.6 * 5.0  # the later stalls still weigh


@given(rate, st.integers(min_value=1, max_value=30))
def test_constant_rate_is_estimated_exactly(mbps: float, n: int) -> None:
    assert fed([mbps] * n).estimate(n).bandwidth_mbps == pytest.approx(mbps, rel=1e-6)


@given(
    st.floats(min_value=0.5, max_value=200.0),
    st.integers(min_value=0, max_value=2**32 - 1),
)
@settings(max_examples=50)
def test_converges_under_20_percent_noise(mbps: float, seed: int) -> None:
    rnd = random.Random(seed)
    est = fed([mbps * rnd.uniform(0.8, 1.2) for _ in range(60)])
    assert est.steps == 0  # noise never looks like a step
    assert 0.8 * mbps <= est.estimate(60).bandwidth_mbps <= 1.2 * mbps


@given(
    st.floats(min_value=0.5, max_value=100.0),
    st.floats(min_value=3.0, max_value=50.0),
    st.booleans(),
    st.integers(min_value=0, max_value=2**32 - 1),
)
@settings(max_examples=80)
def test_reacts_to_a_step_within_two_samples(mbps: float, ratio: float, down: bool, seed: int) -> None:
    rnd = random.Random(seed)
    after = mbps / ratio if down else mbps * ratio
    est = fed([mbps * rnd.uniform(0.8, 1.2) for _ in range(20)] + [after * rnd.uniform(0.8, 1.2)] * 2)
    assert 0.8 * after <= est.estimate(22).bandwidth_mbps <= 1.2 * after


def test_step_20_to_1_mbps() -> None:
    est = fed([20.0] * 10)
    est.add_transfer(10.0, BYTES, transfer_s(1.0))
    first = est.estimate(10.0).bandwidth_mbps
    assert first < 20.0 / 2  # the harmonic mean already drags it down after one sample
    est.add_transfer(11.0, BYTES, transfer_s(1.0))
    assert est.estimate(11.0).bandwidth_mbps == pytest.approx(1.0)
    assert est.steps == 1


def test_one_outlier_does_not_reset_the_window() -> None:
    est = fed([20.0] * 8 + [200.0] + [20.0])
    assert est.steps == 0
    # the burst barely counts: one sample a second keeps 4 in the 3 s window, harmonic mean 25.8
    assert 20.0 <= est.estimate(10.0).bandwidth_mbps < 26.0


def test_rtt_is_subtracted_from_transfers() -> None:
    est = LinkEstimator()
    est.add_rtt(0.0, 100.0)
    assert est.add_transfer(0.0, 1_250_000, 1.1)  # 10 Mbit in 1 s + 100 ms RTT
    assert est.bandwidth_mbps() == pytest.approx(10.0)


def test_transfers_timed_before_any_rtt_sample_are_netted_once_one_arrives() -> None:
    est = LinkEstimator()
    # 154 KB over 11.5 Mbit/s + 80 ms: before any RTT sample it reads 6.6 Mbit/s
    secs = 154_000 * 8 / 11.5e6 + 0.080
    assert est.add_transfer(0.0, 154_000, secs)
    assert est.add_transfer(0.25, 154_000, secs)
    assert est.bandwidth_mbps() == pytest.approx(6.6, abs=0.05)
    est.add_rtt(0.3, 80.0)
    assert est.samples == 2
    assert est.bandwidth_mbps() == pytest.approx(11.5)
    # later samples are netted at once, and a later RTT sample does not re-net anything
    assert est.add_transfer(0.5, 154_000, secs)
    est.add_rtt(0.6, 60.0)
    assert est.bandwidth_mbps() == pytest.approx(11.5)


def test_a_transfer_faster_than_the_first_rtt_sample_is_dropped_when_netted() -> None:
    est = LinkEstimator()
    assert est.add_transfer(0.0, 100_000, 0.09)
    est.add_rtt(0.1, 85.0)  # 5 ms of 90 ms left for the bytes: RTT-dominated, nothing to learn
    assert est.samples == 0
    assert est.bandwidth_mbps() == LinkConfig().prior_bandwidth_mbps


def test_rtt_dominated_transfers_are_ignored() -> None:
    est = LinkEstimator()
    est.add_rtt(0.0, 50.0)
    assert not est.add_transfer(1.0, 100, 0.051)  # below min_bytes
    assert not est.add_transfer(1.0, 10_000, 0.052)  # transfer part 2 ms of 52 ms
    assert not est.add_transfer(1.0, 10_000, 0.040)  # faster than the RTT: nothing to learn
    assert est.ignored == 3
    assert est.samples == 0
    assert est.estimate(1.0).bandwidth_mbps == LinkConfig().prior_bandwidth_mbps


def test_rtt_minimum_ignores_queueing_and_follows_a_shift() -> None:
    est = LinkEstimator()
    for i, r in enumerate([12, 11, 9, 500, 10]):  # probes that waited behind a transfer, and a spike
        est.add_rtt(float(i), r)
    assert est.rtt_ms() == 9
    for i in range(4):
        est.add_rtt(5.0 + i, 80.0)
    assert est.rtt_ms() == 10.0  # a rise shows once the window holds none of the older samples
    est.add_rtt(9.0, 80.0)
    assert est.rtt_ms() == 80.0
    est.add_rtt(10.0, 40.0)
    assert est.rtt_ms() == 40.0  # a fall at once


@given(st.floats(min_value=0.0, max_value=1e4), st.floats(min_value=0.0, max_value=1e4))
def test_confidence_in_unit_interval_and_decays_with_age(age1: float, extra: float) -> None:
    est = fed([5.0, 6.0, 5.5])
    est.add_rtt(2.0, RTT_MS)
    c1 = est.estimate(2.0 + age1).confidence
    c2 = est.estimate(2.0 + age1 + extra).confidence
    assert 0.0 <= c2 <= c1 <= 1.0


def test_confidence_rises_with_samples_and_halves_per_half_life() -> None:
    cfg = LinkConfig(half_life_s=4.0)
    est = LinkEstimator(cfg)
    assert est.estimate(0.0).confidence == 0.0
    est.add_rtt(0.0, RTT_MS)
    confs = []
    for i in range(3):
        est.add_rtt(float(i), RTT_MS)
        est.add_transfer(float(i), BYTES, transfer_s(10.0))
        confs.append(est.estimate(float(i)).confidence)
    assert confs[0] < confs[1] < confs[2] == pytest.approx(1.0)
    assert est.estimate(2.0 + 4.0).confidence == pytest.approx(0.5)
    assert est.estimate(2.0 + 8.0).confidence == pytest.approx(0.25)


def test_needs_probe_when_empty_or_stale_and_not_twice_in_a_row() -> None:
    cfg = LinkConfig(probe_after_s=2.0, min_probe_interval_s=1.0)
    est = LinkEstimator(cfg)
    assert est.needs_probe(0.0)
    est.probe_started(0.0)
    assert not est.needs_probe(0.5)  # a probe is in flight
    est.add_rtt(0.6, RTT_MS)
    est.add_transfer(0.6, BYTES, transfer_s(10.0))
    assert not est.needs_probe(1.5)
    assert not est.needs_probe(2.5)
    assert est.needs_probe(2.6)
    assert est.needs_bandwidth_probe(2.6)
    est.add_transfer(3.0, BYTES, transfer_s(10.0))  # fresh bandwidth, but RTT is still old
    assert est.needs_probe(3.0) and not est.needs_bandwidth_probe(3.0)  # an RTT probe is enough
    est.add_rtt(3.0, RTT_MS)
    assert not est.needs_probe(3.0)
    assert LinkEstimator(cfg).needs_bandwidth_probe(0.0)


def test_suggested_probe_size_follows_the_estimate() -> None:
    slow, fast = fed([1.0] * 3), fed([100.0] * 3)
    assert slow.suggest_probe_bytes() < fast.suggest_probe_bytes()
    assert slow.suggest_probe_bytes() >= 16 * 1024 and fast.suggest_probe_bytes() <= 1 << 20


def test_estimate_is_a_frozen_dataclass_and_bad_inputs_raise() -> None:
    e = LinkEstimate(bandwidth_mbps=1.0, rtt_ms=2.0, confidence=0.5)
    with pytest.raises(AttributeError):
        e.rtt_ms = 3.0  # type: ignore[misc]
    est = LinkEstimator()
    with pytest.raises(PlanError, match="rtt_ms"):
        est.add_rtt(0.0, float("nan"))
    with pytest.raises(PlanError, match="seconds"):
        est.add_transfer(0.0, 10, -1.0)
    with pytest.raises(ConfigError, match="window"):
        LinkConfig(window=0)


# -- load ---------------------------------------------------------------------------------------


def test_device_factor_from_utilisation_and_frequency() -> None:
    load = LoadEstimator(LoadConfig(alpha=1.0))
    assert load.estimate(0.0).device_factor == 1.0
    assert load.add_device(0.0, other_util=0.5) == pytest.approx(2.0)
    assert load.estimate(0.0).device_factor == 1.0  # once is a spike
    load.add_device(0.0, other_util=0.5)
    assert load.estimate(0.0).device_factor == pytest.approx(2.0)  # twice is load
    f = load.add_device(1.0, other_util=0.0, freq_mhz=600, profiled_freq_mhz=1800)
    assert f == pytest.approx(3.0)
    assert load.add_device(2.0, other_util=1.0) == pytest.approx(10.0)  # capped at max_util 0.9
    assert load.add_device(3.0, other_util=0.0, freq_mhz=2000, profiled_freq_mhz=1000) == 1.0
    with pytest.raises(PlanError, match="other_util"):
        load.add_device(4.0, other_util=1.5)


def test_cloud_factor_from_queue_wait_and_tail_time() -> None:
    load = LoadEstimator(LoadConfig(alpha=1.0))
    assert load.add_cloud(0.0, queue_wait_s=0.02, tail_s=0.03, profiled_tail_s=0.01) == pytest.approx(5.0)
    load.add_cloud(0.0, queue_wait_s=0.02, tail_s=0.03, profiled_tail_s=0.01)
    assert load.estimate(0.0).cloud_factor == pytest.approx(5.0)
    assert load.estimate(0.0).device_factor == 1.0
    load.add_cloud(1.0, queue_wait_s=0.0, profiled_tail_s=0.01)
    load.add_cloud(1.0, queue_wait_s=0.0, profiled_tail_s=0.01)
    assert load.estimate(1.0).cloud_factor == 1.0


@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(1e-3, 10.0)),
        min_size=1,
        max_size=30,
    ),
    st.floats(0.0, 1e3),
)
def test_load_factors_are_bounded_and_fade_to_nominal(
    samples: list[tuple[float, float, float, float]], later: float
) -> None:
    cfg = LoadConfig()
    load = LoadEstimator(cfg)
    for i, (util, wait, tail, prof) in enumerate(samples):
        load.add_device(float(i), other_util=util)
        load.add_cloud(float(i), queue_wait_s=wait, tail_s=tail, profiled_tail_s=prof)
    now = float(len(samples))
    a, b = load.estimate(now), load.estimate(now + later)
    for x in (a.device_factor, a.cloud_factor, b.device_factor, b.cloud_factor):
        assert cfg.min_factor <= x <= cfg.max_factor
    # stale news fades toward nominal (1) from either side
    assert abs(b.device_factor - 1) <= abs(a.device_factor - 1) + 1e-12
    assert abs(b.cloud_factor - 1) <= abs(a.cloud_factor - 1) + 1e-12


def test_device_speed_is_learned_from_heads_net_of_load() -> None:
    """A profile 20 % optimistic: the heads say so, and a CPU burst is not mistaken for it."""
    load = LoadEstimator(LoadConfig(alpha=1.0))
    assert load.add_head(0.0, measured_ms=5.0, profiled_ms=4.0) is None  # too short to tell
    for i in range(30):
        load.add_device(float(i), other_util=0.0)
        load.add_head(float(i), measured_ms=120.0, profiled_ms=100.0)
    assert load.device_speed == pytest.approx(1.2, rel=0.01)
    assert load.estimate(30.0).device_factor == pytest.approx(1.2, rel=0.01)
    for i in range(30, 40):  # half the CPU taken by others: heads take 2 x 120 ms
        load.add_device(float(i), other_util=0.5)
        load.add_device(float(i) + 0.5, other_util=0.5)
        load.add_head(float(i) + 0.5, measured_ms=240.0, profiled_ms=100.0)
    assert load.device_speed == pytest.approx(1.2, rel=0.05)
    assert load.estimate(40.0).device_factor == pytest.approx(2.4, rel=0.05)
    assert load.estimate(1000.0).device_factor == pytest.approx(1.2, rel=0.05)  # load fades, speed stays


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.2, 0.85),  # the burst's share of the CPU
    st.integers(1, 4),  # heads per load sample (the prober's rounds are slower than the requests)
    st.floats(0.9, 1.3),  # the board's true speed over the profile
)
def test_a_burst_starting_or_ending_is_not_learnt_as_the_boards_speed(util: float, per_round: int, true: float) -> None:
    """Heads timed while the utilisation estimate lags a burst's start (or end) are not speed samples: the
    speed stays near the board's own (before, 2 heads in a lagging window moved it 1.0 -> 1.36 for good)."""
    load = LoadEstimator()
    t, dt = 0.0, 0.25 / per_round
    for n, phase_util in enumerate((0.0, util, 0.0, util, 0.0)):
        for k in range(40 * per_round):
            if k % per_round == 0:
                load.add_device(t, other_util=phase_util)
            load.add_head(t, measured_ms=100.0 * true / (1.0 - phase_util), profiled_ms=100.0)
            t += dt
            # a burst's start or end lagging the heads never moves the speed far from the board's (a plan
            # that leaves the device then keeps the speed it has: no heads correct it)
            if n:  # (the first phase learns the board's speed)
                assert load.device_speed == pytest.approx(true, rel=0.12)


def test_heads_during_a_lagging_load_estimate_are_left_out() -> None:
    load = LoadEstimator()
    for i in range(10):
        load.add_device(i * 0.25, other_util=0.0)
        load.add_head(i * 0.25, measured_ms=100.0, profiled_ms=100.0)
    load.add_device(2.5, other_util=0.5)  # a burst: the estimate still reads ~1 (a lone sample), heads 2x
    assert load.add_head(2.6, measured_ms=200.0, profiled_ms=100.0) is None
    assert load.add_head(2.7, measured_ms=200.0, profiled_ms=100.0) is None
    assert load.device_speed == pytest.approx(1.0)


def test_the_device_lag_is_large_while_a_burst_is_followed_and_small_once_it_is() -> None:
    load = LoadEstimator()
    assert load.device_lag(0.0) == 0.0  # no sample: nothing to follow
    for i in range(10):
        load.add_device(i * 0.25, other_util=0.0)
    assert load.device_lag(2.3) == pytest.approx(0.0)
    lags = []
    for i in range(10, 20):  # a burst: the factor goes 1 -> 2
        load.add_device(i * 0.25, other_util=0.5)
        lags.append(load.device_lag(i * 0.25 + 0.1))
    assert lags[0] > 0.3 and lags[1] > 0.2  # the median of 3 needs two samples, the mean follows after
    assert lags[-1] < 0.05
    assert load.device_lag(4.9) < 0.15 and not LoadEstimator().device_lag(0.0)


def test_one_slow_head_does_not_move_the_speed() -> None:
    load = LoadEstimator()
    for i in range(10):
        load.add_head(float(i), measured_ms=100.0, profiled_ms=100.0)
    load.add_head(10.0, measured_ms=900.0, profiled_ms=100.0)  # a cold session, a GC pause
    assert load.device_speed == pytest.approx(1.0)
    assert load.add_head(11.0, measured_ms=900.0, profiled_ms=100.0) == LoadConfig().max_speed  # clamped


def test_a_cloud_faster_than_its_profile_counts() -> None:
    load = LoadEstimator(LoadConfig(alpha=1.0))
    for t in (0.0, 0.1):
        load.add_cloud(t, queue_wait_s=0.0, tail_s=0.0075, profiled_tail_s=0.01)
    assert load.estimate(0.1).cloud_factor == pytest.approx(0.75, rel=0.01)  # (the first sample aged 0.1 s)
    assert load.estimate(100.0).cloud_factor == pytest.approx(1.0, abs=0.01)  # stale: nominal


def test_load_ignores_a_single_spike_and_follows_sustained_load() -> None:
    load = LoadEstimator(LoadConfig(alpha=0.25))
    for i in range(10):
        load.add_device(float(i), other_util=0.0)
    load.add_device(10.0, other_util=0.9)  # instantaneous 10x: a one-off (e.g. a cold session)
    assert load.estimate(10.0).device_factor == 1.0
    load.add_device(11.0, other_util=0.9)  # twice in a row: real load
    assert 1.0 < load.estimate(11.0).device_factor < 4.0


def test_first_cloud_sample_spike_does_not_condemn_the_cloud() -> None:
    load = LoadEstimator()
    load.add_cloud(0.0, queue_wait_s=0.3, profiled_tail_s=0.02, tail_s=0.02)  # cold session build
    load.add_cloud(0.1, queue_wait_s=0.0, profiled_tail_s=0.02, tail_s=0.02)
    assert load.estimate(0.1).cloud_factor == pytest.approx(1.0)


def test_after_a_gap_stale_spike_samples_do_not_outvote_a_fresh_one() -> None:
    """The plan left the cloud after a contention spike; seconds later the first request back finds
    the cloud fast: the estimate must move towards it, not back up towards the spike."""
    load = LoadEstimator(LoadConfig(alpha=0.5, half_life_s=10.0))
    for i in range(6):
        load.add_cloud(i * 0.25, queue_wait_s=0.0, profiled_tail_s=0.02, tail_s=0.06)  # 3x, sustained
    spike = load.estimate(1.25).cloud_factor
    assert spike == pytest.approx(3.0, rel=0.05)
    prior = load.estimate(7.0).cloud_factor  # 5.75 s on the device: faded
    assert 1.0 < prior < spike
    load.add_cloud(7.0, queue_wait_s=0.0, profiled_tail_s=0.02, tail_s=0.026)  # 1.3x now
    first = load.estimate(7.0).cloud_factor
    # Two aged spike samples that agree still outvote one fresh sample, but only by what they held above
    # the estimate (before: 2.26 -> 2.63, the stale 3.0 samples voting at full strength).
    assert first < prior + 0.05
    load.add_cloud(7.25, queue_wait_s=0.0, profiled_tail_s=0.02, tail_s=0.026)
    second = load.estimate(7.25).cloud_factor
    assert second < first and second == pytest.approx(1.3 + (first - 1.3) / 2, rel=0.02)
    # Samples close together still filter a one-off: one fast tail amid the spike moves nothing.
    steady = LoadEstimator(LoadConfig(alpha=1.0))
    for t, tail in ((0.0, 0.06), (0.25, 0.06), (0.5, 0.02)):
        steady.add_cloud(t, queue_wait_s=0.0, profiled_tail_s=0.02, tail_s=tail)
    assert steady.estimate(0.5).cloud_factor == pytest.approx(3.0, rel=0.05)  # (aged 0.25-0.5 s)


def test_old_bandwidth_samples_age_out() -> None:
    """Probe-fed estimates (plan on the device): a dip must not outlive max_sample_age_s."""
    flat = {"recency_half_life_s": None}  # equal weights: the window alone ages samples out
    aged = LinkEstimator(LinkConfig(max_sample_age_s=5.0, **flat))
    kept = LinkEstimator(LinkConfig(max_sample_age_s=None, **flat))
    for est in (aged, kept):
        for t in range(4):
            est.add_rate(float(t), 2.0)  # a dip, one probe a second
        for t in range(4, 10):
            est.add_rate(float(t), 3.5)  # recovered, but below the 2x step ratio: no step reset
    assert kept.bandwidth_mbps() < 3.2  # the dip still weighs on the harmonic mean
    assert aged.bandwidth_mbps() == pytest.approx(3.5)
    assert aged.samples >= 2
    # the newest two always stay, however old
    lone = LinkEstimator(LinkConfig(max_sample_age_s=1.0))
    lone.add_rate(0.0, 3.0)
    lone.add_rate(100.0, 5.0)
    assert lone.samples == 2


def test_a_change_below_the_step_ratio_is_followed_from_the_newest_sample() -> None:
    """The rig's HSDPA windows change 1.2-2x a second (no step): 4 requests a second must price the next
    with the rate they just met, not with the last two seconds'."""
    est = LinkEstimator()
    flat = LinkEstimator(LinkConfig(recency_half_life_s=None))
    for e in (est, flat):
        for k in range(8):
            e.add_rate(0.25 * k, 2.0)
        e.add_rate(2.0, 3.0)
    assert est.steps == flat.steps == 0
    assert est.bandwidth_mbps() > 2.5  # over half the way after one sample
    assert flat.bandwidth_mbps() < 2.1  # the window of 8 alone: a ninth of the way
    for e in (est, flat):
        e.add_rate(2.25, 3.0)
    assert est.bandwidth_mbps() >= 0.93 * 3.0
    assert flat.bandwidth_mbps() < 0.75 * 3.0
    with pytest.raises(ConfigError, match="recency_half_life_s"):
        LinkConfig(recency_half_life_s=0.0)


def test_a_probe_measures_a_transfer_longer_than_the_rtt_jitter() -> None:
    from splitrt.plan.observe import probe_bandwidth

    # 1 MiB over 10 ms +-0.5 ms of RTT, in 110 ms: 100 ms of transfer, 84 Mbit/s
    p = probe_bandwidth([0.0095, 0.010, 0.0105, 0.010, 0.0101], [0.112, 0.110, 0.111], 1 << 20)
    assert p.resolved and p.bandwidth_mbps == pytest.approx(8.388608 / 0.1) and p.rtt_ms == pytest.approx(10.0)
    assert "Mbit/s" in p.note(1 << 20) and "not measurable" not in p.note(1 << 20)


@pytest.mark.parametrize("loaded_s", [0.000401, 0.0004, 0.0003])  # a hair above, equal to, below the RTT
def test_a_probe_lost_in_the_jitter_is_not_measured_and_bounded(loaded_s: float) -> None:
    """Loopback: 1 MiB comes back about as fast as an empty probe. The old estimate divided by
    max(transfer, 1 us): 8.4 Tbit/s, "measured". Now: not resolved, and planned at the least rate consistent
    with a transfer hidden in the RTT's jitter (here 0.1 ms): 8.39 Mbit over 0.5 ms."""
    from splitrt.plan.observe import PROBE_RESOLVE, probe_bandwidth

    p = probe_bandwidth([0.0004, 0.00035, 0.00045, 0.0004, 0.0004], [loaded_s, 0.002], 1 << 20)
    assert not p.resolved and p.jitter_ms == pytest.approx(0.1)
    assert p.bandwidth_mbps == pytest.approx(8.388608 / ((PROBE_RESOLVE + 1) * 1e-4))
    assert p.bandwidth_mbps < 20_000
    assert "not measurable by a 1048576 B probe" in p.note(1 << 20)
    stalled = probe_bandwidth([0.0004, 0.00035, 0.07, 0.0004, 0.0004], [loaded_s, 0.002], 1 << 20)
    assert stalled.jitter_ms == pytest.approx(0.1)  # one stalled round trip is not the timer's resolution
    with pytest.raises(PlanError, match="expected RTT and loaded samples"):
        probe_bandwidth([], [0.1], 1)
