"""`splitrt status` / `splitrt top`: a fleet of real servers (and a dead address) at a glance, once or
refreshed; `--json --count N` for scripts and tests."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device
from splitrt.graph import zoo


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[CloudServer]]:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    servers = [CloudServer(ServerConfig(models_dir=d, workers=w, max_queue=3)) for w in (1, 2)]
    for s in servers:
        s.start()
    with Device(zoo.get("tiny_chain"), servers[0].address) as dev:
        for _ in range(3):
            dev.run(dev.random_inputs(), cut="c2")
    yield servers
    for s in servers:
        s.stop(grace_s=0)


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_status_json_once(fleet: list[CloudServer], capsys: pytest.CaptureFixture[str]) -> None:
    dead = _dead_address()
    code = cli.main(["status", fleet[0].address, fleet[1].address, dead, "--json", "--count", "1", "--timeout-s", "5"])
    assert code == 1  # one server is down
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["up"] == 2
    rows = {r["address"]: r for r in out["servers"]}
    first, second = rows[fleet[0].address], rows[fleet[1].address]
    assert first["served"] == 3 and first["errors"] == 0 and first["workers"] == 1 and first["max_queue"] == 3
    assert first["service_ms"] > 0 and first["queue_depth"] == 0
    assert second["served"] == 0 and second["workers"] == 2
    assert rows[dead]["up"] is False and "UNAVAILABLE" in rows[dead]["error"]


def test_status_watch_refreshes(fleet: list[CloudServer], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", fleet[0].address, "--watch", "0.05", "--count", "2", "--json"]) == 0
    snaps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(snaps) == 2
    assert "served_per_s" not in snaps[0]["servers"][0] and snaps[1]["servers"][0]["served_per_s"] == 0.0


def test_top_prints_a_table(fleet: list[CloudServer], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["top", fleet[0].address, fleet[1].address, "--count", "1"]) == 0
    out = capsys.readouterr().out
    assert "2/2 servers up" in out
    assert "served/s" in out and fleet[0].address in out and "0/4" in out  # queue 0 of workers + queue


@pytest.mark.parametrize(
    "argv,message",
    [(["--watch", "0"], "--watch: expected seconds > 0, got 0.0"), (["--count", "0"], "--count: expected >= 1, got 0")],
)
def test_status_refuses_bad_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "127.0.0.1:1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_readme_status_commands_parse() -> None:
    """The README's and docs' fleet commands stay valid (they need servers, so test_readme does not run them)."""
    import re
    import shlex

    from tests.test_readme import docs_text

    text = docs_text()
    found = [
        shlex.split(line.split(" # ")[0].strip())[1:]
        for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith((".venv/bin/splitrt status ", ".venv/bin/splitrt top "))
    ]
    assert {argv[0] for argv in found} == {"status", "top"}
    for argv in found:
        args = cli.build_parser().parse_args(argv)
        assert args.servers and args.func.__name__ == "cmd_status"
