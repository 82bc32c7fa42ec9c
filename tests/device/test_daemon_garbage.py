"""The daemon's local API answers bytes that do not parse with INVALID_ARGUMENT naming the expected
message (gRPC's generated handlers would answer INTERNAL), and keeps serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb


def _ident(b: bytes) -> bytes:
    return b


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28"])
def test_garbage_is_invalid_argument_and_the_daemon_keeps_serving(tmp_path: Path, garbage: bytes) -> None:
    cfg = DaemonConfig(
        models=(ModelConfig(name="tiny", path="zoo:tiny_chain"),),
        api_address="127.0.0.1:0",
        api_socket_path=None,
        metrics_port=None,
        intra_op_threads=1,
        policy="fixed:device",
    )
    service = pb.DESCRIPTOR.services_by_name["LocalInference"].full_name
    with Daemon(cfg) as d, grpc.insecure_channel(str(d.api_address)) as ch:
        for method, message in (("Infer", "LocalInferRequest"), ("GetPlan", "GetPlanRequest")):
            call = ch.unary_unary(f"/{service}/{method}", request_serializer=_ident, response_deserializer=_ident)
            with pytest.raises(grpc.RpcError) as info:
                call(garbage, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value)
            assert "expected a protobuf-encoded splitrt" in str(info.value.details())
            assert message in str(info.value.details())
        x = zoo.random_inputs(zoo.get("tiny_chain"), seed=2)
        with LocalClient(str(d.api_address), timeout_s=30) as client:
            got = client.infer(x, model="tiny")
            assert client.plan("tiny").model == "tiny"
        ref = d.models["tiny"].device.local.run_local(x)
        assert all(np.allclose(got.outputs[k], v, rtol=1e-6, atol=1e-7) for k, v in ref.items())
