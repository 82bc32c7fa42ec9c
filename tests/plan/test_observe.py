"""plan.observe: replies, probes and local runs become estimator samples; the probe schedule. Pure: every
time is passed in, no sockets, no sleeps."""

from __future__ import annotations

import pytest

from splitrt.errors import PlanError
from splitrt.plan import observe
from splitrt.plan.netmon import LinkConfig, LinkEstimator, LoadEstimator
from splitrt.plan.queueing import QueueEstimator


def _reply(**kw: float) -> observe.ReplyObservation:
    base: dict[str, float] = dict(bytes_up=1_000_000, bytes_down=4_000, net_s=0.5, tail_s=0.02, profiled_tail_s=0.01)
    base.update(kw)
    return observe.ReplyObservation(**base)  # type: ignore[arg-type]


def test_a_reply_feeds_the_link_with_both_directions_and_the_tail_factor() -> None:
    link, load = LinkEstimator(LinkConfig()), LoadEstimator()
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.01), 0.0)
    observe.observe_reply(_reply(), 1.0, link=link, load=load)
    # 1.004 MB in 0.5 s minus the 10 ms RTT: 8.032 Mbit / 0.49 s
    assert link.samples == 1
    assert link.bandwidth_mbps() == pytest.approx(1_004_000 * 8 / 1e6 / 0.49, rel=1e-6)
    assert load.estimate(1.0).cloud_factor == 1.0  # one spike is not load (median of 3) ...
    observe.observe_reply(_reply(), 1.1, link=link, load=load)
    # ... the tail taking twice its profiled time again is: the cloud factor moves up from 1
    assert load.estimate(1.1).cloud_factor > 1.1


def test_a_replys_wait_behind_the_devices_own_probe_is_not_the_links() -> None:
    link, load = LinkEstimator(LinkConfig()), LoadEstimator()
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.01), 0.0)
    # 0.3 s of the 0.5 s were spent queued behind our bandwidth probe: 1.004 MB in 0.2 s minus the RTT
    observe.observe_reply(_reply(probe_wait_s=0.3), 1.0, link=link, load=load)
    assert link.bandwidth_mbps() == pytest.approx(1_004_000 * 8 / 1e6 / 0.19, rel=1e-6)


def test_a_reply_of_a_path_without_its_own_link_feeds_only_the_load() -> None:
    load = LoadEstimator()
    for t in (1.0, 1.1):  # the wait counts with the tail: (10 + 30) ms over 10 ms profiled
        observe.observe_reply(_reply(tail_s=0.03, profiled_tail_s=0.01, queue_wait_s=0.01), t, link=None, load=load)
    assert load.estimate(1.1).cloud_factor > 1.3


def test_a_server_part_the_profile_gives_no_time_feeds_no_load_sample() -> None:
    link, load = LinkEstimator(LinkConfig()), LoadEstimator()
    for t in (1.0, 1.1, 1.2):
        observe.observe_reply(_reply(profiled_tail_s=0.0, tail_s=5.0), t, link=link, load=load)
    assert load.estimate(1.2).cloud_factor == 1.0  # untouched (samples would have raised it to the cap)
    assert link.samples == 3


def test_a_negative_network_time_counts_as_zero_not_as_an_error() -> None:
    link, load = LinkEstimator(LinkConfig()), LoadEstimator()
    observe.observe_reply(_reply(net_s=-0.002), 1.0, link=link, load=load)  # clocks of two hosts
    assert link.samples == 0 and link.ignored == 1


def test_probes_become_rtt_or_transfer_samples_by_size() -> None:
    link = LinkEstimator(LinkConfig())
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.08), 0.0)
    assert link.rtt_ms() == pytest.approx(80.0) and link.samples == 0
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=500_000, bytes_down=64, seconds=0.48), 0.5)
    assert link.samples == 1
    assert link.bandwidth_mbps() == pytest.approx(500_064 * 8 / 1e6 / 0.4, rel=1e-6)


def test_a_timed_out_bandwidth_probe_caps_the_rate() -> None:
    link = LinkEstimator(LinkConfig(prior_bandwidth_mbps=50.0))
    observe.observe_probe_timeout(link, observe.ProbeTimeout(bytes_up=1_000_000, timeout_s=4.0), 2.0)
    assert link.bandwidth_mbps() == pytest.approx(2.0)


def test_a_load_report_of_our_own_reply_does_not_count_our_request() -> None:
    own, other = QueueEstimator(), QueueEstimator()
    report = observe.QueueReport(queue_depth=3, workers=1, service_ms=100.0)
    observe.observe_queue(own, report, 1.0, own=True)
    observe.observe_queue(other, report, 1.0, own=False)
    assert 0 < own.estimate(1.0) < other.estimate(1.0)


def test_local_runs_and_device_samples_feed_the_device_factor() -> None:
    load = LoadEstimator()
    for t in (0.0, 0.25, 0.5):
        observe.observe_device(load, observe.DeviceSample(other_util=0.5), t)
    assert load.estimate(0.5).device_factor > 1.3  # half the CPU taken: towards 2
    slow = LoadEstimator()
    for k in range(10):  # heads take 1.5x their profiled time on an idle device: the board is slower
        observe.observe_local(slow, observe.LocalRun(measured_ms=150.0, profiled_ms=100.0), float(k))
    assert slow.estimate(10.0).device_factor > 1.3


def test_a_device_sample_net_of_our_own_share_is_clipped_to_a_fraction() -> None:
    load = LoadEstimator()
    observe.observe_device(load, observe.DeviceSample(other_util=-0.05), 0.0)  # psutil: total < own
    assert load.estimate(0.0).device_factor == pytest.approx(1.0)
    with pytest.raises(PlanError):  # the estimator alone refuses it
        load.add_device(0.0, other_util=-0.05)


def test_a_stale_link_is_probed_and_a_fresh_one_is_not() -> None:
    link = LinkEstimator(LinkConfig())
    due, state = observe.probe_due(link, observe.ProbeState(), 0.0)
    assert due and state.waits == 0
    # the probe went out: not asked again at once
    assert observe.probe_due(link, state, 0.01)[0] is False
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.05), 0.1)
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=200_000, bytes_down=64, seconds=0.2), 0.3)
    assert observe.probe_due(link, state, 0.4)[0] is False  # both estimates fresh
    later = 0.3 + LinkConfig().probe_after_s + 1.0
    assert observe.probe_due(link, state, later)[0] is True


def test_a_due_probe_waits_for_an_idle_link_but_not_for_ever() -> None:
    link = LinkEstimator(LinkConfig())
    state = observe.ProbeState()
    for k in range(observe.IDLE_WAIT_ROUNDS):
        due, state = observe.probe_due(link, state, 0.25 * k, link_busy=True)
        assert not due and state.waits == k + 1
    due, state = observe.probe_due(link, state, 2.0, link_busy=True)
    assert due and state.waits == 0  # a queued RTT sample beats none


def _paced(period_s: float, n: int) -> observe.RequestPace:
    pace = observe.RequestPace()
    for k in range(n):
        pace.started(k * period_s)
    return pace


def test_the_pace_expects_the_next_request_of_a_steady_flow_only() -> None:
    assert _paced(0.25, observe.PACE_SAMPLES - 1).gap_s(0.6) is None  # too few starts to tell
    pace = _paced(0.25, 6)  # starts at 0 .. 1.25 s
    assert pace.gap_s(1.35) == pytest.approx(0.15)  # the next at 1.5 s
    assert pace.gap_s(1.6) == 0.0  # late: expected at once
    assert pace.gap_s(1.25 + observe.REQUEST_FLOW_S) is None  # the flow stopped
    assert _paced(1.5, 6).gap_s(7.6) is None  # further apart than REQUEST_FLOW_S: no flow to fit


def test_the_pace_counts_every_request_and_the_link_is_free_after_one_that_did_not_send() -> None:
    # the rig: after a run on the device the first cloud requests met the probes (80 ms), the pace then
    # being known only after four requests that sent
    pace = observe.RequestPace()
    for k in range(6):
        pace.started(k * 0.25, sends=False)  # a run on the device
    assert pace.gap_s(1.3) is None  # the link is idle: any time suits a probe
    pace.started(1.5)  # the plan switches to the link: its pace is known at once
    assert pace.gap_s(1.6) == pytest.approx(0.15)


def test_while_requests_flow_a_probe_goes_right_after_a_reply_into_a_gap_that_fits() -> None:
    def due(since_reply_s: float, gap_s: float | None) -> tuple[bool, observe.ProbeState]:
        link = LinkEstimator(LinkConfig())  # RTT 80 ms, every estimate stale at 5 s: a probe is due
        observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.08), 0.0)
        return observe.probe_due(link, observe.ProbeState(), 5.0, last_reply_s=5.0 - since_reply_s, gap_s=gap_s)

    assert due(0.01, 0.14)[0]  # just after a reply, 140 ms ahead (> 1 RTT): idle
    assert due(0.1, 0.14) == (False, observe.ProbeState(waits=1))  # 100 ms after it: the next request is near
    assert not due(0.01, 0.02)[0]  # just after a reply, but requests back to back: waits, as on a busy link
    assert due(0.1, None)[0]  # no known pace: the reply alone does not hold it
    # an RTT probe alone (bandwidth fresh) costs the next request nothing: it goes whenever due
    link = LinkEstimator(LinkConfig())
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.08), 0.0)
    observe.observe_reply(_reply(), 4.9, link=link, load=LoadEstimator())
    assert observe.probe_due(link, observe.ProbeState(), 5.0, last_reply_s=4.9, gap_s=0.14)[0]


def test_a_probe_in_a_gap_goes_before_its_rtt_probe_and_fits_the_gap() -> None:
    link = LinkEstimator(LinkConfig(prior_bandwidth_mbps=10.0))
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.08), 0.0)
    now = 1.0  # no bandwidth sample: the bandwidth probe first while requests flow, else the RTT probe
    assert observe.bandwidth_first(link, now, flowing=True)
    assert not observe.bandwidth_first(link, now, flowing=False)
    assert observe.rtt_stale(link, now)  # its RTT probe follows (an RTT sample 1 s old)
    assert not observe.rtt_stale(link, 0.1)
    full = observe.bandwidth_probe(link, now)
    fitted = observe.bandwidth_probe(link, now, gap_s=0.14)
    assert full is not None and fitted is not None
    assert full.bytes_up == int(10e6 / 8 * 0.16)  # 2 RTTs
    assert fitted.bytes_up == int(10e6 / 8 * 0.06)  # what the gap leaves after one RTT
    roomy = LinkEstimator(LinkConfig(prior_bandwidth_mbps=40.0))
    observe.observe_probe(roomy, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.08), 0.0)
    got = observe.bandwidth_probe(roomy, now, gap_s=0.14)
    assert got is not None and got.bytes_up == int(40e6 / 8 * 0.06)  # the gap less one RTT
    tight = observe.bandwidth_probe(roomy, now, gap_s=0.05)
    assert tight is not None and tight.bytes_up == int(40e6 / 8 * 0.04)  # never below half an RTT


def test_a_down_server_is_probed_even_on_a_fresh_busy_link() -> None:
    link = LinkEstimator(LinkConfig())
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.05), 0.0)
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=200_000, bytes_down=64, seconds=0.2), 0.0)
    assert observe.probe_due(link, observe.ProbeState(), 0.1, link_busy=True)[0] is False
    due, _ = observe.probe_due(link, observe.ProbeState(), 0.1, up=False, link_busy=True)
    assert due


def test_the_bandwidth_probe_takes_about_two_rtts_at_the_estimate() -> None:
    link = LinkEstimator(LinkConfig(prior_bandwidth_mbps=10.0))
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.1), 0.0)
    bw = observe.bandwidth_probe(link, 0.0)
    assert bw is not None
    assert bw.rtt_s == pytest.approx(0.1)
    assert bw.bytes_up == int(10e6 / 8 * 0.2)  # 2 RTTs at 10 Mbit/s
    # a fast link: clipped to the largest probe
    fast = LinkEstimator(LinkConfig(prior_bandwidth_mbps=1000.0))
    observe.observe_probe(fast, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.1), 0.0)
    assert observe.bandwidth_probe(fast, 0.0) == observe.BandwidthProbe(
        bytes_up=observe.BANDWIDTH_PROBE_MAX_BYTES, rtt_s=pytest.approx(0.1)
    )


def test_no_bandwidth_probe_while_transfers_keep_bandwidth_fresh() -> None:
    link = LinkEstimator(LinkConfig())
    observe.observe_probe(link, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.05), 0.0)
    observe.observe_reply(_reply(), 0.5, link=link, load=LoadEstimator())
    assert observe.bandwidth_probe(link, 0.6) is None
    assert observe.bandwidth_probe(link, 0.5 + LinkConfig().probe_after_s) is not None


@pytest.mark.parametrize(
    ("pairs", "busy", "twice"), [(True, False, True), (True, True, False), (False, False, False), (False, True, False)]
)
def test_a_bandwidth_probe_goes_twice_only_after_idle_on_a_kernel_that_restarts(
    pairs: bool, busy: bool, twice: bool
) -> None:
    assert observe.probe_twice(pairs=pairs, link_busy=busy) is twice


def test_a_relay_probe_sizes_each_hop_and_marks_every_hop_probed() -> None:
    fresh, stale = LinkEstimator(LinkConfig()), LinkEstimator(LinkConfig(prior_bandwidth_mbps=10.0))
    for t in (0.0, 0.1):
        observe.observe_probe(fresh, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.02), t)
        observe.observe_probe(fresh, observe.ProbeObservation(bytes_up=300_000, bytes_down=64, seconds=0.3), t)
    assert observe.relay_probe_sizes((fresh,), 0.2) is None  # nothing stale, no tier due
    # the second hop has no sample: an RTT probe first (no RTT to size a bandwidth probe against)
    assert observe.relay_probe_sizes((fresh, stale), 0.2) == (64, 64)
    assert observe.relay_probe_sizes((fresh, stale), 0.21) is None  # just probed: not again at once
    observe.observe_probe(stale, observe.ProbeObservation(bytes_up=64, bytes_down=64, seconds=0.05), 0.3)
    later = 0.3 + LinkConfig().min_probe_interval_s
    sizes = observe.relay_probe_sizes((fresh, stale), later)
    assert sizes is not None and sizes[1] == stale.suggest_probe_bytes() > 64
    # a tier due a revival is probed even when every hop is fresh
    assert observe.relay_probe_sizes((fresh,), 0.2, tier_due=True) is not None
