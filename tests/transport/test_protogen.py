"""The committed gRPC stubs equal a fresh generation from proto/splitrt.proto."""

from __future__ import annotations

import re
from pathlib import Path

from splitrt.transport import protogen


def test_committed_stubs_are_up_to_date(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(protogen.GENERATED)
    for path in written:
        committed = protogen.PACKAGE_DIR / path.name
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        fresh, ours = (
            protogen.without_version_stamps(path.read_text()),
            protogen.without_version_stamps(committed.read_text()),
        )
        assert ours == fresh, f"{committed.name} is stale: run `make proto`"


def test_a_newer_generator_version_alone_is_not_stale(tmp_path: Path) -> None:
    """A grpcio-tools release after the stubs were made restamps them and changes nothing else: not stale.
    A changed line of code still is."""
    committed = (protogen.PACKAGE_DIR / "splitrt_pb2_grpc.py").read_text()
    pb2 = (protogen.PACKAGE_DIR / "splitrt_pb2.py").read_text()
    restamped = re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = '9.99.9'", committed)
    assert restamped != committed
    assert protogen.without_version_stamps(restamped) == protogen.without_version_stamps(committed)
    newer_pb2 = re.sub(r"Protobuf Python Version: \S+", "Protobuf Python Version: 9.1.2", pb2)
    newer_pb2 = re.sub(r"(Domain\.PUBLIC,\s*)\d+,\s*\d+,\s*\d+,", r"\g<1>9,\n    1,\n    2,", newer_pb2)
    assert newer_pb2 != pb2
    assert protogen.without_version_stamps(newer_pb2) == protogen.without_version_stamps(pb2)
    edited = committed.replace("class SplitInferenceStub", "class SplitInferenceStubX")
    assert protogen.without_version_stamps(edited) != protogen.without_version_stamps(committed)


def test_stubs_import_and_describe_the_service() -> None:
    from splitrt.transport import splitrt_pb2, splitrt_pb2_grpc

    service = splitrt_pb2.DESCRIPTOR.services_by_name["SplitInference"]
    assert splitrt_pb2.DESCRIPTOR.package == "splitrt.v1"
    assert {m.name for m in service.methods} == {"Infer", "InferStream", "Probe", "Status", "PutModel"}
    assert hasattr(splitrt_pb2_grpc, "SplitInferenceServicer")


def test_v2_stubs_describe_the_open_inference_protocol() -> None:
    from splitrt.transport import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

    service = grpc_predict_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert grpc_predict_v2_pb2.DESCRIPTOR.package == "inference"
    assert {m.name for m in service.methods} >= {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ModelMetadata",
        "ModelInfer",
    }
    # Field numbers are the wire format shared with KServe, Triton and MLServer.
    fields = grpc_predict_v2_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name
    assert (fields["model_name"].number, fields["inputs"].number, fields["raw_input_contents"].number) == (1, 5, 7)
    assert grpc_predict_v2_pb2.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number == 6
    assert hasattr(grpc_predict_v2_pb2_grpc, "GRPCInferenceServiceStub")
