"""The committed gRPC stubs equal a fresh generation from proto/splitrt.proto."""

from __future__ import annotations

from pathlib import Path

from splitrt.transport import protogen


def test_committed_stubs_are_up_to_date(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(protogen.GENERATED)
    for path in written:
        committed = protogen.PACKAGE_DIR / path.name
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        assert committed.read_text() == path.read_text(), f"{committed.name} is stale: run `make proto`"


def test_stubs_import_and_describe_the_service() -> None:
    from splitrt.transport import splitrt_pb2, splitrt_pb2_grpc

    service = splitrt_pb2.DESCRIPTOR.services_by_name["SplitInference"]
    assert splitrt_pb2.DESCRIPTOR.package == "splitrt.v1"
    assert {m.name for m in service.methods} == {"Infer", "InferStream", "Probe", "Status", "PutModel"}
    assert hasattr(splitrt_pb2_grpc, "SplitInferenceServicer")
