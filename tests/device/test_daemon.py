"""Device daemon: config errors, the local API against a real cloud on 127.0.0.1, metrics, SIGTERM drain."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig, load_config, parse_config
from splitrt.errors import CloudError, ConfigError, InputError
from splitrt.graph import zoo
from tests import prom
from tests.conftest import rel_err, session
from tests.loopback import reap

MODEL = "squeezenet"
REPO = Path(__file__).resolve().parents[2]


# -- config -----------------------------------------------------------------------------------------

GOOD = {"model": [{"name": "sq", "path": "zoo:squeezenet"}]}


def test_config_defaults_units_and_relative_paths(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text(
        'deadline_ms = 1500\nclouds = ["10.0.0.5:50051"]\ndiscovery = true\n'
        'decision_log_path = "log/decisions.jsonl"\napi_socket_path = "run/d.sock"\n'
        'metrics_port = -1\n[[model]]\nname = "m"\npath = "models/m.onnx"\n'
    )
    cfg = load_config(f)
    assert cfg.deadline_ms == 1500 and cfg.clouds == ("10.0.0.5:50051",) and cfg.discovery
    assert cfg.decision_log_path == tmp_path / "log" / "decisions.jsonl"
    assert cfg.api_socket_path == tmp_path / "run" / "d.sock"
    assert cfg.metrics_port is None
    assert cfg.models == (ModelConfig(name="m", path=str(tmp_path / "models" / "m.onnx")),)
    with pytest.raises(AttributeError):
        cfg.deadline_ms = 1  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"deadline_ms": "fast"}, r"key 'deadline_ms': expected a number of milliseconds > 0, got 'fast' \(str\)"),
        ({"deadline_ms": -5}, r"key 'deadline_ms': expected a number of milliseconds > 0, got -5"),
        ({"discovery": "yes"}, r"key 'discovery': expected true or false, got 'yes'"),
        ({"metrics_port": True}, r"key 'metrics_port': expected a TCP port .*got True"),
        ({"deadlin_ms": 5}, r"unknown key 'deadlin_ms': expected one of"),
        ({"clouds": ["nohost"]}, r"key 'clouds': expected HOST:PORT, got 'nohost'"),
        ({"api_address": "0.0.0.0:50100"}, r"key 'api_address': expected a loopback address.*got '0.0.0.0:50100'"),
        ({"objective": "speed"}, r"key 'objective': expected one of latency, energy, throughput, got 'speed'"),
        (
            {"policy": "sometimes"},
            r"key 'policy': expected adaptive, route, route-codec, periodic:SECONDS or fixed:PLAN, got 'sometimes'",
        ),
        ({"codecs": ["fp99"]}, r"key 'codecs': expected codec names, got 'fp99'"),
        ({"model": []}, r"key 'model': expected at least one \[\[model\]\] table"),
        ({"model": [{"name": "a"}]}, r"model\[0\]: missing key 'path'"),
        (
            {"model": [{"name": "a", "path": "x.onnx", "profile_device_path": "d.json"}]},
            r"model\[0\]: expected both profile_device_path and profile_cloud_path",
        ),
        ({"model": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}, r"expected unique names"),
        ({"api_address": "", "api_socket_path": ""}, r"expected api_address or api_socket_path"),
    ],
)
def test_config_errors_name_the_key_expected_and_got(extra: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_config({**GOOD, **extra}, base_dir=Path("/tmp"))


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("deadline_ms = = 3\n")
    with pytest.raises(ConfigError, match="expected TOML"):
        load_config(bad)


def test_listeners_default_to_loopback() -> None:
    cfg = parse_config(GOOD, base_dir=Path("/tmp"))
    assert cfg.api_address == "127.0.0.1:50100" and cfg.metrics_address == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"key 'metrics_address': expected a loopback address, got '0\.0\.0\.0'"):
        parse_config({**GOOD, "metrics_address": "0.0.0.0"}, base_dir=Path("/tmp"))


def test_token_file_readable_by_others_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    token.write_text("daemon-s3cret\n")
    token.chmod(0o644)
    cfg = parse_config(
        {**GOOD, "token_path": str(token), "metrics_port": -1, "api_address": "127.0.0.1:0"}, base_dir=tmp_path
    )
    with pytest.raises(ConfigError) as info:
        Daemon(cfg)
    msg = str(info.value)
    assert f"token_path {token}: permissions 0644 are too open" in msg and f"chmod 600 {token}" in msg
    assert "daemon-s3cret" not in msg
    token.chmod(0o600)  # private: accepted; without TLS the daemon warns that the token travels in clear
    with caplog.at_level(logging.WARNING, logger="splitrt.device.daemon"):
        Daemon(cfg).stop(grace_s=0)
    assert any("token travels unencrypted" in r.getMessage() for r in caplog.records)


# -- in-process daemon against a real cloud ----------------------------------------------------------


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("daemon-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


@pytest.fixture(scope="module")
def cloud(models_dir: Path) -> Iterator[CloudServer]:
    s = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def _config(tmp_path: Path, clouds: tuple[str, ...], **kw: Any) -> DaemonConfig:
    base: dict[str, Any] = {
        "models": (ModelConfig(name="sq", path=f"zoo:{MODEL}"),),
        "clouds": clouds,
        "api_address": "127.0.0.1:0",
        "api_socket_path": tmp_path / "d.sock",
        "metrics_port": 0,
        "intra_op_threads": 1,
        "policy": "fixed:c30@fp32",
        "decision_log_path": tmp_path / "decisions.jsonl",
    }
    return DaemonConfig(**{**base, **kw})


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    return {"data_0": np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)}


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Strict: every line parses (prometheus_client's parser), every family is typed."""
    return prom.samples(text)


def metric(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_api_infer_equals_local_run_and_bad_input_is_invalid_argument(tmp_path: Path, cloud: CloudServer) -> None:
    x = inputs(1)
    expected = session(zoo.get(MODEL)).run(None, x)[0]
    with Daemon(_config(tmp_path, (cloud.address,))) as d:
        assert d.api_address is not None and d.metrics_url is not None
        with LocalClient(d.api_address) as tcp, LocalClient(str(tmp_path / "d.sock")) as unix:
            r = tcp.infer(x)
            assert r.plan == "c30@fp32" and r.server == cloud.address and not r.fallback
            assert rel_err(expected, r.outputs["softmaxout_1"]) < 1e-5
            r2 = unix.infer(x, model="sq")
            np.testing.assert_array_equal(r.outputs["softmaxout_1"], r2.outputs["softmaxout_1"])
            # wrong shape and wrong name: INVALID_ARGUMENT naming expected vs got; the daemon keeps serving
            with pytest.raises(InputError, match=r"expected shape \[1, 3, 224, 224\], got \[1, 3, 200, 224\]"):
                tcp.infer({"data_0": x["data_0"][:, :, :200]})
            with pytest.raises(InputError, match=r"expected inputs \['data_0'\], got \['image'\]"):
                unix.infer({"image": x["data_0"]})
            with pytest.raises(CloudError) as info:
                tcp.infer(x, model="nope")
            assert info.value.code == "NOT_FOUND" and "expected one of ['sq']" in str(info.value)
            r3 = tcp.infer(x)
            np.testing.assert_array_equal(r.outputs["softmaxout_1"], r3.outputs["softmaxout_1"])
            plan = unix.plan()
            assert plan.model == "sq" and plan.plan == "c30@fp32" and plan.sha256 == d.models["sq"].device.graph.sha256
            assert plan.completed == 3 and plan.failed == 2
            assert [c.address for c in plan.clouds] == [cloud.address] and plan.clouds[0].up
            assert "shipped profile" in plan.cost_table
        text = urllib.request.urlopen(d.metrics_url, timeout=10).read().decode()
    s = parse_metrics(text)
    assert metric(s, "splitrt_up") == 1
    assert metric(s, "splitrt_requests_total", model="sq") == 5  # NOT_FOUND never reached a model
    assert metric(s, "splitrt_requests_failed_total", model="sq") == 2
    assert metric(s, "splitrt_fallbacks_total", model="sq") == 0
    assert metric(s, "splitrt_request_latency_seconds_count", model="sq") == 3
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in s.items() if k[0].endswith("_bucket"))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets) and buckets[-1] == (math.inf, 3)
    assert metric(s, "splitrt_request_latency_seconds_sum", model="sq") > 0
    assert metric(s, "splitrt_current_cut", model="sq", plan="c30@fp32", cut="c30") == 1
    assert metric(s, "splitrt_current_cut_index", model="sq") == 30
    assert metric(s, "splitrt_cloud_up", model="sq", cloud=cloud.address) == 1
    assert metric(s, "splitrt_bandwidth_estimate_mbps", model="sq") > 0
    # the decision log has one replayable line per successful request
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["plan"] == "c30@fp32"
    assert not (tmp_path / "d.sock").exists()


def test_daemon_with_no_cloud_runs_everything_locally(tmp_path: Path) -> None:
    x = inputs(2)
    expected = session(zoo.get(MODEL)).run(None, x)[0]
    with Daemon(_config(tmp_path, (), policy="adaptive", api_socket_path=None)) as d:
        assert d.api_address is not None
        with LocalClient(d.api_address) as c:
            r = c.infer(x)
    assert r.plan == "device" and r.server is None and not r.fallback
    assert rel_err(expected, r.outputs["softmaxout_1"]) < 1e-5


# -- the command: SIGTERM finishes in-flight requests ------------------------------------------------


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """The daemon's "ready" line (a guard against hanging, not a timing assertion)."""
    assert proc.stdout is not None
    box: dict[str, Any] = {}

    def read() -> None:
        assert proc.stdout is not None
        box["line"] = proc.stdout.readline()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    line = box.get("line", "")
    if not line:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"daemon not ready: {err[-3000:]}")
    ready = json.loads(line)
    assert ready["event"] == "ready"
    return ready


def _metrics(url: str) -> dict[Any, float]:
    return parse_metrics(urllib.request.urlopen(url, timeout=10).read().decode())


@pytest.mark.slow
def test_sigterm_finishes_the_in_flight_request(tmp_path: Path, models_dir: Path) -> None:
    release = threading.Event()
    entered = threading.Event()
    s = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))

    def hold(_req: Any) -> None:
        entered.set()
        release.wait(60)

    s.handler.before_tail = hold
    s.start()
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(
        f'clouds = ["{s.address}"]\npolicy = "fixed:c30@fp32"\ndeadline_ms = 60000\n'
        f'api_address = "127.0.0.1:0"\nmetrics_port = 0\ndrain_timeout_s = 30\nintra_op_threads = 1\n'
        f'[[model]]\nname = "sq"\npath = "{zoo.get(MODEL)}"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitrt.cli", "daemon", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = _wait_ready(proc)
        x = inputs(3)
        result: dict[str, Any] = {}

        def call() -> None:
            with LocalClient(ready["api_address"], timeout_s=90) as c:
                try:
                    result["r"] = c.infer(x)
                except Exception as exc:
                    result["error"] = exc

        t = threading.Thread(target=call)
        t.start()
        assert entered.wait(60), "the request never reached the cloud"
        assert metric(_metrics(ready["metrics_url"]), "splitrt_in_flight_requests") == 1
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # let the daemon start draining (the request is still held in the cloud)
        assert proc.poll() is None, "the daemon exited with a request in flight"
        with LocalClient(ready["api_address"], timeout_s=10) as late, pytest.raises(CloudError):
            late.infer(x)  # draining: new calls are refused
        release.set()
        t.join(60)
        out, err = proc.communicate(timeout=60)
    finally:
        release.set()
        reap(proc)
        s.stop(grace_s=0.5)
    assert "error" not in result, result
    r = result["r"]
    assert r.server == s.address and not r.fallback
    assert rel_err(session(zoo.get(MODEL)).run(None, x)[0], r.outputs["softmaxout_1"]) < 1e-5
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"


def test_daemon_check_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    from splitrt.cli.app import main

    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o644)
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'token_path = "{token}"\nmetrics_port = -1\n[[model]]\nname = "m"\npath = "zoo:tiny_chain"\n')
    assert main(["daemon", "--config", str(cfg), "--check"]) == 2
    token.chmod(0o600)
    assert main(["daemon", "--config", str(cfg), "--check"]) == 0
