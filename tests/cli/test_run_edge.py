"""`splitrt run --edge HOST:PORT --count N --cut auto`: three tiers from the CLI (real cloud and edge
servers on 127.0.0.1), every output verified against a local run; a dead edge loses nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.handler.nexthop import NextTier
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo


@pytest.fixture
def tiers(tmp_path: Path) -> Iterator[tuple[CloudServer, CloudServer]]:
    shutil.copyfile(zoo.get("squeezenet"), tmp_path / "squeezenet.onnx")
    cloud = CloudServer(ServerConfig(models_dir=tmp_path, workers=2, intra_op_threads=1))
    cloud.start()
    edge = CloudServer(
        ServerConfig(models_dir=tmp_path, workers=2, intra_op_threads=1, next_tier=NextTier(address=cloud.address))
    )
    edge.start()
    yield edge, cloud
    edge.stop(grace_s=0)
    cloud.stop(grace_s=0)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[list[dict[str, object]], dict[str, object]]:
    assert cli.main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    return lines[:-1], lines[-1]["summary"]


def test_run_through_an_edge_verifies_every_output(
    tiers: tuple[CloudServer, CloudServer], capsys: pytest.CaptureFixture[str]
) -> None:
    edge, _cloud = tiers
    rows, summary = _run(
        [
            "run",
            "zoo:squeezenet",
            "--edge",
            edge.address,
            "--cut",
            "auto",
            "--count",
            "12",
            "--rate",
            "10",
            "--board",
            "rpi4",
            "--random",
            "--verify",
            "--json",
        ],
        capsys,
    )
    # (where each request ran depends on what the prober measured by then: a cut pair "cA>cB@codec", or "device")
    assert summary["completed"] == 12 and summary["failed"] == 0
    for r in rows:
        assert r["ok"] and (">" in str(r["plan"]) or r["plan"] == "device"), r
        assert float(r["rel_err"]) < 1e-5, r  # type: ignore[arg-type]


def test_a_dead_edge_loses_nothing(tiers: tuple[CloudServer, CloudServer], capsys: pytest.CaptureFixture[str]) -> None:
    edge, cloud = tiers
    address = edge.address
    edge.stop(grace_s=0)
    rows, summary = _run(
        [
            "run",
            "zoo:squeezenet",
            "--edge",
            address,
            "--cloud",
            cloud.address,
            "--cut",
            "auto",
            "--count",
            "6",
            "--random",
            "--verify",
            "--json",
        ],
        capsys,
    )
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert all(r["server"] != "edge" for r in rows), rows  # the edge is gone: the cloud or the device finished
    assert all(float(r["rel_err"]) < 1e-5 for r in rows)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--edge", "127.0.0.1:1", "--cut", "c3"], "--edge: both cuts are chosen per request: expected --cut auto"),
        ([], "run: expected --cloud HOST:PORT, --discover or --edge HOST:PORT"),
    ],
)
def test_edge_flag_mistakes_are_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    cut = [] if "--cut" in argv else ["--cut", "auto"]
    assert cli.main(["run", "zoo:squeezenet", "--random", *cut, *argv]) == 2
    assert message in capsys.readouterr().err
