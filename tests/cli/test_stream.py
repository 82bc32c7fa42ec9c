"""`splitrt run --count N --json`: one line per request, then a summary (against a real cloud on 127.0.0.1)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo

MODEL = "squeezenet"
KEYS = {"id", "ok", "cut", "latency_ms", "fallback", "server"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("stream-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], dict[str, Any], str]:
    rc = cli.main(["run", f"zoo:{MODEL}", *argv, "--json"])
    cap = capsys.readouterr()
    docs = [json.loads(line) for line in cap.out.splitlines()]
    assert "summary" in docs[-1] and all("summary" not in d for d in docs[:-1])
    return rc, docs[:-1], docs[-1]["summary"], cap.err


def test_count_20_json_lines_and_summary(server: CloudServer, capsys: pytest.CaptureFixture[str]) -> None:
    rc, rows, summary, err = run_json(
        capsys, "--cloud", server.address, "--cut", "c30", "--count", "20", "--verify", "--rate", "200"
    )
    assert rc == 0
    assert [r["id"] for r in rows] == list(range(20))
    for r in rows:
        assert set(r) >= KEYS
        assert r["ok"] is True and r["cut"] == "c30" and r["server"] == server.address and r["fallback"] is False
        assert r["latency_ms"] > 0 and r["rel_err"] < 1e-5
    assert summary.pop("cost_table")["kind"] in ("shipped", "prior")
    assert summary == {
        "completed": 20,
        "failed": 0,
        "fallbacks": 0,
        "not_sent": 0,
        "switches": 0,
        "servers": {server.address: 20},
        "different": 0,
    }
    assert "cost table from shipped profile" in err


def test_auto_with_board_and_prior(server: CloudServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # tiny_chain has no shipped profile: the FLOPs prior with the board's speed is used (and said so)
    log = tmp_path / "decisions.jsonl"
    rc = cli.main(
        [
            "run",
            "zoo:tiny_chain",
            "--cloud",
            server.address,
            "--cut",
            "auto",
            "--count",
            "5",
            "--board",
            "rpi4",
            "--json",
            "--decision-log",
            str(log),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0
    assert "FLOPs prior" in cap.err and "GFLOP/s" in cap.err
    summary = json.loads(cap.out.splitlines()[-1])["summary"]
    assert summary["completed"] == 5 and summary["failed"] == 0
    assert len(log.read_text().splitlines()) == 5


def test_dead_cloud_every_request_completes_locally(capsys: pytest.CaptureFixture[str], dead_address: str) -> None:
    rc, rows, summary, _ = run_json(capsys, "--cloud", dead_address, "--cut", "c30", "--count", "6", "--verify")
    assert rc == 0
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert all(r["ok"] and r["server"] is None and r["rel_err"] < 1e-5 for r in rows)
    # the first request found the cloud gone and finished its tail here (a fallback); the rest planned device
    assert rows[0]["fallback"] is True and summary["fallbacks"] == sum(r["fallback"] for r in rows) >= 1


def test_table_output_and_flag_errors(server: CloudServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c30", "--count", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["id", "ok", "plan", "latency_ms", "fallback", "server", "reason"]
    assert "completed" in out
    assert cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c999", "--count", "2"]) == 2
    assert "c999" in capsys.readouterr().err
    assert cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c3", "--count", "0"]) == 2
    assert "--count: expected >= 1, got 0" in capsys.readouterr().err
    # the single-request form still needs inputs
    assert cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--cut", "c3"]) == 2
    assert "expected --input FILE or --random" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", f"zoo:{MODEL}", "--cloud", server.address, "--discover", "--cut", "c3"])


def test_count_takes_the_shapes_of_input_files_and_verify_shows_rel_err(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bert_tiny has a free seq dim: --input files carry it, no --dim asked; --verify's rel_err is in the table."""
    import numpy as np

    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo.get("bert_tiny"), models / "bert_tiny.onnx")
    feeds = tmp_path / "in.npz"
    rng = np.random.default_rng(3)
    np.savez(
        feeds, input_ids=rng.integers(0, 1000, (1, 24)).astype(np.int64), attention_mask=np.ones((1, 24), np.int64)
    )
    with CloudServer(ServerConfig(models_dir=models, workers=1, intra_op_threads=1)) as s:
        s.start()
        argv = [
            "run",
            "zoo:bert_tiny",
            "--cloud",
            s.address,
            "--cut",
            "c20",
            "--count",
            "2",
            "--input",
            str(feeds),
            "--verify",
        ]
        assert cli.main([*argv, "--json"]) == 0
        cap = capsys.readouterr()
        rows = [json.loads(line) for line in cap.out.splitlines()]
        assert all(
            r["ok"] and r["server"] == s.address and r["verify"] == "equal" and r["rel_err"] < 1e-5 for r in rows[:-1]
        )
        assert rows[-1]["summary"]["different"] == 0
        assert cli.main(argv) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == [
            "id",
            "ok",
            "plan",
            "latency_ms",
            "fallback",
            "server",
            "rel_err",
            "verify",
            "reason",
        ]
        assert table[2].split()[-2:] == ["equal", "-"]  # under the header rule; no reason: not a fallback


def test_verify_nan_in_both_at_the_same_places_is_equal(
    server: CloudServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    x[0, :, :8, :8] = np.nan  # spreads through the convolutions: NaN outputs on both sides
    f = tmp_path / "x.npy"
    np.save(f, x)
    rc, rows, summary, _ = run_json(
        capsys, "--cloud", server.address, "--cut", "c30", "--count", "1", "--input", str(f), "--verify"
    )
    assert rc == 0 and rows[0]["ok"]
    assert rows[0]["verify"].startswith("equal (NaN/inf at the same") and summary["different"] == 0


def test_verify_names_nan_where_the_other_run_has_numbers() -> None:
    import numpy as np

    from splitrt.cli.stream import verify

    ref = {"y": np.array([1.0, np.nan, 3.0], np.float32), "z": np.array([2.0], np.float32)}
    assert verify(ref, {"y": np.array([1.0, np.nan, 3.0], np.float32), "z": np.array([2.0], np.float32)}) == (
        0.0,
        "equal (NaN/inf at the same 1 place(s) in both)",
    )
    err, verdict = verify(ref, {"y": np.array([np.nan, 2.0, 3.0], np.float32), "z": np.array([2.0], np.float32)})
    assert err is None and verdict.startswith("different: 'y' is NaN/inf at 2 place(s)")
    err, verdict = verify(ref, {"y": np.array([1.0, np.nan, np.inf], np.float32), "z": np.array([2.0], np.float32)})
    assert err is None and "'y'" in verdict
    err, verdict = verify(ref, {"y": np.array([1.0, np.nan, 3.3], np.float32), "z": np.array([2.0], np.float32)})
    assert err is not None and abs(err - 0.1) < 1e-6 and verdict.startswith("different: rel_err 0.1")
