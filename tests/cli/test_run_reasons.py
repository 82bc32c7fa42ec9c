"""`splitrt run` says why: a fallback's reason is in the stream's JSON and table, an onnxruntime error on the
device is a failed row with a clear message (no traceback), the first request on a new cut reports the tail
session's build as ``build_ms`` (not ``queue_ms``), and plan's table shows the bytes it prices."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("reason-models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    with CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1)) as s:
        yield s


def _lines(out: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    docs = [json.loads(line) for line in out.splitlines()]
    return docs[:-1], docs[-1]["summary"]


def test_a_fallback_says_why_in_json_and_table(capsys: pytest.CaptureFixture[str], dead_address: str) -> None:
    dead = dead_address
    argv = ["run", "zoo:tiny_chain", "--random", "--count", "1", "--cut", "c2", "--cloud", dead, "--no-upload"]
    assert cli.main([*argv, "--json"]) == 0
    rows, summary = _lines(capsys.readouterr().out)
    assert summary["fallbacks"] == 1 and rows[0]["fallback"] is True
    assert dead in rows[0]["fallback_reason"] and "UNAVAILABLE" in rows[0]["fallback_reason"]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "reason" in table.splitlines()[0] and dead in table


def test_an_onnxruntime_error_on_the_device_is_a_failed_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dead_address: str
) -> None:
    """yolo_tiny declares free H and W, but 36 x 36 does not go through its neck (a Concat refuses 3 vs 4).
    Bound at 64 x 64 (the plan's shape), the stream's requests come at 36 x 36."""
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 36, 36), np.float32))
    argv = [
        "run",
        "zoo:yolo_tiny",
        "--input",
        str(x),
        "--count",
        "2",
        "--cut",
        "device",
        "--cloud",
        dead_address,
        "--dim",
        "height=64",
        "--dim",
        "width=64",
    ]
    assert cli.main([*argv, "--json"]) == 1
    cap = capsys.readouterr()
    rows, summary = _lines(cap.out)
    assert summary["failed"] == 2 and not any(r["ok"] for r in rows)
    assert all(
        "failed in onnxruntime on this device at images=[1, 3, 36, 36]" in r["error"] and "Concat" in r["error"]
        for r in rows
    )
    assert "Traceback" not in cap.err
    assert cli.main(argv) == 1
    assert "failed in onnxruntime on this device" in capsys.readouterr().out


def test_the_first_request_on_a_cut_reports_the_build_not_a_queue(server: CloudServer) -> None:
    mg = graph.load(zoo.get("tiny_chain"))
    with Device(mg, server.address, config=DeviceConfig(intra_op_threads=1, upload=False)) as dev:
        feeds = dev.random_inputs(1)
        for cut in ("c1", "c3"):
            first, again = dev.run_detailed(feeds, cut=cut), dev.run_detailed(feeds, cut=cut)
            assert first.build_ms > 0 and again.build_ms < first.build_ms, cut
            # the build is its own term of the round trip, and not the wait for a worker
            assert first.queue_ms + first.build_ms + first.tail_ms <= first.rpc_ms
            assert first.timings()["build_ms"] == first.build_ms


def test_plan_table_shows_the_bytes_each_transfer_prices(capsys: pytest.CaptureFixture[str]) -> None:
    prof = str(REPO / "profiles" / "x86_64-2core__squeezenet.json")
    base = ["plan", "zoo:squeezenet", "--device", prof, "--cloud", prof, "--bandwidth-mbps", "8", "--rtt-ms", "40"]
    assert cli.main([*base, "--json"]) == 0
    rows = {r["cut"]: r for r in json.loads(capsys.readouterr().out)["cuts"]}
    assert cli.main(base) == 0
    lines = capsys.readouterr().out.splitlines()
    col = {name: i for i, name in enumerate(re.split(r"\s{2,}", lines[0].strip()))}  # labels: 2+ spaces apart
    assert {"transfer ms", "sent bytes", "download ms", "reply bytes"} <= set(col)
    sent, transfer, reply, download = (col[k] for k in ("sent bytes", "transfer ms", "reply bytes", "download ms"))
    for line in lines[1:]:
        words = line.split()
        if words and words[0] in rows:
            r = rows[words[0]]
            # transfer ms = sent bytes at 8 Mbit/s (1000 bytes per ms), download ms = reply bytes likewise
            assert int(words[sent]) == r["sent_bytes"] and abs(float(words[transfer]) - r["sent_bytes"] / 1000) < 0.01
            assert (
                int(words[reply]) == r["reply_bytes"] and abs(float(words[download]) - r["reply_bytes"] / 1000) < 0.01
            )
