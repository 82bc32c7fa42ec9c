"""Hostile and careless clients against a real `splitrt serve` (a child process on 127.0.0.1, real
onnxruntime): a Loop that would run for ever is terminated at its deadline, on the client's cancel and at
SIGTERM; a request whose activations would not fit is refused before it runs; a tiny upload asking for
gigabytes is checked without computing them; quotas on nodes and models. After each, the server still
answers a legitimate request and its RSS (psutil) stays under --max-memory-mb."""

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
from onnx import TensorProto, helper, numpy_helper

from splitrt.graph import zoo
from splitrt.graph.model import model_sha256
from splitrt.rig.cloudserver import ServerProcess
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from tests.cli.test_serve import serve_checkout
from tests.hostilemodels import loop_model

# slow: a real server's runs burning CPU until their deadline or SIGTERM (make test-slow)
pytestmark = pytest.mark.slow

TOKEN = "hostile-test-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
BUDGET_MB = 900


def growing_loop_model(rows: int = 256) -> onnx.ModelProto:
    """A Loop that piles up a 256 KiB scan output per iteration, for ever: memory no shape tells."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
            helper.make_node("Expand", ["v_out", "shape"], ["slab"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("slab", TensorProto.FLOAT, [rows, 256]),
        ],
        [
            numpy_helper.from_array(np.ones(1, np.float32), "one"),
            numpy_helper.from_array(np.array([rows, 256], np.int64), "shape"),
        ],
    )
    g = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "cond", "x"], ["y", "slabs"], body=body),
            helper.make_node("ReduceSum", ["slabs"], ["total"], keepdims=0),
        ],
        "grow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.array(2**62, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def outer_model() -> onnx.ModelProto:
    """x [1, n] -> the [n, n] outer product -> its sum: n is the client's, the memory n^2."""
    g = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["xt"]),
            helper.make_node("MatMul", ["xt", "x"], ["outer"]),
            helper.make_node("ReduceSum", ["outer"], ["y"], keepdims=0),
        ],
        "outer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def constant_of_shape_model() -> onnx.ModelProto:
    """~140 bytes asking for a 2 GiB constant (16384 x 32768 float32)."""
    shape = numpy_helper.from_array(np.array([1 << 14, 1 << 15], np.int64), "shape")
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"]), helper.make_node("Add", ["x", "big"], ["y"])],
        "cos",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 14, 1 << 15])],
        [shape],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def chain_model(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def request(sha: str, cut: str, **arrays: np.ndarray) -> pb.InferRequest:
    return pb.InferRequest(
        model_sha256=sha,
        cut_id=cut,
        codec="fp32",
        request_id="t",
        tensors=[
            pb.Tensor(name=k, dtype=str(v.dtype), shape=list(v.shape), codec="fp32", payload=v.tobytes())
            for k, v in arrays.items()
        ],
    )


class Rss:
    """The peak RSS of a process, sampled on a thread while the test runs."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    onnx.save(loop_model(), d / "loop.onnx")
    onnx.save(outer_model(), d / "outer.onnx")
    onnx.save(growing_loop_model(), d / "grow.onnx")
    tokens = tmp_path_factory.mktemp("etc") / "tokens"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    return {"dir": d, "tokens": tokens, **{p.stem: p for p in d.glob("*.onnx")}}


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[tuple[ServerProcess, grpc.Channel, Rss]]:
    s = serve_checkout(
        str(models["dir"]),
        "--workers",
        "2",
        "--max-queue",
        "4",
        "--token-file",
        str(models["tokens"]),
        "--allow-upload",
        "--max-memory-mb",
        str(BUDGET_MB),
        "--max-request-mb",
        "64",
        "--max-models",
        "7",
        "--max-nodes",
        "5000",
        "--intra-op-threads",
        "1",
        # The deadline, cancel and memory terminations are what these tests see (the per-run limit's own
        # test: test_runlimit.py).
        "--max-run-s",
        "600",
    )
    port = s.event("listening")["port"]
    rss = Rss(s.proc.pid)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield s, ch, rss
    peak = rss.stop()
    assert s.stop() == 0
    assert peak <= BUDGET_MB * 2**20, f"server RSS peaked at {peak / 2**20:.0f} MB, budget {BUDGET_MB} MB"


def legit(ch: grpc.Channel, models: dict[str, Path]) -> None:
    """A legitimate request still gets its answer (tiny_chain, whole model in the cloud)."""
    import onnxruntime as ort

    stub = pb_grpc.SplitInferenceStub(ch)
    sha = model_sha256(models["tiny_chain"])
    inp = ort.InferenceSession(str(models["tiny_chain"]), providers=["CPUExecutionProvider"]).get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    reply = stub.Infer(request(sha, "cloud", **{inp.name: x}), timeout=60, metadata=AUTH)
    assert reply.outputs and reply.outputs[0].payload


def running(ch: grpc.Channel) -> int:
    return pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=30, metadata=AUTH).load.running


def wait_for(pred: object, what: str) -> None:
    """Waits for ``pred()`` (a guard of 60 s against hanging, not a timed assert)."""
    end = time.monotonic() + 60
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.05)


def events(s: ServerProcess, name: str) -> list[dict[str, object]]:
    return s.named(name)


def loop_built(s: ServerProcess, ch: grpc.Channel, sha: str) -> None:
    """The loop's tail built (in the builder's child, at a low priority: seconds on a busy host), so a call
    then reaches its run before its deadline, and ``running`` counts its run, not the build (a build holds
    a heavy worker too); the build goes on if this call's deadline passes. Each test on its own: under
    xdist another worker may have run the one that built it."""
    with pytest.raises(grpc.RpcError):
        pb_grpc.SplitInferenceStub(ch).Infer(
            request(sha, "cloud", x=np.zeros(1, np.float32)), timeout=2.0, metadata=AUTH
        )
    wait_for(lambda: any(e["model"] == sha[:12] for e in events(s, "tail_built")), "the loop's tail built")
    wait_for(lambda: running(ch) == 0, "workers free")


def test_endless_loop_is_terminated_at_its_deadline(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    s, ch, _ = server
    stub = pb_grpc.SplitInferenceStub(ch)
    sha = model_sha256(models["loop"])
    x = np.zeros(1, np.float32)
    loop_built(s, ch, sha)
    before = len(events(s, "run_terminated"))
    calls = [stub.Infer.future(request(sha, "cloud", x=x), timeout=2.0, metadata=AUTH) for _ in range(2)]
    # A segment that never ran to the end runs in the heavy lane (one worker): one loop runs to the deadline,
    # the other waits for it and is refused at its own; neither is answered otherwise.
    for c in calls:
        with pytest.raises(grpc.RpcError) as info:
            c.result()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: len(events(s, "run_terminated")) >= before + 1, "a run terminated")
    terminated = events(s, "run_terminated")[before:]
    assert {e["code"] for e in terminated} == {"DEADLINE_EXCEEDED"}
    assert "deadline" in str(terminated[0]["reason"])
    wait_for(lambda: running(ch) == 0, "workers free again")
    legit(ch, models)


def test_cancelled_call_stops_its_tail(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    s, ch, _ = server
    stub = pb_grpc.SplitInferenceStub(ch)
    loop_built(s, ch, model_sha256(models["loop"]))
    before = len(events(s, "run_terminated"))
    call = stub.Infer.future(
        request(model_sha256(models["loop"]), "cloud", x=np.zeros(1, np.float32)), timeout=600, metadata=AUTH
    )
    wait_for(lambda: running(ch) == 1, "the loop running")
    call.cancel()
    # The loop's run ended CANCELLED (a DEADLINE_EXCEEDED one of ``loop_built``'s may be read late).
    wait_for(lambda: any(e["code"] == "CANCELLED" for e in events(s, "run_terminated")[before:]), "the run terminated")
    wait_for(lambda: running(ch) == 0, "the worker free again")
    legit(ch, models)


def test_request_whose_activations_do_not_fit_is_refused(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    _, ch, _ = server
    stub = pb_grpc.SplitInferenceStub(ch)
    sha = model_sha256(models["outer"])
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    ok = stub.Infer(request(sha, "cloud", x=x), timeout=60, metadata=AUTH)  # 256 x 256: fits
    got = np.frombuffer(ok.outputs[0].payload, np.float32)
    assert np.allclose(got, float(x.sum()) ** 2, rtol=1e-3)
    big = np.ones((1, 16384), np.float32)  # 64 KB that would need 1 GiB for the outer product
    with pytest.raises(grpc.RpcError) as info:
        stub.Infer(request(sha, "cloud", x=big), timeout=60, metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    msg = info.value.details()
    assert "x=[1, 16384]" in msg and "expected at most 64 MB (--max-request-mb)" in msg and "needs ~1229 MB" in msg
    legit(ch, models)


def test_run_growing_past_the_budget_is_terminated(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    _, ch, rss = server
    with pytest.raises(grpc.RpcError) as info:  # no shape says what it will hold: the memory watch stops it
        pb_grpc.SplitInferenceStub(ch).Infer(
            request(model_sha256(models["grow"]), "cloud", x=np.zeros(1, np.float32)), timeout=120, metadata=AUTH
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"expected at most {BUDGET_MB - BUDGET_MB // 16} MB (--max-memory-mb)" in (info.value.details() or "")
    assert rss.peak <= BUDGET_MB * 2**20
    legit(ch, models)


def upload(ch: grpc.Channel, model: onnx.ModelProto, name: str) -> pb.PutModelReply:
    import hashlib

    data = model.SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    chunks = [pb.ModelChunk(sha256=sha, name=name, total_bytes=len(data), data=data)]
    return pb_grpc.SplitInferenceStub(ch).PutModel(iter(chunks), timeout=120, metadata=AUTH)


def test_upload_asking_for_gigabytes_is_checked_without_computing_them(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    _, ch, rss = server
    reply = upload(ch, constant_of_shape_model(), "cos.onnx")  # the check folds nothing it cannot bound
    assert not reply.already_present
    with pytest.raises(grpc.RpcError) as info:  # and running it is refused before anything is allocated
        pb_grpc.SplitInferenceStub(ch).Infer(
            request(reply.sha256, "cloud", x=np.ones(1, np.float32)), timeout=60, metadata=AUTH
        )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "(--max-request-mb)" in info.value.details()
    assert rss.peak <= BUDGET_MB * 2**20
    legit(ch, models)


def test_upload_over_the_node_quota_is_refused(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    _, ch, _ = server
    with pytest.raises(grpc.RpcError) as info:
        upload(ch, chain_model(6000), "chain.onnx")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected at most 5000 nodes (--max-nodes), got 6000" in info.value.details()
    legit(ch, models)


def test_upload_over_the_model_quota_is_refused(
    server: tuple[ServerProcess, grpc.Channel, Rss], models: dict[str, Path]
) -> None:
    _, ch, _ = server
    stored = len(pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=30, metadata=AUTH).models)
    refused = None
    for k in range(8 - stored):  # --max-models 7
        try:
            upload(ch, chain_model(3 + k), f"c{k}.onnx")
        except grpc.RpcError as exc:
            refused = exc
            break
    assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "expected fewer than 7 (--max-models)" in (refused.details() or "")
    legit(ch, models)


def test_sigterm_exits_while_loops_run(models: dict[str, Path]) -> None:
    s = serve_checkout(
        str(models["dir"]),
        "--workers",
        "2",
        "--drain-s",
        "2",
        "--token-file",
        str(models["tokens"]),
        "--max-run-s",
        "600",
    )
    port = s.event("listening")["port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        calls = [
            stub.Infer.future(request(model_sha256(models["loop"]), "cloud", x=np.zeros(1, np.float32)), metadata=AUTH)
            for _ in range(2)
        ]  # no deadline at all
        # A segment that never ran to the end runs in the heavy lane: one loop runs, the other waits for it
        # (after the tail's build, which holds that lane too).
        sha = model_sha256(models["loop"])[:12]
        wait_for(lambda: any(e["model"] == sha for e in events(s, "tail_built")), "the loop's tail built")
        wait_for(lambda: running(ch) == 1, "a loop running")
        assert s.stop() == 0  # proc.wait(timeout=30) inside: the drain is 2 s
        for c in calls:
            with pytest.raises(grpc.RpcError) as info:
                c.result(timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert events(s, "drain_terminated")[0]["runs"] == 1
