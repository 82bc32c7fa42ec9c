"""The front door against hostile and careless clients: a real server on 127.0.0.1, attacked with raw HTTP/2
streams (headers and half a message, then nothing) and real gRPC channels, while a legitimate client
must still get its answers. No timed asserts: what is checked is who got which status."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrt.cloud.guard.auth import AuthThrottle, ThrottleConfig, peer_address
from splitrt.cloud.guard.limits import Limits, grpc_options
from splitrt.cloud.handler.servicer import remaining_s
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from tests.prom import samples
from tests.rawh2 import RawConnection

TOKEN = "fr0nt-d00r-t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
INFER = f"/{wire.SERVICE_NAME}/Infer"
WATCH = "/grpc.health.v1.Health/Watch"
# A channel of its own connection (grpc shares one between channels to the same address otherwise).
OWN = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


def _server(models_dir: Path, **limits: object) -> CloudServer:
    cfg = ServerConfig(models_dir=models_dir, workers=1, max_queue=2, tokens=(TOKEN,), limits=Limits(**limits))  # type: ignore[arg-type]
    return CloudServer(cfg)


def _status(ch: grpc.Channel) -> pb.StatusReply:
    return pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=10, metadata=AUTH)


def _check(ch: grpc.Channel) -> int:
    return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def _infer_ok(address: str) -> None:
    with Device(zoo.get("tiny_chain"), address, config=DeviceConfig(token=TOKEN, timeout_s=20)) as dev:
        assert dev.run_detailed(dev.random_inputs(), cut="c2").outputs


def _wait_ended(conns: list[tuple[RawConnection, int]]) -> None:
    for conn, sid in conns:  # bounded: the server's read timeout ends each (the loop's cap is a safety net)
        for _ in range(200):
            if conn.ended(sid, wait_s=0.1):
                break
        assert conn.ended(sid), "the server never ended a half-sent call"


def _counted(s: CloudServer, key: tuple[str, str], n: int) -> None:
    """Wait until the server has counted ``n`` calls of ``key`` (it counts once the call's thread is
    through, which may be just after the client saw the status)."""
    for _ in range(500):
        if s.door.snapshot()["calls"].get(key, 0) >= n:
            break
        threading.Event().wait(0.01)
    assert s.door.snapshot()["calls"].get(key, 0) == n


# -- authentication before the body ---------------------------------------------------------------------


def test_unauthenticated_half_sent_calls_are_refused_before_their_body(models_dir: Path) -> None:
    """60 calls (more than the old 42 slots) send headers and 10 bytes of a 1 MB message, no token: each
    is answered at once, none waits for its body; a client with the token is served throughout."""
    with _server(models_dir, read_timeout_s=600.0) as s, RawConnection("127.0.0.1", s.port) as raw:
        sids = [raw.start_call(INFER, body_prefix_bytes=10, declared_bytes=1 << 20) for _ in range(60)]
        for _ in range(200):
            if all(raw.ended(sid, wait_s=0.05) for sid in sids):
                break
        assert all(raw.ended(sid) for sid in sids) and not raw.closed
        calls = s.door.snapshot()["calls"]
        # 10 free failures, the 11th starts the wait: the rest are refused unchecked (throttled).
        assert calls[("Infer", "UNAUTHENTICATED")] == 11 and calls[("Infer", "RESOURCE_EXHAUSTED")] == 49
        assert s.door.snapshot()["inside"]["infer"] == 0
        _infer_ok(s.address)


def test_a_guesser_waits_but_an_authenticated_channel_does_not(
    models_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lim = {"auth_free_failures": 3, "auth_backoff_s": 600.0, "log_interval_s": 600.0}
    with (
        caplog.at_level(logging.INFO, "splitrt.cloud"),
        _server(models_dir, **lim) as s,
        grpc.insecure_channel(s.address) as legit,
        grpc.insecure_channel(s.address, options=OWN) as bad,
    ):
        assert _status(legit).version  # this connection authenticated
        stub = pb_grpc.SplitInferenceStub(bad)
        codes = []
        for i in range(40):
            try:
                stub.Status(pb.StatusRequest(), timeout=10, metadata=(("authorization", f"Bearer guess{i}"),))
            except grpc.RpcError as exc:
                codes.append(exc.code())
        # 3 free failures, the 4th starts the wait: every later guess is refused unchecked.
        assert codes[:4] == [grpc.StatusCode.UNAUTHENTICATED] * 4
        assert set(codes[4:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        with pytest.raises(grpc.RpcError) as info:  # even the right token, from a new connection of that address
            _status(bad)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "too many failed authentications from 127.0.0.1" in str(info.value.details())
        assert dict(info.value.trailing_metadata() or ()).get(wire.RETRY_AFTER_KEY)
        assert _status(legit).version  # the authenticated channel goes on
        s.ratelog.flush(force=True)
    lines = [r.getMessage() for r in caplog.records]
    per_call = [m for m in lines if '"event": "unauthenticated"' in m or '"event": "auth_throttled"' in m]
    assert len(per_call) <= 2 * s.ratelog.burst  # 41 refusals, a few lines
    summary = [m for m in lines if '"event": "suppressed"' in m]
    assert summary and '"127.0.0.1"' in summary[-1]
    assert TOKEN not in "\n".join(lines)


def test_throttle_backoff_doubles_and_forgets() -> None:
    t = AuthThrottle(ThrottleConfig(free_failures=2, base_s=1.0, max_s=8.0, forget_s=100.0))
    peer = "ipv4:10.0.0.5:4000"
    assert [t.failed(peer, 0.0) for _ in range(7)] == [0.0, 0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert t.wait_s("ipv4:10.0.0.5:5000", 1.0) == 7.0  # another connection, same address
    assert t.wait_s("ipv4:10.0.0.6:4000", 1.0) == 0.0
    assert t.wait_s(peer, 200.0) == 0.0  # forgotten after forget_s
    t.failed(peer, 300.0)
    t.failed(peer, 300.0)
    assert t.failed(peer, 300.0) == 1.0
    t.succeeded("ipv4:10.0.0.5:6000")
    assert t.wait_s("ipv4:10.0.0.5:6000", 300.0) == 0.0 and t.wait_s(peer, 300.0) == 0.0
    assert peer_address("ipv6:[::1]:443") == "::1" and peer_address("unix:/s") == "unix:/s"


def test_throttle_forgets_the_address_that_failed_longest_ago_beyond_max_peers() -> None:
    t = AuthThrottle(ThrottleConfig(free_failures=0, base_s=5.0, max_s=5.0, max_peers=2))
    a, b, c = "ipv4:10.0.0.1:1", "ipv4:10.0.0.2:1", "ipv4:10.0.0.3:1"
    t.failed(a, 0.0)
    t.failed(b, 0.0)
    assert t.wait_s(a, 1.0) == 4.0  # asking is not failing: a stays the oldest
    t.failed(c, 0.0)
    assert (t.wait_s(a, 1.0), t.wait_s(b, 1.0), t.wait_s(c, 1.0)) == (0.0, 4.0, 4.0)
    t.failed(b, 2.0)  # b failed again: now c is the oldest
    t.failed(a, 2.0)
    assert (t.wait_s(b, 3.0), t.wait_s(c, 3.0), t.wait_s(a, 3.0)) == (4.0, 0.0, 4.0)
    assert t.waiting(3.0) == 2


# -- lanes and read timeouts -------------------------------------------------------------------------------


def test_half_sent_calls_with_a_token_are_cut_at_the_read_timeout(models_dir: Path) -> None:
    """Authenticated calls that never finish their message fill the inference lane (workers + queue + 8 =
    11): the 12th is refused at once, Status and health still answer, and at the read timeout every held
    call ends, after which inference is served again."""
    with (
        _server(models_dir, read_timeout_s=1.0, max_calls=11) as s,
        RawConnection("127.0.0.1", s.port) as raw,
        grpc.insecure_channel(s.address) as ch,
    ):
        held = [raw.start_call(INFER, AUTH, body_prefix_bytes=10, declared_bytes=1 << 20) for _ in range(11)]
        for _ in range(200):  # until the lane is full
            if s.door.snapshot()["inside"]["infer"] == 11:
                break
            raw.pump(0.02)
        assert s.door.snapshot()["inside"]["infer"] == 11
        with pytest.raises(grpc.RpcError) as info:
            ch.unary_unary(INFER)(b"", timeout=10, metadata=AUTH)  # refused on its lane, body unread
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "11 infer calls at once, expected at most 11" in str(info.value.details())
        assert _status(ch).version and _check(ch) == health_pb2.HealthCheckResponse.SERVING
        _wait_ended([(raw, sid) for sid in held])
        _counted(s, ("Infer", "DEADLINE_EXCEEDED"), 11)
        snap = s.door.snapshot()
        assert snap["refused"]["timeout"] == 11
        assert snap["inside"]["infer"] == 0
        _infer_ok(s.address)


def test_one_peer_address_holds_only_its_share(models_dir: Path) -> None:
    """A client with the token holds 10 half-sent calls from 127.0.0.2: 4 get in (its share), 6 are refused
    at once naming the per-address cap; a device on 127.0.0.1 is served meanwhile."""
    with (
        _server(models_dir, read_timeout_s=600.0, calls_per_peer=4) as s,
        RawConnection("127.0.0.1", s.port, source="127.0.0.2") as raw,
    ):
        sids = [raw.start_call(INFER, AUTH, body_prefix_bytes=10, declared_bytes=1 << 20) for _ in range(10)]
        for _ in range(200):
            if sum(raw.ended(sid, wait_s=0.02) for sid in sids) == 6:
                break
        assert sum(raw.ended(sid) for sid in sids) == 6 and s.door.snapshot()["inside"]["infer"] == 4
        _counted(s, ("Infer", "RESOURCE_EXHAUSTED"), 6)
        _infer_ok(s.address)
        raw.close()  # the held calls end with their connection
        for _ in range(500):
            if s.door.snapshot()["inside"]["infer"] == 0:
                break
            threading.Event().wait(0.01)
        assert s.door.snapshot()["inside"]["infer"] == 0


def test_watch_streams_are_capped_and_aged_out(models_dir: Path) -> None:
    """50 Watch streams (no token needed) from one address get 3 slots (half the lane of 6); the rest are
    refused at once; health Check, Status and inference answer meanwhile; at their maximum age the held
    streams end with UNAVAILABLE."""
    with _server(models_dir, watch_streams=6, watch_max_age_s=1.0) as s, grpc.insecure_channel(s.address) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch
        streams = [watch(health_pb2.HealthCheckRequest()) for _ in range(50)]  # no deadline
        ended: list[grpc.StatusCode] = []
        first: list[int] = []

        def drain(stream: Iterator[health_pb2.HealthCheckResponse]) -> None:
            try:
                for reply in stream:
                    first.append(reply.status)
            except grpc.RpcError as exc:
                ended.append(exc.code())

        with ThreadPoolExecutor(50) as pool:
            for st in streams:
                pool.submit(drain, st)
            assert _check(ch) == health_pb2.HealthCheckResponse.SERVING
            assert _status(ch).version
            _infer_ok(s.address)
        assert sorted(ended, key=str).count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 47
        assert ended.count(grpc.StatusCode.UNAVAILABLE) == 3 and first.count(1) == 3
        # The lane is left by the call's done-callback, which gRPC may run just after the client has
        # seen the status (CI saw 2 still inside): wait for it, boundedly.
        for _ in range(200):
            if s.door.snapshot()["inside"]["watch"] == 0:
                break
            time.sleep(0.05)
        assert s.door.snapshot()["inside"]["watch"] == 0


def test_an_idle_stream_ends_at_the_idle_limit(models_dir: Path) -> None:
    with (
        _server(models_dir, stream_idle_s=0.5) as s,
        Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=TOKEN)) as dev,
    ):
        gate = threading.Event()
        inputs = dev.random_inputs()

        def frames() -> Iterator[dict[str, object]]:
            yield inputs
            gate.wait(30)  # the device goes quiet with the stream open
            yield inputs

        results = []
        with pytest.raises(Exception) as info:
            for r in dev.stream(frames(), cut="c2"):
                results.append(r)
        gate.set()
        assert len(results) == 1 and results[0].error is None
        assert "DEADLINE_EXCEEDED" in str(info.value) or "next message within 0.5 s" in str(info.value)
        _counted(s, ("InferStream", "DEADLINE_EXCEEDED"), 1)


# -- deadlines ---------------------------------------------------------------------------------------------


def test_calls_without_a_deadline_under_load_are_served(models_dir: Path) -> None:
    """gRPC says ~9.2e18 s remain on a call without a deadline; waiting that long for a worker used to raise
    (UNKNOWN, the request lost). 12 plain unary calls and a 20-frame stream, none with a deadline, one
    worker held a little per request so the others queue."""
    cfg = ServerConfig(models_dir=models_dir, workers=1, max_queue=64)
    with CloudServer(cfg) as s, Device(zoo.get("tiny_chain"), s.address) as dev, grpc.insecure_channel(s.address) as ch:
        pause = threading.Event()
        s.handler.before_tail = lambda header: pause.wait(0.01)
        head = dev.run_head(dev.random_inputs(), "c2")
        request = dev._request(head, codec.Codec.parse("fp32"))[0].to_message()
        stub = pb_grpc.SplitInferenceStub(ch)
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda _: stub.Infer(request), range(12)))  # no timeout
        frames = list(stub.InferStream(iter([request] * 20)))  # no timeout
        assert len(replies) == 12 and all(r.outputs and not r.HasField("error") for r in replies)
        assert len(frames) == 20 and all(not f.HasField("error") for f in frames)
        assert s.stats.errors() == {}
        assert s.door.snapshot()["calls"].get(("Infer", "UNKNOWN"), 0) == 0


def test_remaining_time_is_always_bounded() -> None:
    class Ctx:
        def __init__(self, left: float | None) -> None:
            self.left = left

        def time_remaining(self) -> float | None:
            return self.left

    assert remaining_s(Ctx(None), 60.0) == 60.0
    assert remaining_s(Ctx(9.2e18), 60.0) == 60.0
    assert remaining_s(Ctx(float("nan")), 60.0) == 60.0
    assert remaining_s(Ctx(2.5), 60.0) == 2.5 and remaining_s(Ctx(-1.0), 60.0) == 0.0


# -- connections -------------------------------------------------------------------------------------------


def test_grpc_options_carry_the_stream_window_and_connection_age() -> None:
    """Connections themselves (how many, idle, handshake, pings, streams) are the edge proxy's
    (tests/test_proxy.py); the server sets only the per-stream window and the optional age."""
    opts = dict(grpc_options(Limits(connection_age_s=30.0)))
    assert opts["grpc.max_connection_age_ms"] == 30_000 and opts["grpc.max_connection_age_grace_ms"] == 60_000
    assert "grpc.max_connection_age_ms" not in dict(grpc_options(Limits()))
    assert opts["grpc.http2.bdp_probe"] == 0 and opts["grpc.http2.lookahead_bytes"] == 2 << 20
    assert opts["grpc.http2.max_frame_size"] == 2 << 20  # a frame as large as the window, not 16 KiB
    assert dict(grpc_options(Limits(stream_window_bytes=1 << 30)))["grpc.http2.max_frame_size"] == 2**24 - 1
    assert "grpc.http2.bdp_probe" not in dict(grpc_options(Limits(stream_window_bytes=None)))
    with pytest.raises(ConfigError, match="stream_window_bytes"):
        Limits(stream_window_bytes=1000).check()


def test_failures_are_counted_by_method_and_code_in_metrics(models_dir: Path) -> None:
    from splitrt.cloud.metrics import render

    with _server(models_dir) as s, grpc.insecure_channel(s.address) as ch:
        with pytest.raises(grpc.RpcError):
            pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=10)
        _status(ch)
        text = render(s)
    m = samples(text)
    assert m[("splitrt_cloud_calls_total", (("code", "UNAUTHENTICATED"), ("method", "Status")))] == 1
    assert m[("splitrt_cloud_calls_total", (("code", "OK"), ("method", "Status")))] == 1
    assert m[("splitrt_cloud_lane_capacity", (("lane", "status"),))] == 8


# -- replies the client never takes ---------------------------------------------------------------------


def test_a_reply_never_taken_ends_the_call_and_frees_its_places(models_dir: Path) -> None:
    """Issue 36 item 2: a client that never opens its HTTP/2 window (initial stream window 0, no
    WINDOW_UPDATE) sends 10 Probe calls asking for 100 KB replies (admitted: they take places in the
    queue). At most its share of the probe lane gets in (the lane is held until the reply is taken, not
    until it is made), a device on another address is served meanwhile, and at the read timeout every
    held call ends and its admission place is free again."""
    probe = pb.ProbeRequest(reply_bytes=100_000).SerializeToString()
    with (
        _server(models_dir, read_timeout_s=1.0, probe_calls=4) as s,
        RawConnection("127.0.0.1", s.port, source="127.0.0.2", window_bytes=0) as raw,
    ):
        sids = [raw.call(f"/{wire.SERVICE_NAME}/Probe", probe, AUTH) for _ in range(10)]
        for _ in range(200):  # until the refusals are through (8 of 10: the address's share is 2)
            if sum(raw.ended(sid, wait_s=0.02) for sid in sids) >= 8:
                break
        assert s.door.snapshot()["inside"]["probe"] <= 2
        assert s.admission.admitted <= 2  # the workers (1) + queue (2) are not all held by one reader
        _infer_ok(s.address)
        _wait_ended([(raw, sid) for sid in sids])
        for _ in range(500):
            if s.admission.admitted == 0 and s.door.snapshot()["inside"]["probe"] == 0:
                break
            threading.Event().wait(0.01)
        assert s.admission.admitted == 0 and s.door.snapshot()["inside"]["probe"] == 0
        assert s.door.snapshot()["refused"]["reply_timeout"] >= 1


def _big_reply_model(d: Path, floats: int) -> str:
    """A model answering ``floats`` float32 (its reply) to a 1-float request; returns its sha256."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from splitrt.graph.model import model_sha256

    g = helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        "big_reply",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [floats])],
        [numpy_helper.from_array(np.array([floats], np.int64), "s")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), d / "big.onnx")
    return model_sha256(d / "big.onnx")


def test_replies_not_taken_are_held_in_the_memory_budget(tmp_path: Path) -> None:
    """A client that never opens its window holds each 16 MiB Infer reply made for it (its bytes and gRPC
    core's copy: 32.1 MiB of RSS per reply, measured) until it takes it or the read timeout ends the call.
    Those bytes are reserved in the memory budget meanwhile: replies beyond it are refused, what is held
    is counted, and it is freed when the calls end."""
    import numpy as np
    import psutil

    from splitrt.cloud.capacity.memory import REPLY_HELD_FACTOR

    mib16 = 16 << 20
    sha = _big_reply_model(tmp_path, mib16 // 4)
    req = pb.InferRequest(model_sha256=sha, cut_id="cloud", codec="fp32", request_id="r", output_codec="fp32")
    req.tensors.add(name="x", dtype="float32", shape=[1], codec="fp32", payload=np.ones(1, np.float32).tobytes())
    msg = req.SerializeToString()
    limit = psutil.Process().memory_info().rss + (300 << 20)  # room for ~7 held replies beside one run
    cfg = ServerConfig(
        models_dir=tmp_path,
        workers=2,
        max_queue=16,
        tokens=(TOKEN,),
        max_memory_bytes=limit,
        limits=Limits(read_timeout_s=600.0),
    )
    with CloudServer(cfg) as s:
        with grpc.insecure_channel(s.address, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
            assert ch.unary_unary(INFER)(msg, timeout=120, metadata=AUTH)  # the tail built, its graph kept
        conns = [RawConnection("127.0.0.1", s.port, source=f"127.0.0.{a}", window_bytes=0) for a in (2, 3)]
        try:
            calls = [(raw, raw.call(INFER, msg, AUTH)) for raw in conns for _ in range(6)]
            held = 0
            for _ in range(1200):  # until no run is left: what is used is the replies held, no more
                held = sum(not raw.ended(sid, wait_s=0.01) for raw, sid in calls)
                counted = s.door.snapshot()["reply_bytes"]
                if held and REPLY_HELD_FACTOR * mib16 * held <= counted <= REPLY_HELD_FACTOR * (mib16 + 4096) * held:
                    break
            else:
                raise AssertionError(f"{held} replies held, {counted} bytes counted for replies")
            snap = s.budget.snapshot()
            assert 0 < held < len(calls)  # some held, the rest refused: the budget bounds them
            assert counted <= snap["used_bytes"] <= snap["limit_bytes"] - snap["baseline_bytes"]
            assert snap["refused"] > 0
        finally:
            for raw in conns:
                raw.close()
        for _ in range(1000):  # the client left: the calls end and their replies are freed
            if s.door.snapshot()["reply_bytes"] == 0:
                break
            time.sleep(0.02)
        assert s.door.snapshot()["reply_bytes"] == 0


def test_streamed_replies_not_taken_are_held_in_the_memory_budget(tmp_path: Path) -> None:
    """An InferStream reply a client does not take (window 0) is held as a unary one is: its bytes and gRPC
    core's copy reserved in the memory budget and counted while held, freed when the call ends."""
    import numpy as np
    import psutil

    from splitrt.cloud.capacity.memory import REPLY_HELD_FACTOR

    mib16 = 16 << 20
    sha = _big_reply_model(tmp_path, mib16 // 4)
    req = pb.InferRequest(model_sha256=sha, cut_id="cloud", codec="fp32", request_id="r", output_codec="fp32")
    req.tensors.add(name="x", dtype="float32", shape=[1], codec="fp32", payload=np.ones(1, np.float32).tobytes())
    cfg = ServerConfig(
        models_dir=tmp_path,
        workers=2,
        tokens=(TOKEN,),
        max_memory_bytes=psutil.Process().memory_info().rss + (600 << 20),
        limits=Limits(read_timeout_s=600.0),
    )
    with CloudServer(cfg) as s:
        with RawConnection("127.0.0.1", s.port, source="127.0.0.2", window_bytes=0) as raw:
            sids = [raw.call(f"/{wire.SERVICE_NAME}/InferStream", req.SerializeToString(), AUTH) for _ in range(2)]
            counted = 0
            for _ in range(1200):  # until both replies are made (and held: the window stays shut)
                counted = s.door.snapshot()["reply_bytes"]
                if counted >= 2 * REPLY_HELD_FACTOR * mib16:
                    break
                time.sleep(0.05)
            assert 2 * REPLY_HELD_FACTOR * mib16 <= counted <= 2 * REPLY_HELD_FACTOR * (mib16 + 4096)
            assert s.budget.snapshot()["used_bytes"] >= counted
            assert not any(raw.ended(sid) for sid in sids)
        for _ in range(1000):  # the client left: the calls end and their replies are freed
            if s.door.snapshot()["reply_bytes"] == 0:
                break
            time.sleep(0.02)
        assert s.door.snapshot()["reply_bytes"] == 0


def test_a_lease_gives_back_a_taken_reply_at_once_and_the_rest_at_the_end() -> None:
    """``Lease.unhold``: a streamed reply the client took goes back to the budget then, not at the call's end;
    never more than the lease holds, and nothing held once the call has ended."""
    from splitrt.cloud.guard.watchdog import Lease

    given: list[int] = []
    ends: list[bool] = []
    lease = Lease(None, time.monotonic, give_back=given.append, on_end=lambda: ends.append(True))
    assert lease.hold(100) and lease.hold(50)
    lease.unhold(100)
    assert given == [100] and lease.held_bytes == 50
    lease.unhold(80)  # more than it holds: only what it holds
    assert given == [100, 50] and lease.held_bytes == 0
    assert lease.hold(30)
    lease.end()
    assert given == [100, 50, 30] and ends == [True] and not lease.hold(10)


def test_an_ended_lease_leaves_no_cycle_through_its_owner() -> None:
    """An owner whose bound method is the lease's ``on_end`` (the door's call) is freed by reference
    counting once the call ended, not by the cyclic collector: it holds the call's gRPC state."""
    import gc
    import weakref

    from splitrt.cloud.guard.watchdog import Lease

    class Owner:
        def __init__(self) -> None:
            self.lease = Lease(object(), time.monotonic, on_end=self.release)
            self.released = False

        def release(self) -> None:
            self.released = True

    owner = Owner()
    gone = weakref.ref(owner)
    gc.disable()
    try:
        owner.lease.end()
        assert owner.released
        del owner
        assert gone() is None
    finally:
        gc.enable()


def test_forwarded_peer_names_the_client_a_proxy_set() -> None:
    from splitrt.cloud.guard.door import forwarded_peer

    assert forwarded_peer((("x-forwarded-for", "203.0.113.9"), ("x-forwarded-client-port", "4242"))) == (
        "ipv4:203.0.113.9:4242"
    )
    assert forwarded_peer((("x-forwarded-for", "10.0.0.1, 2001:db8::1"),)) == "ipv6:[2001:db8::1]:0"
    assert forwarded_peer((("x-forwarded-for", "203.0.113.9"), ("x-forwarded-client-port", "x" * 9))) == (
        "ipv4:203.0.113.9:0"
    )
    assert forwarded_peer((("x-forwarded-for", "not an address"),)) is None
    assert forwarded_peer(()) is None


def test_a_client_cannot_name_itself_without_a_trusted_proxy(models_dir: Path) -> None:
    """x-forwarded-for from a peer that is not a trusted proxy is ignored: a guesser that names a new
    address on every call is throttled on its own."""
    codes = []
    with _server(models_dir) as s, grpc.insecure_channel(s.address, options=OWN) as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        for i in range(12):
            md = (("authorization", f"Bearer guess{i}"), ("x-forwarded-for", f"203.0.113.{i}"))
            with pytest.raises(grpc.RpcError) as info:
                stub.Status(pb.StatusRequest(), timeout=10, metadata=md)
            codes.append(info.value.code())
    assert codes.count(grpc.StatusCode.UNAUTHENTICATED) == 11 and codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED
