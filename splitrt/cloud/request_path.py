"""The request path of ``CloudServer.infer``: admission, the tail (built in a slot), the input check,
the request's memory (its activations estimated at its shapes, refused beyond ``max_request_bytes``,
reserved in the budget), the run in a worker slot under the canceller (deadline, client cancel,
shutdown, memory), and the reply's encoding."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import grpc
import numpy as np

from splitrt.cloud.cancel import CallToken
from splitrt.cloud.common import RpcFailure
from splitrt.cloud.inputs import check_inputs, decode_inputs
from splitrt.cloud.memory import trim
from splitrt.cloud.tails import Tail
from splitrt.errors import CodecError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

if TYPE_CHECKING:
    from splitrt.cloud.server import CloudServer

TRIM_AFTER_BYTES = 16 << 20


def infer(
    server: CloudServer, request: wire.Framed, time_remaining_s: float | None, t0: float, token: CallToken | None = None
) -> wire.Framed:
    """Admit, build or find the tail, check, estimate and reserve memory, run in a slot, encode."""
    header = request.header
    deadline_s = server.config.default_deadline_s if time_remaining_s is None else time_remaining_s
    deadline_s = min(deadline_s, 86400.0)  # no deadline: gRPC says ~9.2e18 s, too far for any wait
    deadline = time.monotonic() + deadline_s
    if not server.admission.admit():
        # Early, before any decoding, with a hint devices use to plan around this server.
        a = server.admission
        hint = server.stats.retry_after_ms(queue_depth=a.admitted, workers=a.workers)
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"server busy: queue depth {a.admitted}, expected at most "
            f"{a.workers + a.max_queue} (workers {a.workers} + queue {a.max_queue}); "
            f"retry after {hint:g} ms",
            retry_after_ms=hint,
        )
    try:
        if header.next_cut_id:  # three tiers: run up to the next cut, forward the rest
            return server.relay.infer(request, deadline_s, t0, token)
        t_lease = time.perf_counter()
        with server.tails.lease(header.model_sha256, header.cut_id, timeout_s=deadline - time.monotonic()) as tail:
            # The first request on a cut builds its session: that is build_ms, not a wait for a worker.
            build_ms = (time.perf_counter() - t_lease) * 1e3
            # Cheap: nothing inflated or allocated yet.
            bytes_in = check_inputs(request, tail, server.max_decoded_bytes)
            try:
                out_codec = codec.Codec.parse(header.output_codec or "fp32")
            except CodecError as exc:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            held = server.budget.reserve(
                request_bytes(server, request, tail, bytes_in), f"request at cut {header.cut_id!r}"
            )
            try:
                return run(server, request, tail, out_codec, deadline, t0, token, bytes_in, build_ms)
            finally:
                server.budget.release(held)
                if held > TRIM_AFTER_BYTES:  # its freed activations back to the OS, not kept as heap
                    trim()
    finally:
        server.admission.leave()


def request_bytes(server: CloudServer, request: wire.Framed, tail: Tail, bytes_in: int) -> int:
    """What a request holds while it runs: its message, and its activations at its shapes (estimated
    from the graph, ``peak``; refused beyond ``max_request_bytes``)."""
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in request.tensors}
    cut = request.header.cut_id
    est = server.peaks.estimate(f"{request.header.model_sha256}/{cut}", tail.skeleton, shapes)
    # onnxruntime's kernels add scratch space to the tensors alive at once: bert_tiny at 16 x 512
    # peaked 14 % above the estimate (132 MB estimated, 150 MB measured).
    need = int(est.peak_bytes * 1.2)
    limit = server.config.max_request_bytes
    if need > limit:
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"cut {cut!r} at input shapes {', '.join(f'{k}={list(v)}' for k, v in shapes.items())}: "
            f"needs ~{need / 2**20:.0f} MB of activations, expected at most {limit / 2**20:.0f} MB "
            "(--max-request-mb); send smaller inputs",
        )
    return need + bytes_in


def run(
    server: CloudServer,
    request: wire.Framed,
    tail: Tail,
    out_codec: codec.Codec,
    deadline: float,
    t0: float,
    token: CallToken | None,
    bytes_in: int,
    build_ms: float = 0.0,
) -> wire.Framed:
    header = request.header
    if not server.admission.acquire(min(deadline - time.monotonic(), 86400.0)):
        raise RpcFailure(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"waited {(time.perf_counter() - t0) * 1e3:.1f} ms for a worker: expected "
            "one within the request's deadline",
        )
    t_run = time.perf_counter()
    try:
        if token is not None and token.cancelled:  # its client left while it waited: nothing to compute
            raise RpcFailure(
                grpc.StatusCode.CANCELLED,
                f"tail of cut {header.cut_id!r}: the client cancelled the call while it waited for a worker",
            )
        # Decoded only in a worker slot: at most ``workers`` requests inflate at once.
        feeds = decode_inputs(request, server.max_decoded_bytes)
        if server.before_tail is not None:
            server.before_tail(header)
        t_run = time.perf_counter()
        values = server.canceller.run(
            tail.session, tail.outputs, feeds, what=f"tail of cut {header.cut_id!r}", deadline=deadline, token=token
        )
        t_done = time.perf_counter()
    finally:
        server.admission.release_slot()
    reply = pb.InferReply(
        request_id=header.request_id,
        tail_ms=(t_done - t_run) * 1e3,
        queue_ms=max((t_run - t0) * 1e3 - build_ms, 0.0),
        build_ms=build_ms,
        load=server.load(),
    )
    try:
        outputs = [
            codec.encode(n, np.asarray(v), out_codec, copy=False) for n, v in zip(tail.outputs, values, strict=True)
        ]
    except CodecError as exc:
        raise RpcFailure(grpc.StatusCode.INTERNAL, f"cannot encode outputs: {exc}") from exc
    server._bytes_in.value = bytes_in
    return wire.Framed(header=reply, tensors=outputs)
