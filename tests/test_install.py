"""devices/install.sh into a temporary prefix, then the installed daemon once: metrics answer, GetPlan and
an inference work over the unix socket, SIGTERM stops it cleanly.

The installer runs with ``--reuse-env`` (the venv sees this interpreter's packages; splitrt itself is
installed as a copy with ``pip install --no-deps``): ~4 s here, against ~16 s for a full install from
the local wheelhouse (minutes when the wheels are downloaded).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.device.daemon import LocalClient

REPO = Path(__file__).resolve().parent.parent


def test_installer_rejects_bad_arguments(tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(REPO / "devices" / "install.sh"), "--prefix", str(tmp_path), "--device", "rpi9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "--device: expected one of: rpi4 rpi5 jetson-nano jetson-orin-nano x86, got 'rpi9'" in r.stderr
    r = subprocess.run(
        [
            "bash",
            str(REPO / "devices" / "install.sh"),
            "--prefix",
            str(tmp_path),
            "--device",
            "x86",
            "--api-address",
            "0.0.0.0:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "expected 127.0.0.1:PORT (loopback), got '0.0.0.0:1'" in r.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow
def test_install_then_run_the_installed_daemon(tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "splitrt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(
        [
            "bash",
            str(REPO / "devices" / "install.sh"),
            "--prefix",
            str(prefix),
            "--device",
            "rpi4",
            "--source",
            str(REPO),
            "--python",
            sys.executable,
            "--reuse-env",
            "--no-systemd",
            "--no-discovery",
            "--api-address",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipping systemd (--no-systemd)" in r.stderr
    config = (prefix / "etc" / "splitrt" / "daemon.toml").read_text()
    assert f'board = "{prefix}/share/splitrt/devices/rpi4.toml"' in config and "discovery = false" in config
    for unit in ("splitrt-daemon.service", "splitrt-cloud.service"):
        text = (prefix / "lib" / "systemd" / "system" / unit).read_text()
        assert "@PREFIX@" not in text and f"ExecStart={prefix}/" in text
    # the venv runs the installed copy, not the checkout
    where = subprocess.run(
        [str(prefix / "venv" / "bin" / "python"), "-c", "import splitrt; print(splitrt.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(prefix / "venv")), where

    proc = subprocess.Popen(
        [str(prefix / "bin" / "splitrt-daemon")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(line=proc.stdout.readline() if proc.stdout else ""), daemon=True)
        t.start()
        t.join(120)  # a guard against hanging, not a timing assertion
        if not box.get("line"):
            proc.kill()
            pytest.fail(f"installed daemon not ready: {proc.communicate()[1][-3000:]}")
        ready = json.loads(box["line"])
        assert ready["event"] == "ready" and ready["api_socket"] == str(prefix / "var" / "run" / "daemon.sock")
        assert "shipped profile" in ready["models"]["squeezenet"]["cost_table"]
        assert str(prefix / "share" / "splitrt" / "profiles") in ready["models"]["squeezenet"]["cost_table"]
        text = urllib.request.urlopen(ready["metrics_url"], timeout=30).read().decode()
        assert "# TYPE splitrt_request_latency_seconds histogram" in text and "splitrt_up 1.0" in text
        with LocalClient(ready["api_socket"]) as c:
            plan = c.plan()
            assert plan.model == "squeezenet" and plan.policy == "adaptive" and list(plan.clouds) == []
            x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
            out = c.infer({"data_0": x})
            assert out.plan == "device" and out.outputs["softmaxout_1"].shape == (1, 1000, 1, 1)
            assert c.plan().completed == 1
        proc.send_signal(signal.SIGTERM)
        out_text, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out_text.splitlines()[-1])["event"] == "stopped"
    assert len((prefix / "var" / "log" / "decisions.jsonl").read_text().splitlines()) == 1
