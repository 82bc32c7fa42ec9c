"""The cloud server's Prometheus metrics, scraped over HTTP after real requests and parsed: requests
and errors by code, queue depth, the tail-latency histogram, segment cache hits; `splitrt serve
--metrics-port` serves the same on 127.0.0.1."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import CloudError, ConfigError
from splitrt.graph import zoo
from splitrt.transport import codec
from tests.cli.test_serve import serve_checkout
from tests.prom import samples


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


def _scrape(url: str) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"] == CONTENT_TYPE_PLAIN_0_0_4
        text = r.read().decode()
    return text, samples(text)


def test_metrics_after_real_requests(models_dir: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=models_dir, workers=1, max_queue=2, metrics_port=0)) as s,
        Device(zoo.get("tiny_chain"), s.address) as dev,
    ):
        assert s.metrics_url is not None and s.metrics_url.startswith("http://127.0.0.1:")
        x = dev.random_inputs()
        for cut in ("c2", "c2", "c2", "c3"):
            dev.run(x, cut=cut)
        framed, _ = dev._request(dev.run_head(x, "c2"), codec.Codec.parse("fp32"))
        framed.header.cut_id = "c99"  # a cut the model does not have
        with pytest.raises(CloudError, match="NOT_FOUND"):
            dev._link().infer(framed, timeout_s=10)
        text, m = _scrape(s.metrics_url)
        assert "# TYPE splitrt_cloud_tail_seconds histogram" in text
        assert m[("splitrt_cloud_requests_total", (("code", "OK"),))] == 4
        assert m[("splitrt_cloud_errors_total", (("code", "NOT_FOUND"),))] == 1
        assert ("splitrt_cloud_errors_total", (("code", "OK"),)) not in m
        assert m[("splitrt_cloud_queue_depth", ())] == 0 and m[("splitrt_cloud_workers", ())] == 1
        assert m[("splitrt_cloud_tail_seconds_count", ())] == 4
        assert m[("splitrt_cloud_tail_seconds_bucket", (("le", "+Inf"),))] == 4
        buckets = sorted(
            (float(dict(k[1])["le"]), v) for k, v in m.items() if k[0] == "splitrt_cloud_tail_seconds_bucket"
        )
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
        assert m[("splitrt_cloud_tail_seconds_sum", ())] > 0 and m[("splitrt_cloud_service_ms", ())] > 0
        assert m[("splitrt_cloud_request_seconds_count", ())] == 5  # every outcome
        # Two tails built, then two cache hits; per session: c2 served 3, c3 once.
        assert m[("splitrt_cloud_segment_cache_misses_total", ())] == 2
        assert m[("splitrt_cloud_segment_cache_hits_total", ())] == 2
        sha = dev.sha256[:16]
        assert m[("splitrt_cloud_segment_hits_total", (("cut", "c2"), ("model", sha)))] == 3
        assert m[("splitrt_cloud_served_total", ())] == 4
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(s.metrics_url.replace("/metrics", "/other"), timeout=10)
        assert info.value.code == 404
        info.value.close()  # the error holds the response (and its socket)
        url = s.metrics_url
    with pytest.raises(urllib.error.URLError):  # stopped with the server
        urllib.request.urlopen(url, timeout=10)


def test_a_taken_metrics_port_fails_the_start(models_dir: Path) -> None:
    with CloudServer(ServerConfig(models_dir=models_dir, metrics_port=0)) as s:
        assert s.metrics_url is not None
        port = int(s.metrics_url.rsplit(":", 1)[1].split("/")[0])
        other = CloudServer(ServerConfig(models_dir=models_dir, metrics_port=port))
        with pytest.raises(ConfigError, match=f"metrics 127.0.0.1:{port}: expected a free port"):
            other.start()


def test_serve_metrics_port(models_dir: Path) -> None:
    s = serve_checkout(str(models_dir), "--workers", "1", "--metrics-port", "0")
    try:
        ev = s.event("listening")
        assert ev["metrics_url"].startswith("http://127.0.0.1:")
        # A fresh process's first request builds its tail: on a loaded host that passed the 10 s default.
        with Device(zoo.get("tiny_chain"), f"127.0.0.1:{ev['port']}", config=DeviceConfig(timeout_s=60)) as dev:
            dev.run(dev.random_inputs(), cut="c3")
        _, m = _scrape(ev["metrics_url"])
        assert m[("splitrt_cloud_requests_total", (("code", "OK"),))] == 1
        assert m[("splitrt_cloud_up", ())] == 1
    finally:
        assert s.stop() == 0
