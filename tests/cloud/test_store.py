"""The model store against attacks through uploads and files: names never used as paths, external data
that leaves the store, oversize, sha256 mismatch, cancelled and killed uploads, garbage files. A real
gRPC server on 127.0.0.1; after each attack nothing is written outside the store."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from splitrt.cloud.models.store import ModelStore, location_refused
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

TOKEN = "store-t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root``: files with their size and mtime (ns), directories as (-1, 0)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames:
            out[str((Path(dirpath) / n).relative_to(root))] = (-1, 0)
        for n in filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(root, store): the store is root/srv/models; root also holds a file an attacker would like."""
    store = tmp_path / "srv" / "models"
    store.mkdir(parents=True)
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 64)
    yield tmp_path, store


def _stub(address: str) -> pb_grpc.SplitInferenceStub:
    return pb_grpc.SplitInferenceStub(grpc.insecure_channel(address))


def _put(
    address: str,
    data: bytes,
    *,
    sha: str | None = None,
    name: str = "m.onnx",
    total: int | None = None,
    chunk: int = 1 << 16,
) -> pb.PutModelReply:
    sha = hashlib.sha256(data).hexdigest() if sha is None else sha
    chunks = [
        pb.ModelChunk(sha256=sha, name=name, total_bytes=len(data) if total is None else total, data=data[:chunk])
    ]
    chunks += [pb.ModelChunk(data=data[i : i + chunk]) for i in range(chunk, len(data), chunk)]
    return _stub(address).PutModel(iter(chunks), timeout=20, metadata=AUTH)


def _refused(address: str, data: bytes, **kw: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _put(address, data, **kw)  # type: ignore[arg-type]
    return info.value


def external_model(location: str) -> onnx.ModelProto:
    """y = x @ W with W (4x4 float32) stored as external data at ``location``."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "64")):
        w.external_data.add(key=k, value=v)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    "name", ["../../../evil.onnx", "/tmp/evil.onnx", "..", "a/../../b.onnx", "x\x00y", "C:\\evil.onnx", "secret.bin"]
)
def test_upload_names_are_never_paths(world: tuple[Path, Path], name: str) -> None:
    root, store = world
    data = zoo.get("tiny_chain").read_bytes()
    before = snapshot(root)
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        reply = _put(s.address, data, name=name)
    sha = hashlib.sha256(data).hexdigest()
    assert reply.sha256 == sha and not reply.already_present
    after = snapshot(root)
    assert set(after) - set(before) == {f"srv/models/{sha}.onnx"}
    assert {k: v for k, v in after.items() if k in before} == before
    assert not Path("/tmp/evil.onnx").exists() or Path("/tmp/evil.onnx").stat().st_mtime < time.time() - 60


@pytest.mark.parametrize("location", ["../../secret.bin", "/etc/passwd", "w.bin", "sub/../w.bin"])
def test_uploaded_model_with_external_data_is_refused(world: tuple[Path, Path], location: str) -> None:
    root, store = world
    (store / "w.bin").write_bytes(np.eye(4, dtype=np.float32).tobytes())  # even inside the store
    data = external_model(location).SerializeToString()
    before = snapshot(root)
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        err = _refused(s.address, data)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            f"expected a self-contained model (no external data), got external-data location {location!r}"
            in err.details()
        )
        assert "nothing stored" in err.details()
    assert snapshot(root) == before


def test_store_refuses_external_data_outside_it(world: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    root, store = world
    weights = np.eye(4, dtype=np.float32).tobytes()
    (store / "w.bin").write_bytes(weights)
    (root / "outside.bin").write_bytes(weights)
    (store / "link.bin").symlink_to(root / "outside.bin")
    onnx.save(external_model("w.bin"), str(store / "inside.onnx"))
    for i, loc in enumerate(["../../outside.bin", str(root / "outside.bin"), "link.bin", "."]):
        onnx.save(external_model(loc), str(store / f"out{i}.onnx"))
    with caplog.at_level(logging.WARNING, logger="splitrt.cloud"):
        s = ModelStore(store)
        s.scan()  # nothing changed: refused files are not looked at again
    assert [m.path.name for m in s.models()] == ["inside.onnx"]
    refused = [r.getMessage() for r in caplog.records if '"event": "model_refused"' in r.getMessage()]
    assert len(refused) == 4
    assert all("expected external data inside" in m for m in refused)
    assert location_refused(store, store / "m.onnx", ["w.bin", "sub/x.bin"]) is None
    assert location_refused(store, store / "m.onnx", ["w.bin", "../x"]) == (
        "../x",
        f"expected external data inside {store}",
    )


def test_garbage_model_file_is_skipped_and_status_still_answers(world: tuple[Path, Path]) -> None:
    _, store = world
    shutil.copyfile(zoo.get("tiny_chain"), store / "good.onnx")
    (store / "garbage.onnx").write_bytes(b"\xff\xfe not a model" * 10)
    (store / "empty.onnx").write_bytes(b"")
    with CloudServer(ServerConfig(models_dir=store)) as s:
        st = _stub(s.address).Status(pb.StatusRequest(), timeout=10)
    assert [m.name for m in st.models] == ["good.onnx"]


def test_oversize_upload_is_refused_declared_or_not(world: tuple[Path, Path]) -> None:
    root, store = world
    data = zoo.get("tiny_chain").read_bytes()
    limit = len(data) - 1
    before = snapshot(root)
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,), max_model_bytes=limit)) as s:
        err = _refused(s.address, data)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"expected at most {limit} bytes, got total_bytes {len(data)}" in err.details()
        err = _refused(s.address, data, total=0, chunk=1024)  # not declared: stopped while streaming
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"expected at most {limit} bytes, got more; nothing stored" in err.details()
        err = _refused(s.address, data, total=10)  # declared small, sent big
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert snapshot(root) == before


@pytest.mark.parametrize(
    ("sha", "what"),
    [
        ("ab" * 32, "sha256 mismatch"),
        ("AB" * 31, "hex sha256 of 64"),
        ("zz" * 32, "hex sha256 of 64"),
        ("", "hex sha256 of 64"),
    ],
)
def test_upload_must_match_its_declared_sha256(world: tuple[Path, Path], sha: str, what: str) -> None:
    root, store = world
    data = zoo.get("tiny_chain").read_bytes()
    before = snapshot(root)
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        err = _refused(s.address, data, sha=sha)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and what in err.details()
    assert snapshot(root) == before


def test_cancelled_upload_leaves_nothing(world: tuple[Path, Path]) -> None:
    root, store = world
    data = zoo.get("squeezenet").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    before = snapshot(root)
    hold = threading.Event()

    def chunks() -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(sha256=sha, total_bytes=len(data), data=data[:100_000])
        hold.wait(30)  # the device dies mid-upload
        yield pb.ModelChunk(data=data[100_000:])

    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        call = _stub(s.address).PutModel.future(chunks(), timeout=30, metadata=AUTH)
        for _ in range(1000):  # until the server writes its temporary file
            if list(store.glob(".upload-*.part")):
                break
            time.sleep(0.01)
        assert list(store.glob(".upload-*.part")), "the upload started"
        call.cancel()
        hold.set()
        for _ in range(1000):
            if not list(store.iterdir()):
                break
            time.sleep(0.01)
        assert list(store.iterdir()) == []
        assert len(_stub(s.address).Status(pb.StatusRequest(), timeout=10, metadata=AUTH).models) == 0
    assert snapshot(root) == before


def test_upload_left_by_a_killed_server_is_removed_at_start(world: tuple[Path, Path]) -> None:
    _, store = world
    (store / ".upload-0123abcd.part").write_bytes(b"half a model")
    shutil.copyfile(zoo.get("tiny_chain"), store / "keep.onnx")
    ModelStore(store)
    assert [p.name for p in store.iterdir()] == ["keep.onnx"]


def test_uploaded_file_is_private_and_whole(world: tuple[Path, Path]) -> None:
    _, store = world
    data = zoo.get("tiny_chain").read_bytes()
    with CloudServer(ServerConfig(models_dir=store, allow_upload=True, tokens=(TOKEN,))) as s:
        _put(s.address, data, chunk=1000)
        assert _put(s.address, data).already_present
    (f,) = store.iterdir()
    assert f.read_bytes() == data and f.stat().st_mode & 0o077 == 0
