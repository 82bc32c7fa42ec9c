"""bench_attack's rows for issue 36: hostile *data* (the values, files and pace a client sends), each row an
``Attack`` run by ``bench_attack.run_row`` like the others.

- ``value_bomb`` zoo vit_tiny at c4: the int64 that feeds Expand of the class token set to 3e7 (8 bytes
  asking for ~7.7 GB); ``value_cos`` an upload whose ConstantOfShape takes n from the request (8 GiB);
- ``exfil`` uploads naming the server's files as external data (a Constant's value, an If branch's
  initializer, a sparse tensor; the warm file, the legit model, the token file), then Infer;
- ``trickle`` 2 uploads declaring nearly the whole store quota and sending 1 KiB every 2 s, while a legit
  client (another address) uploads 1 MiB models;
- ``env_errors`` unknown models and cuts: no server path in any answer;
- invented: ``hostile_shapes`` (huge declared dims on a tiny payload, dims whose product overflows int64,
  negative and zero dims, rank 64), ``zstd_bomb`` (a 1 GiB zero frame at the legit cut, and a frame whose
  declared content size lies), ``nan_flood`` (NaN/Inf inputs, int8/fp16 replies asked), ``many_outputs``
  (an upload with 4000 outputs: its tail build took minutes of cut enumeration; uploads now keep at most
  1024 outputs), ``deep_nest`` (If nested 120 deep: beyond protobuf's recursion limit), ``value_ops``
  (uploads whose signal and image ops take their size from the request: a window's length, DFT's and
  STFT's, the mel matrix's, AffineGrid's size, MaxUnpool's output shape; 1-8 GB each), ``nonzero_bomb``
  (NonZero of a 128 MB all-ones tensor sent as a 12 KB zstd payload: 768 MB of int64 out).

Extra targets: each attacker call ended (none pending or hung) with no INTERNAL/UNKNOWN; the memory rows are
refused naming what they need; nothing of the server's files comes back; the trickles are cut and the
legit uploads beside them stored.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import numpy as np
from bench_attack import AUTH, SERVICE, Attack, Ctx, Flood, _channel, _infer, infer_bytes, upload
from onnx import TensorProto, helper, numpy_helper

from splitrt.transport import splitrt_pb2 as pb

SERVER_ERRORS = ("INTERNAL", "UNKNOWN")


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], **kw: Any) -> bytes:
    g = helper.make_graph(nodes, kw.pop("name", "hostile"), inputs, outputs, **kw)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return bytes(m.SerializeToString())


class Data(Flood):
    """A flood whose calls' answers are kept: codes, and the first message of each code."""

    def __init__(self, name: str, what: str, threads: int, models: tuple[str, ...] = ()) -> None:
        super().__init__(name, what, threads, models)
        self.said: dict[str, str] = {}
        self.pending = 0
        self.answered = 0  # over the attack and the SIGTERM re-arm (``codes`` is the attack's)

    def call(self, fn: Any, *args: Any, **kw: Any) -> str:
        with self.lock:
            self.pending += 1
        try:
            fn(*args, **kw)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name if exc.code() is not None else "UNKNOWN"
            with self.lock:
                self.said.setdefault(code, str(exc.details())[:300])
        except Exception as exc:
            code = f"client:{type(exc).__name__}"
        finally:
            with self.lock:
                self.pending -= 1
                self.answered += 1
        return code

    def disarm(self) -> None:
        super().disarm()
        self.notes.setdefault("said", dict(self.said))

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        codes = self.notes.get("codes", {})
        return [
            ("attacker's calls ended", self.pending == 0 and self.answered > 0),
            ("no INTERNAL/UNKNOWN", not any(c in codes for c in SERVER_ERRORS)),
        ]


class ValueBomb(Data):
    def __init__(self) -> None:
        super().__init__("value_bomb", "vit_tiny at c4, cls.batch = 3e7 (8 bytes -> ~7.7 GB; 2 clients)", 2)
        self.models = ("vit_tiny",)

    def prepare(self, ctx: Ctx) -> None:
        tokens = np.zeros((1, 16, 64), np.float32)
        self.req = infer_bytes(
            ctx.shas["vit_tiny"], "c4", {"patch.tokens": tokens, "cls.batch": np.array([30_000_000], np.int64)}
        )

    def one(self, ch: grpc.Channel, i: int) -> str:
        return self.call(_infer(ch), self.req, timeout=30, metadata=AUTH)

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        said = self.notes.get("said", {}).get("RESOURCE_EXHAUSTED", "")
        return [*super().extra_targets(row), ("refused naming its need", "needs ~" in said and "MB" in said)]


def count_model() -> bytes:
    """ConstantOfShape(n) summed: n is the request's (int64 [2])."""
    one = numpy_helper.from_array(np.ones(1, np.float32))
    return _model(
        [
            helper.make_node("ConstantOfShape", ["n"], ["big"], value=one),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )


class UploadThen(Data):
    """Upload ``data`` once (token), then Infer ``tensors`` at cut ``cloud`` in a loop."""

    def __init__(self, name: str, what: str, data: bytes, tensors: dict[str, np.ndarray], timeout_s: float) -> None:
        super().__init__(name, what, 1)
        self.data, self.tensors, self.timeout_s = data, tensors, timeout_s
        self.sha = hashlib.sha256(data).hexdigest()

    def prepare(self, ctx: Ctx) -> None:
        if "upload" not in self.notes:
            t0 = time.monotonic()
            self.notes["upload"] = upload(ctx.address, self.data, f"{self.name}.onnx", 60.0, detail=True)
            self.notes["upload_s"] = round(time.monotonic() - t0, 2)
        self.req = infer_bytes(self.sha, "cloud", self.tensors)

    def one(self, ch: grpc.Channel, i: int) -> str:
        code = self.call(_infer(ch), self.req, timeout=self.timeout_s, metadata=AUTH)
        self.stop_ev.wait(0.2)
        return code


class ValueCos(UploadThen):
    def __init__(self) -> None:
        n = np.array([1 << 15, 1 << 16], np.int64)
        super().__init__(
            "value_cos",
            "uploaded ConstantOfShape(n), n = [32768, 65536] in the request (8 GiB)",
            count_model(),
            {"n": n},
            30.0,
        )

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        said = self.notes.get("said", {}).get("RESOURCE_EXHAUSTED", "")
        return [*super().extra_targets(row), ("refused naming its need", "needs ~" in said)]


def _external(t: Any, location: str, length: int) -> Any:
    for f in ("raw_data", "int32_data", "int64_data", "float_data"):
        t.ClearField(f)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length))):
        t.external_data.add(key=k, value=v)
    return t


def leak_models(nonce: int) -> list[tuple[str, bytes]]:
    """Models whose bytes would be a server file's, hidden three ways, for three of its files."""
    out = []
    for loc in (".splitrt-warm.json", "squeezenet.onnx", "../tokens.txt"):
        n = 64
        val = _external(numpy_helper.from_array(np.zeros(n, np.uint8), "v"), loc, n)
        y = helper.make_tensor_value_info("y", TensorProto.UINT8, [n])
        const = _model(
            [helper.make_node("Constant", [], ["c"], value=val), helper.make_node("Identity", ["c"], ["y"])],
            [],
            [y],
            name=f"leak{nonce}",
        )
        w = _external(numpy_helper.from_array(np.zeros(n, np.uint8), "w"), loc, n)
        o = [helper.make_tensor_value_info("o", TensorProto.UINT8, [n])]
        then = helper.make_graph([helper.make_node("Identity", ["w"], ["o"])], "then", [], o, [w])
        other = helper.make_graph([helper.make_node("Identity", ["z"], ["o"])], "else", [], o)
        branch = _model(
            [
                helper.make_node("Constant", [], ["z"], value=numpy_helper.from_array(np.zeros(n, np.uint8))),
                helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
            ],
            [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
            [y],
            name=f"leak{nonce}",
        )
        values = _external(numpy_helper.from_array(np.zeros(16, np.float32), "W"), loc, 64)
        sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.arange(16, dtype=np.int64), "i"), [16])
        sp = _model(
            [helper.make_node("Add", ["x", "W"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
            name=f"leak{nonce}",
            sparse_initializer=[sparse],
        )
        out += [(f"constant:{loc}", const), (f"if:{loc}", branch), (f"sparse:{loc}", sp)]
    return out


class Exfil(Data):
    def __init__(self) -> None:
        super().__init__("exfil", "uploads naming the warm file, a model, the token file as external data", 1)
        self.stored: Counter[str] = Counter()
        self.leaked = 0

    def one(self, ch: grpc.Channel, i: int) -> str:
        kind, data = leak_models(i // 9)[i % 9]
        code = upload(self.ctx.address, data, "m.onnx", 30.0)
        with self.lock:
            self.answered += 1
        if code == "OK":  # stored: can it be made to answer with the file's bytes?
            self.stored[kind] += 1
            tensors = {"cond": np.array(True)} if kind.startswith("if") else {}
            if kind.startswith("sparse"):
                tensors = {"x": np.zeros(16, np.float32)}
            try:
                reply = _infer(ch)(
                    infer_bytes(hashlib.sha256(data).hexdigest(), "cloud", tensors), timeout=30, metadata=AUTH
                )
                msg = pb.InferReply.FromString(reply)
                self.leaked += sum(1 for t in msg.outputs if any(t.payload))
            except grpc.RpcError:
                pass
        return code.split(" ")[0]

    def disarm(self) -> None:
        super().disarm()
        self.notes["stored"] = dict(self.stored)
        self.notes["leaked_replies"] = self.leaked

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        return [*super().extra_targets(row), ("none stored, nothing leaked", not self.stored and not self.leaked)]


class Trickle(Attack):
    """2 uploads declaring the store's quota, 1 KiB every 2 s; a legit client (its own address) uploads a
    small distinct model every second meanwhile."""

    name = "trickle"
    what = "2 uploads declaring 124 MiB of 256, sending 1 KiB / 2 s; legit 1 MiB uploads beside"
    min_attack_s = 16.0  # the pace's 10 s grace, then the cut

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, str, float]] = []
        self.legit: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _drip(self) -> Iterator[bytes]:
        yield pb.ModelChunk(
            sha256="cd" * 32, name="squat.onnx", total_bytes=124 << 20, data=bytes(1024)
        ).SerializeToString()
        while not self.stop_ev.wait(2.0):
            yield pb.ModelChunk(data=bytes(1024)).SerializeToString()

    def arm(self, ctx: Ctx) -> None:
        def squat() -> None:
            with _channel(ctx.address) as ch:
                t0 = time.monotonic()
                try:
                    ch.stream_unary(f"{SERVICE}/PutModel")(self._drip(), timeout=120, metadata=AUTH)
                    code, said = "OK", ""
                except grpc.RpcError as exc:
                    code, said = exc.code().name, str(exc.details())[:200]
                with self.lock:
                    self.ended.append((code, said, round(time.monotonic() - t0, 1)))

        def legit() -> None:
            from bench_attack import distinct_model

            i = 0
            while not self.stop_ev.wait(1.0):
                i += 1
                code = upload(ctx.server_address, distinct_model(10_000 + i + int(time.time()), 1.0), "ok.onnx", 30)
                with self.lock:
                    self.legit[code.split(" ")[0]] += 1

        self.spawn(squat, 2)
        self.spawn(legit)

    def disarm(self) -> None:
        self.notes.setdefault("squatters", list(self.ended))
        self.notes.setdefault("legit_uploads", dict(self.legit))

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        ended = self.notes.get("squatters", [])
        cut = [e for e in ended if e[0] == "DEADLINE_EXCEEDED" and "upload cut" in e[1]]
        legit = self.notes.get("legit_uploads", {})
        return [
            ("squatters cut by pace", len(ended) == 2 and len(cut) == 2),
            ("legit uploads stored", bool(legit) and set(legit) == {"OK"}),
        ]


class EnvErrors(Data):
    def __init__(self) -> None:
        super().__init__("env_errors", "unknown models and cuts, malformed names (2 clients)", 2)
        self.paths: list[str] = []

    def prepare(self, ctx: Ctx) -> None:
        self.paths = [str(ctx.store), str(ctx.store.resolve()), "/tmp/", str(ctx.store.parent)]
        self.reqs = [
            infer_bytes("ab" * 32, "cloud", {}),
            infer_bytes(ctx.shas["squeezenet"], "no-such-cut", {}),
            infer_bytes("../../etc/passwd", "cloud", {}),
            infer_bytes(ctx.shas["squeezenet"] + "~bogus", "cloud", {}),
        ]

    def one(self, ch: grpc.Channel, i: int) -> str:
        def go() -> None:
            try:
                _infer(ch)(self.reqs[i % len(self.reqs)], timeout=30, metadata=AUTH)
            except grpc.RpcError as exc:
                if any(p in str(exc.details()) for p in self.paths):
                    self.notes["path_said"] = str(exc.details())[:300]
                raise

        return self.call(go)

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        return [*super().extra_targets(row), ("no server path said", "path_said" not in self.notes)]


class HostileShapes(Data):
    def __init__(self) -> None:
        super().__init__("hostile_shapes", "huge, overflowing, negative, zero and rank-64 dims on tiny payloads", 2)

    def prepare(self, ctx: Ctx) -> None:
        legit = pb.InferRequest.FromString(ctx.legit_request)
        t = legit.tensors[0]
        shapes = [
            [1 << 40, 1 << 40],
            [1 << 32, 1 << 32, 16],  # 2^68 elements: an int64 product wraps to 0
            [1 << 62, 4],  # wraps to 0 too
            [-1, *list(t.shape)[1:]],
            [0, *list(t.shape)[1:]],
            [1] * 64,
        ]
        self.reqs = []
        for i, shape in enumerate(shapes):
            for cod in ("fp32", "int8", "fp32+zstd"):
                msg = pb.InferRequest(
                    model_sha256=legit.model_sha256,
                    cut_id=ctx.legit_cut,
                    codec=cod,
                    request_id=f"shape{i}",
                    output_codec="fp32",
                )
                msg.tensors.add(name=t.name, dtype=t.dtype, shape=shape, codec=cod, payload=bytes(16))
                self.reqs.append(msg.SerializeToString())

    def one(self, ch: grpc.Channel, i: int) -> str:
        return self.call(_infer(ch), self.reqs[i % len(self.reqs)], timeout=30, metadata=AUTH)


class ZstdBomb(Data):
    min_attack_s = 8.0

    def __init__(self) -> None:
        super().__init__("zstd_bomb", "fp32+zstd frames inflating to 1 GiB at the legit cut (2 clients)", 2)

    def build(self) -> None:
        if getattr(self, "frames", None):
            return
        import zstandard

        c = zstandard.ZstdCompressor(level=1).compressobj()
        zeros = bytes(16 << 20)
        big = b"".join(c.compress(zeros) for _ in range(64)) + c.flush()  # no content size: streamed
        self.frames = [big, zstandard.ZstdCompressor(level=1).compress(bytes(64 << 20))]  # 64 MiB, size declared
        self.notes["frame_bytes"] = [len(f) for f in self.frames]

    def prepare(self, ctx: Ctx) -> None:
        self.build()
        legit = pb.InferRequest.FromString(ctx.legit_request)
        t = legit.tensors[0]
        self.reqs = []
        for frame in self.frames:
            header = pb.InferRequest(
                model_sha256=legit.model_sha256,
                cut_id=ctx.legit_cut,
                codec="fp32+zstd",
                request_id="zstd",
                output_codec="fp32",
            )
            header.tensors.add(name=t.name, dtype=t.dtype, shape=list(t.shape), codec="fp32+zstd", payload=frame)
            self.reqs.append(header.SerializeToString())

    def one(self, ch: grpc.Channel, i: int) -> str:
        return self.call(_infer(ch), self.reqs[i % len(self.reqs)], timeout=30, metadata=AUTH)


class NanFlood(Data):
    def __init__(self) -> None:
        super().__init__("nan_flood", "legit-shaped NaN/Inf tensors, fp32/int8/fp16 replies asked (2 clients)", 2)

    def prepare(self, ctx: Ctx) -> None:
        legit = pb.InferRequest.FromString(ctx.legit_request)
        self.reqs = []
        for fill in (np.nan, np.inf, -np.inf):
            for out in ("fp32", "int8", "fp16+zstd"):
                msg = pb.InferRequest(
                    model_sha256=legit.model_sha256,
                    cut_id=ctx.legit_cut,
                    codec="fp32",
                    request_id="nan",
                    output_codec=out,
                )
                for t in legit.tensors:
                    data = np.full(tuple(t.shape), fill, np.float32).tobytes()
                    msg.tensors.add(name=t.name, dtype=t.dtype, shape=list(t.shape), codec="fp32", payload=data)
                self.reqs.append(msg.SerializeToString())

    def one(self, ch: grpc.Channel, i: int) -> str:
        return self.call(_infer(ch), self.reqs[i % len(self.reqs)], timeout=30, metadata=AUTH)


def many_outputs_model(n: int = 4000) -> bytes:
    return _model(
        [helper.make_node("Identity", ["x"], [f"y{i}"]) for i in range(n)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4]) for i in range(n)],
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def deep_nest_model(depth: int = 200) -> bytes:
    """If nested ``depth`` deep in its then-branches (3 messages a level: beyond protobuf's default recursion
    limit of 100 at ~33), written byte by byte: protobuf itself refuses to build it."""
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, [1]).SerializeToString()
    leaf = _ld(1, helper.make_node("Identity", ["x"], ["o"]).SerializeToString()) + _ld(2, b"leaf") + _ld(12, out)

    def attr(name: bytes, graph: bytes) -> bytes:
        return _ld(1, name) + _ld(6, graph) + _varint(20 << 3) + _varint(5)  # type GRAPH

    g = leaf
    for d in range(depth):
        node = _ld(1, b"cond") + _ld(2, b"o") + _ld(4, b"If") + _ld(5, attr(b"then_branch", g))
        g = _ld(1, node + _ld(5, attr(b"else_branch", leaf))) + _ld(2, f"level{d}".encode()) + _ld(12, out)
    inputs = b"".join(
        _ld(11, helper.make_tensor_value_info(n, t, s).SerializeToString())
        for n, t, s in (("x", TensorProto.FLOAT, [1]), ("cond", TensorProto.BOOL, []))
    )
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]).SerializeToString()
    top_node = _ld(1, b"cond") + _ld(2, b"y") + _ld(4, b"If") + _ld(5, attr(b"then_branch", g))
    top_node += _ld(5, attr(b"else_branch", leaf))
    graph = _ld(1, top_node) + _ld(2, b"deep") + inputs + _ld(12, y)
    opset = helper.make_opsetid("", 17).SerializeToString()
    return _varint(1 << 3) + _varint(8) + _ld(8, opset) + _ld(7, graph)


def _value_op(op: str, inputs: Sequence[tuple[str, int, Sequence[int]]], opset: int = 17, **attrs: Any) -> bytes:
    """``op`` on the request's ``inputs`` (name, type, shape; "" leaves an operand out), summed to a scalar."""
    g = helper.make_graph(
        [
            helper.make_node(op, [n for n, _, _ in inputs], ["big"], **attrs),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        op.lower(),
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    return bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9).SerializeToString())


def value_op_cases() -> list[tuple[str, bytes, dict[str, np.ndarray]]]:
    """(op, model, request tensors asking 1-8 GB through the op's size operand)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    g = 1 << 28  # float32 elements: 1 GiB
    return [
        ("HannWindow", _value_op("HannWindow", [("n", i64, [])]), {"n": np.array(g, np.int64)}),
        (
            "DFT",
            _value_op("DFT", [("x", f, [1, 16, 1]), ("n", i64, [])]),
            {"x": np.ones((1, 16, 1), np.float32), "n": np.array(g // 2, np.int64)},
        ),
        (
            "STFT",
            _value_op("STFT", [("x", f, [1, 65536, 1]), ("st", i64, []), ("", f, []), ("fl", i64, [])]),
            {"x": np.ones((1, 65536, 1), np.float32), "st": np.array(1, np.int64), "fl": np.array(32768, np.int64)},
        ),
        (
            "MelWeightMatrix",
            _value_op("MelWeightMatrix", [(n, i64, []) for n in ("nb", "dl", "sr")] + [("lo", f, []), ("hi", f, [])]),
            {
                "nb": np.array(16384, np.int64),
                "dl": np.array(32768, np.int64),
                "sr": np.array(16000, np.int64),
                "lo": np.array(0, np.float32),
                "hi": np.array(8000, np.float32),
            },
        ),
        (
            "AffineGrid",
            _value_op("AffineGrid", [("th", f, [1, 2, 3]), ("sz", i64, [4])], opset=20),
            {"th": np.zeros((1, 2, 3), np.float32), "sz": np.array([1, 1, 16384, 8192], np.int64)},
        ),
        (
            "MaxUnpool",
            _value_op(
                "MaxUnpool", [("x", f, [1, 1, 2, 2]), ("ix", i64, [1, 1, 2, 2]), ("os", i64, [4])], kernel_shape=[2, 2]
            ),
            {
                "x": np.ones((1, 1, 2, 2), np.float32),
                "ix": np.zeros((1, 1, 2, 2), np.int64),
                "os": np.array([1, 1, 16384, 16384], np.int64),
            },
        ),
    ]


class ValueOps(Data):
    """Each of ``value_op_cases`` uploaded once, then Infer at its bomb values in turn (1 client)."""

    def __init__(self) -> None:
        super().__init__("value_ops", "uploads sized by request values: windows, DFT, STFT, mel, AffineGrid...", 1)
        self.cases = value_op_cases()

    def prepare(self, ctx: Ctx) -> None:
        if "uploads" not in self.notes:
            self.notes["uploads"] = {op: upload(ctx.address, data, f"{op}.onnx", 60.0) for op, data, _ in self.cases}
        self.reqs = [infer_bytes(hashlib.sha256(data).hexdigest(), "cloud", t) for _, data, t in self.cases]

    def one(self, ch: grpc.Channel, i: int) -> str:
        code = self.call(_infer(ch), self.reqs[i % len(self.reqs)], timeout=30, metadata=AUTH)
        self.stop_ev.wait(0.1)
        return code

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        codes, said = self.notes.get("codes", {}), self.notes.get("said", {}).get("RESOURCE_EXHAUSTED", "")
        uploaded = set(self.notes.get("uploads", {}).values()) == {"OK"}
        return [
            *super().extra_targets(row),
            ("all uploaded, every call refused naming its need", uploaded and set(codes) == {"RESOURCE_EXHAUSTED"}),
            ("refused naming its need", "needs ~" in said),
        ]


class NonzeroBomb(UploadThen):
    def __init__(self) -> None:
        g = helper.make_graph(
            [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("ReduceSum", ["nz"], ["y"], keepdims=0)],
            "nonzero",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
            [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        super().__init__(
            "nonzero_bomb",
            "uploaded NonZero; 128 MB of ones as a 12 KB zstd payload (768 MB of int64 out)",
            m.SerializeToString(),
            {},
            30.0,
        )

    def prepare(self, ctx: Ctx) -> None:
        super().prepare(ctx)
        from splitrt.transport import codec, wire

        header = pb.InferRequest(model_sha256=self.sha, cut_id="cloud", codec="fp32+zstd", request_id="nz")
        enc = [codec.encode("x", np.ones((4096, 4096, 2), np.float32), "fp32+zstd")]
        self.notes["payload_bytes"] = len(enc[0].payload)
        self.req = bytes(wire.Framed(header=header, tensors=enc).to_message().SerializeToString())

    def extra_targets(self, row: dict[str, Any]) -> list[tuple[str, bool]]:
        said = self.notes.get("said", {}).get("RESOURCE_EXHAUSTED", "")
        return [*super().extra_targets(row), ("refused naming its need", "needs ~" in said)]


def rows() -> list[Attack]:
    return [
        ValueBomb(),
        ValueCos(),
        Exfil(),
        Trickle(),
        EnvErrors(),
        HostileShapes(),
        ZstdBomb(),
        NanFlood(),
        UploadThen(
            "many_outputs",
            "uploaded 4000-output model (refused: > 1024 outputs), then Infer",
            many_outputs_model(),
            {"x": np.ones(4, np.float32)},
            30.0,
        ),
        UploadThen(
            "deep_nest",
            "uploaded If nested 200 deep (beyond protobuf's limit), then Infer",
            deep_nest_model(),
            {"x": np.ones(1, np.float32), "cond": np.array(True)},
            30.0,
        ),
        ValueOps(),
        NonzeroBomb(),
    ]
