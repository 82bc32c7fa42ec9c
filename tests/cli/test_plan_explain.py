"""`splitrt plan --explain`, the constraint flags of plan and run, and inspect's split-vs-route line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan import explain
from splitrt.profile import boards, profiler

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "x86_64-2core__squeezenet.json"


def test_explain_json_is_the_verdict_of_the_shipped_profile(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", "squeezenet", "--explain", "--board", "rpi4", "--codec", "all", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and "shipped profile" in doc["table"]
    p = profiler.load_profile(PROFILE)
    rpi4 = boards.load_board("rpi4")
    table = profiler.cost_table(p, p, device_speed_factor=rpi4.cpu_speed_factor)
    want = explain.explain(table, rtt_ms=40.0, max_mbps=100.0, power=rpi4.power)
    assert doc["explain"]["summary"] == want.summary
    assert [b["from_mbps"] for b in doc["explain"]["bands"]] == [b.from_mbps for b in want.bands]


def test_explain_says_route_plainly_when_nothing_is_smaller(capsys: pytest.CaptureFixture[str]) -> None:
    # bert_tiny's hidden states (16 x 64 floats) are never smaller than its token ids (16 int64)
    assert (
        cli.main(["plan", "bert_tiny", "--dim", "seq=16", "--explain", "--explain-objectives", "latency,energy"]) == 0
    )
    out = capsys.readouterr().out
    assert "cost table: FLOPs prior" in out
    assert "route, do not split: no inner tensor is smaller than the input under any allowed codec" in out


def test_plan_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "squeezenet", "--bandwidth-mbps", "5"]) == 2
    assert "expected --device, --cloud, --rtt-ms (or --explain)" in capsys.readouterr().err
    assert cli.main(["plan", "squeezenet", "--explain", "--explain-loads", "0.5"]) == 2
    assert "--explain-loads: expected numbers >= 1" in capsys.readouterr().err


def test_plan_honours_and_prices_the_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "plan",
        "squeezenet",
        "--device",
        str(PROFILE),
        "--cloud",
        str(PROFILE),
        "--board",
        "rpi4",
        "--bandwidth-mbps",
        "50",
        "--rtt-ms",
        "10",
        "--json",
    ]
    assert cli.main(args) == 0
    free = json.loads(capsys.readouterr().out)
    assert cli.main([*args, "--no-raw-input", "--min-head-flops", "0.3", "--device-memory-mb", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    c = doc["constraints"]
    mg = graph.load(zoo.get("squeezenet"))
    share = {x.id: x.head_flops_fraction for x in mg.cuts()}
    assert doc["best"]["cut"] != "cloud" and share[doc["best"]["cut"]] >= 0.3
    assert c["excluded"]["cloud"] in ("privacy floor", "raw input") and c["excluded"].get("device") == "memory"
    assert c["price"]["unconstrained"] == free["best"]["plan"]
    assert c["price"]["cost"] == pytest.approx(doc["best"]["predicted_ms"] - free["best"]["predicted_ms"], abs=1e-3)
    assert {r["cut"] for r in doc["cuts"] if r["excluded"]} == set(c["excluded"])
    assert cli.main([*args, "--device-memory-mb", "0.5", "--no-raw-input"]) == 2
    assert "expected at least one cut meeting them" in capsys.readouterr().err


def test_inspect_prints_the_split_vs_route_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inspect", "squeezenet"]) == 0
    assert (
        "split vs route on rpi4 (every codec; details: splitrt plan MODEL --explain): split" in capsys.readouterr().out
    )
    assert cli.main(["inspect", "squeezenet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["routing"]["board"] == "rpi4"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("run-constraints")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def test_run_streams_inside_the_constraints_and_route_only_routes(
    server: CloudServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(
        [
            "run",
            "zoo:tiny_chain",
            "--cloud",
            server.address,
            "--cut",
            "auto",
            "--count",
            "4",
            "--no-raw-input",
            "--verify",
            "--json",
        ]
    )
    cap = capsys.readouterr()
    rows = [json.loads(line) for line in cap.out.splitlines()][:-1]
    assert rc == 0 and "routing cannot comply" in cap.err
    assert all(r["ok"] and not r["plan"].startswith("cloud") for r in rows), rows
    rc = cli.main(["run", "zoo:tiny_chain", "--cloud", server.address, "--cut", "route", "--count", "4", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:-1]
    assert rc == 0 and all(r["plan"].split("@")[0] in ("cloud", "device") for r in rows), rows
    # a fixed cut the constraints exclude is refused before anything runs
    assert (
        cli.main(["run", "zoo:tiny_chain", "--cloud", server.address, "--cut", "cloud", "--random", "--no-raw-input"])
        == 2
    )
    assert "--cut cloud: excluded by the constraints (raw input)" in capsys.readouterr().err
