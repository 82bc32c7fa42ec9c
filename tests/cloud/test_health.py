"""The server's grpc.health.v1 service: bytes that do not parse are INVALID_ARGUMENT (as on every
SplitInference method), never INTERNAL; well-formed checks answer as the stock service does."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo
from splitrt.transport import wire


@pytest.fixture()
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    with CloudServer(ServerConfig(models_dir=tmp_path, workers=1)) as s, grpc.insecure_channel(s.address) as ch:
        yield ch


def _ident(b: bytes) -> bytes:
    return b


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28"])
def test_garbage_is_invalid_argument_on_check_and_watch(channel: grpc.Channel, garbage: bytes) -> None:
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=_ident, response_deserializer=_ident)
    watch = channel.unary_stream(
        "/grpc.health.v1.Health/Watch", request_serializer=_ident, response_deserializer=_ident
    )
    for call in (lambda: check(garbage, timeout=10), lambda: next(iter(watch(garbage, timeout=10)))):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expected a protobuf-encoded grpc.health.v1.HealthCheckRequest" in str(info.value.details())


def test_well_formed_checks_answer_as_the_stock_service(channel: grpc.Channel) -> None:
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    for name in ("", wire.SERVICE_NAME):
        assert (
            check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    with pytest.raises(grpc.RpcError) as info:
        check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    watch = channel.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    stream = watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(iter(stream)).status == health_pb2.HealthCheckResponse.SERVING
    stream.cancel()


def test_health_says_not_serving_while_admission_stays_saturated(tmp_path: Path) -> None:
    """Issue 36 item 2: one worker, no queue, its one place held by a run that waits (the test hook):
    after ``saturated_s`` health Check says NOT_SERVING (a balancer sends devices elsewhere); once the
    run ends it says SERVING again."""
    from splitrt.cloud.guard.limits import Limits
    from splitrt.device.client import Device, DeviceConfig

    shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    go = threading.Event()
    cfg = ServerConfig(models_dir=tmp_path, workers=1, max_queue=0, limits=Limits(saturated_s=0.3))
    with CloudServer(cfg) as s, grpc.insecure_channel(s.address) as ch:
        s.handler.before_tail = lambda header: go.wait(30)
        check = health_pb2_grpc.HealthStub(ch).Check
        dev = Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(timeout_s=30))
        with dev, ThreadPoolExecutor(1) as pool:
            held = pool.submit(dev.run_detailed, dev.random_inputs(), cut="c2")
            statuses = []
            for _ in range(300):
                statuses.append(check(health_pb2.HealthCheckRequest(), timeout=10).status)
                if statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                threading.Event().wait(0.05)
            assert statuses[0] == health_pb2.HealthCheckResponse.SERVING  # not at once: a spell must last
            assert statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING
            assert check(health_pb2.HealthCheckRequest(service=wire.SERVICE_NAME), timeout=10).status == (
                health_pb2.HealthCheckResponse.NOT_SERVING
            )
            go.set()
            assert held.result(timeout=30).outputs
        for _ in range(300):
            if check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING:
                break
            threading.Event().wait(0.05)
        assert check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING


def test_saturation_needs_a_lasting_spell() -> None:
    from splitrt.cloud.capacity.saturation import Saturation

    sat = Saturation(threshold_s=2.0)
    assert [sat.update(x, t) for x, t in [(True, 0.0), (True, 1.9), (True, 2.0), (False, 2.1), (True, 2.2)]] == [
        False,
        False,
        True,
        False,
        False,
    ]
