"""The decision core replays: a decision log recorded from real processes (bench/record_decision_log.py:
a cloud server behind a relay stepping 1000 -> 15 -> 1000 Mbit/s, a throttled device running resnet50)
fed to a fresh controller gives the same decisions, with no sockets, sessions or sleeps."""

from __future__ import annotations

import json
from pathlib import Path

from splitrt.plan.controller import Controller, ControllerConfig, Decision
from splitrt.plan.costmodel import CostTable
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.queueing import QueueEstimator
from splitrt.plan.replay import replay

DATA = Path(__file__).resolve().parents[1] / "data"


def test_recorded_log_replays_to_the_same_decisions() -> None:
    lines = (DATA / "decisions_resnet50.jsonl").read_text().splitlines()
    table = CostTable.from_dict(json.loads((DATA / "decisions_resnet50.table.json").read_text()))
    logged = [Decision.from_json(line) for line in lines]
    assert len(logged) == 60
    assert len({d.plan for d in logged}) >= 2, "the recording should hold plan changes"
    pairs = replay(lines, table, ControllerConfig())
    assert len(pairs) == len(logged)
    for old, new in pairs:
        assert (new.plan, new.best, new.switched) == (old.plan, old.best, old.switched), old.request
        assert abs(new.predicted_ms - old.predicted_ms) <= 1e-9 * max(1.0, old.predicted_ms)


def test_a_changed_table_changes_some_decision() -> None:
    """The replay is not vacuous: a cloud 50x slower than recorded turns some cloud plan into another."""
    lines = (DATA / "decisions_resnet50.jsonl").read_text().splitlines()
    data = json.loads((DATA / "decisions_resnet50.table.json").read_text())
    data["tail_ms"] = [t * 50 for t in data["tail_ms"]]
    pairs = replay(lines, CostTable.from_dict(data), ControllerConfig())
    assert any(new.plan != old.plan for old, new in pairs)


def test_a_log_with_a_queueing_cloud_replays() -> None:
    """A fast cloud whose queue builds up, refuses once and drains, as reported in replies (the estimator fed as
    the runtime feeds it): the queue term moves the plan to the device and back, and the log (JSON and
    the compact string form) replays to the same decisions; without the queue it would not."""
    table = CostTable.from_dict(json.loads((DATA / "decisions_resnet50.table.json").read_text()))
    ctl, queue = Controller(table), QueueEstimator()
    link = LinkEstimate(bandwidth_mbps=400.0, rtt_ms=5.0, confidence=1.0)
    depths = [0, 0, 2, 6, 12, 20, 20, 12, 6, 2, 0, 0]
    lines = []
    for n, depth in enumerate(depths):
        t = 0.1 * n
        if n == 6:
            queue.add_refusal(t, retry_after_ms=400.0)
        else:
            queue.add_load(t, queue_depth=depth, workers=2, service_ms=30.0)
        load = LoadEstimate(device_factor=1.0, cloud_factor=0.2, queue_ms=queue.estimate(t + 0.05))
        lines.append(ctl.decide(t + 0.05, link, load, request=f"r{n}").to_json())
    logged = [Decision.from_json(line) for line in lines]
    assert any(d.plan == "device" for d in logged) and logged[0].plan != "device" and logged[-1].plan != "device"
    assert max(d.cloud_queue_ms for d in logged) >= 200.0
    for old, new in replay(lines, table, ControllerConfig()):
        assert (new.plan, new.best, new.switched, new.queue_ms) == (old.plan, old.best, old.switched, old.queue_ms)
        assert new.cloud_queue_ms == old.cloud_queue_ms
    assert [Decision.parse(str(d)) for d in logged] == logged
    without = [json.dumps({**json.loads(line), "waits_ms": [0.0]}) for line in lines]
    assert any(new.plan != old.plan for old, new in replay(without, table, ControllerConfig()))
