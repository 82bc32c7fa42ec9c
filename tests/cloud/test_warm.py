"""Warm start (``splitrt.cloud.models.warm``): a server remembers the (model, cut) pairs it served in its models
directory and makes their tails again at start, in the background; ``--warm`` names more. Real gRPC
servers on 127.0.0.1, real onnxruntime sessions, the real builder child where ``splitrt serve`` uses one
(tiny_chain, random weights)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrt.cloud.models import warm
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.graph.model import model_sha256

REPO = Path(__file__).resolve().parents[2]
WARM_ARGS = ["--warm", "tiny_chain.onnx@c2", "--warm", "tiny_chain.onnx@c42"]


@pytest.fixture()
def models_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


def _config(models_dir: Path, **kw: Any) -> ServerConfig:
    return ServerConfig(**{"models_dir": models_dir, "workers": 2, "intra_op_threads": 1, "warm_file": True, **kw})


def _until(pred: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait for ``pred`` (the bound is a guard against hanging, not a timing)."""
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, f"expected {what} within {timeout_s:g} s"
        time.sleep(0.02)


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    out = []
    for r in caplog.records:
        if r.name == "splitrt.cloud":
            event = json.loads(r.getMessage())
            if event["event"] == name:
                out.append(event)
    return out


def _serve(server: CloudServer, model: Path, cuts: list[str]) -> None:
    # 60 s: a build in a child process on a loaded host passed the Device's 10 s default.
    with Device(model, server.address, config=DeviceConfig(timeout_s=60)) as d:
        x = d.random_inputs(seed=3)
        want = d.run_local(x)["y"]
        for cut in cuts:
            got = d.run(x, cut=cut)["y"]
            assert np.abs(want).max() > 0 and np.allclose(got, want, rtol=1e-5, atol=1e-6), cut


def test_a_restarted_server_makes_the_tails_it_served_without_a_request(
    models_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="splitrt.cloud")
    model = models_dir / "tiny_chain.onnx"
    sha = model_sha256(model)
    with CloudServer(_config(models_dir, build_in_child=True)) as first:
        assert first.warm.pairs == [] and _events(caplog, "warm_started") == []  # nothing remembered yet
        _serve(first, model, ["c3"])
        # The first new pair is written at once, on a thread of its own; the next ones within 5 s at stop.
        _until(lambda: (models_dir / warm.WARM_FILE).exists(), "the warm file written while serving")
        assert warm.read_pairs(models_dir / warm.WARM_FILE, 16) == [(sha, "c3")]
        _serve(first, model, ["c5", "c3"])
    stored = json.loads((models_dir / warm.WARM_FILE).read_text())
    assert stored["format"] == "splitrt-warm" and stored["pairs"] == [[sha, "c3"], [sha, "c5"]]  # most recent first
    caplog.clear()

    server = CloudServer(_config(models_dir, build_in_child=True))
    builder = server.tails.builder
    assert builder is not None
    made: list[str] = []
    gate = threading.Event()
    make = builder.make

    def gated(path: Path, root: Path, sha256: str, cut_id: str, max_nodes: int | None) -> Any:
        made.append(cut_id)
        gate.wait(60)  # the warm-up's first build is held until a request for the same cut is waiting
        return make(path, root, sha256, cut_id, max_nodes)

    builder.make = gated  # type: ignore[method-assign]
    server.start()
    try:
        _until(lambda: made == ["c3"], "the warm-up to start building c3")
        # Health says SERVING while the warm-up's build is held: a warm-up is no readiness condition.
        with grpc.insecure_channel(server.address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == health_pb2.HealthCheckResponse.SERVING and server.served == 0
        answered: list[BaseException | None] = []

        def request() -> None:
            try:
                _serve(server, model, ["c3"])
                answered.append(None)
            except BaseException as exc:
                answered.append(exc)

        caller = threading.Thread(target=request)
        caller.start()
        _until(lambda: server.admission.admitted == 1, "the request to be admitted")
        time.sleep(0.2)  # lets it reach the build in flight (the assertions below hold either way)
        gate.set()
        caller.join(60)
        assert answered == [None]
        _until(lambda: len(server.tails.snapshot()) == 2, "both remembered tails built")
        # One build per cut: the request for c3 waited on the warm-up's build instead of making its own.
        assert sorted(made) == ["c3", "c5"] and server.tails.cache_misses == 2
        assert {(s, c) for s, c, _ in server.tails.snapshot()} == {(sha, "c3"), (sha, "c5")}
        built = _events(caplog, "tail_built")
        assert sorted(e["cut"] for e in built) == ["c3", "c5"]
        assert _events(caplog, "warm_started")[0]["pairs"] == 2
        _until(lambda: bool(_events(caplog, "warm_done")), "warm_done")
        assert _events(caplog, "warm_done")[0]["built"] == 2
        assert server.served == 1
    finally:
        gate.set()
        server.stop(grace_s=1.0)


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xffnot json at all",
        b'{"format": "someone-else", "pairs": []}',
        b'{"format": "splitrt-warm", "version": 1, "pairs": [["not-a-sha", "c3"]]}',
        b'[["0123", "c3"]]',
    ],
    ids=["garbage", "foreign", "bad-pair", "a-list"],
)
def test_a_corrupt_or_foreign_warm_file_is_ignored_with_one_warning(
    models_dir: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    caplog.set_level(logging.INFO, logger="splitrt.cloud")
    path = models_dir / warm.WARM_FILE
    path.write_bytes(content)
    with CloudServer(_config(models_dir)) as server:
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [json.loads(r.getMessage())["event"] for r in warnings] == ["warm_file_ignored"]
        assert "expected" in _events(caplog, "warm_file_ignored")[0]["error"]
        assert _events(caplog, "warm_started") == [] and server.tails.snapshot() == []
        _serve(server, models_dir / "tiny_chain.onnx", ["c2"])  # and it serves, and remembers anew
    assert warm.read_pairs(path, 16) == [(model_sha256(models_dir / "tiny_chain.onnx"), "c2")]


def test_warm_names_pairs_to_make_and_no_warm_leaves_the_file_alone(
    models_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="splitrt.cloud")
    sha = model_sha256(models_dir / "tiny_chain.onnx")
    path = models_dir / warm.WARM_FILE
    warm.write_pairs(path, [(sha, "c1"), ("f" * 64, "c2")])  # the second model is gone from the store
    before = path.read_bytes()
    # Without the file: only the named pairs, by file stem and by sha256 prefix.
    with CloudServer(_config(models_dir, warm=("tiny_chain@c4", f"{sha[:8]}@c2,c4"), warm_file=False)) as server:
        assert server.warm.pairs == [(sha, "c4"), (sha, "c2")]
        _until(lambda: len(server.tails.snapshot()) == 2, "the named tails built")
        assert {c for _, c, _ in server.tails.snapshot()} == {"c4", "c2"}  # not the remembered c1
        _serve(server, models_dir / "tiny_chain.onnx", ["c3"])
    assert path.read_bytes() == before  # --no-warm: not written either
    # With it: the named ones first, then the remembered ones whose model is still here.
    caplog.clear()
    with CloudServer(_config(models_dir, warm=("tiny_chain.onnx@c5",))) as server:
        _until(lambda: bool(_events(caplog, "warm_done")), "the warm-up done")
        # Least recently used first: the named pair, built first, is now the most recent (evicted last).
        assert [c for _, c, _ in server.tails.snapshot()] == ["c1", "c5"]
        started = _events(caplog, "warm_started")[0]
        assert started["pairs"] == 2 and started["explicit"] == 1 and started["left_out"] == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope.onnx@c1", "expected a model file name in the models directory or a sha256 prefix of at least 4 hex"),
        ("nope.onnx@c1", "(1 models: tiny_chain.onnx), got 'nope.onnx'"),
        ("tiny_chain.onnx@c99", "model tiny_chain.onnx has no cut 'c99': expected one of its 7 cut ids (cloud, c1,"),
        ("tiny_chain.onnx@c2>c99", "has no cut 'c99'"),
        ("tiny_chain.onnx@device", "expected a cut before 'device' (a tail to make), got 'device'"),
        ("tiny_chain.onnx", "expected MODEL@CUT[,CUT...]"),
        ("tiny_chain.onnx@c1,", "got an empty part"),
        ("00000000@c1", "got '00000000'"),
    ],
)
def test_warm_with_an_unknown_model_or_cut_is_refused(models_dir: Path, spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CloudServer(_config(models_dir, warm=(spec,)))
    assert f"--warm {spec!r}" in str(info.value) and message in str(info.value), str(info.value)


def test_serve_warm_with_an_unknown_cut_exits_2_before_listening(models_dir: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "splitrt.cli", "serve", "--models", str(models_dir), "--port", "0", *WARM_ARGS],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2, r.stderr
    assert "splitrt: error: --warm 'tiny_chain.onnx@c42': model tiny_chain.onnx has no cut 'c42'" in r.stderr
    assert "listening" not in r.stderr


def test_the_file_stays_bounded_and_is_written_rarely(tmp_path: Path) -> None:
    path = tmp_path / warm.WARM_FILE
    now = [0.0]
    stale = tmp_path / f".{warm.WARM_FILE}.999999999.1.tmp"  # a killed server's: no such process
    stale.write_text("{")
    rec = warm.Recorder(
        path, 3, remembered=[("a" * 64, "old")], min_interval_s=5.0, clock=lambda: now[0], background=False
    )
    assert not stale.exists()
    shas = [f"{i:064x}" for i in range(10)]
    rec.served(shas[0], "c1")
    assert rec.writes == 1 and warm.read_pairs(path, 99) == [(shas[0], "c1"), ("a" * 64, "old")]
    for sha in shas[1:]:  # new pairs within the interval: remembered, not written
        rec.served(sha, "c1")
    assert rec.writes == 1
    rec.served(shas[9], "c1")  # the most recent again: nothing changes
    now[0] = 5.0
    rec.served(shas[9], "c1")
    assert rec.writes == 1  # nothing new since: no write
    rec.served(shas[0], "c2")
    assert rec.writes == 2
    want = [(shas[0], "c2"), (shas[9], "c1"), (shas[8], "c1")]
    assert rec.pairs() == want and warm.read_pairs(path, 99) == want
    rec.served(shas[8], "c1")  # a known pair moves up: written at flush, not now
    assert rec.writes == 2
    rec.flush()
    rec.flush()  # nothing changed since
    assert rec.writes == 3 and warm.read_pairs(path, 99)[0] == (shas[8], "c1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [warm.WARM_FILE]  # no temporary file left
    assert path.stat().st_mode & 0o077 == 0
    # A longer file (another server's limit) is read up to this one's.
    warm.write_pairs(path, [(s, "c1") for s in shas])
    assert warm.read_pairs(path, 4) == [(s, "c1") for s in shas[:4]]


def test_flush_waits_for_a_write_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At stop the file holds every pair served, even with the background write still going."""
    path = tmp_path / warm.WARM_FILE
    entered, release = threading.Event(), threading.Event()
    write = warm.write_pairs

    def slow(p: Path, pairs: Any) -> None:
        entered.set()
        release.wait(30)
        write(p, pairs)

    monkeypatch.setattr(warm, "write_pairs", slow)
    rec = warm.Recorder(path, 4)  # background writes, as the server's
    rec.served("d" * 64, "c1")
    assert entered.wait(30)  # the background write has its snapshot and is held
    opener = threading.Timer(0.2, release.set)
    opener.start()
    rec.flush()
    opener.join()
    assert warm.read_pairs(path, 4) == [("d" * 64, "c1")]


def test_an_unwritable_file_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="splitrt.cloud")
    (tmp_path / "not-a-dir").write_text("")  # unwritable even for root (CI), unlike a read-only directory
    rec = warm.Recorder(tmp_path / "not-a-dir" / warm.WARM_FILE, 4, min_interval_s=0.0, background=False)
    rec.served("b" * 64, "c1")
    rec.served("c" * 64, "c1")
    rec.flush()
    assert len(_events(caplog, "warm_file_unwritable")) == 1 and rec.writes == 0
    assert rec.pairs() == [("c" * 64, "c1"), ("b" * 64, "c1")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]


def test_choose_puts_named_pairs_first_once_and_drops_gone_models() -> None:
    a, b, gone = "a" * 64, "b" * 64, "c" * 64
    remembered = [(b, "c1"), (gone, "c1"), (a, "c2"), (f"{a}~If0=1", "c3")]
    got = warm.choose([(a, "c2"), (a, "c9")], remembered, known=frozenset({a, b}), limit=4)
    assert got == [(a, "c2"), (a, "c9"), (b, "c1"), (f"{a}~If0=1", "c3")]
    assert warm.choose([], remembered, known=frozenset({a, b}), limit=2) == [(b, "c1"), (a, "c2")]
    assert warm.choose([], remembered, known=frozenset(), limit=8) == []
