"""Issue 19 figures: the cloud server against bad input, the model store against attacks, and requests
over a link at 0 Mbit/s.

    .venv/bin/python attacks/bench_badinput.py [--messages 10000] [--seed 0] [--threads 4] [--json]

One ``splitrt serve`` child process (uploads on, a bearer token, 2 workers, 4 MiB messages, 16 MiB
models) serves a store inside a fresh temporary root; its cwd is inside that root too.

1. gRPC messages: ``--messages`` random and mutated messages over every method the server serves
   (SplitInference's Infer, InferStream, Probe, Status, PutModel, and grpc.health.v1's Check and Watch),
   sent as raw bytes through a generic channel (identity serializers), so
   malformed protobuf reaches the server: random bytes, bit flips, truncations, splices, inserted
   varints of valid requests; structured mutations (shapes, dtypes, codecs, names, payload sizes, cut ids,
   model hashes, reply sizes, chunk fields, the three-tier fields ``next_cut_id``/``next_codec`` and
   ``next_probe`` sizes, health service names); a share without or with a wrong token. Counted: the status
   code of every call (and of every InferStream frame). Then: is the server alive (process, Status, a
   correct Infer), its RSS before (after a warm-up that builds every tail) and after.
   1b. The device daemon's local API (``LocalInference``: Infer, GetPlan; an in-process ``Daemon`` that splits
   tiny_chain with this server): ``--daemon-messages`` random and mutated messages (garbage bytes, bad
   model names, deadlines, shapes, dtypes, codecs, payloads); then a correct request must still match.
2. Malformed ONNX files, each uploaded with its correct sha256 (so it reaches the model loader) and
   dropped into the store directory (then Status and an Infer naming it): the status each got.
3. Store attacks: traversal names, external-data locations outside the store (uploaded, and in a model
   dropped into the directory, also through a symlink), oversize (declared and streamed), sha256
   mismatch and malformed hashes, a cancelled upload, a server SIGKILLed mid-upload (restarted: is its
   temporary file gone?). The temporary root is snapshotted (every file, size, mtime) before and after:
   what changed outside the store must be nothing.
4. A link at 0 Mbit/s: an ``AdaptiveDevice`` (squeezenet, deadline ``--deadline-ms``) whose cloud is
   behind a ``UserspaceLink`` at its minimum rate (0.01 Mbit/s: the crossing tensors never make it), or a
   server that accepts connections and never answers; policies ``fixed:<mid cut>`` (every request tries
   the cloud while it is up) and ``adaptive``. Counted: requests completed locally within their deadline.

Targets: 0 crashes, 0 UNKNOWN/INTERNAL statuses, RSS growth < 10 %, nothing written outside the store,
100 % of requests at 0 Mbit/s completed locally within their deadline. Progress on stderr; ``--json``
prints everything as one JSON document. The host's load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import psutil
from _shared import code as _code
from _shared import free_port as _free_port
from _shared import progress
from grpc_health.v1 import health_pb2
from onnx import TensorProto, helper, numpy_helper

from splitrt.cli.tables import render
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import RigError
from splitrt.graph import zoo
from splitrt.rig.cloudserver import start_server
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

TOKEN = "bench-badinput-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = f"/{wire.SERVICE_NAME}"
BAD_CODES = {"UNKNOWN", "INTERNAL"}
MAX_MESSAGE_MB = 4
MAX_MODEL_MB = 16


def _progress(msg: str) -> None:
    progress("badinput", msg)


# -- the server ---------------------------------------------------------------------------------------


class Server:
    """``splitrt serve`` in a child process (logs to a file outside the temporary root)."""

    def __init__(self, store: Path, cwd: Path, token_file: Path, log_path: Path) -> None:
        self.store, self.cwd, self.token_file, self.log_path = store, cwd, token_file, log_path
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        flags = ["--allow-upload", "--token-file", str(self.token_file), "--workers", "2", "--max-queue", "16"]
        flags += ["--max-message-mb", str(MAX_MESSAGE_MB), "--max-model-mb", str(MAX_MODEL_MB)]
        flags += ["--intra-op-threads", "1", "--drain-s", "1", "--log-level", "ERROR"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.starts += 1
        try:
            served = start_server(self.store, *flags, port=self.port, env=env, cwd=self.cwd, log_path=self.log_path)
        except RigError as exc:
            raise SystemExit(str(exc)) from exc
        self.proc = served.proc

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss(self) -> int:
        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def _channel(address: str) -> grpc.Channel:
    mb = 64 * 2**20
    return grpc.insecure_channel(
        address, options=[("grpc.max_send_message_length", mb), ("grpc.max_receive_message_length", mb)]
    )


# -- 1. gRPC messages ------------------------------------------------------------------------------------


class Seeds:
    """Valid serialized messages to mutate (from real heads of the store's models)."""

    def __init__(self, address: str) -> None:
        self.infer: list[bytes] = []
        self.models: list[str] = []
        for name in ("tiny_chain", "multi_io"):
            with Device(zoo.get(name), address, config=DeviceConfig(token=TOKEN, upload=False)) as dev:
                self.models.append(dev.sha256)
                x = dev.random_inputs()
                for cut in [c.id for c in dev.graph.cuts()][:-1]:
                    head = dev.run_head(x, cut)
                    for spec in ("fp32", "fp16", "int8c+zlib"):
                        framed = dev._request(head, codec.Codec.parse(spec))[0]
                        self.infer.append(framed.to_message().SerializeToString())
        self.probe = [
            pb.ProbeRequest(payload=bytes(n), reply_bytes=m).SerializeToString()
            for n, m in ((0, 0), (64, 64), (1000, 5000))
        ]
        self.status = [b"", pb.StatusRequest().SerializeToString()]
        data = zoo.get("tiny_chain").read_bytes()
        self.model_bytes = data
        self.chunks = [
            pb.ModelChunk(
                sha256=hashlib.sha256(data).hexdigest(), name="tiny.onnx", total_bytes=len(data), data=data
            ).SerializeToString()
        ]


def mutate_bytes(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One random byte-level mutation (or a random message)."""
    b = bytearray(data)
    kind = rng.randrange(11)
    if kind == 0 or not b:
        return rng.randbytes(rng.choice([0, 1, 7, 64, 512, 4096]))
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 2:
        return bytes(b[: rng.randrange(len(b))])
    elif kind == 3:
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 32))
    elif kind == 4:
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 64)]
    elif kind == 5:
        i = rng.randrange(len(b))
        b[i:i] = b[i : i + rng.randint(1, 256)]
    elif kind == 6:
        return bytes(b[: rng.randrange(len(b) + 1)]) + other[rng.randrange(len(other) + 1) :]
    elif kind == 7:  # a field with a huge or overlong varint (length, tag or value)
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.choice(
            [
                b"\xff" * 11,
                b"\x2a\xff\xff\xff\xff\x0f",
                b"\x0a\x80\x80\x80\x80\x10",
                b"\x2a\x05\x12\x03abc",
                b"\x78\x01",
                b"\xfa\xff\xff\xff\x0f\x00",
            ]
        )
    elif kind == 8:
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 9:
        return bytes(b) * rng.randint(2, 4)
    else:
        return bytes(b) + rng.randbytes(rng.randint(1, 100))
    return bytes(b)


def _rand_str(rng: random.Random) -> str:
    return rng.choice(
        [
            "",
            "x",
            "float32",
            "float128",
            "object",
            "<U8",
            "V16",
            "O",
            "bool",
            "int64",
            "complex64",
            "../../etc/passwd",
            "\u00e9\u4e2d",
            "a" * 5000,
            "c1",
            "c-1",
            "c99999",
            "cloud",
            "device",
            "fp32",
            "int3",
            "int8c+zlib+zlib",
            "zlib",
            "raw",
            "fp16+zlib",
            "\x00",
            "%s%n",
        ]
    )


def mutate_infer(rng: random.Random, seed: bytes, models: list[str]) -> bytes:
    """A structured mutation of a valid InferRequest: fields with values a careless server trips on."""
    req = pb.InferRequest.FromString(seed)
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(12)
        t = req.tensors[rng.randrange(len(req.tensors))] if req.tensors else req.tensors.add()
        if kind == 0:
            del t.shape[:]
            t.shape.extend(
                rng.choice(
                    [
                        [1 << 62, 1 << 62],
                        [-1, 3],
                        [0],
                        [2] * 64,
                        [1 << 31],
                        [1, 3, 32, 32, 1],
                        [],
                        [-(1 << 63)],
                        [1 << 20, 1 << 20, 1 << 20],
                    ]
                )
            )
        elif kind == 1:
            t.dtype = _rand_str(rng)
        elif kind == 2:
            t.codec = _rand_str(rng)
        elif kind == 3:
            t.name = _rand_str(rng)
        elif kind == 4:
            t.payload = rng.randbytes(rng.choice([0, 1, 3, 100, 4096, 70000]))
        elif kind == 5:
            req.cut_id = _rand_str(rng)
        elif kind == 6:
            req.model_sha256 = rng.choice([*models, "", "0" * 64, "../" * 21 + "a", rng.randbytes(32).hex()])
        elif kind == 7:
            req.output_codec = _rand_str(rng)
        elif kind == 8:
            for _ in range(rng.choice([1, 2, 50])):
                req.tensors.add().CopyFrom(t)
        elif kind == 9:  # three tiers: run up to a (maybe bogus, earlier or later) cut here
            req.next_cut_id = rng.choice([_rand_str(rng), req.cut_id, "device", "c1", "c2", "c3"])
        elif kind == 10:
            req.next_cut_id = rng.choice(["device", "c2", "c3", req.cut_id])
            req.next_codec = _rand_str(rng)
        else:
            t.pad = rng.randbytes(rng.choice([0, 7, 1000]))
    return req.SerializeToString()


def mutate_probe(rng: random.Random) -> bytes:
    sizes = [0, 1, 1 << 20, MAX_MESSAGE_MB * 2**20 - 1024, MAX_MESSAGE_MB * 2**20, 1 << 40, (1 << 64) - 1]
    req = pb.ProbeRequest(payload=rng.randbytes(rng.choice([0, 10, 5000])), reply_bytes=rng.choice(sizes))
    if rng.random() < 0.3:  # an edge's next hop (this server has none: next_error, not a failure)
        req.next_probe = True
        req.next_payload_bytes, req.next_reply_bytes = rng.choice(sizes), rng.choice(sizes)
    return req.SerializeToString()


HEALTH = "/grpc.health.v1.Health"
METHODS = ("Infer", "InferStream", "Probe", "Status", "PutModel", "Check", "Watch")


def mutate_health(rng: random.Random) -> bytes:
    name = rng.choice(["", wire.SERVICE_NAME, "nope", _rand_str(rng)])
    seed = health_pb2.HealthCheckRequest(service=name).SerializeToString()
    return seed if rng.random() < 0.4 else mutate_bytes(rng, seed or b"\x0a\x00", seed)


def mutate_chunks(rng: random.Random, seeds: Seeds) -> list[bytes]:
    data = seeds.model_bytes
    kind = rng.randrange(6)
    if kind == 0:  # mutated model bytes with their own (correct) sha256: they reach the model loader
        bad = mutate_bytes(rng, data, data)
        return [
            pb.ModelChunk(
                sha256=hashlib.sha256(bad).hexdigest(), name=_rand_str(rng), total_bytes=len(bad), data=bad
            ).SerializeToString()
        ]
    if kind == 1:
        return [
            pb.ModelChunk(
                sha256=_rand_str(rng), total_bytes=rng.choice([0, 1 << 62, (1 << 64) - 1]), data=rng.randbytes(100)
            ).SerializeToString()
        ]
    if kind == 2:
        return [mutate_bytes(rng, seeds.chunks[0], seeds.chunks[0]) for _ in range(rng.randint(1, 3))]
    if kind == 3:
        return [pb.ModelChunk(sha256="ab" * 32, data=rng.randbytes(1000)).SerializeToString(), rng.randbytes(50)]
    if kind == 4:
        return []
    return [
        pb.ModelChunk(sha256=hashlib.sha256(b"x").hexdigest(), name="../../../x.onnx", data=b"x").SerializeToString()
    ]


def make_calls(rng: random.Random, seeds: Seeds, n: int) -> list[tuple[str, Any, Any]]:
    """(method, payload, metadata) x n; payload: bytes, or a list of bytes for streaming methods."""
    calls: list[tuple[str, Any, Any]] = []
    for _ in range(n):
        r = rng.random()
        md: Any = AUTH
        if rng.random() < 0.04:
            md = rng.choice(
                [
                    None,
                    (("authorization", "Bearer wrong"),),
                    (("authorization", "Basic eA=="),),
                    (("authorization", "Bearer " + TOKEN[:-1]),),
                ]
            )
        if r < 0.42:
            seed = rng.choice(seeds.infer)
            data = (
                mutate_infer(rng, seed, seeds.models)
                if rng.random() < 0.5
                else mutate_bytes(rng, seed, rng.choice(seeds.infer))
            )
            calls.append(("Infer", data, md))
        elif r < 0.57:
            frames = [
                mutate_bytes(rng, s, s)
                if rng.random() < 0.4
                else (mutate_infer(rng, s, seeds.models) if rng.random() < 0.5 else s)
                for s in (rng.choice(seeds.infer) for _ in range(rng.randint(1, 4)))
            ]
            calls.append(("InferStream", frames, md))
        elif r < 0.72:
            data = mutate_probe(rng) if rng.random() < 0.5 else mutate_bytes(rng, rng.choice(seeds.probe), b"")
            calls.append(("Probe", data, md))
        elif r < 0.79:
            calls.append(("Status", mutate_bytes(rng, rng.choice(seeds.status) or b"\x08\x01", b""), md))
        elif r < 0.85:
            calls.append((rng.choice(["Check", "Watch"]), mutate_health(rng), md))
        else:
            calls.append(("PutModel", mutate_chunks(rng, seeds), md))
    return calls


def call_one(ch: grpc.Channel, method: str, payload: Any, md: Any) -> list[str]:
    """The status code name(s) of one call: one per call, plus ``frame:CODE`` per InferStream reply."""
    path = f"{HEALTH if method in ('Check', 'Watch') else SERVICE}/{method}"
    try:
        if method == "Watch":  # a server stream that runs until cancelled: its first answer counts
            watch = ch.unary_stream(path)(payload, timeout=20, metadata=md)
            next(watch)
            watch.cancel()
            return ["OK"]
        if method == "InferStream":
            out = []
            for raw in ch.stream_stream(path)(iter(payload), timeout=20, metadata=md):
                reply = pb.InferReply.FromString(raw)
                out.append(f"frame:{reply.error.code or 'OK'}")
            return ["OK", *out]
        if method == "PutModel":
            ch.stream_unary(path)(iter(payload), timeout=20, metadata=md)
        else:
            ch.unary_unary(path)(payload, timeout=20, metadata=md)
        return ["OK"]
    except Exception as exc:  # grpc.RpcError (the status we count), or a client-side failure
        return [_code(exc)]


def fuzz(server: Server, seeds: Seeds, n: int, seed: int, threads: int) -> dict[str, Any]:
    rng = random.Random(seed)
    calls = make_calls(rng, seeds, n)
    codes: dict[str, Counter[str]] = {m: Counter() for m in METHODS}
    frames: Counter[str] = Counter()
    examples: dict[str, str] = {}
    done = [0]
    rss: list[float] = []
    lock = threading.Lock()
    chans = [_channel(server.address) for _ in range(threads)]

    def run(i: int) -> None:
        method, payload, md = calls[i]
        got = call_one(chans[i % threads], method, payload, md)
        with lock:
            codes[method][got[0]] += 1
            for f in got[1:]:
                frames[f.split(":", 1)[1]] += 1
            for c in got:
                c = c.split(":", 1)[-1]
                if c in BAD_CODES or c.startswith("client"):
                    examples.setdefault(f"{method}:{c}", repr(payload)[:300])
            done[0] += 1
            if done[0] % 1000 == 0:
                rss.append(round(server.rss() / 2**20, 1) if server.alive() else -1.0)
                _progress(f"messages: {done[0]}/{n}, server alive: {server.alive()}, RSS {rss[-1]} MiB")

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, range(n)))
    for c in chans:
        c.close()
    return {
        "messages": n,
        "seconds": round(time.monotonic() - t0, 1),
        "codes": {m: dict(c) for m, c in codes.items()},
        "stream_frames": dict(frames),
        "bad_examples": examples,
        "rss_mb_per_1000": rss,
        "bad": sum(c[k] for c in codes.values() for k in c if k in BAD_CODES or k.startswith("client"))
        + sum(frames[k] for k in frames if k in BAD_CODES),
    }


def warm_up(address: str) -> None:
    """Every tail of the store's models built once, every method called once."""
    for name in ("tiny_chain", "multi_io"):
        with Device(zoo.get(name), address, config=DeviceConfig(token=TOKEN, upload=False)) as dev:
            x = dev.random_inputs()
            for _ in range(3):
                for cut in dev.graph.cuts():
                    dev.run(x, cut=cut.id)
            dev.probe(1000, 1000)
            list(dev.stream([x] * 4, cut=dev.graph.cuts()[1].id))


def still_serves(address: str) -> bool:
    try:
        with Device(
            zoo.get("tiny_chain"), address, config=DeviceConfig(token=TOKEN, upload=False, timeout_s=30)
        ) as dev:
            x = dev.random_inputs(seed=3)
            got, ref = dev.run(x, cut="c2")["y"], dev.run_local(x)["y"]
            return bool(np.allclose(got, ref, rtol=1e-5, atol=1e-6)) and len(dev.status().models) >= 2
    except Exception as exc:
        _progress(f"server does not serve: {exc}")
        return False


# -- 1b. the device daemon's local API ------------------------------------------------------------------


def mutate_local(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes]:
    """A LocalInference call: (method, request bytes), structured or byte-level mutations."""
    if rng.random() < 0.2:
        name = rng.choice(["", "tiny", "nope", _rand_str(rng)])
        seed = pb.GetPlanRequest(model=name).SerializeToString()
        return "GetPlan", seed if rng.random() < 0.5 else mutate_bytes(rng, seed or b"\x0a\x00", seed)
    seed = rng.choice(seeds)
    if rng.random() < 0.5:
        return "Infer", mutate_bytes(rng, seed, rng.choice(seeds))
    req = pb.LocalInferRequest.FromString(seed)
    kind = rng.randrange(5)
    t = req.tensors[0]
    if kind == 0:
        req.model = _rand_str(rng)
    elif kind == 1:
        req.deadline_ms = rng.choice([-1.0, 1e-9, 1e300, float("nan"), float("inf")])
    elif kind == 2:
        del t.shape[:]
        t.shape.extend(rng.choice([[1 << 62], [-1, 4], [0], [2] * 64, []]))
    elif kind == 3:
        t.dtype, t.codec = _rand_str(rng), _rand_str(rng)
    else:
        t.payload = rng.randbytes(rng.choice([0, 3, 100, 70000]))
    return "Infer", req.SerializeToString()


def fuzz_daemon(server: Server, root: Path, n: int, seed: int, threads: int) -> dict[str, Any]:
    """``n`` random and mutated messages to an in-process ``Daemon`` (tiny_chain, split with the bench's
    server) over its LocalInference methods; then: does it still answer a correct request?"""
    from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig

    cfg = DaemonConfig(
        models=(ModelConfig(name="tiny", path="zoo:tiny_chain"),),
        clouds=(server.address,),
        token_path=server.token_file,
        upload=False,
        api_address="127.0.0.1:0",
        api_socket_path=None,
        metrics_port=None,
        intra_op_threads=1,
        policy="fixed:c2@fp32",
        deadline_ms=2000.0,
    )
    rng = random.Random(seed)
    codes: dict[str, Counter[str]] = {"LocalInfer": Counter(), "GetPlan": Counter()}
    examples: dict[str, str] = {}
    with Daemon(cfg) as d:
        address = d.api_address
        assert address is not None
        x = {k: v for k, v in zoo.random_inputs(zoo.get("tiny_chain"), seed=1).items()}
        req = pb.LocalInferRequest(model="tiny")
        for name, value in x.items():
            wire.add_tensor(req.tensors, codec.encode(name, np.ascontiguousarray(value), codec.Codec.parse("fp32")))
        seeds = [req.SerializeToString(), pb.LocalInferRequest(model="", tensors=req.tensors).SerializeToString()]
        calls = [mutate_local(rng, seeds) for _ in range(n)]
        ch = _channel(address)
        lock = threading.Lock()

        def run(i: int) -> None:
            method, data = calls[i]
            try:
                ch.unary_unary(f"/{pb.DESCRIPTOR.services_by_name['LocalInference'].full_name}/{method}")(
                    data, timeout=20
                )
                code = "OK"
            except Exception as exc:
                code = _code(exc)
            with lock:
                codes["LocalInfer" if method == "Infer" else "GetPlan"][code] += 1
                if code in BAD_CODES or code.startswith("client"):
                    examples.setdefault(f"{method}:{code}", repr(data)[:300])

        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(n)))
        ch.close()
        with LocalClient(address, timeout_s=30) as client:
            got = client.infer(x, model="tiny")
            ref = cast(Any, d.models["tiny"].device).local.run_local(x)  # an AdaptiveDevice
            alive = all(np.allclose(got.outputs[k], v, rtol=1e-5, atol=1e-6) for k, v in ref.items())
    return {
        "messages": n,
        "seconds": round(time.monotonic() - t0, 1),
        "codes": {m: dict(c) for m, c in codes.items()},
        "bad_examples": examples,
        "alive": alive,
        "bad": sum(c[k] for c in codes.values() for k in c if k in BAD_CODES or k.startswith("client")),
    }


# -- 2. malformed ONNX -----------------------------------------------------------------------------------


def _model(
    nodes: list[Any],
    inputs: list[Any],
    outputs: list[Any],
    inits: list[Any] | None = None,
    *,
    opset: int = 17,
    ir: int = 8,
) -> bytes:
    g = helper.make_graph(nodes, "bad", inputs, outputs, inits or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m.SerializeToString()


def _vi(name: str, shape: list[Any], dtype: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def malformed_models(rng: random.Random) -> dict[str, bytes]:
    good = zoo.get("tiny_chain").read_bytes()
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    huge_init = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    del huge_init.dims[:]
    huge_init.dims.extend([1 << 40, 1 << 30])
    deep = _vi("x", [1, 4])
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "leaf", [], [_vi("y", [1, 4])])
    nested = helper.make_node("Identity", ["x"], ["y"])
    for i in range(30):  # If nodes nested 30 deep (protobuf refuses ~100 levels of messages)
        branch = helper.make_graph([nested], f"b{i}", [], [_vi("y", [1, 4])])
        nested = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=leaf)
    return {
        "empty file": b"",
        "garbage (4 KiB random)": rng.randbytes(4096),
        "truncated at 50 %": good[: len(good) // 2],
        "truncated to 10 bytes": good[:10],
        "one flipped byte per 100": bytes(b ^ 0x55 if i % 100 == 0 else b for i, b in enumerate(good)),
        "opset 1 (too old)": _model(relu, [_vi("x", [1, 4])], [_vi("y", [1, 4])], opset=1),
        "opset 999 (from the future)": _model(relu, [_vi("x", [1, 4])], [_vi("y", [1, 4])], opset=999),
        "ir_version 99": _model(relu, [_vi("x", [1, 4])], [_vi("y", [1, 4])], ir=99),
        "unknown operator": _model(
            [helper.make_node("NoSuchOp", ["x"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])]
        ),
        "cyclic graph": _model(
            [
                helper.make_node("Add", ["x", "b"], ["a"]),
                helper.make_node("Relu", ["a"], ["b"]),
                helper.make_node("Identity", ["b"], ["y"]),
            ],
            [_vi("x", [1, 4])],
            [_vi("y", [1, 4])],
        ),
        "self-loop node": _model([helper.make_node("Add", ["x", "y"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])]),
        "huge declared input dims": _model(relu, [_vi("x", [1 << 40, 1 << 40, 1 << 40])], [_vi("y", [1 << 40])]),
        "negative dims": _model(relu, [_vi("x", [-5, 4])], [_vi("y", [-5, 4])]),
        "initializer claims 2^70 elements": _model(
            [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])], [huge_init]
        ),
        "output nobody produces": _model(relu, [_vi("x", [1, 4])], [_vi("nothing", [1, 4])]),
        "duplicate node outputs": _model(
            [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
            [_vi("x", [1, 4])],
            [_vi("y", [1, 4])],
        ),
        "If nested 30 deep": _model([nested], [deep, _vi("c", [], TensorProto.BOOL)], [_vi("y", [1, 4])]),
        "wrong dtype edges (int into Relu)": _model(
            relu, [_vi("x", [1, 4], TensorProto.STRING)], [_vi("y", [1, 4], TensorProto.STRING)]
        ),
    }


def try_models(server: Server, cases: dict[str, bytes], store: Path) -> list[dict[str, Any]]:
    rows = []
    ch = _channel(server.address)
    put = ch.stream_unary(
        f"{SERVICE}/PutModel",
        request_serializer=pb.ModelChunk.SerializeToString,
        response_deserializer=pb.PutModelReply.FromString,
    )
    infer = ch.unary_unary(f"{SERVICE}/Infer")
    status = ch.unary_unary(f"{SERVICE}/Status", response_deserializer=pb.StatusReply.FromString)
    for i, (name, data) in enumerate(cases.items()):
        sha = hashlib.sha256(data).hexdigest()
        row: dict[str, Any] = {"case": name, "bytes": len(data)}
        try:
            put(iter([pb.ModelChunk(sha256=sha, total_bytes=len(data), data=data)]), timeout=60, metadata=AUTH)
            row["upload"], row["error"] = "OK (stored)", ""
        except grpc.RpcError as exc:
            row["upload"], row["error"] = _code(exc), (exc.details() or "")[:110]
        dropped = store / f"dropped-{i}.onnx"
        dropped.write_bytes(data)
        try:
            listed = {m.sha256 for m in status(b"", timeout=30, metadata=AUTH).models}
            row["dropped_in"] = "listed" if sha in listed else "not listed"
            req = pb.InferRequest(model_sha256=sha, cut_id="cloud", request_id=f"m{i}")  # builds the whole tail
            infer(req.SerializeToString(), timeout=30, metadata=AUTH)
            row["infer"] = "OK"
        except grpc.RpcError as exc:
            row["infer"] = _code(exc)
        dropped.unlink()
        row["alive"] = server.alive()
        rows.append(row)
        _progress(f"onnx: {name}: upload {row['upload']}, infer {row['infer']}, alive {row['alive']}")
    status(b"", timeout=30, metadata=AUTH)  # the store forgets the removed files
    ch.close()
    return rows


# -- 3. store attacks ------------------------------------------------------------------------------------


def small_model(i: int, location: str | None = None) -> bytes:
    """y = x @ W, W seeded by ``i`` (a distinct model per attack), optionally as external data."""
    w = numpy_helper.from_array(np.random.default_rng(i).standard_normal((4, 4)).astype(np.float32), "W")
    if location is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", "0"), ("length", "64")):
            w.external_data.add(key=k, value=v)
    return _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])], [w])


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == skip or skip in here.parents:
            continue
        for n in dirnames:
            if here / n != skip:
                out[str((here / n).relative_to(root)) + "/"] = (-1, 0)
        for n in filenames:
            st = (here / n).lstat()
            out[str((here / n).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def _put(address: str, chunks: Iterator[pb.ModelChunk] | list[pb.ModelChunk], timeout: float = 60) -> str:
    with _channel(address) as ch:
        put = ch.stream_unary(
            f"{SERVICE}/PutModel",
            request_serializer=pb.ModelChunk.SerializeToString,
            response_deserializer=pb.PutModelReply.FromString,
        )
        try:
            reply = put(iter(chunks), timeout=timeout, metadata=AUTH)
            return "OK (already had it)" if reply.already_present else "OK (stored as <sha256>.onnx)"
        except grpc.RpcError as exc:
            return f"{_code(exc)}: {(exc.details() or '')[:90]}"


def _one(data: bytes, *, name: str = "m.onnx", sha: str | None = None, total: int | None = None) -> list[pb.ModelChunk]:
    return [
        pb.ModelChunk(
            sha256=hashlib.sha256(data).hexdigest() if sha is None else sha,
            name=name,
            total_bytes=len(data) if total is None else total,
            data=data,
        )
    ]


def store_attacks(server: Server, root: Path, store: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def attack(kind: str, what: str, result: str) -> None:
        rows.append({"attack": kind, "what": what, "result": result, "alive": server.alive()})
        _progress(f"store: {kind}: {what}: {result}")

    names = [
        "../../outside/evil.onnx",
        "/tmp/splitrt-evil.onnx",
        "..",
        "../cwd/x.onnx",
        "a/../../b.onnx",
        "x\x00y.onnx",
        "C:\\Windows\\evil.onnx",
        "tokens",
    ]
    for i, name in enumerate(names):
        attack("traversal name", repr(name), _put(server.address, _one(small_model(100 + i), name=name)))
    for i, loc in enumerate(
        [
            "../outside/decoy.bin",
            str(root / "outside" / "decoy.bin"),
            "/etc/passwd",
            "../../../../../../etc/shadow",
            "decoy.bin",
            "sub/../../outside/decoy.bin",
        ]
    ):
        attack("external data (upload)", repr(loc), _put(server.address, _one(small_model(200 + i, loc))))
    (store / "link.bin").symlink_to(root / "outside" / "decoy.bin")
    with _channel(server.address) as ch:
        status = ch.unary_unary(f"{SERVICE}/Status", response_deserializer=pb.StatusReply.FromString)
        for i, loc in enumerate(["../outside/decoy.bin", str(root / "outside" / "decoy.bin"), "link.bin"]):
            data = small_model(300 + i, loc)
            (store / f"ext-{i}.onnx").write_bytes(data)
            listed = {m.name for m in status(b"", timeout=30, metadata=AUTH).models}
            attack(
                "external data (file in store)",
                repr(loc),
                "served (listed)" if f"ext-{i}.onnx" in listed else "refused (not listed)",
            )
            (store / f"ext-{i}.onnx").unlink()
        (store / "link.bin").unlink()
        status(b"", timeout=30, metadata=AUTH)
    big = MAX_MODEL_MB * 2**20 + 1
    attack("oversize", f"declared total_bytes {big}", _put(server.address, _one(b"\x00" * 100, total=big)))

    def stream_big() -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(sha256="cd" * 32, data=bytes(2**20))
        for _ in range(MAX_MODEL_MB + 1):
            yield pb.ModelChunk(data=bytes(2**20))

    attack("oversize", f"{MAX_MODEL_MB + 2} MiB streamed, undeclared", _put(server.address, stream_big()))
    attack(
        "sha256 mismatch",
        "valid model, another model's sha256",
        _put(server.address, _one(small_model(400), sha=hashlib.sha256(b"other").hexdigest())),
    )
    for sha in ["../" * 21 + "x", "AB" * 32 + "00", "", "g" * 64]:
        attack("malformed sha256", repr(sha[:24]), _put(server.address, _one(small_model(401), sha=sha)))
    attack("cancelled upload", "device gone after 1 of 2 chunks", cancelled_upload(server, store))
    attack("killed server", "SIGKILL mid-upload, then restart", killed_upload(server, store))
    return rows


def _held_upload(server: Server, store: Path) -> tuple[Any, threading.Event, grpc.Channel]:
    data = zoo.get("squeezenet").read_bytes()
    hold = threading.Event()

    def chunks() -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(sha256=hashlib.sha256(data).hexdigest(), total_bytes=len(data), data=data[: 2**20])
        hold.wait(60)
        yield pb.ModelChunk(data=data[2**20 :])

    ch = _channel(server.address)
    put = ch.stream_unary(f"{SERVICE}/PutModel", request_serializer=pb.ModelChunk.SerializeToString)
    future = put.future(chunks(), timeout=60, metadata=AUTH)
    for _ in range(600):
        if list(store.glob(".upload-*.part")):
            break
        time.sleep(0.05)
    return future, hold, ch


def cancelled_upload(server: Server, store: Path) -> str:
    future, hold, ch = _held_upload(server, store)
    started = bool(list(store.glob(".upload-*.part")))
    future.cancel()
    hold.set()
    for _ in range(200):
        if not list(store.glob(".upload-*.part")):
            break
        time.sleep(0.05)
    ch.close()
    left = len(list(store.glob(".upload-*.part")))
    return f"temporary file seen: {started}; left after cancel: {left}"


def killed_upload(server: Server, store: Path) -> str:
    _, hold, ch = _held_upload(server, store)
    started = len(list(store.glob(".upload-*.part")))
    server.kill()
    hold.set()
    ch.close()
    after_kill = len(list(store.glob(".upload-*.part")))
    server.start()
    left = len(list(store.glob(".upload-*.part")))
    return f"temporary files: {started} during, {after_kill} after SIGKILL, {left} after restart"


# -- 4. 0 Mbit/s -----------------------------------------------------------------------------------------


def black_hole() -> tuple[socket.socket, threading.Event]:
    """A TCP server that accepts connections and never answers (nor reads)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue
        for c in held:
            c.close()

    threading.Thread(target=loop, daemon=True).start()
    return srv, stop


def zero_link(server: Server, store: Path, *, requests: int, deadline_ms: float) -> list[dict[str, Any]]:
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.graph import model as graph
    from splitrt.profile.priors import flops_table
    from splitrt.rig.shaper import MIN_RATE_MBPS, UserspaceLink

    shutil.copyfile(zoo.get("squeezenet"), store / "squeezenet.onnx")  # the cloud has the model
    mg = graph.load(zoo.get("squeezenet"))
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    mid = mg.cuts()[len(mg.cuts()) // 2].id
    x = {"data_0": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    rows = []
    relay = UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", server.port), rate_mbps=MIN_RATE_MBPS)
    hole, hole_stop = black_hole()
    links = {
        f"relay at {MIN_RATE_MBPS} Mbit/s": f"127.0.0.1:{relay.port}",
        "server that never answers": f"127.0.0.1:{hole.getsockname()[1]}",
    }
    try:
        for link, address in links.items():
            for policy in (f"fixed:{mid}@fp32", "adaptive"):
                cfg = RuntimeConfig(deadline_ms=deadline_ms, policy=policy, backoff_initial_s=0.2, backoff_max_s=1.0)
                lat, local, within = [], 0, 0
                with AdaptiveDevice(
                    mg,
                    table,
                    [address],
                    config=cfg,
                    device_config=DeviceConfig(token=TOKEN, upload=False, intra_op_threads=1),
                ) as dev:
                    for _ in range(requests):
                        out = dev.infer(x, deadline_ms=deadline_ms)
                        lat.append(out.latency_ms)
                        local += int(out.server is None)
                        within += int(out.latency_ms <= deadline_ms)
                rows.append(
                    {
                        "link": link,
                        "policy": policy.split("@")[0],
                        "requests": requests,
                        "local": local,
                        "within_deadline": within,
                        "deadline_ms": deadline_ms,
                        "p50_ms": round(statistics.median(lat), 1),
                        "max_ms": round(max(lat), 1),
                    }
                )
                _progress(f"0 Mbit/s: {link}, {policy}: {local}/{requests} local, {within} within the deadline")
    finally:
        relay.close()
        hole_stop.set()
        hole.close()
    return rows


# -- main ------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, root: Path, logs: Path) -> dict[str, Any]:
    store, cwd, outside = root / "store", root / "cwd", root / "outside"
    for d in (store, cwd, outside):
        d.mkdir()
    (outside / "decoy.bin").write_bytes(np.eye(4, dtype=np.float32).tobytes())
    for name in ("tiny_chain", "multi_io"):
        shutil.copyfile(zoo.get(name), store / f"{name}.onnx")
    token_file = root / "tokens"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    before = snapshot(root, store)
    server = Server(store, cwd, token_file, logs / "server.log")
    server.start()
    result: dict[str, Any] = {"load_avg_start": [round(v, 2) for v in os.getloadavg()]}
    try:
        _progress("warm-up: every tail once, then a round of other random messages (worker threads, caches)")
        warm_up(server.address)
        seeds = Seeds(server.address)
        fuzz(server, seeds, args.warmup_messages, args.seed + 1, args.threads)
        rss0 = server.rss()
        _progress(f"fuzzing: {args.messages} messages, {args.threads} threads")
        result["grpc"] = fuzz(server, seeds, args.messages, args.seed, args.threads)
        rss1 = server.rss()
        result["server"] = {
            "alive": server.alive() and still_serves(server.address),
            "rss_before_mb": rss0 / 2**20,
            "rss_after_mb": rss1 / 2**20,
            "rss_growth_pct": 100.0 * (rss1 - rss0) / rss0,
        }
        _progress(f"daemon API: {args.daemon_messages} messages")
        result["daemon"] = fuzz_daemon(server, root, args.daemon_messages, args.seed + 2, args.threads)
        _progress("malformed ONNX files")
        result["onnx"] = try_models(server, malformed_models(random.Random(args.seed)), store)
        _progress("store attacks")
        result["store"] = store_attacks(server, root, store)
        result["server"]["alive_after_attacks"] = server.alive() and still_serves(server.address)
        result["zero_link"] = zero_link(server, store, requests=args.link_requests, deadline_ms=args.deadline_ms)
        result["server"]["exit_code"] = server.stop()
        result["server"]["starts"] = server.starts
    finally:
        server.kill()
    after = snapshot(root, store)
    result["outside_store"] = {
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": sorted(k for k in before if k in after and before[k] != after[k]),
    }
    result["store_files"] = sorted(p.name for p in store.iterdir())
    result["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    return result


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool]]:
    crashes = r["server"]["starts"] - 1 - 1  # the planned SIGKILL restart is not a crash
    crashes += sum(not row["alive"] for row in r["onnx"]) + sum(not row["alive"] for row in r["store"])
    crashes += int(not r["server"]["alive"]) + int(not r["server"]["alive_after_attacks"])
    crashes += int(r["server"]["exit_code"] != 0) + int(not r["daemon"]["alive"])
    bad = (
        r["grpc"]["bad"]
        + r["daemon"]["bad"]
        + sum(row["upload"] in BAD_CODES or row["infer"] in BAD_CODES for row in r["onnx"])
        + sum(any(c in row["result"] for c in BAD_CODES) for row in r["store"])
    )
    outside = (
        len(r["outside_store"]["added"])
        + len(r["outside_store"]["removed"])
        + len(r["outside_store"]["changed"])
        + int(r["outside_elsewhere"])
    )
    n = sum(row["requests"] for row in r["zero_link"])
    ok = sum(min(row["local"], row["within_deadline"]) for row in r["zero_link"])
    growth = r["server"]["rss_growth_pct"]
    return [
        ("crashes", str(crashes), crashes == 0),
        ("UNKNOWN/INTERNAL statuses (and client-side failures)", str(bad), bad == 0),
        ("server RSS growth over the fuzz", f"{growth:+.1f} %", growth < 10.0),
        ("paths written outside the store", str(outside), outside == 0),
        (
            "requests at 0 Mbit/s completed locally within the deadline",
            f"{ok}/{n} ({100 * ok / max(1, n):.0f} %)",
            ok == n,
        ),
    ]


def print_tables(r: dict[str, Any]) -> None:
    g = r["grpc"]
    print(
        f"\n1. gRPC messages: {g['messages']} random and mutated, {g['seconds']} s "
        f"(load average {r['load_avg_start'][0]} -> {r['load_avg_end'][0]}, {os.cpu_count()} CPUs)"
    )
    rows = [
        [m, sum(c.values()), ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))]
        for m, c in g["codes"].items()
    ]
    rows.append(
        [
            "(InferStream frames)",
            sum(g["stream_frames"].values()),
            ", ".join(f"{k} {v}" for k, v in sorted(g["stream_frames"].items(), key=lambda kv: -kv[1])),
        ]
    )
    print(render(["method", "calls", "status codes seen"], rows))
    s = r["server"]
    print(
        f"\nserver alive and serving after the fuzz: {s['alive']}; RSS {s['rss_before_mb']:.1f} MiB before, "
        f"{s['rss_after_mb']:.1f} MiB after ({s['rss_growth_pct']:+.1f} %)"
    )
    for k, v in g["bad_examples"].items():
        print(f"  bad: {k}: {v}")
    dm = r["daemon"]
    print(
        f"\n1b. the device daemon's LocalInference API: {dm['messages']} random and mutated messages, "
        f"{dm['seconds']} s; answers a correct request afterwards: {dm['alive']}"
    )
    print(
        render(
            ["method", "calls", "status codes seen"],
            [
                [m, sum(c.values()), ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))]
                for m, c in dm["codes"].items()
            ],
        )
    )
    for k, v in dm["bad_examples"].items():
        print(f"  bad: {k}: {v}")
    print("\n2. malformed ONNX files (uploaded with their correct sha256; dropped into the store directory)")
    print(
        render(
            ["file", "bytes", "upload", "upload error", "dropped in", "Infer", "alive"],
            [
                [o["case"], o["bytes"], o["upload"], o["error"][:70], o["dropped_in"], o["infer"], o["alive"]]
                for o in r["onnx"]
            ],
        )
    )
    print("\n3. store attacks")
    print(
        render(
            ["attack", "what", "result", "alive"],
            [[a["attack"], a["what"], a["result"][:95], a["alive"]] for a in r["store"]],
        )
    )
    o = r["outside_store"]
    print(
        f"\nwritten outside the store (temporary root before/after; /tmp/splitrt-evil.onnx): "
        f"added {o['added']}, removed {o['removed']}, changed {o['changed']}, elsewhere {r['outside_elsewhere']}; "
        f"store holds {len(r['store_files'])} files"
    )
    print("\n4. link at 0 Mbit/s (AdaptiveDevice, squeezenet)")
    print(
        render(
            ["link", "policy", "requests", "completed locally", "within deadline", "deadline ms", "p50 ms", "max ms"],
            [
                [
                    z["link"],
                    z["policy"],
                    z["requests"],
                    z["local"],
                    z["within_deadline"],
                    z["deadline_ms"],
                    z["p50_ms"],
                    z["max_ms"],
                ]
                for z in r["zero_link"]
            ],
        )
    )
    print("\ntargets")
    print(render(["target", "measured", "met"], [[t, v, "yes" if ok else "NO"] for t, v, ok in r["targets"]]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="gRPC messages to send (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4, help="concurrent callers")
    ap.add_argument(
        "--warmup-messages",
        type=int,
        default=2000,
        help="random messages (another seed) sent before the 'before' RSS is read",
    )
    ap.add_argument("--daemon-messages", type=int, default=2000, help="messages to the device daemon's local API")
    ap.add_argument("--link-requests", type=int, default=15, help="requests per 0 Mbit/s scenario (4 scenarios)")
    ap.add_argument("--deadline-ms", type=float, default=800.0, help="deadline of the 0 Mbit/s requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    evil = Path("/tmp/splitrt-evil.onnx")
    existed = evil.exists()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="splitrt-badinput-") as tmp,
        tempfile.TemporaryDirectory(prefix="splitrt-badinput-logs-") as logs,
    ):
        result = run(args, Path(tmp), Path(logs))
    result["outside_elsewhere"] = evil.exists() and not existed
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["targets"] = targets(result)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print_tables(result)
        print(f"\n{result['seconds']} s in all")
    return 0 if all(ok for _, _, ok in result["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
