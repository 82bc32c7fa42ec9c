"""The server's grpc.health.v1 service: bytes that do not parse are INVALID_ARGUMENT (as on every
SplitInference method), never INTERNAL; well-formed checks answer as the stock service does."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

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
