"""Bearer-token authentication of the server's calls (a gRPC interceptor)."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

import grpc

from splitrt.cloud.common import log_event


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as ``handler`` that aborts with UNAUTHENTICATED."""

    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


def token_matches(given: bytes, tokens: tuple[bytes, ...]) -> bool:
    """True when ``given`` is one of ``tokens``, in time independent of where they differ: every token is
    compared (no early exit on a match), with ``hmac.compare_digest`` on sha256 digests (equal lengths,
    so not even a token's length shows in the timing)."""
    digest = hashlib.sha256(given).digest()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(digest, hashlib.sha256(t).digest())
    return ok and bool(given)


class TokenInterceptor(grpc.ServerInterceptor):
    """Bearer-token auth for every method except the standard health service. Tokens are never logged:
    a refused call logs the method and whether it carried a token at all."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)

    def __repr__(self) -> str:
        return f"TokenInterceptor({len(self._tokens)} tokens)"

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        method = handler_call_details.method or ""
        if method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        auth = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                auth = value if isinstance(value, str) else value.decode("utf-8", "replace")
        given = auth[7:].strip().encode() if auth.lower().startswith("bearer ") else b""
        ok = token_matches(given, self._tokens)
        handler = continuation(handler_call_details)
        if ok or handler is None:
            return handler
        log_event("unauthenticated", logging.WARNING, method=method, had_token=bool(auth))
        reason = "a bearer token" if not auth else "a valid bearer token"
        return _deny_handler(handler, f"expected {reason} in the 'authorization' metadata")
