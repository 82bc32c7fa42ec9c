"""The rig's child processes (``rig.processes``): its JSON-line workers with a real child process (an
``on_event`` callback that raises loses that event, not the pipe's reader), and ``free_port``, the one
copy the tests and benchmarks use."""

from __future__ import annotations

import ast
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from splitrt.rig.processes import Children, JsonWorker, free_port

REPO = Path(__file__).resolve().parents[2]

# A worker in miniature: once told to go, four progress events, then a reply; then it waits for Quit.
CHILD = """
import json, sys
sys.stdin.readline()
for k in range(4):
    print(json.dumps({"event": "progress", "t_s": float(k), "plan": "c1@fp32", "latency_ms": 1.0}), flush=True)
print(json.dumps({"event": "done", "count": 4}), flush=True)
sys.stdin.readline()
"""


def test_a_raising_callback_loses_its_event_not_the_reader(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    children = Children(tmp_path)
    worker = JsonWorker(children.popen([sys.executable, "-c", CHILD], "child.log", pipes=True), "device7")
    seen: list[float] = []

    def on_event(ev: dict[str, Any]) -> None:
        seen.append(float(ev["t_s"]))
        if ev["t_s"] in (0.0, 1.0):  # the same kind twice: logged once
            raise ValueError(f"cannot show {ev['t_s']}")
        if ev["t_s"] == 2.0:
            raise KeyError("plan")

    worker.on_event = on_event
    try:
        with caplog.at_level(logging.WARNING, logger="splitrt.rig.processes"):
            worker.send('{"type": "Go"}')
            reply = worker.reply(timeout_s=30)
    finally:
        worker.close()
        children.terminate_all()
    assert reply == {"event": "done", "count": 4}
    assert seen == [0.0, 1.0, 2.0, 3.0]  # every event reached the callback, in order
    logged = [r.getMessage() for r in caplog.records if r.name == "splitrt.rig.processes"]
    assert len(logged) == 2, logged  # once per exception type
    assert "device7" in logged[0] and "ValueError" in logged[0] and '"t_s": 0.0' in logged[0]
    assert "device7" in logged[1] and "KeyError" in logged[1] and '"t_s": 2.0' in logged[1]


def test_free_port_is_written_once_and_binds() -> None:
    defined = sorted(
        str(path.relative_to(REPO))
        for top in ("splitrt", "tests", "bench", "attacks")
        for path in (REPO / top).rglob("*.py")
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "free_port"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert defined == ["splitrt/rig/processes.py"]  # loopback.py, the benches and attacks import it
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free when picked
