"""Hostile model files: external data on a tensor anywhere in an upload (a Constant node's value, an
initializer inside an If branch, a sparse tensor) is refused, and so is a sparse initializer; a model
in the store naming the server's own files (the warm file) or a stored upload naming anything is
skipped. A real gRPC server on 127.0.0.1; the bytes of the named file never come back."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.cloud.models.store import ModelStore
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.graph.walk import external_locations
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

TOKEN = "data-t0ken-xyz"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SECRET = b'{"format": "splitrt-warm", "secret": 1}'


def _external(t: onnx.TensorProto, location: str, length: int) -> onnx.TensorProto:
    t.ClearField("raw_data")
    t.ClearField("int32_data")
    t.ClearField("int64_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length))):
        t.external_data.add(key=k, value=v)
    return t


def constant_model(location: str) -> onnx.ModelProto:
    """~190 bytes: y = the bytes of ``location``, as a Constant node's value (uint8)."""
    value = _external(numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "v"), location, len(SECRET))
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Identity", ["c"], ["y"])],
        "leak",
        [],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [len(SECRET)])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def if_branch_model(location: str) -> onnx.ModelProto:
    """An If whose then-branch's initializer is external data at ``location``."""
    w = _external(numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "w"), location, len(SECRET))
    out = [helper.make_tensor_value_info("o", TensorProto.UINT8, [len(SECRET)])]
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["o"])], "then", [], out, [w])
    other = helper.make_graph(
        [helper.make_node("Constant", [], ["o"], value=numpy_helper.from_array(np.zeros(len(SECRET), np.uint8)))],
        "else",
        [],
        out,
    )
    g = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
        "leak_if",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [len(SECRET)])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def sparse_model(location: str | None) -> onnx.ModelProto:
    """y = x + W with W a sparse initializer (its values external at ``location`` if given)."""
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "W")
    if location is not None:
        _external(values, location, 8)
    indices = numpy_helper.from_array(np.array([0, 3], np.int64), "W_idx")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        sparse_initializer=[sparse],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _put(address: str, data: bytes) -> pb.PutModelReply:
    sha = hashlib.sha256(data).hexdigest()
    with grpc.insecure_channel(address) as ch:
        chunk = pb.ModelChunk(sha256=sha, name="m.onnx", total_bytes=len(data), data=data)
        return pb_grpc.SplitInferenceStub(ch).PutModel(iter([chunk]), timeout=30, metadata=AUTH)


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    (d / ".splitrt-warm.json").write_bytes(SECRET)
    (d / "weights.bin").write_bytes(SECRET)  # an operator's file beside the models
    return d


@pytest.mark.parametrize(
    "make",
    [constant_model, if_branch_model, sparse_model],
    ids=["constant-value", "if-branch-initializer", "sparse-values"],
)
@pytest.mark.parametrize("location", [".splitrt-warm.json", "weights.bin"])
def test_upload_with_external_data_on_any_tensor_is_refused(
    store: Path, make: Callable[[str], onnx.ModelProto], location: str
) -> None:
    model = make(location)
    assert external_locations(model) == [location]  # the walker sees it wherever it is
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        with pytest.raises(grpc.RpcError) as info:
            _put(s.address, model.SerializeToString())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"expected a self-contained model (no external data), got external-data location {location!r}" in (
            info.value.details() or ""
        )
        assert str(store) not in (info.value.details() or "")
    assert sorted(p.name for p in store.glob("*.onnx")) == []


def test_upload_with_a_sparse_initializer_is_refused(store: Path) -> None:
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        with pytest.raises(grpc.RpcError) as info:
            _put(s.address, sparse_model(None).SerializeToString())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expected dense initializers, got 1 sparse (first 'W')" in (info.value.details() or "")
    assert list(store.glob("*.onnx")) == []


def test_store_skips_models_naming_the_servers_files(store: Path) -> None:
    onnx.save(constant_model(".splitrt-warm.json"), str(store / "warm_leak.onnx"))
    onnx.save(if_branch_model("other.onnx"), str(store / "model_leak.onnx"))
    upload_named = constant_model("weights.bin")
    data = upload_named.SerializeToString()
    (store / f"{hashlib.sha256(data).hexdigest()}.onnx").write_bytes(data)  # as an old upload was stored
    onnx.save(constant_model("weights.bin"), str(store / "operators.onnx"))  # an operator's own data file
    shutil_src = zoo.get("tiny_chain")
    (store / "other.onnx").write_bytes(shutil_src.read_bytes())
    names = sorted(m.path.name for m in ModelStore(store).models())
    assert names == ["operators.onnx", "other.onnx"]


def _request(sha: str, cut: str, **arrays: np.ndarray) -> pb.InferRequest:
    tensors = [
        pb.Tensor(
            name=k,
            dtype=str(v.dtype),
            shape=list(v.shape),
            codec="fp32" if v.dtype.kind == "f" else "raw",
            payload=v.tobytes(),
        )
        for k, v in arrays.items()
    ]
    return pb.InferRequest(model_sha256=sha, cut_id=cut, codec="fp32", request_id="t", tensors=tensors)


def count_model() -> onnx.ModelProto:
    """An upload whose memory is the request's values: ConstantOfShape(n) summed."""
    one = numpy_helper.from_array(np.ones(1, np.float32))
    g = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["n"], ["big"], value=one),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        "count",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sizes_computed_from_request_values_are_refused_before_the_run(store: Path) -> None:
    """vit_tiny at c4: the int64 crossing that feeds Expand of the class token; an upload's
    ConstantOfShape whose n comes in the request. Sized by their values, refused with what they need."""
    from splitrt.graph.model import model_sha256

    vit = store / "vit_tiny.onnx"
    vit.write_bytes(zoo.get("vit_tiny").read_bytes())
    cfg = ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,), max_request_bytes=16 << 20, workers=1)
    tokens = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        sha = model_sha256(vit)
        ok = stub.Infer(
            _request(sha, "c4", **{"patch.tokens": tokens, "cls.batch": np.array([1], np.int64)}),
            timeout=120,
            metadata=AUTH,
        )
        assert ok.outputs
        with pytest.raises(grpc.RpcError) as info:  # 100 000 class tokens: 25 MB from 8 bytes, then more
            stub.Infer(
                _request(sha, "c4", **{"patch.tokens": tokens, "cls.batch": np.array([100_000], np.int64)}),
                timeout=120,
                metadata=AUTH,
            )
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        msg = info.value.details() or ""
        assert "values cls.batch=[100000]" in msg and "expected at most 16 MB (--max-request-mb)" in msg, msg
        sha_count = _put(s.address, count_model().SerializeToString()).sha256
        small = stub.Infer(_request(sha_count, "cloud", n=np.array([4, 8], np.int64)), timeout=120, metadata=AUTH)
        assert np.frombuffer(small.outputs[0].payload, np.float32)[0] == 32.0
        with pytest.raises(grpc.RpcError) as info:  # 64 MB asked for by 16 bytes
            stub.Infer(_request(sha_count, "cloud", n=np.array([4096, 4096], np.int64)), timeout=120, metadata=AUTH)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        msg = info.value.details() or ""
        assert "values n=[4096, 4096]" in msg and "needs ~77 MB" in msg, msg


def test_outputs_the_asked_codec_cannot_carry_are_the_requests_fault(store: Path) -> None:
    """NaN in, NaN out, int8 asked for the reply: INVALID_ARGUMENT naming the codec (was INTERNAL)."""
    (store / "tiny_chain.onnx").write_bytes(zoo.get("tiny_chain").read_bytes())
    from splitrt.graph.model import model_sha256

    sha = model_sha256(store / "tiny_chain.onnx")
    x = np.full((1, 3, 32, 32), np.nan, np.float32)
    with CloudServer(ServerConfig(models_dir=store, workers=1)) as s, grpc.insecure_channel(s.address) as ch:
        req = _request(sha, "cloud", x=x)
        req.output_codec = "int8"
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.SplitInferenceStub(ch).Infer(req, timeout=60)
        req.output_codec = "fp16"  # one that carries them: answered
        assert pb_grpc.SplitInferenceStub(ch).Infer(req, timeout=60).outputs
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot encode outputs in output_codec 'int8'" in (info.value.details() or "")


def evasive_count_model() -> onnx.ModelProto:
    """As ``count_model``, n passed through ops onnx's data propagation does not carry (Abs, Div, Max,
    Identity) before ConstantOfShape: only evaluating them tells the size."""
    one = numpy_helper.from_array(np.ones(1, np.float32))
    g = helper.make_graph(
        [
            helper.make_node("Abs", ["n"], ["a"]),
            helper.make_node("Div", ["a", "one64"], ["d"]),
            helper.make_node("Max", ["d", "one64"], ["m"]),
            helper.make_node("Identity", ["m"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["big"], value=one),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        "evasive",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.ones(2, np.int64), "one64")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_sizes_computed_through_unpropagated_ops_are_refused_too(store: Path) -> None:
    cfg = ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,), max_request_bytes=16 << 20, workers=1)
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        sha = _put(s.address, evasive_count_model().SerializeToString()).sha256
        small = stub.Infer(_request(sha, "cloud", n=np.array([4, 8], np.int64)), timeout=120, metadata=AUTH)
        assert np.frombuffer(small.outputs[0].payload, np.float32)[0] == 32.0
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(_request(sha, "cloud", n=np.array([4096, 4096], np.int64)), timeout=120, metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "values n=[4096, 4096]" in (info.value.details() or "") and "needs ~77 MB" in (info.value.details() or "")


def test_upload_with_thousands_of_outputs_is_refused(store: Path) -> None:
    """2000 Identity outputs of one input: every cut would list them (tens of seconds of cut enumeration
    and O(outputs^2) memory for a 90 KB upload)."""
    n = 2000
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], [f"y{i}"]) for i in range(n)],
        "fan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4]) for i in range(n)],
    )
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    with (
        CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s,
        pytest.raises(grpc.RpcError) as info,
    ):
        _put(s.address, data)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected at most 1024 graph outputs, got 2000" in (info.value.details() or "")
    assert list(store.glob("*.onnx")) == []


def _value_sized(op: str, inputs: list[tuple[str, int, list[int]]], opset: int = 17, **attrs: object) -> bytes:
    """``op`` on the request's ``inputs`` (name, type, shape; "" an operand left out), its output summed."""
    g = helper.make_graph(
        [
            helper.make_node(op, [n for n, _, _ in inputs], ["big"], **attrs),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        op.lower(),
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9).SerializeToString()


F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _i(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _f(*v: float) -> np.ndarray:
    return np.array(v, np.float32)


# Ops whose output is sized by an operand's value: (model, fixed inputs, small values, large values: 64+ MB).
VALUE_SIZED = {
    "Tile": (_value_sized("Tile", [("x", F, [1]), ("r", I64, [1])]), {"x": _f(1)}, {"r": _i(8)}, {"r": _i(1 << 25)}),
    "Range": (
        _value_sized("Range", [("s", F, []), ("l", F, []), ("d", F, [])]),
        {"s": np.float32(0), "d": np.float32(1)},
        {"l": np.float32(8)},
        {"l": np.float32(1 << 25)},
    ),
    "Resize-scales": (
        _value_sized("Resize", [("x", F, [1, 1, 4, 4]), ("", F, []), ("sc", F, [4])]),
        {"x": np.ones((1, 1, 4, 4), np.float32)},
        {"sc": _f(1, 1, 2, 2)},
        {"sc": _f(1, 1, 1024, 1024)},
    ),
    "Pad": (
        _value_sized("Pad", [("x", F, [1, 1]), ("p", I64, [4])]),
        {"x": np.ones((1, 1), np.float32)},
        {"p": _i(0, 0, 3, 3)},
        {"p": _i(0, 0, 4096, 4096)},
    ),
    "OneHot": (
        _value_sized("OneHot", [("i", I64, [4]), ("d", I64, [1]), ("v", F, [2])]),
        {"i": _i(0, 1, 2, 3), "v": _f(0, 1)},
        {"d": _i(8)},
        {"d": _i(1 << 22)},
    ),
    "MaxUnpool": (
        _value_sized(
            "MaxUnpool", [("x", F, [1, 1, 2, 2]), ("ix", I64, [1, 1, 2, 2]), ("os", I64, [4])], kernel_shape=[2, 2]
        ),
        {"x": np.ones((1, 1, 2, 2), np.float32), "ix": np.zeros((1, 1, 2, 2), np.int64)},
        {"os": _i(1, 1, 4, 4)},
        {"os": _i(1, 1, 4096, 4096)},
    ),
    "DFT": (
        _value_sized("DFT", [("x", F, [1, 16, 1]), ("n", I64, [])]),
        {"x": np.ones((1, 16, 1), np.float32)},
        {"n": np.int64(32)},
        {"n": np.int64(1 << 23)},
    ),
    "STFT": (
        _value_sized("STFT", [("x", F, [1, 8192, 1]), ("st", I64, []), ("", F, []), ("fl", I64, [])]),
        {"x": np.ones((1, 8192, 1), np.float32)},
        {"st": np.int64(256), "fl": np.int64(512)},
        {"st": np.int64(1), "fl": np.int64(4096)},
    ),
    "HannWindow": (_value_sized("HannWindow", [("n", I64, [])]), {}, {"n": np.int64(8)}, {"n": np.int64(1 << 24)}),
    "MelWeightMatrix": (
        _value_sized(
            "MelWeightMatrix", [("nb", I64, []), ("dl", I64, []), ("sr", I64, []), ("lo", F, []), ("hi", F, [])]
        ),
        {"sr": np.int64(16000), "lo": np.float32(0), "hi": np.float32(8000)},
        {"nb": np.int64(8), "dl": np.int64(64)},
        {"nb": np.int64(4096), "dl": np.int64(8192)},
    ),
    "AffineGrid": (
        _value_sized("AffineGrid", [("th", F, [1, 2, 3]), ("sz", I64, [4])], opset=20),
        {"th": np.zeros((1, 2, 3), np.float32)},
        {"sz": _i(1, 1, 8, 8)},
        {"sz": _i(1, 1, 4096, 2048)},
    ),
}


@pytest.mark.slow
def test_every_op_sized_by_a_request_value_is_refused_before_the_run(store: Path) -> None:
    """Each op runs at small values, and at values asking 64 MB or more (onnxruntime allocates them: 1 GiB
    asked of MaxUnpool, DFT, STFT, a window, the mel matrix or AffineGrid took 1.1-8 GB) it is refused
    before the run, naming what it needs."""
    cfg = ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,), max_request_bytes=16 << 20, workers=1)
    wrong = {}
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        for op, (data, fixed, small, large) in VALUE_SIZED.items():
            sha = _put(s.address, data).sha256
            if not stub.Infer(_request(sha, "cloud", **fixed, **small), timeout=120, metadata=AUTH).outputs:
                wrong[op] = "no output at small values"
            try:
                stub.Infer(_request(sha, "cloud", **fixed, **large), timeout=120, metadata=AUTH)
                wrong[op] = "ran at large values"
            except grpc.RpcError as exc:
                said = exc.details() or ""
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "needs ~" not in said:
                    wrong[op] = f"{exc.code()}: {said[:200]}"
    assert not wrong, wrong


def test_data_dependent_sizes_are_counted_at_their_worst(store: Path) -> None:
    """NonZero's output is as large as the data makes it: of an all-true bool tensor, rank x its elements
    of int64 (a 4 MB input, 96 MB out; 64 MB in a 2 KB zstd payload asked 2 GiB). Counted at that worst
    before the run: refused naming the need; a small input runs."""
    g = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("ReduceSum", ["nz"], ["y"], keepdims=0)],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.BOOL, ["a", "b", "c"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
    )
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    cfg = ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,), max_request_bytes=16 << 20, workers=1)
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        sha = _put(s.address, data).sha256
        assert stub.Infer(_request(sha, "cloud", x=np.ones((2, 2, 2), np.bool_)), timeout=120, metadata=AUTH).outputs
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(_request(sha, "cloud", x=np.ones((4, 1024, 1024), np.bool_)), timeout=120, metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
    assert "needs ~120 MB" in (info.value.details() or ""), info.value.details()
