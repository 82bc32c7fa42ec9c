"""Choosing a power reader: by flag, by the board file, or detected in order RAPL, INA3221, Pi 5 PMIC."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitrt.errors import ConfigError, PowerError
from splitrt.profile import boards
from splitrt.profile.power import FakeReader, SampledReader
from splitrt.profile.power_meter import CsvMeterReader
from splitrt.profile.power_select import choose, detect, open_reader
from splitrt.profile.power_sysfs import RaplReader
from tests.profile.test_power import PMIC_OUTPUT, rapl_tree, write


def ina3221_tree(root: Path) -> Path:
    hw = root / "class" / "hwmon" / "hwmon2"
    write(hw / "name", "ina3221")
    write(hw / "in1_label", "VDD_IN")
    write(hw / "in1_input", 5000)
    write(hw / "curr1_input", 1000)
    return root


def no_pmic() -> str:
    raise PowerError("vcgencmd: expected output, got none (test)")


def test_detection_order_rapl_then_ina3221_then_pmic(tmp_path: Path) -> None:
    both = ina3221_tree(tmp_path / "both")
    rapl_tree(both / "class" / "powercap", {"intel-rapl:0": ("package-0", 1, 100)})
    got = detect(sys_root=both, run_pmic=lambda: PMIC_OUTPUT, start=False)
    assert isinstance(got.reader, RaplReader) and got.how == "detected" and got.skipped == ()

    jetson = ina3221_tree(tmp_path / "jetson")
    got = detect(sys_root=jetson, run_pmic=lambda: PMIC_OUTPUT, start=False)
    assert isinstance(got.reader, SampledReader) and got.reader.name == "jetson-ina3221"
    assert got.skipped[0].startswith("rapl: ") and "no such directory" in got.skipped[0]

    pi = tmp_path / "pi"
    pi.mkdir()
    got = detect(sys_root=pi, run_pmic=lambda: PMIC_OUTPUT, start=False)
    assert got.reader is not None and got.reader.name == "rpi5-pmic" and len(got.skipped) == 2

    got = detect(sys_root=pi, run_pmic=no_pmic, start=False)
    assert got.reader is None and got.how == "none"
    assert [s.split(":")[0] for s in got.skipped] == ["rapl", "jetson-ina3221", "rpi5-pmic"]


def test_flag_beats_board_beats_detection(tmp_path: Path) -> None:
    root = ina3221_tree(tmp_path)
    meter = tmp_path / "meter.csv"
    meter.write_text("1,2\n")
    got = choose(f"csv:{meter}", "rapl", sys_root=root, run_pmic=no_pmic, start=False)
    assert isinstance(got.reader, CsvMeterReader) and got.how == "flag"
    got = choose(None, "jetson-ina3221", sys_root=root, run_pmic=no_pmic, start=False)
    assert got.reader is not None and got.reader.name == "jetson-ina3221" and got.how == "board"
    got = choose("auto", "auto", sys_root=root, run_pmic=no_pmic, start=False)
    assert got.how == "detected" and got.reader is not None and got.reader.name == "jetson-ina3221"
    assert choose("none", "rapl", sys_root=root, start=False).reader is None
    # a reader the board names but cannot read is an error, not a silent estimate
    with pytest.raises(PowerError, match="no such directory"):
        choose(None, "rapl", sys_root=root, start=False)


def test_reader_names() -> None:
    fake = open_reader("fake:3.5,1.5")
    assert isinstance(fake, FakeReader) and (fake.idle_w, fake.cpu_w) == (3.5, 1.5)
    assert isinstance(open_reader("fake"), FakeReader)
    for bad in ("fake:-1", "fake:x", "fake:1,2,3", "watts", "csv:"):
        with pytest.raises(ConfigError, match="power reader: expected"):
            open_reader(bad)


def test_sampled_reader_thread_runs_and_stops(tmp_path: Path) -> None:
    r = open_reader("jetson-ina3221", sys_root=ina3221_tree(tmp_path))
    assert isinstance(r, SampledReader)
    try:
        assert r.energy_uj() >= 0  # 5 W held since the first sample
    finally:
        r.close()


def test_boards_name_their_reader_and_radio_source() -> None:
    readers = {b.name: b.power_reader for b in boards.all_boards()}
    assert readers["rpi5"] == "rpi5-pmic" and readers["jetson-orin-nano"] == "jetson-ina3221"
    for b in boards.all_boards():
        assert "Huang" in b.radio_source, b.name
        if b.power_reader not in (None, "auto"):
            with pytest.raises((PowerError, ConfigError)):  # not this host's hardware
                open_reader(b.power_reader, sys_root=Path("/nonexistent"), run_pmic=no_pmic, start=False)


def test_board_reader_must_be_a_name(tmp_path: Path) -> None:
    base = 'cores = 1\nmemory_mb = 1\nexecution_providers = ["CPUExecutionProvider"]\ncpu_speed_factor = 1\n'
    path = tmp_path / "b.toml"
    path.write_text(base + "[power]\nidle_w = 1\nactive_w = 2\nradio_w = 1\nreader = 3\n")
    with pytest.raises(ConfigError, match=r"\[power\] reader must be a reader name .* got 3"):
        boards.load_board(path)
