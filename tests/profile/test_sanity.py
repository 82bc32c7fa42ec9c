"""Implausible profiles (a short profile on a busy host): heads dearer than the whole model, a bigger head
cheaper than a smaller one it contains. Named by cut, in `profile`'s and `plan`'s output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from splitrt.cli import app as cli
from splitrt.profile import profiler, sanity

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "x86_64-2core__squeezenet.json"


def _with(prof: profiler.Profile, **heads: float) -> profiler.Profile:
    cuts = tuple(dataclasses.replace(c, head_ms=heads.get(c.cut, c.head_ms)) for c in prof.cuts)
    return dataclasses.replace(prof, cuts=cuts)


def test_a_steady_profile_has_no_warning() -> None:
    prof = profiler.load_profile(PROFILE)
    assert sanity.implausible(prof) == [] and sanity.warning(prof, "x") is None


def test_head_dearer_than_the_whole_model_is_named() -> None:
    prof = profiler.load_profile(PROFILE)
    bad = _with(prof, c20=2 * prof.total_ms)
    lines = sanity.implausible(bad)
    assert any(line.startswith("heads dearer than the whole model") and "c20" in line for line in lines)
    text = sanity.warning(bad, "sq.json")
    assert text is not None and "sq.json" in text and "--runs" in text


def test_bigger_head_cheaper_than_a_smaller_one_it_contains() -> None:
    prof = profiler.load_profile(PROFILE)
    ids = prof.cut_ids
    small, big = prof.cut("c40"), prof.cut("c60")
    assert int(small.head_mask, 16) & ~int(big.head_mask, 16) == 0, "c60's head contains c40's"
    bad = _with(prof, c40=big.head_ms + 0.3 * prof.total_ms)  # c40 now dearer than c60, which contains it
    lines = [line for line in sanity.implausible(bad) if line.startswith("bigger heads cheaper")]
    assert lines and "< c40 " in lines[0], lines
    first = lines[0].split(": ", 1)[1].split()[0]  # a cut whose head contains c40's, named first
    assert int(small.head_mask, 16) & ~int(prof.cut(first).head_mask, 16) == 0 and first != "c40"
    # within the tolerance: noise a quiet host makes too, not reported
    assert sanity.implausible(_with(prof, c40=small.head_ms + 0.5 * sanity.TOLERANCE * prof.total_ms)) == []
    assert ids[0] == "cloud"


def test_plan_warns_naming_the_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(PROFILE.read_text())
    for c in data["cuts"]:
        if c["cut"] == "c33":
            c["head_ms"] = 3 * data["total_ms"]
    noisy = tmp_path / "noisy.json"
    noisy.write_text(json.dumps(data))
    rc = cli.main(
        [
            "plan",
            "squeezenet",
            "--device",
            str(noisy),
            "--cloud",
            str(PROFILE),
            "--bandwidth-mbps",
            "10",
            "--rtt-ms",
            "20",
            "--json",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0
    assert "noisy.json looks noisy" in cap.err and "c33" in cap.err
    warnings = json.loads(cap.out)["warnings"]
    assert len(warnings) == 1 and "c33" in warnings[0] and "more repeats" in warnings[0]
