"""Power readers against recorded sysfs trees and command outputs written by the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from splitrt.errors import PowerError, ProfileError
from splitrt.profile.power import FakeReader, SampledReader, measure_interval
from splitrt.profile.power_meter import CsvMeterReader
from splitrt.profile.power_pmic import Rpi5Pmic, parse_pmic, pmic_power_w
from splitrt.profile.power_sysfs import JetsonIna3221, RaplReader

# `vcgencmd pmic_read_adc` on a Raspberry Pi 5 (firmware 2023-10+): one line per ADC channel, currents
# first, then voltages; EXT5V_V and BATT_V have no current channel.
PMIC_OUTPUT = """\
 3V7_WL_SW_A current(0)=0.05855580A
   3V3_SYS_A current(1)=0.06148359A
   1V8_SYS_A current(2)=0.13272650A
  DDR_VDD2_A current(3)=0.13955800A
  DDR_VDDQ_A current(4)=0.00980400A
   1V1_SYS_A current(5)=0.19811380A
    0V8_SW_A current(6)=0.34157550A
  VDD_CORE_A current(7)=5.03652000A
   3V3_DAC_A current(17)=0.00006105A
   3V3_ADC_A current(18)=0.00054945A
   0V8_AON_A current(16)=0.00531135A
      HDMI_A current(22)=0.02161170A
 3V7_WL_SW_V volt(8)=3.61069200V
   3V3_SYS_V volt(9)=3.29982600V
   1V8_SYS_V volt(10)=1.81684800V
  DDR_VDD2_V volt(11)=1.10109800V
  DDR_VDDQ_V volt(12)=0.60366240V
   1V1_SYS_V volt(13)=1.10292900V
    0V8_SW_V volt(14)=0.80292960V
  VDD_CORE_V volt(15)=0.89369880V
   3V3_DAC_V volt(20)=3.29944700V
   3V3_ADC_V volt(21)=3.30402600V
   0V8_AON_V volt(19)=0.79618980V
      HDMI_V volt(23)=4.92450000V
     EXT5V_V volt(24)=4.92450000V
      BATT_V volt(25)=0.00341880V
"""


def write(path: Path, text: str | int | float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")
    return path


def rapl_tree(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """powercap tree: {dir: (name, energy_uj, max_energy_range_uj)}."""
    for d, (name, energy, max_range) in zones.items():
        write(root / d / "name", name)
        write(root / d / "energy_uj", energy)
        write(root / d / "max_energy_range_uj", max_range)
    return root


# --- RAPL ---------------------------------------------------------------------------------------------


def test_rapl_sums_packages_not_subzones_or_psys(tmp_path: Path) -> None:
    root = rapl_tree(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", 1_000, 10**9),
            "intel-rapl:0:0": ("core", 500, 10**9),  # part of package-0
            "intel-rapl:1": ("package-1", 2_000, 10**9),
            "intel-rapl:2": ("psys", 9_000, 10**9),  # the platform: contains the packages
        },
    )
    r = RaplReader(root)
    assert [z.name for z in r.zones] == ["intel-rapl:0/package-0", "intel-rapl:1/package-1"]
    assert r.energy_uj() == 0
    write(root / "intel-rapl:0" / "energy_uj", 4_000)
    write(root / "intel-rapl:0:0" / "energy_uj", 3_000)
    write(root / "intel-rapl:1" / "energy_uj", 2_500)
    assert r.energy_uj() == 3_000 + 500


def test_rapl_counter_wraps_at_max_energy_range(tmp_path: Path) -> None:
    root = rapl_tree(tmp_path, {"intel-rapl:0": ("package-0", 990_000, 1_000_000)})
    r = RaplReader(root)
    write(root / "intel-rapl:0" / "energy_uj", 5_000)  # passed 1_000_000 and restarted from 0
    assert r.energy_uj() == 10_000 + 5_000
    write(root / "intel-rapl:0" / "energy_uj", 7_000)
    assert r.energy_uj() == 17_000


def test_rapl_missing_or_unreadable_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(PowerError, match="no such directory"):
        RaplReader(tmp_path / "absent")
    with pytest.raises(PowerError, match="zones, got none"):
        RaplReader(tmp_path)
    root = rapl_tree(tmp_path / "pc", {"intel-rapl:0": ("package-0", 1, 100)})
    energy = root / "intel-rapl:0" / "energy_uj"
    r = RaplReader(root)
    energy.unlink()
    with pytest.raises(PowerError, match=f"{energy}: expected a power/energy file, got no such file"):
        r.energy_uj()
    write(energy, "garbage")
    with pytest.raises(PowerError, match=f"{energy}: expected a number, got 'garbage'"):
        r.energy_uj()
    assert issubclass(PowerError, ProfileError)


def test_rapl_unreadable_counter_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = rapl_tree(tmp_path, {"intel-rapl:0": ("package-0", 1, 100)})
    energy = root / "intel-rapl:0" / "energy_uj"
    r = RaplReader(root)
    read_text = Path.read_text

    def denied(self: Path, *args: object, **kw: object) -> str:
        if self == energy:  # what a non-root user meets on Linux >= 5.10 (mode 0400); root would read it
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(PowerError, match=f"{energy}: expected a readable file, got permission denied"):
        r.energy_uj()


def test_rapl_on_this_host_when_readable() -> None:
    root = Path("/sys/class/powercap")
    if not any(root.glob("intel-rapl:*/energy_uj")):
        pytest.skip(f"no RAPL on this host: {root} has no intel-rapl:*/energy_uj (VM, or not Intel/AMD)")
    if not all(os.access(p, os.R_OK) for p in root.glob("intel-rapl:*/energy_uj")):
        pytest.skip(f"{root}/intel-rapl:*/energy_uj not readable by uid {os.geteuid()} (root-only since 5.10)")
    r = RaplReader(root)
    first = r.energy_uj()
    sum(i * i for i in range(200_000))  # some work; the counter may or may not have ticked yet
    assert r.energy_uj() >= first >= 0


# --- Raspberry Pi 5 PMIC ------------------------------------------------------------------------------


def test_pmic_sums_current_times_voltage_per_rail() -> None:
    rails = parse_pmic(PMIC_OUTPUT)
    assert len(rails) == 12 and "EXT5V" not in rails and "BATT" not in rails
    assert rails["VDD_CORE"] == (5.03652, 0.8936988)
    expected = sum(a * v for a, v in rails.values())
    assert pmic_power_w(PMIC_OUTPUT) == pytest.approx(expected)
    assert expected == pytest.approx(
        5.03652 * 0.8936988
        + 0.05855580 * 3.610692
        + 0.34157550 * 0.8029296
        + 0.19811380 * 1.102929
        + 0.13272650 * 1.816848
        + 0.13955800 * 1.101098
        + 0.06148359 * 3.299826
        + 0.02161170 * 4.9245
        + 0.00980400 * 0.6036624
        + 0.00531135 * 0.7961898
        + 0.00054945 * 3.304026
        + 0.00006105 * 3.299447
    )
    assert Rpi5Pmic(lambda: PMIC_OUTPUT).power_w() == pytest.approx(expected)


def test_pmic_skips_nan_and_refuses_garbage() -> None:
    text = " VDD_CORE_A current(7)=0.5A\n VDD_CORE_V volt(15)=0.8V\n BATT_V volt(25)=nanV\n X_A current(1)=nanA\n"
    assert pmic_power_w(text) == pytest.approx(0.4)
    with pytest.raises(PowerError, match=r"expected lines like 'VDD_CORE_A current.*got 'error=2 error_msg"):
        Rpi5Pmic(lambda: 'error=2 error_msg="Invalid arguments"\n')


def test_sampled_reader_integrates_trapezoids_and_holds_the_last_sample() -> None:
    clock = [0.0]
    watts = iter([2.0, 4.0, 4.0])

    class Source:
        name = "test-rails"

        def power_w(self) -> float:
            return next(watts)

    r = SampledReader(Source(), period_s=0.5, clock=lambda: clock[0])  # first sample at t=0: 2 W
    clock[0] = 1.0
    r.sample()  # 4 W at t=1: (2+4)/2 x 1 s = 3 J
    assert r.energy_uj() == pytest.approx(3e6)
    clock[0] = 1.5  # held at 4 W since the last sample
    assert r.energy_uj() == pytest.approx(5e6)
    clock[0] = 2.0
    r.sample()
    assert r.energy_uj() == pytest.approx(7e6) and r.samples == 3


# --- Jetson INA3221 -----------------------------------------------------------------------------------


def test_ina3221_hwmon_uses_the_input_rail(tmp_path: Path) -> None:
    hw = tmp_path / "class" / "hwmon" / "hwmon1"
    write(hw / "name", "ina3221")
    for n, (label, mv, ma) in enumerate(
        [("VDD_IN", 5048, 1210), ("VDD_CPU_GPU_CV", 5040, 400), ("VDD_SOC", 5040, 330)], start=1
    ):
        write(hw / f"in{n}_label", label)
        write(hw / f"in{n}_input", mv)
        write(hw / f"curr{n}_input", ma)
    write(tmp_path / "class" / "hwmon" / "hwmon0" / "name", "soc_thermal")  # another hwmon: ignored
    src = JetsonIna3221(tmp_path)
    assert [r.label for r in src.rails] == ["VDD_IN"]  # the others are parts of VDD_IN
    assert src.power_w() == pytest.approx(5.048 * 1.210)


def test_ina3221_hwmon_sums_rails_without_an_input_rail(tmp_path: Path) -> None:
    hw = tmp_path / "class" / "hwmon" / "hwmon3"
    write(hw / "name", "ina3221")
    write(hw / "in1_label", "VDD_GPU_SOC")
    write(hw / "in1_input", 19000)
    write(hw / "curr1_input", 200)
    write(hw / "in2_label", "VDD_CPU_CV")
    write(hw / "in2_input", 19000)
    write(hw / "curr2_input", 100)
    write(hw / "in3_label", "NC")  # not connected
    write(hw / "in3_input", 0)
    write(hw / "curr3_input", 0)
    write(hw / "in4_input", 19000)  # a sum-voltage channel with no current: not a rail
    assert JetsonIna3221(tmp_path).power_w() == pytest.approx(19 * 0.3)


def test_ina3221_old_iio_power_files(tmp_path: Path) -> None:
    dev = tmp_path / "bus" / "i2c" / "drivers" / "ina3221x" / "6-0040" / "iio:device0"
    for n, (label, mw) in enumerate([("POM_5V_IN", 3120), ("POM_5V_GPU", 80), ("POM_5V_CPU", 900)]):
        write(dev / f"rail_name_{n}", label)
        write(dev / f"in_power{n}_input", mw)
    assert JetsonIna3221(tmp_path).power_w() == pytest.approx(3.12)


def test_ina3221_missing(tmp_path: Path) -> None:
    with pytest.raises(PowerError, match=f"{tmp_path}: expected INA3221 rails"):
        JetsonIna3221(tmp_path)
    hw = tmp_path / "class" / "hwmon" / "hwmon1"
    write(hw / "name", "ina3221")
    write(hw / "in1_label", "VDD_IN")
    write(hw / "in1_input", 5000)
    write(hw / "curr1_input", "")  # present but unreadable as a number
    with pytest.raises(PowerError, match=f"{hw / 'curr1_input'}: expected a number"):
        JetsonIna3221(tmp_path)


# --- external meter (CSV / serial stream) -------------------------------------------------------------


def test_csv_meter_integrates_timestamped_watts_as_lines_arrive(tmp_path: Path) -> None:
    path = tmp_path / "meter.csv"
    path.write_text("time_s,power_w\n1700000000.0,5.0\n1700000001.0,7.0\n1700000002")  # last line partial
    r = CsvMeterReader(path)
    assert r.energy_uj() == pytest.approx(6e6)  # (5+7)/2 x 1 s
    with path.open("a") as f:
        f.write(".0;7.0\n# a comment\n\n1700000002.5\t9.0\n")
    assert r.energy_uj() == pytest.approx(6e6 + 7e6 + 4e6)
    assert r.samples == 4
    with path.open("a") as f:
        f.write("1700000001.0,1.0\n")  # back in time
    with pytest.raises(PowerError, match=r"meter.csv:8: expected time >= the previous line's 1700000002.5"):
        r.energy_uj()
    r.close()


def test_csv_meter_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(PowerError, match=f"{tmp_path / 'none.csv'}: expected a meter's CSV file"):
        CsvMeterReader(tmp_path / "none.csv")
    path = tmp_path / "m.csv"
    path.write_text("1.0,2.0\n2.0,watts\n")
    with pytest.raises(PowerError, match=r"m.csv:2: expected '<unix time s>,<watts>', got '2.0,watts'"):
        CsvMeterReader(path).energy_uj()


def test_csv_meter_reads_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "serial"
    os.mkfifo(fifo)
    r = CsvMeterReader(fifo)  # no writer yet: must not block
    assert r.energy_uj() == 0
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b"10.0,3.0\n12.0,3.0\n")
        assert r.energy_uj() == pytest.approx(6e6)
    finally:
        os.close(fd)
        r.close()


# --- fake reader, intervals ---------------------------------------------------------------------------


def test_fake_reader_and_measure_interval() -> None:
    wall, cpu = [0.0], [0.0]
    r = FakeReader(idle_w=2.0, cpu_w=3.0, clock=lambda: wall[0], cpu_clock=lambda: cpu[0])

    def sleep(s: float) -> None:
        wall[0] += s

    idle = measure_interval(r, None, min_s=2.0, clock=lambda: wall[0], sleep=sleep)
    assert (idle.energy_uj, idle.duration_s, idle.runs, idle.power_w) == (4e6, 2.0, 0, 2.0)

    def work() -> None:
        wall[0] += 0.25
        cpu[0] += 0.25

    busy = measure_interval(r, work, min_s=1.0, clock=lambda: wall[0])
    assert busy.runs == 4 and busy.power_w == pytest.approx(5.0)
    assert busy.energy_per_run_mj == pytest.approx(1250.0)  # 5 W x 0.25 s
    with pytest.raises(PowerError, match="idle_w >= 0"):
        FakeReader(idle_w=-1.0)
