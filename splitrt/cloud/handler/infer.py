"""One request's path on any server of a path of tiers: ``Handler.infer``: admission, the leased tail,
the input check, the request's memory (``graph.peak``; refused beyond ``max_request_bytes``), the run in
a worker slot under the canceller, then the reply or the forward (``nexthop``, no slot held meanwhile).
Every request is counted and logged, rate-limited.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import numpy as np

from splitrt.cloud.capacity.admission import Admission
from splitrt.cloud.capacity.cancel import CallToken, Canceller
from splitrt.cloud.capacity.fairq import HEAVY, RUN
from splitrt.cloud.capacity.memory import MemoryBudget, trim
from splitrt.cloud.capacity.niced import NicePool
from splitrt.cloud.capacity.runlimit import run_limit_s
from splitrt.cloud.common import MAX_WAIT_S, RpcFailure
from splitrt.cloud.guard.ratelog import RateLog
from splitrt.cloud.handler.inputs import check_inputs, decode_inputs, small_integer_arrays, small_integers
from splitrt.cloud.handler.nexthop import DEVICE_CUT, NextHop, check_cuts
from splitrt.cloud.metrics import ServerStats
from splitrt.cloud.models.store import ModelStore
from splitrt.cloud.models.tails import Tail, TailCache
from splitrt.errors import CodecError
from splitrt.graph.peak import PeakEstimator
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

__all__ = ["Handler"]

TRIM_AFTER_BYTES = 16 << 20
# Trims from the request path are rare (the next large request would fault its pages in afresh); the memory
# watch trims before it judges a run, so what malloc keeps is never charged to a request.
TRIM_EVERY_S = 10.0
Shapes = Mapping[str, tuple[int, ...]]


class Handler:
    """Serves ``InferRequest``s with what it is given; ``before_tail`` (a test hook) is called in the worker
    slot just before a tail runs, with the request's header."""

    def __init__(
        self,
        *,
        admission: Admission,
        budget: MemoryBudget,
        canceller: Canceller,
        niced: NicePool,
        store: ModelStore,
        tails: TailCache,
        next_hop: NextHop,
        stats: ServerStats,
        ratelog: RateLog,
        default_deadline_s: float,
        max_decoded_bytes: int,
        max_request_bytes: int,
        max_run_s: float | None,
    ) -> None:
        self.admission, self.budget, self.canceller, self.niced = admission, budget, canceller, niced
        self.store, self.tails, self.next_hop = store, tails, next_hop
        self.stats, self.ratelog = stats, ratelog
        self.default_deadline_s, self.max_decoded_bytes = default_deadline_s, max_decoded_bytes
        self.max_request_bytes, self.max_run_s = max_request_bytes, max_run_s
        self.peaks = PeakEstimator()
        self.before_tail: Callable[[pb.InferRequest], None] | None = None
        self._bytes_in = threading.local()
        self._next_trim = 0.0  # monotonic

    def infer(
        self, request: wire.Framed, time_remaining_s: float | None, token: CallToken | None = None
    ) -> wire.Framed:
        """Run the request (an ``InferRequest``); the reply is an ``InferReply``. ``RpcFailure`` on refusal."""
        t0 = time.perf_counter()
        h = request.header
        self._bytes_in.value = 0  # set once the request is checked; a failed one must not log the previous one's
        try:
            reply = self._admitted(request, time_remaining_s, t0, token)
        except RpcFailure as exc:
            total_ms = (time.perf_counter() - t0) * 1e3
            queue_full = exc.retry_after_ms is not None
            self.stats.observe(
                code=exc.code.name,
                model_sha256=h.model_sha256,
                cut_id=h.cut_id,
                total_ms=total_ms,
                queue_full=queue_full,
            )
            self.ratelog.request(  # rate-limited: a few lines per code and interval (``--log-every-request``)
                "infer",
                logging.WARNING,
                code=exc.code.name,
                **_fields(h),
                error=exc.message,
                total_ms=round(total_ms, 3),
            )
            raise
        r = reply.header
        total_ms = (time.perf_counter() - t0) * 1e3
        self.stats.observe(
            code="OK", model_sha256=h.model_sha256, cut_id=h.cut_id, total_ms=total_ms, tail_ms=r.tail_ms
        )
        bytes_in = self._bytes_in.value  # set at the top of this call, on this thread
        self.ratelog.request(  # the line's fields are made only when it is logged (most are counted)
            "infer",
            code="OK",
            lazy=lambda: {
                **_fields(h),
                "tail_ms": round(r.tail_ms, 3),
                "queue_ms": round(r.queue_ms, 3),
                "build_ms": round(r.build_ms, 3),
                "total_ms": round(total_ms, 3),
                "bytes_in": bytes_in,
            },
        )
        return reply

    def _admitted(
        self, request: wire.Framed, time_remaining_s: float | None, t0: float, token: CallToken | None
    ) -> wire.Framed:
        """Admit, then serve; the place in the queue is left whatever happens."""
        deadline_s = self.default_deadline_s if time_remaining_s is None else time_remaining_s
        deadline = time.monotonic() + min(deadline_s, MAX_WAIT_S)
        a = self.admission
        # Early, before any decoding, with a hint devices use to plan around this server.
        a.enter("Infer", lambda: self.stats.retry_after_ms(queue_depth=a.admitted, workers=a.workers))
        try:
            return self._serve(request, deadline, t0, token)
        finally:
            a.leave()

    def _serve(self, request: wire.Framed, deadline: float, t0: float, token: CallToken | None) -> wire.Framed:
        """Run this server's segment; with ``next_cut_id``, forward the rest (or finish it here); encode."""
        h = request.header
        onward = bool(h.next_cut_id)
        graph = self.store.graph(h.model_sha256) if onward else None
        if graph is not None:
            check_cuts(graph, h.cut_id, h.next_cut_id)
        key = f"{h.cut_id}>{h.next_cut_id}" if onward else h.cut_id
        t_lease = time.perf_counter()
        # The tail's lease without a generator context (``TailCache.lease``, inlined: per request).
        segment = self.tails.get(h.model_sha256, key, timeout_s=deadline - time.monotonic(), pin=True)
        ok = False
        try:
            # The first request on a cut builds its session: that is build_ms, not a wait for a worker.
            build_ms = (time.perf_counter() - t_lease) * 1e3
            bytes_in = check_inputs(request, segment, self.max_decoded_bytes)  # cheap: nothing inflated yet
            out_codec = _codec(h.output_codec)
            next_codec = _codec(h.next_codec) if onward else out_codec
            shapes = {t.name: tuple(map(int, t.shape)) for t in request.tensors}
            values, t_run, run_ms = self._run(
                segment,
                lambda: decode_inputs(request, self.max_decoded_bytes),  # only in a slot: <= workers inflate
                header=h,
                key=key,
                shapes=shapes,
                values=small_integers(request.tensors),
                bytes_in=bytes_in,
                deadline=deadline,
                token=token,
            )
            ok = True
        finally:
            self.tails.unpin(segment, h.model_sha256, key, ok=ok)
        self._bytes_in.value = bytes_in
        queue_ms = max((t_run - t0) * 1e3 - build_ms, 0.0)
        reply = pb.InferReply(request_id=h.request_id, queue_ms=queue_ms, build_ms=build_ms)
        outputs: dict[str, Any] = dict(zip(segment.outputs, values, strict=True))
        forwarded: list[codec.Encoded] = []
        if graph is not None:  # the segment's outputs: what crosses B, and graph outputs made here
            b = graph.cut(h.next_cut_id)
            env, made = outputs, set(b.kept) - set(graph.cut(h.cut_id).kept)
            outputs = {n: v for n, v in env.items() if n in made}
            answer = None
            if h.next_cut_id != DEVICE_CUT:
                crossing = {n: env[n] for n in b.tensor_names}
                answer = self.next_hop.forward(h, crossing, next_codec, deadline, reply)
            if answer is not None:
                forwarded = answer
            else:
                if h.next_cut_id != DEVICE_CUT:  # the next hop failed or there is none: B's tail here
                    tail_outputs, tail_ms = self._finish(h, env, deadline, token)
                    outputs.update(tail_outputs)
                    run_ms += tail_ms
                self.next_hop.finished()
        try:
            encoded = [codec.encode(n, v, out_codec, copy=False) for n, v in outputs.items()]  # encode: asarray
        except CodecError as exc:  # the request's outputs in the codec it asked for (NaN/Inf in int8): its own
            raise RpcFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"cannot encode outputs in output_codec {h.output_codec or 'fp32'!r}: {exc}; ask for fp32 or fp16",
            ) from exc
        reply.tail_ms = run_ms
        reply.load.CopyFrom(self.admission.load(self.stats.service_ms()))
        if onward:
            reply.edge_ms = (time.perf_counter() - t0) * 1e3
        return wire.Framed(header=reply, tensors=encoded + forwarded)

    def _finish(
        self, h: pb.InferRequest, env: Mapping[str, Any], deadline: float, token: CallToken | None
    ) -> tuple[dict[str, Any], float]:
        """B's tail run here on the tensors crossing B (the next hop failed, or there is none)."""
        with self.tails.lease(h.model_sha256, h.next_cut_id, timeout_s=deadline - time.monotonic()) as tail:
            feeds = {n: np.asarray(env[n]) for n, _, _ in tail.inputs}
            values, _, run_ms = self._run(
                tail,
                lambda: feeds,
                header=h,
                key=h.next_cut_id,
                shapes={n: tuple(int(d) for d in v.shape) for n, v in feeds.items()},
                values=small_integer_arrays(feeds),
                bytes_in=0,  # already held by the caller
                deadline=deadline,
                token=token,
                what=f"tail of cut {h.next_cut_id!r} (next tier failed)",
            )
        return dict(zip(tail.outputs, values, strict=True)), run_ms

    def _request_bytes(
        self, sha256: str, key: str, tail: Tail, shapes: Shapes, bytes_in: int, values: Mapping[str, np.ndarray]
    ) -> tuple[int, int]:
        """What a request holds while it runs (its message and its activations, ``peak``; refused beyond
        ``max_request_bytes``), and how many of its tensors' sizes no shape tells (the watch's suspects)."""
        segment = f"{sha256}/{key}"
        sizing = self.peaks.sizing(segment, tail.skeleton, known=tail.sizing) if values else frozenset()
        # Token ids are data, not sizes.
        values = {k: v for k, v in values.items() if k in sizing} if values else {}
        static = tail.static_peak  # estimated where the segment was made, at its fixed input shapes
        if static is not None and not values and static[0] == tuple(sorted(shapes.items())):
            est = static[1]
        else:
            est = self.peaks.estimate(segment, tail.skeleton, dict(shapes), values)
        # onnxruntime's kernels add scratch space to the tensors alive at once.
        need = int(est.peak_bytes * 1.2)
        limit = self.max_request_bytes
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

    def _run(
        self,
        segment: Tail,
        feeds: Callable[[], dict[str, np.ndarray]],
        *,
        header: pb.InferRequest,
        key: str,
        shapes: Shapes,
        values: Mapping[str, np.ndarray],
        bytes_in: int,
        deadline: float,
        token: CallToken | None,
        what: str | None = None,
    ) -> tuple[list[Any], float, float]:
        """Reserve the request's memory, run ``segment`` in a worker slot: ``(values, t_run, run_ms)``."""
        what = what or (f"segment {key}" if ">" in key else f"tail of cut {key!r}")
        need, unknown = self._request_bytes(header.model_sha256, key, segment, shapes, bytes_in, values)
        held = self.budget.reserve(need, f"request at cut {key!r}")
        ticket, shrink = self.tails.arena.begin(need - bytes_in)  # activations: what the arena holds
        try:
            return self._in_slot(segment, feeds, header, what, deadline, token, suspect=unknown > 0, shrink=shrink)
        finally:
            self.tails.arena.end(ticket, shrink)
            self.budget.release(held)
            if held > TRIM_AFTER_BYTES and time.monotonic() >= self._next_trim:  # freed activations to the OS
                self._next_trim = time.monotonic() + TRIM_EVERY_S
                trim()

    def _in_slot(
        self,
        segment: Tail,
        feeds: Callable[[], dict[str, np.ndarray]],
        header: pb.InferRequest,
        what: str,
        deadline: float,
        token: CallToken | None,
        *,
        suspect: bool,
        shrink: bool,
    ) -> tuple[list[Any], float, float]:
        # Unmeasured or run-limited segments take the heavy lane: runs that never end hold one worker, not all.
        measured_ms = self.stats.segment_service_ms(header.model_sha256, header.cut_id)
        kind = HEAVY if segment.run_limited or measured_ms <= 0 else RUN

        def work(yielding: bool) -> tuple[list[Any], float, float]:
            if token is not None and token.cancelled:  # its client left while it waited: nothing to compute
                raise RpcFailure(
                    grpc.StatusCode.CANCELLED, f"{what}: the client cancelled the call while it waited for a worker"
                )
            inputs = feeds()
            if self.before_tail is not None:
                self.before_tail(header)
            t_run = time.perf_counter()
            limit_s = run_limit_s(flag_s=self.max_run_s, measured_ms=measured_ms, model_bytes=segment.bytes)
            go = functools.partial(
                self.canceller.run,
                segment.session,
                segment.outputs,
                inputs,
                what=what,
                deadline=deadline,
                token=token,
                limit_s=limit_s,
                suspect=suspect,
                shrink_arena=shrink,
            )
            # Over its share, run-limited before, or an upload's: at a lower OS priority (``niced``).
            try:
                niced = segment.run_limited or segment.untrusted or yielding
                values = self.niced.call(go) if niced else go()
            except RpcFailure as exc:
                ran_s = time.perf_counter() - t_run
                if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and ran_s >= limit_s and deadline > time.monotonic():
                    segment.run_limited = True  # ended by the run limit (not its deadline, nor memory before it)
                raise
            return values, t_run, (time.perf_counter() - t_run) * 1e3

        return self.admission.run(work, min(deadline - time.monotonic(), MAX_WAIT_S), what=what, kind=kind)


def _fields(h: pb.InferRequest) -> dict[str, Any]:
    """A request's own fields in its log line."""
    return {"request_id": h.request_id, "model": h.model_sha256[:12], "cut": h.cut_id, "codec": h.codec}


def _codec(name: str) -> codec.Codec:
    try:
        return codec.Codec.parse(name or "fp32")
    except CodecError as exc:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc


def _shown(v: np.ndarray) -> str:
    flat = v.reshape(-1).tolist()
    return str(flat[:8])[:-1] + (", ...]" if len(flat) > 8 else "]")
