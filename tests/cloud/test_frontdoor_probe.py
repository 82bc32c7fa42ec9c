"""Probe bodies are paid for before they are read: a real server on 127.0.0.1 with a small memory budget
(about 40 MB free, 8 MB messages). A probe declares its bytes in metadata (the device's transport does);
the front door reserves 3x that in the budget before reading the body, an undeclared probe its worst
case (a full message each way), and refuses what does not fit at once, with the body never read: a raw
HTTP/2 client that sends the headers and 10 bytes of the body is answered without the rest coming. A
probe sending more than it declared is refused. Uploads have a lane of their own, half of it per address."""

from __future__ import annotations

import shutil
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from splitrt.cloud.capacity.memory import STARTUP_BYTES, limit_for, rss_bytes
from splitrt.cloud.guard.limits import Limits
from splitrt.cloud.guard.probes import PROBE_BUDGET_SHARE, PROBE_PENALTY_S
from splitrt.cloud.handler.servicer import PROBE_MAX_PAYLOAD_BYTES, PROBE_MAX_REPLY_BYTES
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport import wire
from tests.rawh2 import RawConnection

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

TOKEN = "pr0be-budget-t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
PROBE = f"/{wire.SERVICE_NAME}/Probe"
MB = 2**20


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


@pytest.fixture()
def server(models_dir: Path) -> Iterator[CloudServer]:
    cfg = ServerConfig(
        models_dir=models_dir,
        workers=1,
        tokens=(TOKEN,),
        max_message_bytes=8 * MB,
        # The budget's baseline is this process's RSS when the server is made: ~40 MB free above it and
        # the watch's headroom (which grows with the process: a whole test run holds ~600 MB).
        max_memory_bytes=limit_for(40 * MB, rss_bytes() + STARTUP_BYTES),
        limits=Limits(read_timeout_s=600.0),  # a body never read would hang 600 s
    )
    with CloudServer(cfg) as s:
        yield s


def _wait(cond: object, what: str) -> None:
    for _ in range(500):
        if cond():  # type: ignore[operator]
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_undeclared_probe_is_refused_before_its_body_is_read(server: CloudServer) -> None:
    # Undeclared: 3 x (8 MB up + 8 MB back) = 48 MB, more than probes may hold (half of ~40 MB).
    assert PROBE_BUDGET_SHARE * server.budget.available_bytes < 3 * 2 * 8 * MB
    with RawConnection("127.0.0.1", server.port) as raw:
        sid = raw.start_call(PROBE, AUTH, body_prefix_bytes=10, declared_bytes=8 * MB - 64)
        _wait(lambda: raw.ended(sid, wait_s=0.02), "the refusal")  # the body's rest never comes
    snap = server.door.snapshot()
    assert snap["calls"].get(("Probe", "RESOURCE_EXHAUSTED")) == 1 and snap["refused"].get("memory") == 1
    assert server.door.probes.held_bytes == 0 and server.budget.used_bytes == 0


def test_a_declared_probe_holds_its_bytes_while_its_body_is_awaited(server: CloudServer) -> None:
    declared = 2 * MB
    with RawConnection("127.0.0.1", server.port) as raw:
        meta = (*AUTH, (wire.PROBE_BYTES_KEY, str(declared)))
        sid = raw.start_call(PROBE, meta, body_prefix_bytes=10, declared_bytes=declared)
        _wait(lambda: server.door.probes.held_bytes == 3 * declared, "the reservation")
        assert server.budget.used_bytes >= 3 * declared and not raw.ended(sid, wait_s=0.05)
    _wait(lambda: server.door.probes.held_bytes == 0, "the release when the connection went")
    assert server.budget.used_bytes == 0


def test_the_device_declares_its_probes_and_they_are_served(server: CloudServer) -> None:
    with Device(zoo.get("tiny_chain"), server.address, config=DeviceConfig(token=TOKEN, timeout_s=20)) as dev:
        p = dev.probe(1 * MB, 4096)  # 3 x ~1 MB reserved: fits
        assert p.up_bytes == MB and p.down_bytes == 4096
        assert dev.probe(64, 64).down_bytes == 64  # an RTT ping: nothing reserved
    assert server.door.snapshot()["calls"].get(("Probe", "OK")) == 2
    _wait(lambda: server.door.probes.held_bytes == 0 and server.budget.used_bytes == 0, "the release")


def test_a_probe_larger_than_its_share_is_refused_naming_the_header(server: CloudServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(
                pb.ProbeRequest(payload=b"x", reply_bytes=7 * MB),
                timeout=10,
                metadata=(*AUTH, (wire.PROBE_BYTES_KEY, str(7 * MB + 1))),
            )
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert wire.PROBE_BYTES_KEY in str(err.value.details()) and "before its body is read" in str(err.value.details())


def test_a_probe_sending_more_than_it_declared_is_refused_and_its_address_waits(server: CloudServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        lie = (*AUTH, (wire.PROBE_BYTES_KEY, "128"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(pb.ProbeRequest(payload=bytes(100_000), reply_bytes=64), timeout=10, metadata=lie)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "128 bytes declared" in str(err.value.details()) and "got 100064" in str(err.value.details())
        # Its body was read for nothing: the address's next probes are refused before theirs are read.
        honest = (*AUTH, (wire.PROBE_BYTES_KEY, "100064"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(pb.ProbeRequest(payload=bytes(100_000), reply_bytes=64), timeout=10, metadata=honest)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "refused after it was read" in str(err.value.details())
        hint = wire.retry_after_ms(err.value.trailing_metadata())
        assert hint is not None and 0 < hint <= PROBE_PENALTY_S * 1e3
        real = server.door.clock
        server.door.clock = lambda: real() + PROBE_PENALTY_S + 1  # the wait is over
        reply = stub.Probe(pb.ProbeRequest(payload=bytes(100_000), reply_bytes=64), timeout=10, metadata=honest)
        assert reply.received_bytes == 100_000 and len(reply.payload) == 64
    refused = server.door.snapshot()["refused"]
    assert refused.get("undeclared") == 1 and refused.get("probe_penalty") == 1


def test_an_oversize_undeclared_probe_is_read_once_then_its_address_waits(models_dir: Path) -> None:
    # Undeclared, its size is known only once read: over the payload cap it is refused, and the address's
    # next probes (even small declared ones) are refused unread for PROBE_PENALTY_S. A small refusal
    # (a reply over its cap, asked by a few bytes) costs the server nothing and is not held against it.
    cfg = ServerConfig(models_dir=models_dir, workers=1, tokens=(TOKEN,), max_message_bytes=8 * MB)
    with CloudServer(cfg) as server, grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(pb.ProbeRequest(reply_bytes=PROBE_MAX_REPLY_BYTES + 1), timeout=10, metadata=AUTH)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert stub.Probe(pb.ProbeRequest(payload=b"x"), timeout=10, metadata=AUTH).received_bytes == 1
        # Declared honestly, a body read and then refused (a reply over this server's 8 MB messages) is
        # not held against its address either.
        honest = pb.ProbeRequest(payload=bytes(100_000), reply_bytes=8 * MB)
        declared = (*AUTH, (wire.PROBE_BYTES_KEY, str(100_000 + 8 * MB)))
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(honest, timeout=10, metadata=declared)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "reply_bytes" in str(err.value.details())
        assert stub.Probe(pb.ProbeRequest(payload=b"x"), timeout=10, metadata=AUTH).received_bytes == 1
        monkey = pytest.MonkeyPatch()
        monkey.setattr("splitrt.cloud.handler.servicer.PROBE_MAX_PAYLOAD_BYTES", 1 * MB)  # under this server's messages
        try:
            with pytest.raises(grpc.RpcError) as err:
                stub.Probe(pb.ProbeRequest(payload=bytes(2 * MB)), timeout=10, metadata=AUTH)
        finally:
            monkey.undo()
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert f"payload: expected at most {1 * MB} bytes, got {2 * MB}" in str(err.value.details())
        small = (*AUTH, (wire.PROBE_BYTES_KEY, "2"))
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(pb.ProbeRequest(payload=b"x", reply_bytes=1), timeout=10, metadata=small)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and wire.PROBE_BYTES_KEY in str(
            err.value.details()
        )
        assert server.door.snapshot()["refused"].get("probe_penalty") == 1


def test_a_probe_declaring_more_than_the_caps_is_refused_unread(server: CloudServer) -> None:
    cap = PROBE_MAX_PAYLOAD_BYTES + PROBE_MAX_REPLY_BYTES
    with RawConnection("127.0.0.1", server.port) as raw:
        sid = raw.start_call(
            PROBE, (*AUTH, (wire.PROBE_BYTES_KEY, str(cap + 1))), body_prefix_bytes=10, declared_bytes=8 * MB
        )
        _wait(lambda: raw.ended(sid, wait_s=0.02), "the refusal")  # the body's rest never comes
    snap = server.door.snapshot()
    assert snap["calls"].get(("Probe", "INVALID_ARGUMENT")) == 1 and snap["refused"].get("probe_cap") == 1
    # Nothing read, nothing held against it.
    assert server.door.probes.held_bytes == 0 and not server.door.probes.penalty


def test_uploads_have_a_lane_of_their_own_and_an_address_half_of_it(models_dir: Path) -> None:
    # upload_calls 4 (default): one address holds 2 stalled uploads; its third is refused on its headers,
    # while inference is served.
    put = f"/{wire.SERVICE_NAME}/PutModel"
    cfg = ServerConfig(
        models_dir=models_dir, workers=1, tokens=(TOKEN,), allow_upload=True, limits=Limits(read_timeout_s=600.0)
    )
    with CloudServer(cfg) as server, RawConnection("127.0.0.1", server.port, source="127.0.0.2") as raw:
        held = [raw.start_call(put, AUTH, body_prefix_bytes=10, declared_bytes=1 << 20) for _ in range(3)]
        _wait(lambda: sum(raw.ended(sid, wait_s=0.02) for sid in held) == 1, "one refusal")
        snap = server.door.snapshot()
        assert snap["inside"]["upload"] == 2 and snap["refused"].get("lane:upload") == 1
        assert snap["inside"]["infer"] == 0
        with Device(zoo.get("tiny_chain"), server.address, config=DeviceConfig(token=TOKEN, timeout_s=20)) as dev:
            assert dev.run(dev.random_inputs(), cut="c2")["y"].shape
        raw.close()
        _wait(lambda: server.door.snapshot()["inside"]["upload"] == 0, "the stalled uploads' end")


def test_a_probe_asking_for_a_reply_beyond_the_cap_is_refused(models_dir: Path) -> None:
    with CloudServer(ServerConfig(models_dir=models_dir, workers=1)) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Probe(pb.ProbeRequest(payload=b"x", reply_bytes=PROBE_MAX_REPLY_BYTES + 1), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert f"reply_bytes: expected at most {PROBE_MAX_REPLY_BYTES}, got" in str(err.value.details())
        assert len(stub.Probe(pb.ProbeRequest(payload=b"x", reply_bytes=1 << 20), timeout=10).payload) == 1 << 20


def _initial_window(port: int) -> int | None:
    """The INITIAL_WINDOW_SIZE in the server's first SETTINGS frame (None: not set, HTTP/2's 65535)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(9)[:3] + b"\x04\x00" + bytes(4))
        buf = b""
        while True:
            while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
                chunk = sock.recv(65536)
                assert chunk, "the server closed the connection before its SETTINGS"
                buf += chunk
            size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
            payload, buf = buf[9 : 9 + size], buf[9 + size :]
            if kind == 0x4 and not flags & 0x1:  # SETTINGS, not an ACK
                params = dict(struct.unpack(">HI", payload[i : i + 6]) for i in range(0, len(payload), 6))
                return params.get(0x4)


def test_a_client_sends_at_most_the_stream_window_before_its_message_is_read(models_dir: Path) -> None:
    # A call refused on its headers can have pushed only this much of its body (HTTP/2 flow control: the
    # client may not send past the window); a message the server reads gets the window it needs.
    cfg = ServerConfig(models_dir=models_dir, workers=1, limits=Limits(stream_window_bytes=256 * 1024))
    with CloudServer(cfg) as server, grpc.insecure_channel(server.address) as ch:
        assert _initial_window(server.port) == 256 * 1024
        stub = pb_grpc.SplitInferenceStub(ch)
        size = 6 * MB  # 24 windows
        declared = ((wire.PROBE_BYTES_KEY, str(size + 64)),)
        reply = stub.Probe(pb.ProbeRequest(payload=bytes(size), reply_bytes=64), timeout=30, metadata=declared)
        assert reply.received_bytes == size and len(reply.payload) == 64
    with CloudServer(ServerConfig(models_dir=models_dir, workers=1)) as server:
        assert _initial_window(server.port) == Limits().stream_window_bytes == 2 << 20
    with CloudServer(ServerConfig(models_dir=models_dir, workers=1, limits=Limits(stream_window_bytes=None))) as server:
        own = _initial_window(server.port)  # gRPC's own: 4 MiB from the start in grpcio 1.85, then BDP-sized
        assert own is None or own > 2 << 20


def _refused_push(models_dir: Path, limits: Limits) -> int:
    """DATA bytes a call refused on its headers (no token) pushed into a server with ``limits``, from a
    client that sends all the windows allow before it reads, on a connection that first carried three
    6 MiB messages (the traffic BDP probing sizes windows by)."""
    cfg = ServerConfig(models_dir=models_dir, workers=1, tokens=(TOKEN,), limits=limits)
    with CloudServer(cfg) as server, RawConnection("127.0.0.1", server.port) as raw:
        raw.pump(1.0)
        for _ in range(3):
            sid = raw.start_call(PROBE, (*AUTH, (wire.PROBE_BYTES_KEY, str(6 * MB + 64))))
            raw.push(sid, pb.ProbeRequest(payload=bytes(6 * MB), reply_bytes=64).SerializeToString())
            _wait(lambda sid=sid: raw.ended(sid, wait_s=0.02), "the warm-up reply")
        assert not raw.reset and not raw.closed
        sid = raw.start_call(PROBE)
        pushed = raw.push(sid, bytes(64 * MB))
        _wait(lambda: raw.ended(sid, wait_s=0.02), "the refusal")
        assert server.door.snapshot()["refused"].get("unauthenticated") == 1
        return pushed


def test_a_call_refused_on_its_headers_pushes_at_most_the_stream_window(models_dir: Path) -> None:
    # The documented bound (docs/operator/security.md): --stream-window-kb of a message, however much the
    # connection carried before. gRPC's own windows, sized by that traffic, let the same call push more.
    window = Limits().stream_window_bytes
    assert window is not None and 64 * 1024 < _refused_push(models_dir, Limits()) <= window
    assert _refused_push(models_dir, Limits(stream_window_bytes=None)) > window
