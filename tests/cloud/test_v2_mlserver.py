"""Tails on a real third-party v2 server: MLServer (PyPI, its own cached venv, see tests/v2server.py) serves
the repository `splitrt export-repository` writes; devices reach it with `v2://host:port`.

The heads run here, the tails in MLServer's process (through the runtime class the export ships), and the
outputs equal the whole model run locally. Bad requests are refused with a clear INVALID_ARGUMENT /
NOT_FOUND and the adaptive runtime finishes them locally.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from splitrt.cli.app import main as cli_main
from splitrt.device.client import Device
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import CloudError
from splitrt.export import v2repo
from splitrt.graph import model as graph
from splitrt.graph import shapes, zoo
from splitrt.profile.priors import flops_table
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.v2 import V2Transport, model_name
from tests.conftest import rel_err
from tests.v2server import MLServer, server_venv

CHAIN_CUTS = ("c3", "c5")
BERT_CUTS = ("cloud", "c3", "c12")  # c3 sends int64 tensors and an int64 scalar
FIXED_CUT = "c2"  # tiny_chain's tail at c2, exported for batch 1 only


@pytest.fixture(scope="module")
def chain() -> graph.ModelGraph:
    return graph.load(zoo.get("tiny_chain"))


@pytest.fixture(scope="module")
def bert() -> graph.ModelGraph:
    return graph.load(zoo.get("bert_tiny"))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, chain: graph.ModelGraph) -> Path:
    out = tmp_path_factory.mktemp("v2repo")
    # Through the CLI, as an operator would.
    assert (
        cli_main(["export-repository", "--model", "zoo:tiny_chain", "--cuts", ",".join(CHAIN_CUTS), "--out", str(out)])
        == 0
    )
    assert (
        cli_main(
            [
                "export-repository",
                "--model",
                "zoo:bert_tiny",
                "--cuts",
                ",".join(BERT_CUTS),
                "--dim",
                "seq=6",
                "--out",
                str(out),
            ]
        )
        == 0
    )  # sizes only: the tails stay generic
    fixed = graph.load(chain.path, shapes.binding_from([], ["N=1"], None))
    v2repo.export_repository(fixed, [FIXED_CUT], out, fixed_shapes=True)
    return out


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServer]:
    srv = MLServer(repository, server_venv(), tmp_path_factory.mktemp("mlserver"))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("cut", CHAIN_CUTS)
def test_split_request_on_mlserver_equals_the_whole_model(server: MLServer, chain: graph.ModelGraph, cut: str) -> None:
    with Device(chain, server.address) as dev:
        x = dev.random_inputs(seed=3)
        ref = dev.run_local(x)
        res = dev.run_detailed(x, cut=cut)
        assert res.where == "cloud" and res.bytes_up > 0
        assert set(res.outputs) == set(ref)
        for name in ref:
            assert res.outputs[name].shape == ref[name].shape
            assert rel_err(ref[name], res.outputs[name]) < 1e-5, (cut, name)


@pytest.mark.parametrize("cut", BERT_CUTS)
def test_int64_and_scalar_tensors_cross_to_mlserver(server: MLServer, bert: graph.ModelGraph, cut: str) -> None:
    with Device(bert, server.address) as dev:
        x = {
            "input_ids": np.arange(12, dtype=np.int64).reshape(2, 6) % 50,
            "attention_mask": np.array([[1] * 6, [1] * 4 + [0] * 2], dtype=np.int64),
        }
        ref = dev.run_local(x)
        head = dev.run_head(x, cut)
        assert any(a.dtype == np.int64 for a in head.crossing.values())
        res = dev.send(head)
        assert res.where == "cloud"
        for name in ref:
            assert rel_err(ref[name], res.outputs[name]) < 1e-5, (cut, name)


def test_mlserver_reports_the_exported_metadata(server: MLServer, chain: graph.ModelGraph) -> None:
    t = V2Transport(server.address, model_sha256=chain.sha256)
    try:
        status = t.status(timeout_s=10)
        assert "mlserver" in status.version and [m.sha256 for m in status.models] == [chain.sha256]
        name = model_name(chain.sha256, "c3")
        assert t.model_ready(name, timeout_s=10)
        meta = t.model_metadata(name, timeout_s=10)
        tail_in = chain.cut("c3").tensors[0]
        assert [(i.name, i.datatype, list(i.shape)) for i in meta.inputs] == [
            (tail_in.name, "FP32", [-1, *tail_in.shape[1:]])
        ]
        assert meta.platform == "onnxruntime_onnx"
        # A bandwidth probe: 256 KiB up inside ServerLive, which a stock server parses and ignores.
        assert t.probe(pb.ProbeRequest(payload=bytes(256 * 1024)), timeout_s=10).received_bytes == 256 * 1024
    finally:
        t.close()


def test_wrong_shape_is_a_clear_invalid_argument(server: MLServer, chain: graph.ModelGraph) -> None:
    with Device(chain, server.address) as dev:
        head = dev.run_head(dev.random_inputs(), "c3")
        ((name, arr),) = head.crossing.items()
        head.crossing[name] = arr.reshape(arr.shape[0], arr.shape[1], -1)  # same bytes, wrong rank
        with pytest.raises(CloudError) as err:
            dev.send(head)
    assert err.value.code == "INVALID_ARGUMENT" and not err.value.retryable
    msg = str(err.value)
    assert f"expected shape [-1, {', '.join(str(d) for d in arr.shape[1:])}]" in msg
    assert f"got {list(head.crossing[name].shape)}" in msg


def test_refused_requests_finish_locally_on_the_device(server: MLServer, chain: graph.ModelGraph) -> None:
    table = flops_table(chain, device_gflops=5, cloud_gflops=100)
    x2 = {"x": np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)}  # batch 2
    # c2 is exported for batch 1 only (INVALID_ARGUMENT), c4 not at all (NOT_FOUND).
    for plan, code in ((f"{FIXED_CUT}@fp32", "INVALID_ARGUMENT"), ("c4@fp32", "NOT_FOUND")):
        config = RuntimeConfig(policy=f"fixed:{plan}", deadline_ms=10_000)
        with AdaptiveDevice(chain, table, [server.address], config=config, start_prober=False) as dev:
            out = dev.infer(x2)
            assert out.plan == plan and out.fallback and out.server is None
            ref = dev.local.run_local(x2)
            assert all(rel_err(ref[n], out.outputs[n]) < 1e-6 for n in ref)
            (cloud,) = dev.clouds()
            assert code in str(cloud["last_error"])
    # The same tail at batch 1 runs on the server.
    with Device(chain, server.address) as dev:
        x1 = dev.random_inputs()
        res = dev.run_detailed(x1, cut=FIXED_CUT)
        assert res.where == "cloud"
        assert rel_err(dev.run_local(x1)["y"], res.outputs["y"]) < 1e-5


def test_splitrt_run_speaks_v2(server: MLServer, capsys: pytest.CaptureFixture[str]) -> None:
    """The operator's command: `splitrt run MODEL --cloud v2://HOST:PORT --cut c5`."""
    assert cli_main(["run", "zoo:tiny_chain", "--cloud", server.address, "--cut", "c5", "--random", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["where"] == "cloud" and out["cut_id"] == "c5", out


def test_adaptive_runtime_with_prober_serves_from_mlserver(server: MLServer, chain: graph.ModelGraph) -> None:
    """The runtime as a daemon runs it: prober on (ServerLive RTT and bandwidth probes), every request's
    tail on the v2 server, nothing lost."""
    table = flops_table(chain, device_gflops=5, cloud_gflops=100)
    config = RuntimeConfig(policy="fixed:c3@fp32", deadline_ms=10_000, prober_interval_s=0.05)
    with AdaptiveDevice(chain, table, [server.address], config=config) as dev:
        for seed in range(6):
            x = {"x": np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)}
            out = dev.infer(x)
            assert not out.fallback and out.server == server.address
            assert rel_err(dev.local.run_local(x)["y"], out.outputs["y"]) < 1e-5
        (cloud,) = dev.clouds()
        assert cloud["up"] and not cloud["last_error"]
