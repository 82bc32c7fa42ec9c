"""`splitrt plan --dim/--shape` with a profile measured at other shapes: re-priced at the plan's binding
(bytes exact there, times scaled by FLOPs), said in the table and the JSON; refused naming both shapes
when the profile does not say where it was measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from splitrt.cli import app as cli
from splitrt.graph import model as graph
from splitrt.graph import rebind, shapes, zoo
from splitrt.plan import reshape
from splitrt.profile import profiler


@pytest.fixture(scope="module")
def bert16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (short) profile of bert_tiny at seq 16."""
    out = tmp_path_factory.mktemp("reprice") / "bert16.json"
    prof = profiler.measure(
        zoo.get("bert_tiny"),
        runs=1,
        warmup=0,
        segments=2,
        threads=1,
        progress=lambda _: None,
        binding=shapes.binding_from(dims=["seq=16"]),
    )
    profiler.save_profile(prof, out)
    return out


def _plan(capsys: pytest.CaptureFixture[str], profile: Path, *flags: str) -> tuple[int, str, str]:
    rc = cli.main(
        [
            "plan",
            "zoo:bert_tiny",
            "--device",
            str(profile),
            "--cloud",
            str(profile),
            "--bandwidth-mbps",
            "10",
            "--rtt-ms",
            "5",
            *flags,
        ]
    )
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_plan_at_another_seq_is_repriced_and_says_so(bert16: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _plan(capsys, bert16, "--dim", "seq=128", "--json")
    assert rc == 0
    doc = json.loads(out)
    sh = doc["shapes"]
    assert sh["repriced"] is True
    assert sh["planned"] == {"attention_mask": [1, 128], "input_ids": [1, 128]}
    assert sh["device_profile"] == sh["cloud_profile"] == {"attention_mask": [1, 16], "input_ids": [1, 16]}
    assert "input_ids=1x128" in sh["note"] and "input_ids=1x16" in sh["note"]
    # bytes are the plan's binding's own, exactly; times are the runtime's scaling of the profile's
    g128 = graph.load(zoo.get("bert_tiny"), shapes.binding_from(dims=["seq=128"]))
    want_bytes = {c.id: c.bytes for c in g128.cuts()}
    assert {r["cut"]: r["bytes"] for r in doc["cuts"] if r["cut"] != "device"} == {
        k: v for k, v in want_bytes.items() if k != "device"
    }
    prof = profiler.load_profile(bert16)
    table = profiler.cost_table(prof, prof)
    scaled = reshape.scale_table(
        table, rebind.cut_costs_at(g128, {"input_ids": (1, 16), "attention_mask": (1, 16)}), rebind.cut_costs(g128)
    )
    got = np.array([r["device_ms"] for r in doc["cuts"]])
    assert np.allclose(got, np.round(scaled.head_ms, 4), atol=1e-3)
    assert not np.allclose(got, np.round(table.head_ms, 4), atol=1e-3), "the profile's own times: not re-priced"
    rc, text, _ = _plan(capsys, bert16, "--dim", "seq=128")
    assert rc == 0 and "re-priced" in text and "input_ids=1x16" in text and "input_ids=1x128" in text


def test_plan_at_the_profiles_shapes_is_not_repriced(bert16: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _plan(capsys, bert16, "--dim", "seq=16", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["shapes"]["repriced"] is False
    prof = profiler.load_profile(bert16)
    assert [r["bytes"] for r in doc["cuts"]] == [c.bytes for c in prof.cuts]
    # sweep mode says it too
    rc, out, _ = _plan(capsys, bert16, "--dim", "seq=64", "--sweep", "--json")
    assert rc == 0 and json.loads(out)["shapes"]["repriced"] is True


def test_refused_naming_both_shapes_when_the_profile_does_not_record_them(
    bert16: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(bert16.read_text())
    del data["model"]["input_shapes"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    rc, _, err = _plan(capsys, old, "--dim", "seq=128")
    assert rc == 2
    assert "cannot re-price the device profile" in err
    assert "input_ids=1x128" in err and "unknown (not recorded in the profile)" in err
