"""Board descriptors: every shipped TOML loads, and bad files are refused with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitrt.errors import ConfigError
from splitrt.profile import boards

SHIPPED = {"rpi4", "rpi5", "jetson-nano", "jetson-orin-nano", "x86"}


def test_shipped_boards_load() -> None:
    assert set(boards.names()) >= SHIPPED
    for b in boards.all_boards():
        assert b.cores >= 1 and b.memory_mb >= 512
        assert b.cpu_speed_factor > 0
        assert "CPUExecutionProvider" in b.execution_providers
        assert 0 < b.power.idle_w < b.power.active_w
        assert b.power.radio_w > 0
    rpi4 = boards.load_board("rpi4")
    assert rpi4.cores == 4 and rpi4.cpu_speed_factor > boards.load_board("rpi5").cpu_speed_factor
    assert boards.load_board("x86").cpu_speed_factor == 1.0


def test_every_power_figure_cites_a_source() -> None:
    for b in boards.all_boards():
        text = b.path.read_text()
        power_section = text.split("[power]", 1)[1]
        assert power_section.count("#") >= 3, f"{b.path}: cite the source of each power figure"
        head = text.split("[power]", 1)[0]
        assert "cpu_speed_factor" in head or "resnet50_ms" in head


def test_unknown_board(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"known boards: .*rpi4"):
        boards.load_board("pdp11")
    with pytest.raises(ConfigError, match="known boards: none"):
        boards.load_board("rpi4", directory=tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cores = [", "not a readable TOML"),
        (
            'cores = 4\nmemory_mb = 1\ncpu_speed_factor = 1\nexecution_providers = ["x"]',
            "missing key 'power'",
        ),
        (
            'cores = "four"\nmemory_mb = 1\ncpu_speed_factor = 1\nexecution_providers = ["x"]\n[power]\n',
            "cores must be int, got 'four'",
        ),
        (
            'cores = 4\nmemory_mb = 1\ncpu_speed_factor = 0\nexecution_providers = ["x"]\n'
            "[power]\nidle_w = 1\nactive_w = 2\nradio_w = 1\n",
            "cpu_speed_factor must be > 0",
        ),
        (
            'cores = 4\nmemory_mb = 1\ncpu_speed_factor = 1\nexecution_providers = ["x"]\n'
            "[power]\nidle_w = -1\nactive_w = 2\nradio_w = 1\n",
            "idle_w must be",
        ),
    ],
)
def test_bad_descriptor(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        boards.load_board(p)


def test_board_factor_follows_the_host_profile() -> None:
    """A board's factor is its resnet50 time over the shipped host profile's: re-profiling the host
    keeps the emulated board at the board's own speed."""
    rpi4 = boards.load_board("rpi4")
    assert rpi4.cpu_speed_factor * boards.host_reference_ms() == pytest.approx(490.0)
