"""The Prometheus text renderer the daemon and the cloud server share, read back by its parser."""

from __future__ import annotations

import re

import pytest

from splitrt.errors import ConfigError
from splitrt.transport import promtext


def test_families_round_trip_with_escaped_labels() -> None:
    h = promtext.Histogram([0.01, 0.1])
    for x in (0.005, 0.05, 3.0):
        h.observe(x)
    lines: list[str] = []
    promtext.family(lines, "x_total", "counter", "help", [("", {"code": "OK", "m": 'a"b\\c\nd'}, 3.0)])
    promtext.family(lines, "lat_seconds", "histogram", "help", h.samples({"m": "q"}))
    promtext.family(lines, "up", "gauge", "help", [("", {}, float("inf"))])
    text = "\n".join(lines) + "\n"
    assert "# TYPE lat_seconds histogram" in text and 'lat_seconds_bucket{m="q",le="+Inf"} 3.0' in text
    m = promtext.parse(text)
    assert m[("x_total", (("code", "OK"), ("m", 'a"b\\c\nd')))] == 3.0
    assert [m[("lat_seconds_bucket", (("le", le), ("m", "q")))] for le in ("0.01", "0.1", "+Inf")] == [1, 2, 3]
    assert m[("lat_seconds_sum", (("m", "q"),))] == pytest.approx(3.055)
    assert m[("up", ())] == float("inf")


def test_bad_input_names_expected_and_got() -> None:
    with pytest.raises(ConfigError, match=re.escape("expected 'name{labels} value', got 'not a sample line'")):
        promtext.parse("not a sample line")
    with pytest.raises(ConfigError, match=re.escape("expected a non-empty ascending list, got [1.0, 0.5]")):
        promtext.Histogram([1.0, 0.5])
