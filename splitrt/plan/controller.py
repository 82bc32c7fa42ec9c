"""The adaptive controller (pure): which plan to use for the next request, and why.

Per request it re-solves from the current link and load estimates and switches only when the predicted
gain beats a hysteresis threshold (relative and absolute), so stationary noise does not make it flap.
When the cloud is away it plans ``device`` (the whole model locally) and returns to splitting as soon
as the cloud is back. Every decision is a ``Decision`` whose JSON line holds all its inputs:
``replay`` feeds a log back through a fresh controller and must reproduce every decision.

No clocks, sockets or sessions here: ``now_s`` and the estimates come in as arguments.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from splitrt.errors import ConfigError
from splitrt.plan.costmodel import CLOUD_CUT, DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.netmon import LinkEstimate, LoadEstimate
from splitrt.plan.solver import OBJECTIVES, Plan, evaluate, solve


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    objective: str = "latency"
    # Switch only when the current plan is predicted to cost more than the best by both margins.
    hysteresis_fraction: float = 0.08
    hysteresis_ms: float = 1.0
    # Plans to keep warm: the best at these multiples of the estimated bandwidth.
    warm_bandwidth_factors: tuple[float, ...] = (0.25, 0.5, 2.0, 4.0)
    # Lossless by default: a lossy codec (fp16, int8) changes the answer, so it is the user's choice.
    # None allows every codec in the cost table.
    codecs: tuple[str, ...] | None = ("fp32",)
    # The cuts plans may use (None: every cut): a deployment's constraints (``plan.constraints``) or the
    # ``route`` policy (device and cloud only). ``device`` stays the fallback when the cloud is away.
    cuts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_switching(self.objective, self.hysteresis_fraction, self.hysteresis_ms)
        if self.cuts is not None and not self.cuts:
            raise ConfigError("cuts: expected None (every cut) or at least one cut id, got ()")


def check_switching(objective: str, hysteresis_fraction: float, hysteresis_ms: float) -> None:
    """The fields every controller config shares (two tiers here, three in ``plan.chain``)."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if not 0.0 <= hysteresis_fraction < 1.0:
        raise ConfigError(f"hysteresis_fraction: expected [0, 1), got {hysteresis_fraction!r}")
    if hysteresis_ms < 0:
        raise ConfigError(f"hysteresis_ms: expected >= 0, got {hysteresis_ms!r}")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One decision and everything it was made from (one JSON line in the decision log)."""

    t_s: float
    request: str
    bandwidth_mbps: float
    rtt_ms: float
    confidence: float
    device_load: float
    cloud_load: float
    cloud_available: bool
    previous: str | None  # plan key in use before this request
    plan: str  # plan key chosen
    best: str  # the solver's unconstrained best (differs from plan while hysteresis holds)
    predicted_ms: float
    objective_value: float
    switched: bool
    reason: str
    actual_ms: float | None = None
    fallback: bool = False
    server: str | None = None
    seq: int = 0  # decision order (log lines are written in completion order)
    extra: dict[str, object] = field(default_factory=dict)
    # The predicted terms of predicted_ms (they add up to it): device, transfer (the upload), download
    # (the reply, ``reply_bytes`` of it), the round trip the plan waits (0 for `device`), the cloud's
    # queue (0 for `device`), cloud. Logs made before the reply was its own term have it in transfer_ms.
    device_ms: float = 0.0
    transfer_ms: float = 0.0
    round_trip_ms: float = 0.0
    cloud_ms: float = 0.0
    queue_ms: float = 0.0
    download_ms: float = 0.0
    reply_bytes: int = 0
    # Input: the expected wait for a worker at the cloud (``LoadEstimate.queue_ms``); logs without it
    # were made before the queue was priced, and replay with 0.
    cloud_queue_ms: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> Decision:
        return Decision(**json.loads(line))

    def __str__(self) -> str:
        """One compact line for logs and tables; ``Decision.parse`` reads it back exactly, e.g.
        ``#3 t=1.5 c12@fp32 prev=c9@fp32 best=c12@fp32 switched bw=8.0 rtt=20.0 conf=0.9 dl=1.0 cl=1.0
        up pred=23.1 obj=23.1 req=r3 reason='bandwidth 8.0 Mbit/s'``."""
        words = [
            f"#{self.seq}",
            f"t={self.t_s!r}",
            self.plan,
            f"prev={self.previous or '-'}",
            f"best={self.best}",
            "switched" if self.switched else "held",
            f"bw={self.bandwidth_mbps!r}",
            f"rtt={self.rtt_ms!r}",
            f"conf={self.confidence!r}",
            f"dl={self.device_load!r}",
            f"cl={self.cloud_load!r}",
            "up" if self.cloud_available else "down",
            f"pred={self.predicted_ms!r}",
            f"obj={self.objective_value!r}",
            f"terms={self.device_ms!r}/{self.transfer_ms!r}/{self.round_trip_ms!r}/{self.cloud_ms!r}"
            + (f"/{self.queue_ms!r}" if self.queue_ms else ""),
        ]
        if self.download_ms or self.reply_bytes:
            words += [f"down={self.download_ms!r}", f"reply={self.reply_bytes}"]
        if self.cloud_queue_ms:
            words.append(f"cq={self.cloud_queue_ms!r}")
        if self.actual_ms is not None:
            words.append(f"actual={self.actual_ms!r}")
        if self.fallback:
            words.append("fallback")
        if self.server is not None:
            words.append(f"server={shlex.quote(self.server)}")
        words += [f"req={shlex.quote(self.request)}", f"reason={shlex.quote(self.reason)}"]
        if self.extra:
            words.append(f"extra={shlex.quote(json.dumps(self.extra, sort_keys=True))}")
        return " ".join(words)

    @staticmethod
    def parse(text: str) -> Decision:
        """The inverse of ``str(decision)``; raises ``ConfigError`` naming the word it cannot read."""
        try:
            words = shlex.split(text)
            seq = int(words[0].removeprefix("#"))
            plan, flags = words[2], set(words)
            kv = dict(w.split("=", 1) for w in words if "=" in w)
            previous = kv["prev"]
            terms = [float(x) for x in kv["terms"].split("/")] if "terms" in kv else [0.0] * 4
            terms += [0.0] * (5 - len(terms))  # the queue term is written only when not 0
            return Decision(
                seq=seq,
                t_s=float(kv["t"]),
                plan=plan,
                previous=None if previous == "-" else previous,
                best=kv["best"],
                switched="switched" in flags,
                bandwidth_mbps=float(kv["bw"]),
                rtt_ms=float(kv["rtt"]),
                confidence=float(kv["conf"]),
                device_load=float(kv["dl"]),
                cloud_load=float(kv["cl"]),
                cloud_available="up" in flags,
                predicted_ms=float(kv["pred"]),
                objective_value=float(kv["obj"]),
                actual_ms=float(kv["actual"]) if "actual" in kv else None,
                fallback="fallback" in flags,
                server=kv.get("server"),
                request=kv["req"],
                reason=kv["reason"],
                extra=json.loads(kv["extra"]) if "extra" in kv else {},
                device_ms=terms[0],
                transfer_ms=terms[1],
                round_trip_ms=terms[2],
                cloud_ms=terms[3],
                queue_ms=terms[4],
                cloud_queue_ms=float(kv.get("cq", 0.0)),
                download_ms=float(kv.get("down", 0.0)),
                reply_bytes=int(kv.get("reply", 0)),
            )
        except (IndexError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"decision: expected the form of str(Decision) ('#SEQ t=... PLAN prev=... "
                f"best=...'), got {text!r} ({exc!r})"
            ) from exc


def _objective_value(plan: Plan, objective: str) -> float:
    if objective == "energy":
        return plan.energy_mj
    if objective == "throughput":
        return plan.period_ms
    return plan.predicted_ms


class Controller:
    """Holds the current plan; ``decide`` is a pure function of (state, inputs)."""

    def __init__(
        self, table: CostTable, config: ControllerConfig | None = None, *, power: Power = DEFAULT_POWER
    ) -> None:
        self.table = table
        self.config = config or ControllerConfig()
        self.power = power
        self.current: str | None = None
        self.switches = 0
        self._seq = 0
        self._forced_device = False  # the current plan is `device` only because the cloud was away

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _conditions(self, link: LinkEstimate, load: LoadEstimate) -> Conditions:
        return Conditions(
            link=Link(bandwidth_mbps=max(link.bandwidth_mbps, 1e-6), rtt_ms=max(link.rtt_ms, 0.0)),
            device_load=max(load.device_factor, 1e-3),
            cloud_load=max(load.cloud_factor, 1e-3),
            queue_ms=max(load.queue_ms, 0.0),
        )

    def decide(
        self, now_s: float, link: LinkEstimate, load: LoadEstimate, *, cloud_available: bool = True, request: str = ""
    ) -> Decision:
        cfg = self.config
        cond = self._conditions(link, load)
        previous = self.current
        if not cloud_available:
            best = evaluate(self.table, DEVICE_CUT, cond, objective=cfg.objective, power=self.power)
            chosen, reason = best, "cloud unavailable: whole model on the device"
        else:
            best = solve(
                self.table,
                cond,
                objective=cfg.objective,
                power=self.power,
                codecs=list(cfg.codecs) if cfg.codecs else None,
                cuts=list(cfg.cuts) if cfg.cuts else None,
            )
            chosen, reason = best, "first plan" if previous is None else "best plan unchanged"
            if previous is not None and previous != best.key:
                current = evaluate(self.table, previous, cond, objective=cfg.objective, power=self.power)
                cur_v = _objective_value(current, cfg.objective)
                best_v = _objective_value(best, cfg.objective)
                gain = cur_v - best_v
                margin = max(cfg.hysteresis_ms, cfg.hysteresis_fraction * cur_v)
                if previous == DEVICE_CUT and self._forced_device:
                    reason = "cloud back: splitting again"
                elif gain > margin and math.isfinite(cur_v):
                    reason = f"gain {gain:.2f} > margin {margin:.2f}"
                else:
                    chosen = current
                    reason = f"hold: gain {gain:.2f} <= margin {margin:.2f}"
        self._forced_device = not cloud_available
        extra: dict[str, object] = {}
        if cfg.cuts is not None and cloud_available:  # what the allowed cuts cost here (priced per decision)
            free = solve(
                self.table,
                cond,
                objective=cfg.objective,
                power=self.power,
                codecs=list(cfg.codecs) if cfg.codecs else None,
            )
            extra = {
                "unconstrained": free.key,
                "constraint_cost": _objective_value(chosen, cfg.objective) - _objective_value(free, cfg.objective),
            }
        switched = previous is not None and chosen.key != previous
        self.switches += int(switched)
        self.current = chosen.key
        return Decision(
            seq=self.next_seq(),
            t_s=now_s,
            request=request,
            bandwidth_mbps=link.bandwidth_mbps,
            rtt_ms=link.rtt_ms,
            confidence=link.confidence,
            device_load=load.device_factor,
            cloud_load=load.cloud_factor,
            cloud_available=cloud_available,
            previous=previous,
            plan=chosen.key,
            best=best.key,
            predicted_ms=chosen.predicted_ms,
            objective_value=_objective_value(chosen, cfg.objective),
            switched=switched,
            reason=reason,
            device_ms=chosen.device_ms,
            transfer_ms=chosen.transfer_ms,
            round_trip_ms=chosen.rtt_ms,
            cloud_ms=chosen.cloud_ms,
            queue_ms=chosen.queue_ms,
            cloud_queue_ms=load.queue_ms,
            download_ms=chosen.download_ms,
            reply_bytes=chosen.reply_bytes,
            extra=extra,
        )

    def warm_plans(self, link: LinkEstimate, load: LoadEstimate) -> list[str]:
        """Plans likely to be chosen next (current, and best if bandwidth moved by the warm factors):
        the runtime keeps their head sessions built so a switch costs no session build."""
        keys: dict[str, None] = {}
        if self.current:
            keys[self.current] = None
        for f in (1.0, *self.config.warm_bandwidth_factors):
            est = LinkEstimate(bandwidth_mbps=link.bandwidth_mbps * f, rtt_ms=link.rtt_ms, confidence=link.confidence)
            plan = solve(
                self.table,
                self._conditions(est, load),
                objective=self.config.objective,
                power=self.power,
                codecs=list(self.config.codecs) if self.config.codecs else None,
                cuts=list(self.config.cuts) if self.config.cuts else None,
            )
            keys[plan.key] = None
        return list(keys)


ROUTE_CUTS = (CLOUD_CUT, DEVICE_CUT)  # whole-request routing: the whole model here or there


def parse_policy(spec: str) -> tuple[str, str]:
    """``adaptive`` | ``route`` | ``periodic:SECONDS`` | ``fixed:PLAN`` -> (kind, argument); ConfigError
    otherwise."""
    kind, _, arg = spec.partition(":")
    if (
        kind not in ("adaptive", "route", "periodic", "fixed")
        or (kind in ("adaptive", "route") and arg)
        or (kind not in ("adaptive", "route") and not arg)
    ):
        raise ConfigError(f"policy: expected adaptive, route, periodic:SECONDS or fixed:PLAN, got {spec!r}")
    if kind == "periodic":
        try:
            ok = float(arg) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"policy: periodic needs a period > 0 seconds, got {arg!r}")
    return kind, arg


class Policy:
    """What a strategy plans per request, pure like the controller it wraps: ``adaptive`` asks the
    controller every request; ``route`` is adaptive over the cuts ``device`` and ``cloud`` only (whole-request
    routing, what hybrid-inference platforms ship: the baseline splitting must beat; it narrows the
    controller's ``config.cuts``); ``periodic:S`` asks every S seconds and keeps that plan in between
    (REAP-style); ``fixed:PLAN`` never re-plans (``device``, ``cloud@fp16``, ``CUT@CODEC``). The device
    runtime and the trace simulator (``splitrt.rig.sim``) both decide through this class, so they cannot
    drift apart."""

    def __init__(self, spec: str, controller: Controller) -> None:
        from splitrt.errors import PlanError
        from splitrt.plan.solver import parse_plan

        kind, arg = parse_policy(spec)
        table = controller.table
        if kind == "fixed":  # a typo in a fixed plan fails here, not on every request
            try:
                cut, codec = parse_plan(arg, table.codecs[0])
                table.index(cut)
                table.codec_index(codec)
            except PlanError as exc:
                raise ConfigError(f"policy {spec!r}: {exc}") from exc
        if kind == "route":
            controller.config = route_config(controller.config)
        self.spec, self.kind, self.arg = spec, kind, arg
        self.controller = controller
        self._periodic_next_s = 0.0
        self._periodic_plan: str | None = None

    def decide(
        self, now_s: float, link: LinkEstimate, load: LoadEstimate, *, cloud_available: bool = True, request: str = ""
    ) -> Decision:
        ctl = self.controller
        if self.kind == "fixed":
            return self._imposed(now_s, link, load, self.arg, cloud_available, request)
        if self.kind == "periodic" and self._periodic_plan is not None and now_s < self._periodic_next_s:
            return self._imposed(now_s, link, load, self._periodic_plan, cloud_available, request)
        d = ctl.decide(now_s, link, load, cloud_available=cloud_available, request=request)
        if self.kind == "periodic":
            self._periodic_next_s = now_s + float(self.arg)
            self._periodic_plan = d.plan
        return d

    def _imposed(
        self, now_s: float, link: LinkEstimate, load: LoadEstimate, plan: str, cloud_available: bool, request: str
    ) -> Decision:
        from splitrt.plan.solver import parse_plan

        ctl = self.controller
        cut, codec = parse_plan(plan, ctl.table.codecs[0])
        if not cloud_available:
            cut = DEVICE_CUT
        key = cut if cut == DEVICE_CUT else f"{cut}@{codec}"
        p = evaluate(
            ctl.table, (cut, codec), ctl._conditions(link, load), objective=ctl.config.objective, power=ctl.power
        )
        prev = ctl.current
        switched = prev is not None and prev != key
        ctl.current = key
        return Decision(
            seq=ctl.next_seq(),
            t_s=now_s,
            request=request,
            bandwidth_mbps=link.bandwidth_mbps,
            rtt_ms=link.rtt_ms,
            confidence=link.confidence,
            device_load=load.device_factor,
            cloud_load=load.cloud_factor,
            cloud_available=cloud_available,
            previous=prev,
            plan=key,
            best=key,
            predicted_ms=p.predicted_ms,
            objective_value=p.predicted_ms,
            switched=switched,
            reason=f"policy {self.spec}",
            device_ms=p.device_ms,
            transfer_ms=p.transfer_ms,
            round_trip_ms=p.rtt_ms,
            cloud_ms=p.cloud_ms,
            queue_ms=p.queue_ms,
            cloud_queue_ms=load.queue_ms,
            download_ms=p.download_ms,
            reply_bytes=p.reply_bytes,
        )


def route_config(config: ControllerConfig) -> ControllerConfig:
    """``config`` restricted to whole-request routing (and to its own cuts, if it has any)."""
    cuts = tuple(c for c in ROUTE_CUTS if config.cuts is None or c in config.cuts)
    if not cuts:
        raise ConfigError(
            f"policy route: the allowed cuts {list(config.cuts or ())} include neither {CLOUD_CUT} nor {DEVICE_CUT}"
        )
    return replace(config, cuts=cuts)


def replay(
    lines: Iterable[str],
    table: CostTable,
    config: ControllerConfig | None = None,
    *,
    power: Power = DEFAULT_POWER,
    model: str | None = None,
) -> list[tuple[Decision, Decision]]:
    """Re-run a decision log through a fresh controller: pairs of (logged, replayed) decisions.

    Lines are taken in decision order (``seq``). A decision a fixed or periodic policy imposed
    (reason ``policy ...``) is not the controller's: replay adopts it as the plan in use and goes on.
    ``model`` (a sha256 prefix) picks one model's lines from a daemon's shared log. A log whose
    decisions carry ``extra["policy"] == "route"`` replays under ``route_config(config)``.
    """
    ctl = Controller(table, config, power=power)
    logged_all = sorted((Decision.from_json(line) for line in lines if line.strip()), key=lambda d: d.seq)
    if model is not None:
        logged_all = [d for d in logged_all if str(d.extra.get("model", "")).startswith(model[:16])]
    if any(d.extra.get("policy") == "route" for d in logged_all):
        ctl.config = route_config(ctl.config)
    pairs = []
    for logged in logged_all:
        if logged.reason.startswith("policy "):
            ctl.current = logged.plan
            ctl._forced_device = not logged.cloud_available
            pairs.append((logged, logged))
            continue
        again = ctl.decide(
            logged.t_s,
            LinkEstimate(bandwidth_mbps=logged.bandwidth_mbps, rtt_ms=logged.rtt_ms, confidence=logged.confidence),
            LoadEstimate(
                device_factor=logged.device_load, cloud_factor=logged.cloud_load, queue_ms=logged.cloud_queue_ms
            ),
            cloud_available=logged.cloud_available,
            request=logged.request,
        )
        pairs.append((logged, again))
    return pairs
