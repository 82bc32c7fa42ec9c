"""Measured energy in profiles (fake reader) and `plan --objective energy` using it over the board's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from splitrt.cli import app as cli
from splitrt.errors import ProfileError
from splitrt.profile import boards, profiler
from splitrt.profile.energy import EnergyProfile, plan_power, profile_energy
from splitrt.profile.power import ESTIMATED, MEASURED, FakeReader

ROOT = Path(__file__).resolve().parents[2]
SQUEEZENET = ROOT / "profiles" / "x86_64-2core__squeezenet.json"


def test_profile_records_energy_with_the_fake_reader(zoo_path: Any, tmp_path: Path) -> None:
    reader = FakeReader(idle_w=2.0, cpu_w=3.0)
    prof = profiler.measure(
        zoo_path("tiny_chain"),
        runs=2,
        warmup=1,
        segments=3,
        power=reader,
        energy_window_s=0.05,
        progress=lambda _m: None,
    )
    e = profile_energy(prof)
    assert e is not None and e.source == MEASURED and e.reader == "fake"
    # real clocks on a shared host: check what holds whatever the scheduler did, not the watts themselves
    assert e.idle_w > 0 and e.busy_w > 0 and e.whole_model_mj > 0 and e.whole_model_ms > 0
    assert e.whole_model_mj == pytest.approx(e.busy_w * e.whole_model_ms, rel=1e-3)
    anchors = prof.runtime["anchors"]
    assert [(s.start, s.end) for s in e.segments] == list(zip(["cloud", *anchors], [*anchors, "device"], strict=True))
    for s in e.segments:
        assert s.runs >= 1 and s.energy_mj > 0 and s.energy_mj == pytest.approx(s.power_w * s.ms, rel=1e-3)
    path = tmp_path / "p.json"
    profiler.save_profile(prof, path)
    again = profiler.load_profile(path)
    assert profile_energy(again) == e
    assert json.loads(path.read_text())["energy"]["source"] == "measured"


def test_profile_without_reader_has_no_energy_key(zoo_path: Any, tmp_path: Path) -> None:
    prof = profiler.load_profile(SQUEEZENET)
    assert prof.energy is None and profile_energy(prof) is None
    profiler.save_profile(prof, tmp_path / "p.json")
    assert "energy" not in json.loads((tmp_path / "p.json").read_text())


def test_corrupt_energy_object_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="corrupt energy object"):
        EnergyProfile.from_dict({"source": "measured"})
    good = EnergyProfile(
        source=MEASURED, reader="fake", idle_w=1, busy_w=2, whole_model_mj=1, whole_model_ms=1, window_s=1
    ).to_dict()
    with pytest.raises(ProfileError, match="energy source must be 'measured' or 'estimated', got 'guessed'"):
        EnergyProfile.from_dict({**good, "source": "guessed"})


def test_profile_cli_records_the_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.json"
    argv = [
        "profile",
        "tiny_chain",
        "--out",
        str(out),
        "--runs",
        "2",
        "--segments",
        "2",
        "--board",
        "x86",
        "--power-reader",
        "fake:1.5",
        "--energy-window-s",
        "0.05",
    ]
    assert cli.main(argv) == 0
    assert json.loads(out.read_text())["host"]["board"] == "x86"  # `plan --board x86` will not rescale it
    energy = json.loads(out.read_text())["energy"]
    assert energy["reader"] == "fake" and energy["source"] == "measured"
    assert energy["idle_w"] > 0 and energy["busy_w"] > 0 and energy["segments"]
    assert "power reader: fake (flag)" in capsys.readouterr().err
    assert cli.main([*argv[:-4], "--power-reader", "none"]) == 0
    assert "energy" not in json.loads(out.read_text())
    assert "energy stays estimated" in capsys.readouterr().err


def with_energy(tmp_path: Path, *, idle_w: float, busy_w: float, machine: str | None = None) -> Path:
    doc = json.loads(SQUEEZENET.read_text())
    doc["energy"] = EnergyProfile(
        source=MEASURED,
        reader="rapl",
        idle_w=idle_w,
        busy_w=busy_w,
        whole_model_mj=1.0,
        whole_model_ms=1.0,
        window_s=1.0,
    ).to_dict()
    if machine:
        doc["host"]["machine"] = machine
    path = tmp_path / f"device-{idle_w}-{busy_w}.json"
    path.write_text(json.dumps(doc))
    return path


def plan_json(capsys: pytest.CaptureFixture[str], device: Path, *extra: str) -> dict[str, Any]:
    argv = [
        "plan",
        "squeezenet",
        "--device",
        str(device),
        "--cloud",
        str(SQUEEZENET),
        "--objective",
        "energy",
        "--bandwidth-mbps",
        "20",
        "--rtt-ms",
        "20",
        "--json",
        *extra,
    ]
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_plan_energy_uses_measured_power_over_the_board(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    estimated = plan_json(capsys, SQUEEZENET, "--board", "x86")
    assert estimated["power"]["source"] == ESTIMATED and estimated["best"]["energy_source"] == ESTIMATED
    assert estimated["power"]["active_w"] == boards.load_board("x86").power.active_w
    assert "Huang" in estimated["power"]["radio_source"]
    # waiting is expensive, computing nearly free: the energy plan keeps everything on the device
    idle_heavy = plan_json(capsys, with_energy(tmp_path, idle_w=50.0, busy_w=0.01), "--board", "x86")
    # computing is expensive, waiting free: the energy plan offloads (all but a cheap, shrinking head)
    busy_heavy = plan_json(capsys, with_energy(tmp_path, idle_w=0.0, busy_w=100.0), "--board", "x86")
    for out, (idle, busy) in ((idle_heavy, (50.0, 0.01)), (busy_heavy, (0.0, 100.0))):
        pw = out["power"]
        assert (pw["source"], pw["reader"], pw["idle_w"], pw["active_w"]) == (MEASURED, "rapl", idle, busy)
        assert pw["radio_w"] == estimated["power"]["radio_w"]  # the radio stays the board's, with its source
        assert out["best"]["energy_source"] == MEASURED and out["cuts"][0]["energy_source"] == MEASURED
    assert idle_heavy["best"]["cut"] == "device" and busy_heavy["best"]["cut"] != "device"
    assert estimated["best"]["cut"] in (idle_heavy["best"]["cut"], busy_heavy["best"]["cut"])  # one moved
    assert estimated["best"]["energy_mj"] not in (idle_heavy["best"]["energy_mj"], busy_heavy["best"]["energy_mj"])


def test_plan_text_says_which_figures_it_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    device = with_energy(tmp_path, idle_w=3.0, busy_w=9.0)
    argv = [
        "plan",
        "squeezenet",
        "--device",
        str(device),
        "--cloud",
        str(SQUEEZENET),
        "--objective",
        "energy",
        "--bandwidth-mbps",
        "8",
        "--rtt-ms",
        "20",
    ]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "energy measured: idle 3.00 W, active 9.00 W" in text and "(reader rapl)" in text
    assert "radio 1.00 W = 1 uJ/byte here" in text


def test_host_measured_power_is_not_the_emulated_boards(tmp_path: Path) -> None:
    prof = profiler.load_profile(with_energy(tmp_path, idle_w=5.0, busy_w=20.0, machine="x86_64"))
    rpi4 = boards.load_board("rpi4")
    figures = plan_power(prof, rpi4)
    assert figures.source == ESTIMATED and figures.power == rpi4.power
    assert "measured on x86_64, the board is aarch64" in figures.note
    assert plan_power(prof, None).source == MEASURED  # no board: the profile's machine is the device


def test_a_profile_measured_on_the_board_is_not_scaled_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(with_energy(tmp_path, idle_w=3.0, busy_w=7.0, machine="aarch64").read_text())
    doc["host"]["board"] = "rpi5"  # what `splitrt profile --board rpi5` records
    device = tmp_path / "on-rpi5.json"
    device.write_text(json.dumps(doc))
    out = plan_json(capsys, device, "--board", "rpi5")
    assert out["conditions"]["device_speed_factor"] == 1.0
    assert (out["power"]["source"], out["power"]["active_w"]) == (MEASURED, 7.0)
    assert out["power"]["radio_source"] == boards.load_board("rpi5").radio_source
    emulated = plan_json(capsys, SQUEEZENET, "--board", "rpi5")  # a host profile standing in for the board
    assert emulated["conditions"]["device_speed_factor"] > 1.0 and emulated["power"]["source"] == ESTIMATED
