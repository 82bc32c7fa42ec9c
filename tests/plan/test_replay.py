"""The decision core replays: a decision log recorded from real processes (bench/record_decision_log.py:
a cloud server behind a relay stepping 1000 -> 15 -> 1000 Mbit/s, a throttled device running resnet50)
fed to a fresh controller gives the same decisions, with no sockets, sessions or sleeps."""

from __future__ import annotations

import json
from pathlib import Path

from splitrt.plan.controller import ControllerConfig, Decision, replay
from splitrt.plan.costmodel import CostTable

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
