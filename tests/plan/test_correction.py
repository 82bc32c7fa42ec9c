"""The self-correcting cost model: per-plan corrections (unit), the controller using them, replay from the
log, and bounded regret in simulation when one plan's real cost is 1.5x its price (hypothesis)."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from splitrt.errors import ConfigError, PlanError
from splitrt.plan.controller import Controller, ControllerConfig
from splitrt.plan.correction import CorrectionConfig, Corrections, Observation, draws_probes, evidence_key
from splitrt.plan.costmodel import CostTable
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.replay import replay
from splitrt.rig import sim, traces

LINK = LinkEstimate(bandwidth_mbps=10.0, rtt_ms=20.0, confidence=1.0)
LOAD = LoadEstimate(device_factor=1.0, cloud_factor=1.0)


def _table(**kw: object) -> CostTable:
    args: dict[str, object] = {
        "ids": ["cloud", "mid", "device"],
        "head_ms": [0.0, 60.0, 200.0],
        "tail_ms": [40.0, 20.0, 0.0],
        "bytes": [100_000, 10_000, 0],
        "reply_bytes": 4000,
        "codecs": {"fp32": 1.0},
    }
    return CostTable(**(args | kw))  # type: ignore[arg-type]


def test_a_dearer_plan_is_learnt_within_a_few_requests_and_decays_back() -> None:
    c = Corrections(CorrectionConfig(half_life_s=10.0, weight=0.5))
    for i in range(3):
        obs = Observation(plan="cloud@fp32", predicted_ms=5.0, measured_ms=105.0, t_s=2.0, price_ms=400.0)
        assert c.observe(obs) == i
    assert c.seen == 3
    assert c.offset_ms("cloud@fp32", 2.0) == pytest.approx(87.5)  # 50, 75, 87.5 % of the 100 ms excess
    assert c.offset_ms("mid@fp32", 2.0) == 0.0  # no evidence: the model's own price
    assert c.offset_ms("cloud@fp32", 12.0) == pytest.approx(87.5 / 2)  # one half-life later
    # one request that costs what it was priced brings it back down
    c.observe(Observation(plan="cloud@fp32", predicted_ms=5.0, measured_ms=5.0, t_s=12.0, price_ms=400.0))
    assert c.offset_ms("cloud@fp32", 12.0) == pytest.approx(87.5 / 4)
    # no plan costs less than nothing
    c.observe(Observation(plan="mid@fp32", predicted_ms=5.0, measured_ms=-50.0, t_s=12.0, price_ms=400.0))
    assert c.offset_ms("mid@fp32", 12.0) == pytest.approx(-2.5)
    # a lone outlier moves a plan by min_step_ms; confirmed by its next request, by at most 15 % of its price
    c.observe(Observation(plan="mid@fp32", predicted_ms=5.0, measured_ms=900.0, t_s=12.0, price_ms=200.0))
    assert c.offset_ms("mid@fp32", 12.0) == pytest.approx(-2.5 + 5.0)
    c.observe(Observation(plan="mid@fp32", predicted_ms=5.0, measured_ms=900.0, t_s=12.0, price_ms=200.0))
    assert c.offset_ms("mid@fp32", 12.0) == pytest.approx(-2.5 + 5.0 + 30.0)


def test_a_lone_slow_request_does_not_price_its_plan_out() -> None:
    # the rig's device-load burst: one encode took 82 ms where 2 were priced; jpeg75 is priced 10 ms above
    # jpeg50, inside the hysteresis margin: a 30 ms step sent adaptive to jpeg75 for the rest of the cell
    ctl = Controller(_table(ids=["cloud", "device"], head_ms=[0.0, 400.0], tail_ms=[40.0, 0.0], bytes=[10_000, 0]))
    c = ctl.corrections
    for i in range(4):
        c.observe(Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=2.0, t_s=i * 0.25, price_ms=200.0))
    c.observe(Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=84.0, t_s=1.0, price_ms=200.0))
    assert c.offset_ms("cloud@fp32", 1.0) == pytest.approx(5.0, abs=0.1)
    # what it was priced again: the outlier is gone within a few requests
    for _ in range(4):
        c.observe(Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=2.0, t_s=1.25, price_ms=200.0))
    assert abs(c.offset_ms("cloud@fp32", 1.25)) < 1.0
    # slow twice in a row: confirmed, learnt as fast as before (two bounded steps)
    for _ in range(2):
        c.observe(Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=84.0, t_s=1.5, price_ms=200.0))
    assert c.offset_ms("cloud@fp32", 1.5) > 30.0
    # and a lone fast one does not price it back in at once either
    c.observe(Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=-300.0, t_s=1.5, price_ms=200.0))
    assert c.offset_ms("cloud@fp32", 1.5) > 25.0


def test_a_request_that_cost_its_price_is_no_outlier_after_slow_ones() -> None:
    # sim, busy board (a quarter of the calls stalled 50 ms): stalls in a row priced cloud@jpeg50 30 ms up;
    # the next request cost its price but, its step beyond the bound, moved the mean by min_step_ms only,
    # and adaptive fled to a split 20 ms dearer for the rest of the run (1.05x the routers)
    cfg = CorrectionConfig()
    c = Corrections(cfg)
    slow = Observation(plan="cloud@jpeg50", predicted_ms=1.3, measured_ms=81.3, t_s=1.0, price_ms=117.0)
    for _ in range(3):
        c.observe(slow)
    high = c.offset_ms("cloud@jpeg50", 1.0)
    bound = cfg.max_step_fraction * 117.0
    assert cfg.weight * high > bound > cfg.min_step_ms  # the step back is beyond the bound
    c.observe(Observation(plan="cloud@jpeg50", predicted_ms=1.3, measured_ms=1.3, t_s=1.0, price_ms=117.0))
    assert c.offset_ms("cloud@jpeg50", 1.0) == pytest.approx(high - bound)  # a whole bounded step, the plan's
    # a request far below its price is still an outlier: held to min_step_ms until a second confirms it
    d = Corrections(cfg)
    for _ in range(3):
        d.observe(slow)
    d.observe(Observation(plan="cloud@jpeg50", predicted_ms=40.0, measured_ms=0.0, t_s=1.0, price_ms=117.0))
    assert d.offset_ms("cloud@jpeg50", 1.0) == pytest.approx(high - cfg.min_step_ms)


def test_an_image_codecs_quality_variants_share_what_their_requests_cost_beyond_the_price() -> None:
    # a demo run's device-load burst: two encodes of cloud@jpeg50 took 22 and 62 ms where 3 were priced; kept
    # per plan, jpeg75 (~10 ms dearer on the link, no such evidence) became the best and was held
    codecs = {"fp32": 1.0, "jpeg50": 0.1, "jpeg75": 0.15, "fp16": 0.5}
    ctl = Controller(
        _table(ids=["cloud", "device"], head_ms=[0.0, 600.0], tail_ms=[90.0, 0.0], bytes=[150_528, 0], codecs=codecs),
        ControllerConfig(codecs=("jpeg50", "jpeg75", "fp16")),
    )
    assert ctl.decide(0.0, LINK, LOAD).plan == "cloud@jpeg50"
    for t, took in ((0.25, 22.0), (0.5, 62.0)):
        ctl.observe(Observation(plan="cloud@jpeg50", predicted_ms=3.0, measured_ms=took, t_s=t, price_ms=120.0))
    c = ctl.corrections
    assert c.offset_ms("cloud@jpeg50", 0.5) > 10.0  # learnt ...
    assert c.offset_ms("cloud@jpeg75", 0.5) == c.offset_ms("cloud@jpeg50", 0.5)  # ... for both qualities
    # another codec's encoder is its own evidence: fp16 carries only what an outlier left to every call
    assert c.offset_ms("cloud@fp16", 0.5) == c.shared_ms(0.5) < c.offset_ms("cloud@jpeg50", 0.5) - 10.0
    assert c.offsets(0.5, ["jpeg50", "jpeg75", "fp16", "webp75"]) == {
        "cloud@jpeg50": c.offset_ms("cloud@jpeg50", 0.5),
        "cloud@jpeg75": c.offset_ms("cloud@jpeg50", 0.5),
    }
    d = ctl.decide(0.75, LINK, LOAD)
    assert d.plan == "cloud@jpeg50" and d.correction_ms > 10.0
    # what a plan sends still depends on its quality: that evidence stays per plan
    sent = Observation(plan="cloud@jpeg75", predicted_ms=3.0, measured_ms=3.0, t_s=1.0, sent_bytes=2, priced_bytes=1)
    c.observe(sent)
    assert c.bytes_ratio("cloud@jpeg75") == 2.0 and c.bytes_ratio("cloud@jpeg50") == 1.0
    plans = ("cloud@webp90", "c3@jpeg50>c9@fp16", "device", "c3@int8+zstd", "cloud@avif60", "c7@png9")
    assert [evidence_key(p) for p in plans] == [
        "cloud@webp",
        "c3@jpeg>c9@fp16",
        "device",
        "c3@int8+zstd",
        "cloud@avif",  # every image codec the planner knows (``costmodel.IMAGE_CODECS``)
        "c7@png",
    ]


def test_an_outlier_is_left_mostly_to_every_plan_that_calls_a_server() -> None:
    # the rig's busy board: a quota period lands on about one remote call in four, whatever the plan. Kept per
    # plan, two in a row priced the plan in use ~20 ms up, the plans without evidence looked cheaper by as
    # much, and adaptive ran through splits the routers never tried (1.13-1.19x the best router)
    cfg = CorrectionConfig()
    c = Corrections(cfg)
    slow = Observation(plan="cloud@jpeg50", predicted_ms=3.0, measured_ms=63.0, t_s=1.0, price_ms=110.0)
    c.observe(slow)  # a lone outlier: min_step_ms, mostly shared
    assert c.offset_ms("cloud@jpeg50", 1.0) == pytest.approx(5.0)
    assert c.shared_ms(1.0) == pytest.approx(cfg.shared_fraction * 5.0)
    c.observe(slow)  # confirmed: the bound, 15 % of 110 ms, mostly shared too
    assert c.offset_ms("cloud@jpeg50", 1.0) == pytest.approx(5.0 + 16.5)
    # a split without evidence of its own carries the shared part: it is no cheaper for the outliers
    assert c.offset_ms("c5@jpeg50", 1.0) == c.shared_ms(1.0) == pytest.approx(cfg.shared_fraction * 21.5)
    assert c.offset_ms("device", 1.0) == 0.0  # no call, no share of a call's outliers
    # the shared part goes stale faster than a plan's own evidence (``shared_half_life_s``)
    assert c.shared_ms(1.0 + cfg.shared_half_life_s) == pytest.approx(c.shared_ms(1.0) / 2)
    # an excess within the step's bound is the plan's own: nothing of it is shared
    d = Corrections(cfg)
    d.observe(Observation(plan="mid@fp32", predicted_ms=3.0, measured_ms=13.0, t_s=1.0, price_ms=110.0))
    assert d.offset_ms("mid@fp32", 1.0) == pytest.approx(5.0) and d.shared_ms(1.0) == 0.0
    with pytest.raises(ConfigError, match="shared_fraction"):
        CorrectionConfig(shared_fraction=1.0)
    with pytest.raises(ConfigError, match="shared_half_life_s"):
        CorrectionConfig(shared_half_life_s=0.0)


def test_outliers_every_plan_meets_do_not_send_adaptive_through_the_plans_it_has_not_tried() -> None:
    # cloud and mid priced within the hysteresis, a quarter of the remote calls stalled 60 ms on the device
    # (sim ``stalls``): the plan in use meets them, the other does not until it runs. Kept per plan, the
    # evidence made adaptive alternate; shared, it holds the plan the routers would
    table = _table(head_ms=[0.0, 30.0, 400.0], tail_ms=[40.0, 10.0, 0.0], bytes=[60_000, 50_000, 0])
    link = traces.constant(10.0, 80.0)
    shared = CorrectionConfig().shared_fraction
    runs = {}
    for fraction in (0.0, shared):
        cc = ControllerConfig(codecs=None, correction=CorrectionConfig(shared_fraction=fraction))
        ratios, switches = [], []
        for seed in range(6):  # each seed stalls the same requests in every strategy
            cfg = sim.SimConfig(duration_s=30.0, rtt_ms=40.0, stalls=(0.25, 60.0), seed=seed, controller=cc)
            rs = sim.simulate(table, "adaptive", link, cfg)
            fixed = [sim.latencies(sim.simulate(table, f"fixed:{p}", link, cfg)) for p in ("cloud@fp32", "mid@fp32")]
            ratios.append(statistics.fmean(sim.latencies(rs)) / min(statistics.fmean(f) for f in fixed))
            switches.append(sum(a.plan != b.plan for a, b in itertools.pairwise(rs)))
        runs[fraction] = (statistics.fmean(ratios), statistics.fmean(switches))
    assert runs[shared][1] < runs[0.0][1] and runs[shared][0] < runs[0.0][0], runs
    assert runs[shared][0] <= 1.01, runs


def test_requests_timed_while_the_load_estimate_lags_are_no_evidence() -> None:
    # a device-load burst's first requests, priced at the load before it: any plan would have met them
    c = Corrections()
    for lag in (0.5, 0.8, 0.31):
        c.observe(
            Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=84.0, t_s=1.0, price_ms=200.0, load_lag=lag)
        )
    assert c.seen == 3 and c.offset_ms("cloud@fp32", 1.0) == 0.0
    # a lag within the bound counts: two slow requests in a row are learnt as before
    for _ in range(2):
        c.observe(
            Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=84.0, t_s=1.0, price_ms=200.0, load_lag=0.3)
        )
    assert c.offset_ms("cloud@fp32", 1.0) > 30.0
    # the bytes a lagging request sent still count: they are no load's
    mid = Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=1.0)
    c.observe(replace(mid, sent_bytes=20.0, priced_bytes=10.0, load_lag=1.0))
    # (mid has no excess of its own: it carries only the part cloud's outliers left to every call)
    assert c.bytes_ratio("mid@fp32") == 2.0 and c.offset_ms("mid@fp32", 1.0) == c.shared_ms(1.0) > 0
    # a looser bound learns from them
    loose = Corrections(CorrectionConfig(max_load_lag=2.0))
    loose.observe(
        Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=12.0, t_s=1.0, price_ms=200.0, load_lag=1.0)
    )
    assert loose.offset_ms("cloud@fp32", 1.0) == pytest.approx(5.0)
    o = Observation(plan="cloud@fp32", predicted_ms=2.0, measured_ms=84.0, t_s=1.0, load_lag=0.75)
    assert Observation.from_json(o.to_json()) == o
    assert Observation.from_json({k: v for k, v in o.to_json().items() if k != "load_lag"}).load_lag == 0.0
    with pytest.raises(ConfigError, match="max_load_lag"):
        CorrectionConfig(max_load_lag=0.0)
    with pytest.raises(PlanError, match="load_lag"):
        Observation(plan="cloud@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, load_lag=-0.1)


def test_the_wait_behind_the_devices_own_probes_is_priced_at_its_mean() -> None:
    # one request in four queues 160 ms behind a bandwidth probe: the plan's mean wait is ~40 ms, which the
    # excess's 15 % step bound (an outlier's) would not learn
    c = Corrections()
    for n in range(40):
        wait = 160.0 if n % 4 == 3 else 0.0
        c.observe(
            Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, price_ms=150.0, probe_wait_ms=wait)
        )
    assert 20.0 < c.offset_ms("mid@fp32", 0.0) < 70.0
    assert c.offsets(0.0) == {"mid@fp32": c.offset_ms("mid@fp32", 0.0)}
    assert c.offset_ms("mid@fp32", 10.0) == pytest.approx(c.offset_ms("mid@fp32", 0.0) / 2)  # it decays alike
    # a probe sized at a wrong estimate (1.6 s on the wire) counts as at most the plan's price
    c = Corrections()
    c.observe(Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, price_ms=150.0))
    c.observe(
        Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, price_ms=150.0, probe_wait_ms=1600.0)
    )
    assert c.offset_ms("mid@fp32", 0.0) == pytest.approx(0.2 * 150.0)
    o = Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, probe_wait_ms=12.5)
    assert Observation.from_json(o.to_json()) == o
    with pytest.raises(PlanError, match="probe_wait_ms"):
        Observation(plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, probe_wait_ms=-1.0)


def test_the_probe_an_idle_link_drew_is_not_the_plans() -> None:
    # requests back to back (4 Hz, 150 ms each): the probes they meet are the plan's making
    def req(t_s: float, wait: float) -> Observation:
        return Observation(
            plan="mid@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=t_s, price_ms=150.0, probe_wait_ms=wait
        )

    c = Corrections()
    c.observe(req(0.15, 120.0))  # the first request: the link's first probe, any plan's
    assert c.offset_ms("mid@fp32", 0.15) == 0.0
    c.observe(req(0.40, 120.0))
    assert c.offset_ms("mid@fp32", 0.40) == pytest.approx(0.2 * 120.0)
    # a request that starts 2 s after the last ended: the estimate went stale by idling, not by the plan
    before = c.offset_ms("mid@fp32", 2.55)
    c.observe(req(2.55, 150.0))
    assert c.offset_ms("mid@fp32", 2.55) == pytest.approx(before)
    # within idle_gap_s it counts again
    c.observe(req(2.80, 150.0))
    assert c.offset_ms("mid@fp32", 2.80) > before + 20.0
    # a longer idle_gap_s counts a request after 2 s idle as back to back
    loose = Corrections(CorrectionConfig(idle_gap_s=10.0))
    loose.observe(req(0.15, 0.0))
    loose.observe(req(2.55, 150.0))
    assert loose.offset_ms("mid@fp32", 2.55) == pytest.approx(0.2 * 150.0)
    with pytest.raises(ConfigError, match="idle_gap_s"):
        CorrectionConfig(idle_gap_s=-1.0)


def test_disabled_corrections_count_but_learn_nothing() -> None:
    c = Corrections(CorrectionConfig(enabled=False))
    c.observe(Observation(plan="cloud@fp32", predicted_ms=0.0, measured_ms=500.0, t_s=0.0))
    assert c.seen == 1 and c.offset_ms("cloud@fp32", 0.0) == 0.0 and c.offsets(0.0) == {}


def test_bad_config_and_observation_are_refused() -> None:
    with pytest.raises(ConfigError, match="half_life_s"):
        CorrectionConfig(half_life_s=0.0)
    with pytest.raises(ConfigError, match="weight"):
        CorrectionConfig(weight=1.5)
    with pytest.raises(PlanError, match="predicted_ms"):
        Observation(plan="device", predicted_ms=-1.0, measured_ms=0.0, t_s=0.0)
    with pytest.raises(PlanError, match="expected plan"):
        Observation.from_json({"plan": "device"})
    o = Observation(plan="c3@fp16", predicted_ms=1.5, measured_ms=7.25, t_s=3.0, price_ms=90.0)
    assert Observation.from_json(o.to_json()) == o


def test_the_controller_drops_a_plan_that_costs_more_than_its_price() -> None:
    ctl = Controller(_table())
    first = ctl.decide(0.0, LINK, LOAD)
    assert first.plan == "mid@fp32" and first.correction_ms == 0.0 and first.seen == 0
    t, plans = 0.0, []
    for _ in range(9):  # mid's requests take 60 ms more than priced (cloud is priced 32 ms above mid)
        d = ctl.decide(t, LINK, LOAD)
        plans.append(d.plan)
        extra = 60.0 if d.plan == "mid@fp32" else 0.0
        ctl.observe(Observation(plan=d.plan, predicted_ms=0.0, measured_ms=extra, t_s=t, price_ms=d.predicted_ms))
        t += 0.25
    # the first excess is an outlier until the second confirms it, and the outliers' steps are mostly left to
    # every call (cloud's too) until the excess proves to be mid's own: dropped after six requests
    assert plans[:6] == ["mid@fp32"] * 6 and "mid@fp32" not in plans[6:], plans
    d = ctl.decide(t, LINK, LOAD)
    # the correction is a term of its own: the terms still add up to the prediction
    assert d.correction_ms == ctl.corrections.offset_ms(d.plan, t)
    total = d.device_ms + d.transfer_ms + d.download_ms + d.round_trip_ms + d.queue_ms + d.cloud_ms
    assert total + d.encode_ms + d.call_ms + d.decode_ms + d.correction_ms == pytest.approx(d.predicted_ms)
    # tried again once the evidence is old enough
    later = ctl.decide(t + 120.0, LINK, LOAD)
    assert later.plan == "mid@fp32"


def test_the_bytes_a_plan_sends_are_learnt_from_its_requests() -> None:
    c = Corrections()
    assert c.bytes_ratio("cloud@fp32") == 1.0 and c.bytes_plans() == []
    seen = Observation(
        plan="cloud@fp32", predicted_ms=1.0, measured_ms=1.0, t_s=0.0, sent_bytes=8000, priced_bytes=10000
    )
    c.observe(seen)
    assert c.bytes_ratio("cloud@fp32") == pytest.approx(0.8)  # the first frame's own ratio
    c.observe(replace(seen, sent_bytes=6000))
    assert c.bytes_ratio("cloud@fp32") == pytest.approx(0.7)  # half-way to the next one's
    c.observe(replace(seen, sent_bytes=0))  # not sent (a fallback): nothing learnt
    c.observe(replace(seen, t_s=1e6))  # no decay: a frame is what it is
    assert c.bytes_ratio("cloud@fp32") == pytest.approx(0.75)
    assert c.bytes_plans() == ["cloud@fp32"] and c.bytes_ratio("mid@fp32") == 1.0
    back = Observation.from_json(seen.to_json())
    assert (back.sent_bytes, back.priced_bytes) == (8000, 10000)
    old = {k: v for k, v in seen.to_json().items() if not k.endswith("_bytes")}  # a log line from before
    assert Observation.from_json(old).sent_bytes == 0.0
    with pytest.raises(PlanError, match="sent_bytes"):
        replace(seen, sent_bytes=-1.0)


def test_the_controller_prices_a_plans_upload_with_the_bytes_it_sent() -> None:
    """cloud@fp32 priced at 100 KB (80 ms at 10 Mbit/s): its requests send 40 KB, so it costs 48 ms less
    than the table says, and that makes it beat mid@fp32 (priced 32 ms below it)."""
    ctl = Controller(_table())
    assert ctl.decide(0.0, LINK, LOAD).plan == "mid@fp32"
    cloud = ctl.evaluate(ctl.route(*ctl.inputs(LINK, LOAD, True)), "cloud@fp32")
    ctl.observe(
        Observation(plan="cloud@fp32", predicted_ms=0.0, measured_ms=0.0, t_s=0.0, sent_bytes=40e3, priced_bytes=100e3)
    )
    d = ctl.decide(0.5, LINK, LOAD)
    assert d.plan == "cloud@fp32"
    assert d.correction_ms == pytest.approx(-0.6 * 100_000 * 8 / 10e6 * 1e3)
    assert d.predicted_ms == pytest.approx(cloud.predicted_ms - 48.0)


def test_replay_rebuilds_the_corrections_from_the_logged_observations() -> None:
    table = _table()
    ctl = Controller(table)
    lines = []
    t = 0.0
    for i in range(30):
        bw = 10.0 if i % 10 < 6 else 1.0
        d = ctl.decide(t, LinkEstimate(bandwidth_mbps=bw, rtt_ms=20.0, confidence=1.0), LOAD, request=f"r{i}")
        extra = 120.0 if d.plan == "mid@fp32" else 3.0
        sent = 60_000.0 if d.plan == "cloud@fp32" else 0.0  # cloud's frames weigh 0.6 of their price
        obs = Observation(
            plan=d.plan,
            predicted_ms=d.encode_ms + d.call_ms,
            measured_ms=extra,
            t_s=t + 0.2,
            price_ms=d.predicted_ms,
            sent_bytes=sent,
            priced_bytes=100_000.0 if sent else 0.0,
        )
        index = ctl.observe(obs)
        lines.append(d.__class__(**{**d.__dict__, "extra": {"observed": {"index": index, **obs.to_json()}}}).to_json())
        t += 0.25
    logged = [d for d, _ in replay(lines, table)]
    assert any(d.correction_ms > 0 for d in logged) and len({d.plan for d in logged}) > 1
    pairs = replay(lines, table)
    assert [a.plan for a, b in pairs] == [b.plan for a, b in pairs]
    assert [a.correction_ms for a, b in pairs] == pytest.approx([b.correction_ms for a, b in pairs])
    # without the observations the corrections are not rebuilt, and the decisions differ
    bare = [line.replace('"observed"', '"unused"') for line in lines]
    assert [a.plan for a, b in replay(bare, table)] != [b.plan for a, b in replay(bare, table)]


PLANS = ("device", "cloud@fp32", "mid@fp32")


def _means(table: CostTable, cfg: sim.SimConfig, link: traces.Trace) -> tuple[float, dict[str, float]]:
    fixed = {p: statistics.fmean(sim.latencies(sim.simulate(table, f"fixed:{p}", link, cfg))) for p in PLANS}
    return statistics.fmean(sim.latencies(sim.simulate(table, "adaptive", link, cfg))), fixed


@settings(max_examples=25, deadline=None)
@given(
    head_mid=st.floats(20.0, 300.0),
    head_rest=st.floats(20.0, 400.0),
    tails=st.tuples(st.floats(5.0, 100.0), st.floats(5.0, 50.0)),
    sent=st.tuples(st.integers(10_000, 600_000), st.integers(1_000, 200_000)),
    encode=st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 10.0)),
    call_ms=st.floats(0.0, 5.0),
    mbps=st.floats(0.5, 30.0),
    rtt_ms=st.floats(5.0, 100.0),
    bad=st.sampled_from(PLANS),
    cost=st.floats(1.0, 1.5),
)
# mid's uploads are RTT-dominated, so bandwidth goes stale and probes (~150 ms on the wire) delay one request
# in four: unlearnt, mid was priced 220 for 262 and adaptive held it (cloud 211) at 1.24x
@example(
    head_mid=44.70763590172925,
    head_rest=304.3537790656768,
    tails=(86.70004005684376, 5.0),
    sent=(65060, 18064),
    encode=(0.0, 0.0),
    call_ms=0.0,
    mbps=12.590189848187965,
    rtt_ms=80.0,
    bad="mid@fp32",
    cost=1.5,
)
# a 5 KB mid request queued ~150 ms behind the device's own bandwidth probe: with that wait in the link's
# sample, 3 Mbit/s read as 0.4, mid was priced out and adaptive ran device (1.3x its price) 60 % of the time
@example(
    head_mid=60.0,
    head_rest=137.18955167281848,
    tails=(92.43313351540326, 37.84217588913392),
    sent=(600000, 1238),
    encode=(19.080717886722148, 1.4053242997932605),
    call_ms=0.0,
    mbps=3.0,
    rtt_ms=84.28568283748253,
    bad="device",
    cost=1.2981169970198727,
)
def test_regret_against_the_best_fixed_plan_is_bounded_when_one_plan_is_mispriced(
    head_mid: float,
    head_rest: float,
    tails: tuple[float, float],
    sent: tuple[int, int],
    encode: tuple[float, float],
    call_ms: float,
    mbps: float,
    rtt_ms: float,
    bad: str,
    cost: float,
) -> None:
    table = _table(
        head_ms=[0.0, head_mid, head_mid + head_rest],
        tail_ms=[*tails, 0.0],
        bytes=[*sent, 0],
        encode_ms={"fp32": [*encode, 0.0]},
        call_ms=call_ms,
    )
    cfg = sim.SimConfig(
        duration_s=60.0, rtt_ms=rtt_ms, plan_cost=((bad, cost),), controller=ControllerConfig(codecs=None)
    )
    link = traces.constant(mbps, 80.0)
    adaptive, fixed = _means(table, cfg, link)
    # The estimators' own regret (probes sharing a slow link with requests) is not the corrections' to
    # remove: at 0.5 Mbit/s adaptive can trail the best plan by 26 % with nothing mispriced. Bound what the
    # misprice adds: a few requests to learn it, one now and then to check it still holds.
    fair = statistics.fmean(sim.latencies(sim.simulate(table, "adaptive", link, replace(cfg, plan_cost=()))))
    assert adaptive <= 1.10 * max(min(fixed.values()), fair), (adaptive, fair, fixed)


def test_without_corrections_a_mispriced_plan_costs_its_whole_misprice() -> None:
    # mid is priced best (111 ms, cloud 143) but really costs 2x: the uncorrected controller keeps it
    table = _table()
    link = traces.constant(10.0, 80.0)
    regrets = {}
    for enabled in (True, False):
        cc = ControllerConfig(codecs=None, correction=CorrectionConfig(enabled=enabled))
        cfg = sim.SimConfig(duration_s=60.0, rtt_ms=20.0, plan_cost=(("mid@fp32", 2.0),), controller=cc)
        adaptive, fixed = _means(table, cfg, link)
        regrets[enabled] = adaptive / min(fixed.values())
    assert regrets[False] > 1.3 and regrets[True] < 1.10, regrets


def test_a_plan_whose_uploads_refresh_bandwidth_is_not_charged_the_probes_it_meets() -> None:
    """The rig's hsdpa/train inception_v1 device-burst cell: a cloud@jpeg90 request (97 ms upload, 83 ms RTT)
    queued 187 ms behind the probe that opened a turn; charged to its plan, the wait priced it 37 ms up and
    adaptive left it for cloud@jpeg95, a plan without that evidence, for 11 requests. A plan whose upload is a
    bandwidth sample keeps the estimate fresh itself: the probe was none of its making."""
    assert not draws_probes(97.0, 83.0) and draws_probes(3.0, 80.0)  # cloud@jpeg90; a tiny cut's 2 kB
    kw = {"priced_ms": 1.5, "total_ms": 460.0, "head_ms": 0.0, "round_trip_ms": 458.0, "t_s": 1.0}
    assert (
        Observation.of_request(plan="cloud@fp32", probe_wait_ms=187.0, upload_ms=97.0, rtt_ms=83.0, **kw).probe_wait_ms
        == 0
    )
    assert (
        Observation.of_request(plan="c1@fp32", probe_wait_ms=187.0, upload_ms=3.0, rtt_ms=80.0, **kw).probe_wait_ms
        == 187
    )
    assert Observation.of_request(plan="c1@fp32", probe_wait_ms=187.0, **kw).probe_wait_ms == 187  # not known
    # the controller: two cloud codecs priced alike, one request of the plan in use meets a probe
    table = _table(codecs={"fp32": 1.0, "fp16": 0.98})
    ctl, fast = Controller(table, ControllerConfig(codecs=None)), replace(LINK, bandwidth_mbps=40.0)
    first = ctl.decide(0.0, fast, LOAD)
    assert first.plan == "cloud@fp16" and first.hop_upload_ms[0] > 0.25 * first.hop_rtt_ms[0]
    ctl.observe(
        Observation.of_request(
            plan=first.plan,
            priced_ms=first.encode_ms + first.call_ms,
            total_ms=first.predicted_ms + 187.0,
            head_ms=0.0,
            round_trip_ms=first.predicted_ms + 187.0 - first.encode_ms - first.call_ms,
            t_s=0.2,
            price_ms=first.predicted_ms,
            probe_wait_ms=187.0,
            upload_ms=first.hop_upload_ms[0],
            rtt_ms=first.hop_rtt_ms[0],
        )
    )
    assert ctl.decide(0.25, fast, LOAD).plan == "cloud@fp16"
