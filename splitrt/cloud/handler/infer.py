"""The request path of ``CloudServer.infer``, one for every server on a path of tiers: admission, the
segment (built in a slot, leased from the ``TailCache`` so it is not evicted while it runs), the input
check, the request's memory (its activations estimated at its shapes, refused beyond
``max_request_bytes``, reserved in the budget), the run in a worker slot under the canceller (deadline,
client cancel, shutdown, memory), then either the reply or, for a request naming ``next_cut_id``, the
forward to the server's next hop (``nexthop``) with B's tail run here when the next hop fails or there is
none, and the reply's encoding.

A request for cut A runs A's tail (``"A"``); one with ``next_cut_id`` B runs A -> B (``"A>B"``).

- Paths of tiers (``cloud.handler.infer``, one request path for every server; ``cloud.handler.nexthop``):
  ``ServerConfig.next_tier = NextTier(address, token, tls_ca_path, reserve_s, timeout_s, backoff_*)`` (``splitrt
  serve --next HOST:PORT``) gives a server a next hop. An ``InferRequest`` with ``next_cut_id`` B runs cut_id A
  -> B here (``TailCache`` key ``"A>B"``, leased like a tail: ``partition.split(graph, [A, B])[1]``) and
  forwards B's crossing tensors (``next_codec``) to the next tier as an ordinary request; its outputs return
  undecoded. B = ``device``: nothing forwarded. B before A: INVALID_ARGUMENT naming both; unknown cut:
  NOT_FOUND. The next tier failing (or none configured) is never the device's error: the edge runs B's tail
  itself and sets ``InferReply.next_error`` (then skips the next tier for a doubling backoff). Replies carry
  ``edge_ms`` (arrival to reply), ``next_ms``, ``next_tail_ms``, ``next_queue_ms``, ``next_bytes_up/down``,
  ``next_address``, ``next_load``; ``Probe`` with ``next_probe`` probes the next tier with
  ``next_payload_bytes``/``next_reply_bytes`` (``ProbeReply.next_ms``/``next_error``); ``Status.next_address``.
  No worker slot is held while the forward is on the wire. Proto fields 20-29 are the three-tier ones.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from splitrt.cloud.capacity.cancel import CallToken
from splitrt.cloud.capacity.fairq import HEAVY, RUN
from splitrt.cloud.capacity.memory import trim
from splitrt.cloud.capacity.runlimit import run_limit_s
from splitrt.cloud.capacity.shapevalues import small_integer_arrays, small_integers
from splitrt.cloud.common import RpcFailure
from splitrt.cloud.handler.inputs import check_inputs, decode_inputs
from splitrt.cloud.handler.nexthop import DEVICE_CUT, check_cuts
from splitrt.cloud.models.tails import Tail
from splitrt.errors import CodecError
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

if TYPE_CHECKING:
    from splitrt.cloud.server import CloudServer

TRIM_AFTER_BYTES = 16 << 20
Shapes = Mapping[str, tuple[int, ...]]


def infer(
    server: CloudServer, request: wire.Framed, time_remaining_s: float | None, t0: float, token: CallToken | None = None
) -> wire.Framed:
    """Admit, then serve (:func:`serve`); the place in the queue is left whatever happens."""
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
        return serve(server, request, deadline, t0, token)
    finally:
        server.admission.leave()


def serve(
    server: CloudServer, request: wire.Framed, deadline: float, t0: float, token: CallToken | None
) -> wire.Framed:
    """Run this server's segment; with ``next_cut_id``, forward the rest (or finish it here); encode."""
    h = request.header
    onward = bool(h.next_cut_id)
    graph = server.store.graph(h.model_sha256) if onward else None
    if graph is not None:
        check_cuts(graph, h.cut_id, h.next_cut_id)
    key = f"{h.cut_id}>{h.next_cut_id}" if onward else h.cut_id
    t_lease = time.perf_counter()
    with server.tails.lease(h.model_sha256, key, timeout_s=deadline - time.monotonic()) as segment:
        # The first request on a cut builds its session: that is build_ms, not a wait for a worker.
        build_ms = (time.perf_counter() - t_lease) * 1e3
        bytes_in = check_inputs(request, segment, server.max_decoded_bytes)  # cheap: nothing inflated yet
        out_codec = _codec(h.output_codec)
        next_codec = _codec(h.next_codec) if onward else out_codec
        shapes = {t.name: tuple(int(d) for d in t.shape) for t in request.tensors}
        values, t_run, run_ms = run(
            server,
            segment,
            lambda: decode_inputs(request, server.max_decoded_bytes),  # only in a slot: <= workers inflate
            header=h,
            key=key,
            shapes=shapes,
            values=small_integers(request.tensors),
            bytes_in=bytes_in,
            deadline=deadline,
            t0=t0,
            token=token,
        )
    server._bytes_in.value = bytes_in
    reply = pb.InferReply(request_id=h.request_id, queue_ms=max((t_run - t0) * 1e3 - build_ms, 0.0), build_ms=build_ms)
    outputs: dict[str, Any] = dict(zip(segment.outputs, values, strict=True))
    forwarded: list[codec.Encoded] = []
    if graph is not None:  # the segment's outputs: what crosses B, and graph outputs made here
        b = graph.cut(h.next_cut_id)
        env, made = outputs, set(b.kept) - set(graph.cut(h.cut_id).kept)
        outputs = {n: v for n, v in env.items() if n in made}
        answer = None
        if h.next_cut_id != DEVICE_CUT:
            crossing = {n: env[n] for n in b.tensor_names}
            answer = server.next_hop.forward(h, crossing, next_codec, deadline, reply)
        if answer is not None:
            forwarded = answer
        else:
            if h.next_cut_id != DEVICE_CUT:  # the next hop failed or there is none: B's tail here
                tail_outputs, tail_ms = finish(server, h, env, deadline, t0, token)
                outputs.update(tail_outputs)
                run_ms += tail_ms
            server.next_hop.finished()
    try:
        encoded = [codec.encode(n, np.asarray(v), out_codec, copy=False) for n, v in outputs.items()]
    except CodecError as exc:  # the request's outputs in the codec it asked for (NaN/Inf in int8): its own
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"cannot encode outputs in output_codec {h.output_codec or 'fp32'!r}: {exc}; ask for fp32 or fp16",
        ) from exc
    reply.tail_ms = run_ms
    reply.load.CopyFrom(server.load())
    if onward:
        reply.edge_ms = (time.perf_counter() - t0) * 1e3
    return wire.Framed(header=reply, tensors=encoded + forwarded)


def finish(
    server: CloudServer,
    h: pb.InferRequest,
    env: Mapping[str, Any],
    deadline: float,
    t0: float,
    token: CallToken | None,
) -> tuple[dict[str, Any], float]:
    """B's tail run here on the tensors crossing B (the next hop failed, or there is none)."""
    with server.tails.lease(h.model_sha256, h.next_cut_id, timeout_s=deadline - time.monotonic()) as tail:
        feeds = {n: np.asarray(env[n]) for n, _, _ in tail.inputs}
        values, _, run_ms = run(
            server,
            tail,
            lambda: feeds,
            header=h,
            key=h.next_cut_id,
            shapes={n: tuple(int(d) for d in v.shape) for n, v in feeds.items()},
            values=small_integer_arrays(feeds),
            bytes_in=0,  # already held by the caller
            deadline=deadline,
            t0=t0,
            token=token,
            what=f"tail of cut {h.next_cut_id!r} (next tier failed)",
        )
    return dict(zip(tail.outputs, values, strict=True)), run_ms


def _codec(name: str) -> codec.Codec:
    try:
        return codec.Codec.parse(name or "fp32")
    except CodecError as exc:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc


def request_bytes(
    server: CloudServer,
    sha256: str,
    key: str,
    tail: Tail,
    shapes: Shapes,
    bytes_in: int,
    values: Mapping[str, np.ndarray] | None = None,
) -> tuple[int, int]:
    """What a request holds while it runs: its message, and its activations at its shapes and its small
    integer inputs' values (estimated from the graph, ``peak``; refused beyond ``max_request_bytes``); and
    how many of its tensors' sizes no shape tells (data dependent: the memory watch's first suspects)."""
    segment = f"{sha256}/{key}"
    sizing = server.peaks.sizing(segment, tail.skeleton) if values else frozenset()
    values = {k: v for k, v in (values or {}).items() if k in sizing}  # token ids are data, not sizes
    static = tail.static_peak  # estimated where the segment was made, at its fixed input shapes
    if static is not None and not values and static[0] == tuple(sorted(shapes.items())):
        est = static[1]
    else:
        est = server.peaks.estimate(segment, tail.skeleton, dict(shapes), values)
    # onnxruntime's kernels add scratch space to the tensors alive at once: bert_tiny at 16 x 512
    # peaked 14 % above the estimate (132 MB estimated, 150 MB measured).
    need = int(est.peak_bytes * 1.2)
    limit = server.config.max_request_bytes
    if need > limit:
        said = "".join(f", {k}={_shown(v)}" for k, v in values.items())
        raise RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"cut {key!r} at input shapes {', '.join(f'{k}={list(v)}' for k, v in shapes.items())}"
            + (f" and values{said[1:]}" if said else "")
            + ": "
            f"needs ~{need / 2**20:.0f} MB of activations, expected at most {limit / 2**20:.0f} MB "
            "(--max-request-mb); send smaller inputs",
        )
    return need + bytes_in, est.unknown


def _shown(v: np.ndarray) -> str:
    flat = v.reshape(-1).tolist()
    return str(flat[:8])[:-1] + (", ...]" if len(flat) > 8 else "]")


def run(
    server: CloudServer,
    segment: Tail,
    feeds: Callable[[], dict[str, np.ndarray]],
    *,
    header: pb.InferRequest,
    key: str,
    shapes: Shapes,
    bytes_in: int,
    deadline: float,
    t0: float,
    token: CallToken | None,
    what: str | None = None,
    values: Mapping[str, np.ndarray] | None = None,
) -> tuple[list[Any], float, float]:
    """Reserve the request's memory (``values``: its small integer inputs, ``shapevalues``), run ``segment``
    in a worker slot: ``(values, t_run, run_ms)``."""
    what = what or (f"segment {key}" if ">" in key else f"tail of cut {key!r}")
    need, unknown = request_bytes(server, header.model_sha256, key, segment, shapes, bytes_in, values)
    held = server.budget.reserve(need, f"request at cut {key!r}")
    try:
        return _in_slot(server, segment, feeds, header, what, deadline, t0, token, suspect=unknown > 0)
    finally:
        server.budget.release(held)
        if held > TRIM_AFTER_BYTES:  # its freed activations back to the OS, not kept as heap
            trim()


def _in_slot(
    server: CloudServer,
    segment: Tail,
    feeds: Callable[[], dict[str, np.ndarray]],
    header: pb.InferRequest,
    what: str,
    deadline: float,
    t0: float,
    token: CallToken | None,
    *,
    suspect: bool = False,
) -> tuple[list[Any], float, float]:
    # A segment with no successful run yet (nothing measured: an upload may loop for ever), or whose run hit
    # the per-run limit, runs in the heavy lane (``fairq.HEAVY``: at most ``heavy_workers`` at once): runs
    # that never end, from any number of clients, then hold one worker, not all.
    measured_ms = server.stats.segment_service_ms(header.model_sha256, header.cut_id)
    kind = HEAVY if segment.run_limited or measured_ms <= 0 else RUN
    if not server.admission.acquire(min(deadline - time.monotonic(), 86400.0), kind=kind):
        raise RpcFailure(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"waited {(time.perf_counter() - t0) * 1e3:.1f} ms for a worker ({what}): expected "
            "one within the request's deadline",
        )
    try:
        if token is not None and token.cancelled:  # its client left while it waited: nothing to compute
            raise RpcFailure(
                grpc.StatusCode.CANCELLED, f"{what}: the client cancelled the call while it waited for a worker"
            )
        inputs = feeds()
        if server.before_tail is not None:
            server.before_tail(header)
        t_run = time.perf_counter()
        limit_s = run_limit_s(flag_s=server.config.limits.max_run_s, measured_ms=measured_ms, model_bytes=segment.bytes)
        go = functools.partial(
            server.canceller.run,
            segment.session,
            segment.outputs,
            inputs,
            what=what,
            deadline=deadline,
            token=token,
            limit_s=limit_s,
            suspect=suspect,
        )
        # A client over its share runs at a lower OS priority (``niced``): the CPU goes to the others first.
        try:
            values = server.niced.call(go) if server.admission.yielding() else go()
        except RpcFailure as exc:
            ran_s = time.perf_counter() - t_run
            if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and ran_s >= limit_s and deadline > time.monotonic():
                segment.run_limited = True  # ended by the run limit (not its deadline, nor memory before it)
            raise
        return values, t_run, (time.perf_counter() - t_run) * 1e3
    finally:
        server.admission.release_slot()
