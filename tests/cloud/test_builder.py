"""Tail segments made in a child process (``splitrt.cloud.models.builder``, ``ServerConfig.build_in_child``, what
``splitrt serve`` does): the same answers as segments made in the server's process, the server's process
never loads the model's graph, errors as the in-process build gives them, and a server stopping while a
segment is being made does not wait for it. Real gRPC servers on 127.0.0.1, real onnxruntime sessions
(squeezenet, random weights)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from splitrt.cloud.capacity.memory import BUILDER_RESIDENT_BYTES
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device
from splitrt.errors import CloudError
from splitrt.graph import zoo
from splitrt.graph.model import model_sha256
from splitrt.graph.peak import PeakEstimator, peak_bytes
from splitrt.graph.sizing import sizing_inputs
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport.grpc_transport import GrpcTransport


def chain(n: int) -> onnx.ModelProto:
    """A chain of ``n`` Neg nodes: seconds to load and split for large ``n`` (Python per node)."""
    nodes = [
        helper.make_node("Neg", ["x" if i == 0 else f"t{i - 1}"], ["y" if i == n - 1 else f"t{i}"]) for i in range(n)
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("squeezenet"), d / "squeezenet.onnx")
    onnx.save(chain(30_000), d / "long_chain.onnx")
    onnx.save(chain(50), d / "short_chain.onnx")
    return d


@pytest.fixture(scope="module")
def device(models_dir: Path) -> Iterator[Device]:
    with Device(models_dir / "squeezenet.onnx", "127.0.0.1:1") as d:
        yield d


def _infer(server: CloudServer, request: wire.Framed) -> wire.Framed:
    t = GrpcTransport(server.address)
    try:
        return t.infer(request, timeout_s=120)
    finally:
        t.close()


def _request(device: Device, cut: str, seed: int) -> wire.Framed:
    head = device.run_head(device.random_inputs(seed), cut)
    return device._request(head, codec.Codec.parse("fp32"))[0]


def _outputs(reply: wire.Framed) -> dict[str, np.ndarray]:
    assert isinstance(reply.header, pb.InferReply) and not reply.header.HasField("error")
    return {t.name: codec.decode(t) for t in reply.tensors}


@pytest.mark.slow
def test_segments_made_in_a_child_answer_as_those_made_here(models_dir: Path, device: Device) -> None:
    cuts = [*[c.id for c in device.graph.cuts()[1:-1]][::9][:4], "cloud"]
    requests = [_request(device, cut, seed) for seed, cut in enumerate(cuts)]
    x = np.random.default_rng(0).standard_normal(1).astype(np.float32)
    short = wire.Framed(  # fixed input shapes: its peak estimate is made with its segment
        header=pb.InferRequest(
            request_id="s", model_sha256=model_sha256(models_dir / "short_chain.onnx"), cut_id="cloud"
        ),
        tensors=[codec.encode("x", x, codec.Codec.parse("fp32"))],
    )
    requests.append(short)
    answers: dict[bool, list[dict[str, np.ndarray]]] = {}
    for in_child in (False, True):
        config = ServerConfig(models_dir=models_dir, workers=2, intra_op_threads=1, build_in_child=in_child)
        with CloudServer(config) as server:
            answers[in_child] = [_outputs(_infer(server, r)) for r in requests]
            # Made in the child, the server's process never loaded the model's graph (nor charged it).
            assert (server.store._loaded == {}) is in_child
            assert len(server.tails.snapshot()) == len(cuts) + 1
            # Every input shape here is fixed: made in the child, each tail comes with its peak estimate,
            # the one the request path would have made here.
            for tail in server.tails._cache.values():
                assert (tail.static_peak is not None) is in_child
                # And which inputs' values decide a size, walked there, not on the request path here.
                assert (tail.sizing is not None) is in_child
                if in_child:
                    assert tail.sizing == sizing_inputs(tail.skeleton)
                if in_child:
                    shapes = dict(tail.static_peak[0])
                    assert shapes.keys() == {n for n, _, _ in tail.inputs}
                    assert tail.static_peak[1] == peak_bytes(tail.skeleton, shapes)
                    assert tail.static_peak[1].peak_bytes > 0
            if in_child:
                assert server.tails.builder is not None
                directory = server.tails.builder._dir
                assert directory is not None and list(Path(directory).iterdir()) == []  # files removed once open
                # What the ledger counts for the child at rest covers it once it has made segments (it trims).
                pool = server.tails.builder.children._pool
                assert pool is not None
                resident = sum(psutil.Process(p.pid).memory_info().rss for p in pool._processes.values())
                assert 0 < resident <= BUILDER_RESIDENT_BYTES, resident
        if in_child:
            assert not Path(directory).exists()  # and their directory with the server
    for here, child in zip(answers[False], answers[True], strict=True):
        assert here.keys() == child.keys()
        for name in here:
            assert np.array_equal(here[name], child[name]), name  # same segment, same session: same bits
        assert any(np.abs(v).max() > 0 for v in here.values())  # random weights: not a constant answer
    assert np.array_equal(answers[True][-1]["y"], x)  # 50 Negs


def test_a_child_reports_what_the_in_process_build_reports(models_dir: Path, device: Device) -> None:
    config = ServerConfig(models_dir=models_dir, workers=2, intra_op_threads=1, build_in_child=True, max_nodes=20_000)
    good = _request(device, device.graph.cuts()[5].id, 0)
    sha = good.header.model_sha256
    with CloudServer(config) as server:
        cases = [
            (f"{sha}", "c99999", grpc.StatusCode.NOT_FOUND, "cut 'c99999' of model"),
            (f"{sha}", "device", grpc.StatusCode.INVALID_ARGUMENT, "leaves nothing to run on a server"),
            # Over --max-nodes: refused by the child before it enumerates cuts.
            (
                model_sha256(models_dir / "long_chain.onnx"),
                "cloud",
                grpc.StatusCode.FAILED_PRECONDITION,
                "at most 20000",
            ),
        ]
        for model, cut, code, text in cases:
            req = wire.Framed(header=pb.InferRequest(request_id="r", model_sha256=model, cut_id=cut), tensors=[])
            with pytest.raises(CloudError) as info:
                _infer(server, req)
            assert info.value.code == code.name, info.value
            assert text in str(info.value) and str(models_dir) not in str(info.value)
        assert _outputs(_infer(server, good))  # and the server goes on serving
        # The model's cut ids came back with its segments: a made-up cut is refused without a load in the child.
        builder = server.tails.builder
        assert builder is not None
        children: list[int] = []
        ensure = builder.children._ensure
        builder.children._ensure = lambda: children.append(1) or ensure()  # type: ignore[method-assign]
        for cut in ("c88888", f"{good.header.cut_id}>nope"):
            req = wire.Framed(header=pb.InferRequest(request_id="r", model_sha256=sha, cut_id=cut), tensors=[])
            with pytest.raises(CloudError) as info:
                _infer(server, req)
            assert info.value.code == "NOT_FOUND" and "no cut" in str(info.value), info.value
        assert children == []


@pytest.mark.slow
def test_a_lasting_failure_is_answered_again_without_the_child(models_dir: Path, device: Device) -> None:
    """A model with no such ``~steps`` (the child loads the model to find out) and a cut that cannot be
    built are each refused by the child once, then here: a flood of them costs no load and no slot."""
    config = ServerConfig(models_dir=models_dir, workers=2, intra_op_threads=1, build_in_child=True)
    sha = model_sha256(models_dir / "squeezenet.onnx")
    with CloudServer(config) as server:
        builder = server.tails.builder
        assert builder is not None
        children: list[str] = []
        submit = builder.children._ensure
        builder.children._ensure = lambda: children.append("load") or submit()  # type: ignore[method-assign]
        said = []
        for model, cut in [(f"{sha}~bogus", "cloud"), (f"{sha}~0t", "c3"), (sha, "device")] * 3:
            req = wire.Framed(header=pb.InferRequest(request_id="r", model_sha256=model, cut_id=cut), tensors=[])
            with pytest.raises(CloudError) as info:
                _infer(server, req)
            said.append((info.value.code, str(info.value)))
        assert len(children) == 3, children  # once per failing case, not per request
        assert said[:3] == said[3:6] == said[6:], said  # the same answer every time
        assert [c for c, _ in said[:3]] == ["NOT_FOUND", "NOT_FOUND", "INVALID_ARGUMENT"], said
        assert all(str(models_dir) not in text for _, text in said)


def test_stopping_does_not_wait_for_a_segment_being_made(models_dir: Path) -> None:
    config = ServerConfig(models_dir=models_dir, workers=2, intra_op_threads=1, build_in_child=True)
    sha = model_sha256(models_dir / "long_chain.onnx")
    req = wire.Framed(
        header=pb.InferRequest(request_id="r", model_sha256=sha, cut_id="cloud"),
        tensors=[codec.encode("x", np.ones(1, np.float32), codec.Codec.parse("fp32"))],
    )
    server = CloudServer(config)
    server.start()
    outcome: list[object] = []
    caller = threading.Thread(target=lambda: outcome.append(_try(server, req)))
    caller.start()
    # The child is making the 30 000-node chain's segment (seconds of Python) when the server stops.
    while not server.tails._building and caller.is_alive():
        time.sleep(0.02)
    assert server.tails._building, outcome
    server.stop(0.5)
    caller.join(120)  # a guard against hanging, not a timing: without the stop it would still finish
    assert not caller.is_alive() and not server.busy()
    assert server.tails.builder is not None and server.tails.builder.children._pool is None
    assert outcome and isinstance(outcome[0], CloudError), outcome  # it failed: nothing was built
    assert outcome[0].code == "UNAVAILABLE", outcome[0]


def _try(server: CloudServer, req: wire.Framed) -> object:
    try:
        return _infer(server, req)
    except Exception as exc:
        return exc


def test_a_sizing_answer_made_with_the_segment_is_taken_as_is() -> None:
    """The request path asks the cache with the tail's own answer: no walk of the segment's nodes here."""
    peaks = PeakEstimator()
    assert peaks.sizing("m/c", None, known=frozenset({"n"})) == {"n"}  # a skeleton of None: never walked
    assert peaks.sizing("m/c", None) == {"n"}  # cached for the estimate's own lookup
