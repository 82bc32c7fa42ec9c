"""`splitrt daemon --check` refuses what the start would fail on (a socket or a log in /proc, a fixed
plan naming no cut, a board path out of devices/, a model that is a device file), and the daemon
drains on SIGHUP as on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from splitrt.cli.app import main
from tests.loopback import reap

REPO = Path(__file__).resolve().parents[2]
BASE = 'metrics_port = -1\napi_address = "127.0.0.1:0"\n'


@pytest.mark.parametrize(
    ("top", "model", "said"),
    [
        ('api_socket_path = "/proc/x.sock"\n', "zoo:tiny_chain", "key 'api_socket_path': expected a unix socket"),
        ('decision_log_path = "/proc/self/mem"\n', "zoo:tiny_chain", "key 'decision_log_path': expected a regular"),
        ('policy = "fixed:nonsense"\n', "zoo:tiny_chain", "policy 'fixed:nonsense': unknown cut 'nonsense'"),
        ('board = "../../etc/passwd"\n', "zoo:tiny_chain", "key 'board': expected a board name"),
        ("", "/dev/zero", "model 'm' path: expected an .onnx file (a regular file), got '/dev/zero'"),
    ],
    ids=["socket-in-proc", "log-in-proc", "fixed-nonsense", "board-path", "model-dev-zero"],
)
def test_check_refuses_what_the_start_would_fail_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], top: str, model: str, said: str
) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'{top}{BASE}[[model]]\nname = "m"\npath = "{model}"\n')
    assert main(["daemon", "--config", str(cfg), "--check"]) == 2  # a ConfigError, not a traceback
    err = capsys.readouterr().err
    assert f"splitrt: error: {said}" in err or said in err, err


def test_check_refuses_a_socket_path_over_an_existing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "precious.txt"  # the start removes what is at the socket path
    victim.write_text("keep me")
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'api_socket_path = "{victim}"\n{BASE}[[model]]\nname = "m"\npath = "zoo:tiny_chain"\n')
    assert main(["daemon", "--config", str(cfg), "--check"]) == 2
    assert "got an existing non-socket file" in capsys.readouterr().err
    assert main(["daemon", "--config", str(cfg)]) == 2  # and the start refuses it too, before removing it
    assert victim.read_text() == "keep me"


def test_daemon_drains_on_sighup(tmp_path: Path) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'{BASE}drain_timeout_s = 5\n[[model]]\nname = "m"\npath = "zoo:tiny_chain"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitrt.cli", "daemon", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(line=proc.stdout.readline() if proc.stdout else ""))
        t.start()
        t.join(120)  # a guard against hanging
        assert json.loads(box.get("line") or "{}").get("event") == "ready", box
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"
    assert "stopping, draining" in err
