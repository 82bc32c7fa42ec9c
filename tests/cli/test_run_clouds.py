"""`splitrt run --cloud A --cloud B --count N`: the stream is balanced over both clouds (real servers on
127.0.0.1), outputs verified against a local run; one request takes one cloud."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo

MODEL = "tiny_chain"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CloudServer, CloudServer]]:
    d = tmp_path_factory.mktemp("clouds-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    a = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    b = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    a.start()
    b.start()
    yield a, b
    a.stop(grace_s=0.5)
    b.stop(grace_s=0.5)


def test_a_stream_is_balanced_over_every_cloud_given(
    servers: tuple[CloudServer, CloudServer], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = servers
    rc = cli.main(
        [
            "run",
            f"zoo:{MODEL}",
            "--cloud",
            a.address,
            "--cloud",
            b.address,
            "--cut",
            "c2",
            "--count",
            "12",
            "--verify",
            "--json",
        ]
    )
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summary, rows = docs[-1]["summary"], docs[:-1]
    assert rc == 0 and summary["completed"] == 12 and summary["failed"] == 0
    assert all(r["ok"] and r["rel_err"] < 1e-5 for r in rows)
    assert set(summary["servers"]) == {a.address, b.address}, summary


def test_one_request_takes_one_cloud(servers: tuple[CloudServer, CloudServer]) -> None:
    a, b = servers
    argv = ["run", f"zoo:{MODEL}", "--cloud", a.address, "--cloud", b.address, "--cut", "c2", "--random"]
    assert cli.main(argv) == 2
