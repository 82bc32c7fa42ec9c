"""The metrics endpoint the daemon and the cloud server share: prometheus_client's exposition of our
collectors over HTTP, read back by its parser (labels escaped, histogram buckets, 404, a taken port)."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric

from splitrt.errors import ConfigError
from splitrt.transport import promserve
from tests.prom import samples


class _State:
    def __init__(self) -> None:
        self.hist = Histogram("lat_seconds", "help", ["m"], buckets=(0.01, 0.1), registry=None)
        self.calls = 0

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        yield promserve.family(CounterMetricFamily, "x_total", "help", ["code", "m"], [(("OK", 'a"b\\c\nd'), 3.0)])
        yield promserve.family(GaugeMetricFamily, "up", "help", [], [((), float("inf"))])
        yield from self.hist.collect()


def test_collectors_render_on_each_scrape_and_parse_back() -> None:
    state = _State()
    for x in (0.005, 0.05, 3.0):
        state.hist.labels(m="q").observe(x)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(state)
    httpd, url = promserve.serve(reg, "127.0.0.1", 0)
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
            text = r.read().decode()
        with urllib.request.urlopen(url.removesuffix("metrics"), timeout=10) as r:  # "/" too
            assert samples(r.read().decode())[("up", ())] == math.inf
        assert state.calls == 2  # rendered per scrape, nothing cached
        assert "# TYPE lat_seconds histogram" in text
        m = samples(text)
        assert m[("x_total", (("code", "OK"), ("m", 'a"b\\c\nd')))] == 3.0
        assert [m[("lat_seconds_bucket", (("le", le), ("m", "q")))] for le in ("0.01", "0.1", "+Inf")] == [1, 2, 3]
        assert m[("lat_seconds_sum", (("m", "q"),))] == pytest.approx(3.055)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=10)
        assert info.value.code == 404
        info.value.close()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(ConfigError, match=f"metrics 127.0.0.1:{port}: expected a free port, got "):
            promserve.serve(reg, "127.0.0.1", port)
    finally:
        httpd.shutdown()
        httpd.server_close()
