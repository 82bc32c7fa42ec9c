"""One cost table for every command (issue 33): `plan`, `plan --explain`, `run --cut auto` (one request
and `--count`), `sim` and the daemon, given one device profile, one cloud profile and `--board rpi4`,
all price the device the same (the profile x the board's speed factor); a profile measured on the board
itself (`profile --board`) is not scaled, by any of them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import select_cost_table
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.costmodel import DEVICE_CUT
from splitrt.profile import boards, profiler

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "x86_64-2core__squeezenet.json"
MODEL = "squeezenet"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("one-table")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _device_ms(capsys: pytest.CaptureFixture[str], server: CloudServer, profile: Path, board: str) -> dict[str, float]:
    """The whole model's device ms as each command priced it."""
    prof = ["--device", str(profile), "--cloud", str(profile), "--board", board]
    run_prof = ["--device-profile", str(profile), "--cloud-profile", str(profile), "--board", board]
    got: dict[str, float] = {}
    plan = _json(capsys, ["plan", MODEL, *prof, "--bandwidth-mbps", "10", "--rtt-ms", "20", "--json"])
    got["plan"] = plan["cost_table"]["device_ms"]
    got["plan.device_row"] = next(r["device_ms"] for r in plan["cuts"] if r["cut"] == DEVICE_CUT)
    got["plan --explain"] = _json(capsys, ["plan", MODEL, *prof, "--explain", "--json"])["cost_table"]["device_ms"]
    got["sim"] = _json(
        capsys, ["sim", "--model", MODEL, *prof, "--duration", "5", "--strategies", "adaptive,route", "--json", "-"]
    )["cost_table"]["device_ms"]
    run1 = _json(
        capsys, ["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "auto", "--random", *run_prof, "--json"]
    )
    got["run"] = run1["auto"]["cost_table"]["device_ms"]
    assert (
        cli.main(
            ["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "auto", "--count", "2", *run_prof, "--json"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])["summary"]
    got["run --count"] = summary["cost_table"]["device_ms"]
    table, _ = select_cost_table(
        graph.load(zoo.get(MODEL)), profile_device=profile, profile_cloud=profile, board=boards.load_board(board)
    )
    got["daemon"] = round(float(table.head_ms[table.index(DEVICE_CUT)]), 4)
    return got


def test_every_command_prices_the_device_at_the_board_speed(
    server: CloudServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rpi4 = boards.load_board("rpi4")
    host_ms = profiler.load_profile(PROFILE).total_ms
    got = _device_ms(capsys, server, PROFILE, "rpi4")
    want = host_ms * rpi4.cpu_speed_factor
    assert rpi4.cpu_speed_factor > 2
    for command, ms in got.items():
        assert ms == pytest.approx(want, rel=1e-3), f"{command}: {ms} ms, expected {want} ({got})"


def test_a_profile_measured_on_the_board_is_not_scaled_by_any_command(
    server: CloudServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p = profiler.load_profile(PROFILE)
    on_board = tmp_path / "rpi4__squeezenet.json"
    profiler.save_profile(dataclasses.replace(p, host={**p.host, "board": "rpi4"}), on_board)
    got = _device_ms(capsys, server, on_board, "rpi4")
    for command, ms in got.items():
        assert ms == pytest.approx(p.total_ms, rel=1e-3), f"{command}: {ms} ms, expected {p.total_ms} ({got})"


def test_run_auto_on_loopback_says_the_bandwidth_is_not_measurable(
    server: CloudServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1 MiB probe over loopback returns within the RTT's jitter: `run --cut auto` plans at the most the
    probe resolves and says so, never a rate from dividing by a near-zero transfer time (Tbit/s)."""
    assert cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "auto", "--random", "--json"]) == 0
    out, err = capsys.readouterr()
    auto = json.loads(out)["auto"]
    if auto["bandwidth_measured"]:  # a busy host can stretch one probe past the jitter: then it is a measurement
        assert "loopback: bandwidth " in err and auto["bandwidth_mbps"] > 0
    else:
        assert "loopback: bandwidth not measurable by a 1048576 B probe" in err
    assert auto["bandwidth_mbps"] < 1e5  # at most ~100 Gbit/s: 1 MiB over the jitter floor's resolution
