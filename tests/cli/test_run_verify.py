"""`run --verify` checks one request as well as a stream, and every codec the planner can choose
(``int8c+zstd`` ...) is accepted by `--codec` (derived from the codec registry), issue 33."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.transport import codec

MODEL = "squeezenet"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("verify-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def test_verify_one_request(server: CloudServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c10", "--random", "--verify", "--json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify"] == "equal" and doc["rel_err"] < 1e-4


@pytest.mark.parametrize("spec", ["int8c+zstd", "fp16+zlib"])
def test_every_registry_codec_is_accepted_and_verified(
    server: CloudServer, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    assert spec in codec.names()
    one = ["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c10", "--random", "--codec", spec]
    assert cli.main([*one, "--verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rel_err"] is not None and doc["rel_err"] < 0.2
    stream = ["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c10", "--codec", spec, "--count", "2"]
    assert cli.main([*stream, "--verify", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    rows = lines[:-1]
    assert [r["plan"] for r in rows] == [f"c10@{spec}"] * 2
    assert all(r["server"] == server.address and r["rel_err"] is not None for r in rows)


def test_an_unknown_codec_is_refused_naming_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", f"zoo:{MODEL}", "--cloud", "127.0.0.1:1", "--cut", "c10", "--codec", "int4"])
    assert "int8c+zstd" in capsys.readouterr().err
