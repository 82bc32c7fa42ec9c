"""The image's HEALTHCHECK: grpc.health.v1.Health/Check against the local `splitrt serve`; exit 0 only when it
answers SERVING. TLS when $SPLITRT_HEALTH_TLS_CA names a readable CA file (the server's port is TLS in the
default command), verified for the name $SPLITRT_HEALTH_TLS_NAME; plaintext otherwise (a loopback or
--insecure server). Runs with the image's venv (grpcio and grpcio-health-checking are splitrt's
dependencies); nothing to download at run time."""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    address = os.environ.get("SPLITRT_HEALTH_ADDRESS", "127.0.0.1:50051")
    ca = os.environ.get("SPLITRT_HEALTH_TLS_CA", "")
    if ca and os.access(ca, os.R_OK):
        with open(ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        name = os.environ.get("SPLITRT_HEALTH_TLS_NAME", "localhost")
        channel = grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", name)])
    else:
        channel = grpc.insecure_channel(address)
    try:
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    except grpc.RpcError as exc:
        print(f"healthcheck: {address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"healthcheck: {address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
