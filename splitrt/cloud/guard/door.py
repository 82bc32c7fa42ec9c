"""The server's front door (a ``grpc.ServerInterceptor`` that re-registers every method as
request-streaming, so it decides on a call's headers before a byte of its body is read): auth and the
guessers' throttle (``auth``), a lane per method with a per-peer share (RESOURCE_EXHAUSTED at once when
full), a Probe's declared bytes held first (``probes``), then the body, frames and replies read under a
``watchdog.Lease``. Behind a trusted proxy the client is the address it names. Every outcome is counted
(``snapshot``) and failures logged, rate-limited. Operators: docs/operator/security.md.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from splitrt.cloud.capacity.admission import prepay, serving
from splitrt.cloud.capacity.memory import REPLY_COUNTED_BYTES, MemoryBudget, reply_held_bytes
from splitrt.cloud.common import RpcFailure, client_key
from splitrt.cloud.guard.auth import AuthThrottle, ThrottleConfig, Tokens, Verdict, forwarded_peer, peer_address
from splitrt.cloud.guard.limits import Limits
from splitrt.cloud.guard.probes import (
    PROBE_FREE_BYTES,
    PROBE_MAX_PAYLOAD_BYTES,
    PROBE_MAX_REPLY_BYTES,
    PROBE_PENALTY_S,
    ProbeGate,
    declared,
)
from splitrt.cloud.guard.ratelog import RateLog
from splitrt.cloud.guard.watchdog import Lease, Watchdog
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire

__all__ = ["FrontDoor", "forwarded_peer", "lane_of"]

HEALTH = "/grpc.health.v1.Health/"
HEALTH_LANES = ("health", "watch")  # no token asked
# Threads beyond the lanes' caps: refusals run on them (microseconds each).
SPARE_THREADS = 16
# Methods whose failures the server logs itself (one ``infer`` line per request).
_SELF_LOGGED = {f"/{wire.SERVICE_NAME}/Infer"}


def lane_of(method: str) -> str:
    """The lane a method's calls are admitted to: ``watch``, ``health``, ``status``, ``probe``, ``upload`` or
    ``infer``."""
    if method.startswith(HEALTH):
        return "watch" if method.endswith("/Watch") else "health"
    if method == f"/{wire.SERVICE_NAME}/Probe":
        return "probe"
    if method == f"/{wire.SERVICE_NAME}/PutModel":
        return "upload"
    return "status" if method == f"/{wire.SERVICE_NAME}/Status" else "infer"


class FrontDoor(grpc.ServerInterceptor):
    """The door, with its own rate-limited log, guessers' throttle and watchdog (which flushes the log's
    summary); ``infer_calls`` is the inference lane's cap."""

    def __init__(
        self,
        *,
        tokens: tuple[str, ...],
        limits: Limits,
        infer_calls: int,
        retry_after_ms: Callable[[], float] = lambda: 100.0,
        budget: MemoryBudget | None = None,
        max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        limits.check()
        self.tokens = Tokens(tokens)
        self.auth = bool(tokens)  # calls but health's carry a token
        self.budget = budget if budget is not None else MemoryBudget(None)
        self.max_message_bytes = max_message_bytes
        self.probes = ProbeGate(self.budget, max_message_bytes)  # Probe bodies paid for before they are read
        self.limits = limits
        self.throttle = AuthThrottle(
            ThrottleConfig(
                free_failures=limits.auth_free_failures, base_s=limits.auth_backoff_s, max_s=limits.auth_backoff_max_s
            )
        )
        self.ratelog = RateLog(interval_s=limits.log_interval_s, every_request=limits.log_every_request)
        self.watchdog = Watchdog()
        self.watchdog.on_tick.append(self.ratelog.flush)
        self.retry_after_ms = retry_after_ms
        self.clock: Callable[[], float] = time.monotonic
        self.caps = {
            "infer": infer_calls,
            "status": limits.status_calls,
            "probe": limits.probe_calls,
            "upload": limits.upload_calls,
            "health": limits.health_calls,
            "watch": limits.watch_streams,
        }
        self.inside = dict.fromkeys(self.caps, 0)
        # One peer address holds at most this many calls of a lane (so another always finds room).
        self.peer_caps = {
            lane: limits.calls_per_peer if lane == "infer" else max(1, cap // 2) for lane, cap in self.caps.items()
        }
        self.by_peer: dict[tuple[str, str], int] = {}  # (lane, address) -> calls inside
        self.lock = threading.Lock()
        self.calls: dict[tuple[str, str], int] = {}  # (method, code)
        self.refused: Counter[str] = Counter()  # unauthenticated, throttled, lane:<lane>, timeout
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def __repr__(self) -> str:
        return f"FrontDoor({self.tokens!r}, caps={self.caps})"

    @property
    def threads(self) -> int:
        """Worker threads the server needs: every lane full, and spares for refusals."""
        return sum(self.caps.values()) + SPARE_THREADS

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # UNIMPLEMENTED, answered by gRPC without reading anything
        method = handler_call_details.method or ""
        # Wrapped once per registered method (bounded: unknown methods are None above), not per call.
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            wrapped = _wrap(self, handler, _Method(method, lane_of(method), self.limits))
            cached = self._wrapped[method] = (handler, wrapped)
        return cached[1]

    def client_peer(self, ctx: Any) -> str:
        """The call's client as a gRPC peer string: the connection's peer, or the one a trusted proxy names."""
        peer = ctx.peer() or ""
        if not self.limits.trusted_proxies or peer_address(peer) not in self.limits.trusted_proxies:
            return peer
        forwarded = forwarded_peer(ctx.invocation_metadata())
        return peer if forwarded is None else forwarded

    def penalize_probes(self, address: str, why: str) -> None:
        """``address`` sent a Probe body that was read and then refused: its next ones are refused unread."""
        self.probes.penalize(address, self.clock())
        self.ratelog.event("probe_penalized", peer=address, seconds=PROBE_PENALTY_S, why=why[:200])

    def count(self, short: str, code: grpc.StatusCode, refused: str = "") -> None:
        """One outcome of a call to method ``short`` (its last path part)."""
        key = (short, code._name_)  # enum's documented sunder name: ``.name`` and hashing the member are calls
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            if refused:
                self.refused[refused] += 1

    def snapshot(self) -> dict[str, Any]:
        """Counters for metrics: lanes (inside, caps), calls by (method, code), refusals, replies' bytes held."""
        reply_bytes = self.watchdog.held_bytes()  # the calls' leases own their replies' bytes
        with self.lock:
            return {
                "inside": dict(self.inside),
                "caps": dict(self.caps),
                "calls": dict(self.calls),
                "refused": dict(self.refused),
                "reply_bytes": reply_bytes,
                "waiting_peers": self.throttle.waiting(self.clock()),
            }


class _Method:
    """What a method's calls are checked against, made once per registered method (not per call): its lane
    and its lease timeouts with their reasons, formatted here."""

    __slots__ = (
        "first_reason",
        "first_s",
        "lane",
        "method",
        "next_reason",
        "next_s",
        "reply_reason",
        "reply_s",
        "short",
        "stream_first_reason",
        "stream_first_s",
    )

    def __init__(self, method: str, lane: str, limits: Limits) -> None:
        self.method, self.lane = method, lane
        self.short = short = method.rpartition("/")[2] or method
        self.first_s = limits.health_read_timeout_s if lane in HEALTH_LANES else limits.read_timeout_s
        self.first_reason = f"{short}: expected the request message within {self.first_s:g} s, got none"
        self.stream_first_s = limits.read_timeout_s
        self.stream_first_reason = f"{short}: expected the first message within {self.stream_first_s:g} s, got none"
        # Upload chunks come back to back; stream frames come when the device has one.
        self.next_s = limits.read_timeout_s if short == "PutModel" else limits.stream_idle_s
        self.next_reason = f"{short}: expected the next message within {self.next_s:g} s, got none"
        self.reply_s = t = limits.read_timeout_s
        self.reply_reason = f"{short}: expected the client to take the reply within {t:g} s, got no room"


class _Call:
    """One call through the door, on its thread: ``enter`` (auth, lane; aborts on refusal), reads under the
    lease, ``finish`` (counts, logs); the lease's ``on_end`` frees the lane and a Probe's prepaid bytes."""

    def __init__(self, door: FrontDoor, m: _Method, context: Any) -> None:
        self.door, self.m, self.context = door, m, context
        self.method, self.lane, self.short = m.method, m.lane, m.short
        self.lease: Lease | None = None
        self.peer = ""
        self.key = (m.lane, "")
        self.refused = False
        self.prepaid = 0  # budget bytes this call's Probe body was paid for before it was read
        self.declared: int | None = None
        self.read_bytes = 0  # a Probe's payload bytes, once its body is read
        self.keep = False  # a unary reply made, not yet taken: the lease ends with the call, not the handler
        self.on_end = False  # the lease's ``end`` is registered to run at the call's end

    def enter(self) -> None:
        door, ctx = self.door, self.context
        peer = self.peer = door.client_peer(ctx)
        verdict = door.tokens.check(ctx.invocation_metadata()) if door.auth and self.lane not in HEALTH_LANES else None
        if verdict is not None:
            with door.lock:
                now = door.clock()
                wait_s = door.throttle.wait_s(peer, now)
                if wait_s <= 0 and verdict is Verdict.OK:
                    door.throttle.succeeded(peer)
                elif wait_s <= 0:
                    door.throttle.failed(peer, now)
            if wait_s > 0:
                hint = round(wait_s * 1e3, 1)
                door.ratelog.event("auth_throttled", peer=peer_address(peer), method=self.method, retry_after_ms=hint)
                self._refuse(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "throttled",
                    f"too many failed authentications from {peer_address(peer)}: expected a wait, "
                    f"got a call; retry after {hint:g} ms",
                    hint,
                )
            if verdict is not Verdict.OK:
                had = verdict is Verdict.WRONG
                door.ratelog.event("unauthenticated", peer=peer_address(peer), method=self.method, had_token=had)
                self._refuse(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "unauthenticated",
                    f"expected {'a valid' if had else 'a'} bearer token in the 'authorization' metadata",
                )
        self.key = (self.lane, peer_address(peer))
        with door.lock:
            cap, inside = door.caps[self.lane], door.inside[self.lane]
            peer_cap, mine = door.peer_caps[self.lane], door.by_peer.get(self.key, 0)
            admitted = inside < cap and mine < peer_cap
            if admitted:
                door.inside[self.lane] = inside + 1
                door.by_peer[self.key] = mine + 1
        if not admitted:
            hint = door.retry_after_ms() if self.lane == "infer" else 100.0
            door.ratelog.event("lane_full", peer=self.key[1], method=self.method, lane=self.lane, cap=cap)
            what = (
                f"{inside} {self.lane} calls at once, expected at most {cap}"
                if inside >= cap
                else f"{mine} {self.lane} calls at once from {self.key[1]}, expected at most {peer_cap} per address"
            )
            self._refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"lane:{self.lane}",
                f"server busy: {what}; retry after {hint:g} ms",
                hint,
            )
        serving(client_key(peer))  # whose worker-seconds this call's work is (fair queuing, ``fairq``)
        self.lease = door.watchdog.lease(ctx, give_back=door.budget.release, on_end=self.release)
        if self.lane == "watch":
            age = door.limits.watch_max_age_s
            self.lease.arm_life(
                age, f"Watch: streams last at most {age:g} s on this server; watch again", grpc.StatusCode.UNAVAILABLE
            )
        # The lease ends however the call ends (False: it has ended already; ``finish`` then ends it).
        self.on_end = bool(ctx.add_callback(self.lease.end))

    def _refuse(self, code: grpc.StatusCode, reason: str, message: str, retry_after_ms: float | None = None) -> None:
        self.door.count(self.short, code, reason)
        self.refused = True  # counted and logged here: ``finish`` only releases
        if retry_after_ms is not None:
            self.context.set_trailing_metadata(((wire.RETRY_AFTER_KEY, f"{retry_after_ms:g}"),))
        self.context.abort(code, message)
        raise AssertionError("unreachable")  # abort raises

    def release(self) -> None:
        """Give back the door's places (lane, per-address count) and a Probe's prepaid bytes: the lease's
        ``on_end``, once the call ended (``Lease.end``)."""
        door = self.door
        with door.lock:
            door.inside[self.lane] -= 1
            left = door.by_peer[self.key] - 1
            if left > 0:
                door.by_peer[self.key] = left
            else:
                del door.by_peer[self.key]
            prepaid, self.prepaid = self.prepaid, 0
            if self.keep and self.lease is not None and self.lease.fired:
                self.door.refused["reply_timeout"] += 1
        if prepaid:
            self.door.probes.release(prepaid)

    def end(self) -> None:
        """The handler is done with the call and nothing is left for the client to take: its lease ends."""
        assert self.lease is not None  # ``finish`` runs only after ``enter`` admitted the call
        self.lease.end()

    def prepay(self) -> None:
        """A Probe's bytes held before its body is read (``probes``); RESOURCE_EXHAUSTED otherwise, or
        INVALID_ARGUMENT for a declared size over the caps, nothing read."""
        door, probes, address = self.door, self.door.probes, self.key[1]
        wait_s = probes.wait_s(address, door.clock())
        if wait_s > 0:
            self._refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "probe_penalty",
                f"Probe: a probe body from {address} was refused after it was read (more than declared, or "
                f"over a cap); expected no probe from it for {PROBE_PENALTY_S:g} s, got one; retry after "
                f"{wait_s * 1e3:.0f} ms, declaring sizes in '{wire.PROBE_BYTES_KEY}' metadata",
                wait_s * 1e3,
            )
        self.declared = declared(self.context.invocation_metadata())
        cap = probes.cap_bytes
        if self.declared is not None and self.declared > cap:
            self._refuse(
                grpc.StatusCode.INVALID_ARGUMENT,
                "probe_cap",
                f"Probe: expected at most {cap} bytes (payload {PROBE_MAX_PAYLOAD_BYTES} + reply "
                f"{PROBE_MAX_REPLY_BYTES}) declared in '{wire.PROBE_BYTES_KEY}', got {self.declared}",
            )
        need = probes.need_bytes(self.declared)
        if need == 0:
            return
        fits, share = probes.try_hold(need)
        if not fits:
            door.ratelog.event("probe_refused", peer=address, need_mb=round(need / 2**20, 1))
            what = f"{self.declared} declared bytes" if self.declared is not None else "an undeclared size"
            self._refuse(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "memory",
                f"Probe: {what} needs ~{need / 2**20:.0f} MB before its body is read, expected at most what "
                f"probes may hold now ({max(0.0, share - probes.held_bytes) / 2**20:.0f} MB free of "
                f"{share / 2**20:.0f} MB); declare smaller probes in '{wire.PROBE_BYTES_KEY}' metadata; "
                "retry after 1000 ms",
                1000.0,
            )
        self.prepaid = need
        prepay(need)

    def check_declared(self, request: Any) -> None:
        """A Probe that sent more than it declared: INVALID_ARGUMENT before the handler runs (what such a
        lie can cost is bounded by the probe lane: ``probe_calls`` bodies of at most a message each)."""
        if isinstance(request, wire.ProbeBody):
            self.read_bytes, reply = request.payload_bytes, int(request.header.reply_bytes)
        elif isinstance(request, pb.ProbeRequest):
            self.read_bytes, reply = len(request.payload), int(request.reply_bytes)
        else:
            return
        if self.declared is None:
            return
        sent = self.read_bytes + reply
        if sent > self.declared:
            if self.read_bytes > PROBE_FREE_BYTES:  # its body cost a read
                self.door.penalize_probes(self.key[1], f"sent {sent} bytes, declared {self.declared}")
            self._refuse(
                grpc.StatusCode.INVALID_ARGUMENT,
                "undeclared",
                f"Probe: expected at most the {self.declared} bytes declared in '{wire.PROBE_BYTES_KEY}', "
                f"got {sent} (payload + reply_bytes)",
            )

    def _read(self, it: Iterator[Any], timeout_s: float, reason: str) -> Any:
        lease = self.lease
        assert lease is not None
        lease.arm(timeout_s, reason)
        try:
            return next(it)
        finally:
            lease.deadline_s = None  # ``disarm``, inline: per request

    def first(self, it: Iterator[Any]) -> Any:
        try:
            return self._read(it, self.m.first_s, self.m.first_reason)
        except StopIteration:
            self.context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{self.short}: expected one request message, got none"
            )
            raise AssertionError("unreachable") from None

    def frames(self, it: Iterator[Any]) -> Iterator[Any]:
        m = self.m
        first = True
        while True:
            try:
                if first:
                    msg = self._read(it, m.stream_first_s, m.stream_first_reason)
                else:
                    msg = self._read(it, m.next_s, m.next_reason)
            except StopIteration:
                return
            first = False
            yield msg

    def sending(self) -> None:
        assert self.lease is not None
        self.lease.arm(self.m.reply_s, self.m.reply_reason)

    def sent(self) -> None:
        assert self.lease is not None
        self.lease.disarm()

    def replied(self) -> None:
        """A unary reply is made: the call keeps its places until the client takes it, at most
        ``read_timeout_s`` (then DEADLINE_EXCEEDED)."""
        assert self.lease is not None
        self.lease.arm(self.m.reply_s, self.m.reply_reason)
        self.keep = self.on_end

    def finish(self, ok: bool) -> None:
        """Count the outcome; log a failure the handler did not log itself."""
        ctx, lease = self.context, self.lease
        if self.refused:
            self.end()
            serving("")
            prepay(0)
            return
        exc = None if ok else sys.exc_info()[1]  # ok: no exception on its way out
        code = ctx.code() if hasattr(ctx, "code") else None
        if lease is not None and lease.fired:
            code, reason = lease.code, "timeout"
        elif code is None and (ok or isinstance(exc, GeneratorExit)):
            code, reason = grpc.StatusCode.OK if ok else grpc.StatusCode.CANCELLED, ""
        elif code is None:
            code = grpc.StatusCode.CANCELLED if not ctx.is_active() else grpc.StatusCode.UNKNOWN
            reason = ""
        else:
            reason = ""
        self.door.count(self.short, code, reason)
        # What an abort said (its exception is a bare ``Exception()``); only a failure is told.
        said = "" if code is grpc.StatusCode.OK else _details(ctx)
        # An undeclared probe refused once read (a declared one is judged before: see ``prepay``; a declared
        # one refused after, e.g. a reply over a small ``--max-message-mb``, was honest and is not held).
        undeclared_read = self.declared is None and self.read_bytes > PROBE_FREE_BYTES
        if self.lane == "probe" and code is grpc.StatusCode.INVALID_ARGUMENT and undeclared_read:
            self.door.penalize_probes(self.key[1], f"{self.read_bytes} bytes read, then refused: {said}")
        if not (ok and self.keep):  # a reply still to be taken keeps its places until the call ends
            self.end()
        serving("")
        prepay(0)
        logged_by_handler = self.method in _SELF_LOGGED and not reason and code is not grpc.StatusCode.UNKNOWN
        if code is grpc.StatusCode.OK or logged_by_handler:
            return
        level = logging.ERROR if code is grpc.StatusCode.UNKNOWN else logging.WARNING
        detail = (
            lease.reason if reason and lease is not None else (said or repr(exc) if exc is not None else said)[:300]
        )
        self.door.ratelog.event(
            "call_failed", level, peer=peer_address(self.peer), method=self.method, code=code.name, error=detail
        )


def _hold_reply(call: _Call, n: int) -> int:
    """Reserve ``reply_held_bytes(n)`` for a reply, owned by the call's lease until it is taken or the call
    ends; aborts RESOURCE_EXHAUSTED when they do not fit. Returns the bytes held (a Probe's: prepaid)."""
    need = reply_held_bytes(n if call.on_end and call.lane != "probe" else 0)
    if not need:
        return 0
    try:
        call.door.budget.reserve(need, f"{call.short}: its {n >> 20} MiB reply until it is taken")
    except RpcFailure as exc:
        call.context.abort(exc.code, exc.message)
        raise AssertionError("unreachable") from exc  # abort raises
    assert call.lease is not None
    if not call.lease.hold(need):  # the call ended meanwhile: nobody will take the reply
        call.door.budget.release(need)
        return 0
    return need


def _wrap(door: FrontDoor, h: grpc.RpcMethodHandler, m: _Method) -> grpc.RpcMethodHandler:
    """``h`` as a request-streaming handler that goes through the door first (a unary reply serialised here)."""
    kw = {"request_deserializer": h.request_deserializer, "response_serializer": h.response_serializer}
    if h.response_streaming:

        def streaming(request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
            call = _Call(door, m, context)
            call.enter()
            ok, held = False, 0
            try:
                if h.request_streaming:
                    replies = h.stream_stream(call.frames(request_iterator), context)
                else:
                    replies = h.unary_stream(call.first(request_iterator), context)
                for reply in replies:
                    # Serialised here to be counted: held until the next is handed to gRPC or the call ends.
                    data = reply if serialize is None else serialize(reply)
                    need = _hold_reply(call, len(data) if isinstance(data, bytes) else 0)
                    call.sending()
                    yield data
                    call.sent()
                    assert call.lease is not None
                    call.lease.unhold(held)  # the one before was taken
                    held = need
                ok = True
            finally:
                call.finish(ok)

        serialize, kw["response_serializer"] = kw["response_serializer"], None
        return grpc.stream_stream_rpc_method_handler(streaming, **kw)

    probe = m.lane == "probe"

    def unary(request_iterator: Iterator[Any], context: Any) -> Any:
        call = _Call(door, m, context)
        call.enter()
        ok = False
        try:
            if h.request_streaming:
                reply = h.stream_unary(call.frames(request_iterator), context)
            else:
                if probe:
                    call.prepay()
                request = call.first(request_iterator)
                if probe:
                    call.check_declared(request)
                reply = h.unary_unary(request, context)
            data = reply if h.response_serializer is None or reply is None else h.response_serializer(reply)
            if isinstance(data, bytes) and len(data) >= REPLY_COUNTED_BYTES:  # a smaller one holds nothing
                _hold_reply(call, len(data))
            ok = True
            call.replied()
            return data
        finally:
            call.finish(ok)

    return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=h.request_deserializer)


def _details(context: Any) -> str:
    said = context.details() if hasattr(context, "details") else b""
    return said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said or "")
