"""`splitrt plan` and `splitrt profile` end to end through the CLI entry point."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from splitrt.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "x86_64-2core__squeezenet.json"


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "squeezenet", "--device", str(PROFILE), "--cloud", str(PROFILE)]
    rc = cli.main([*args, "--bandwidth-mbps", "10", "--rtt-ms", "20", "--board", "rpi4", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    best, cuts = out["best"], out["cuts"]
    assert {"cut", "predicted_ms", "codec", "energy_mj"} <= set(best)
    assert {"cut", "device_ms", "transfer_ms", "cloud_ms", "total_ms", "bytes"} <= set(cuts[0])
    assert cuts[0]["cut"] == "cloud" and cuts[-1]["cut"] == "device"
    same_codec = [c["total_ms"] for c in cuts]
    assert best["predicted_ms"] <= min(same_codec) + 1e-3
    # a board 1000x slower than the host: everything goes to the cloud at this bandwidth
    rc = cli.main([*args, "--bandwidth-mbps", "1000", "--rtt-ms", "1", "--device-load", "50", "--json"])
    assert json.loads(capsys.readouterr().out)["best"]["cut"] == "cloud"


def test_plan_sweep_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "squeezenet", "--device", str(PROFILE), "--cloud", str(PROFILE), "--rtt-ms", "20"]
    assert cli.main([*args, "--bandwidth-mbps", "10", "--sweep", "--json"]) == 0
    bands = json.loads(capsys.readouterr().out)["sweep"]
    assert bands[0]["from_mbps"] == 0.1 and bands[-1]["to_mbps"] == 1000.0
    assert all(a["to_mbps"] == b["from_mbps"] for a, b in itertools.pairwise(bands))
    assert cli.main([*args, "--bandwidth-mbps", "10", "--objective", "energy", "--min-cut"]) == 0
    text = capsys.readouterr().out
    assert "best (energy)" in text and "<- best" in text and "min-cut" in text


def test_plan_refuses_other_models_profile(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "resnet50", "--device", str(PROFILE), "--cloud", str(PROFILE)]
    assert cli.main([*args, "--bandwidth-mbps", "10", "--rtt-ms", "1"]) == 2
    assert "expected sha256" in capsys.readouterr().err


def test_profile_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.json"
    assert cli.main(["profile", "tiny_chain", "--out", str(out), "--runs", "2", "--segments", "2"]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "splitrt.profile/1" and data["cuts"][0]["cut"] == "cloud"
    assert "[profile]" in capsys.readouterr().err
