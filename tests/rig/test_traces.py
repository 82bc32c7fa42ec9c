"""Bandwidth traces: formats, synthetic traces, queries, shipped data."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitrt.errors import ConfigError
from splitrt.rig import traces


def test_two_column_parse_and_piecewise_constant() -> None:
    t = traces.parse_two_column("# comment\n10.0 2.0\n11.0\t4.0\n\n12.5 1.0\n", "x")
    assert t.times_s == (0.0, 1.0, 2.5)
    assert t.rates_mbps == (2.0, 4.0, 1.0)
    assert t.duration_s == pytest.approx(3.75)  # last sample holds the median gap (1.25 s)
    assert t.rate_at(0) == 2.0
    assert t.rate_at(0.999) == 2.0
    assert t.rate_at(1.0) == 4.0
    assert t.rate_at(3.7) == 1.0
    assert t.rate_at(3.75) == 2.0  # wraps around
    assert t.rate_at(3.75 + 1.5) == 4.0
    with pytest.raises(ConfigError):
        t.rate_at(-1)


@pytest.mark.parametrize(
    "text,match",
    [
        ("0 1 2\n", "2 columns"),
        ("0 a\n", "two numbers"),
        ("0 1\n0 2\n", "does not increase"),
        ("0 -1\n1 1\n", ">= 0"),
        ("", "empty"),
    ],
)
def test_two_column_errors_name_the_line(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        traces.parse(text, "bad")


def test_mahimahi_rate_and_autodetect(tmp_path: Path) -> None:
    # 1 Mbit/s = 83.33 packets of 1500 B per s. First second: 100 opportunities (1.2 Mbit/s),
    # second second: 50 (0.6 Mbit/s).
    stamps = [10 * i for i in range(1, 101)] + [1000 + 20 * i for i in range(1, 51)]
    p = tmp_path / "link.mahi"
    p.write_text("".join(f"{s}\n" for s in stamps))
    t = traces.load(p)
    assert t.duration_s == 2.0
    assert t.rate_at(0.2) == pytest.approx(1.2)
    assert t.rate_at(1.7) == pytest.approx(0.6)
    assert t.mean_mbps() == pytest.approx(150 * 1500 * 8 / 1e6 / 2.0)
    with pytest.raises(ConfigError, match="non-decreasing"):
        traces.parse_mahimahi("5\n3\n")


def test_mahimahi_bins_delivery_opportunities() -> None:
    # 500, 1000 and 250 packets of 1500 B spread over three 2 s bins: 3, 6 and 1.5 Mbit/s; 6000: the period
    stamps = [b * 2000 + 1 + k * 2000 // n for b, n in enumerate((500, 1000, 250)) for k in range(n)]
    back = traces.parse_mahimahi("".join(f"{ms}\n" for ms in [*stamps, 6000]), bin_ms=2000)
    assert back.duration_s == pytest.approx(6.0)
    assert [round(r, 1) for r in back.rates_mbps] == [3.0, 6.0, 1.5]


def test_synthetic_traces() -> None:
    s = traces.step([8, 2, 5], 3.0)
    assert s.duration_s == 9.0 and s.rate_at(4) == 2 and s.rate_at(8.9) == 5
    q = traces.square(1, 10, period_s=4, duration_s=10)
    assert q.duration_s == 10
    assert [q.rate_at(x) for x in (0, 2.5, 4.5, 6.5, 9)] == [10, 1, 10, 1, 10]
    c = traces.constant(3.5, 12)
    assert c.median_mbps() == c.mean_mbps() == 3.5 and c.duration_s == 12
    with pytest.raises(ConfigError):
        traces.step([], 1)


def test_median_is_time_weighted_and_scaling() -> None:
    t = traces.from_samples("w", [0, 1, 10], [5.0, 1.0, 2.0], duration_s=11)
    assert t.median_mbps() == 1.0  # 1 Mbit/s holds 9 of 11 s
    k = t.scaled(5)
    assert k.rates_mbps == (25.0, 5.0, 10.0) and k.times_s == t.times_s
    assert k.median_mbps() == 5.0
    with pytest.raises(ConfigError):
        t.scaled(0)
    assert t.clipped(min_mbps=1.5).rates_mbps == (5.0, 1.5, 2.0)


def test_window_wraps() -> None:
    t = traces.step([1, 2, 3], 10)
    w = t.window(25, 10)  # 25..30 at 3, then wraps to 1 for 30..35
    assert w.duration_s == 10
    assert w.times_s == (0.0, 5.0) and w.rates_mbps == (3.0, 1.0)


@given(st.lists(st.floats(0, 50), min_size=1, max_size=20), st.floats(0.1, 5), st.floats(0, 500))
def test_rate_at_always_a_sample(levels: list[float], step_s: float, t: float) -> None:
    tr = traces.step(levels, step_s)
    assert tr.rate_at(t) in tr.rates_mbps
    assert min(levels) <= tr.median_mbps() <= max(levels)


def test_shipped_traces() -> None:
    names = traces.shipped()
    assert len([n for n in names if n.startswith("hsdpa/")]) >= 3
    assert len([n for n in names if n.startswith("fcc/")]) == 2
    for n in names:
        t = traces.load_shipped(n)
        assert t.name == n
        assert t.duration_s > 100 and len(t.times_s) > 100
        assert 0.3 < t.median_mbps() < 10 and max(t.rates_mbps) > 2 * t.median_mbps()
    with pytest.raises(ConfigError, match="hsdpa/bus"):
        traces.load_shipped("nope")
    readme = Path(traces.__file__).parents[1] / "data" / "traces" / "README.md"
    assert "Riiser" in readme.read_text() and "FCC" in readme.read_text()
