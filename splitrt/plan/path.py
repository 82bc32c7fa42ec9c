"""Cuts over a path of tiers (pure): the device, then 0..k servers; one cut and one codec per hop.

A path of N tiers has N-1 hops. A ``Plan`` holds ``cuts[h]`` (where hop ``h`` hands the request from
tier ``h`` to tier ``h + 1``) and ``codecs[h]`` (how hop ``h`` encodes the crossing tensors). Cuts are
non-decreasing in the tables' topological order, so tier ``t`` runs the segment between the cut before
it and its own:

- tier 0 (the device) runs ``head_ms[cuts[0]]``;
- a middle tier runs ``head_ms[cuts[t]] - head_ms[cuts[t - 1]]`` of its own table (exact when that
  profile's head times are prefix sums of chain segments, as the profiler writes them; clipped at 0);
- the last tier runs ``tail_ms[cuts[-1]]``.

Once a cut is ``device`` the tier before it finishes: later hops carry nothing and later tiers run
nothing. A hop that carries the request costs its upload + the reply + its RTT + the receiving tier's
queue. Two tiers are the N=2 case: ``solve_path([t, t], ...)`` is ``solver.solve(t, ...)``
(``tests/plan/test_path.py`` checks it, the three-tier formula and brute force on random tables).

The solver is a dynamic programme over stages: the best cost of "tiers 0..t done, hop t at cut c" is a
running minimum over the previous cut when the middle tier's head times never decrease (O(cuts x codecs)
a hop), O(cuts^2) otherwise and for throughput (a bottleneck, min over paths of the slowest stage).
Latency and energy add stage by stage; energy weights the device's own compute by ``active_w``, its
upload by ``send_w`` and every other millisecond by ``idle_w``. Ties go to the earlier cut.

String form: hops joined by ``>``, each ``<cut>@<codec>`` or ``device`` (``c3@fp16>c12@int8``,
``c5@fp32>device``); two tiers read exactly as ``solver.parse_plan`` does.

- ``path.Plan`` is the one plan type for any number of tiers: ``cuts``/``codecs`` (one per hop, cuts
  non-decreasing), ``objective``, ``predicted_ms``, ``energy_mj``, ``period_ms``, ``tier_ms`` (per tier),
  ``hop_upload_ms``/``hop_download_ms``/``hop_rtt_ms``/``hop_queue_ms``/``hop_bytes``/``hop_sent_bytes`` (per
  hop), ``reply_bytes``; the terms add up to ``predicted_ms`` (``tests/plan/test_terms.py``, ``test_path.py``);
  two tiers read ``.cut``, ``.codec``, ``.device_ms``, ``.transfer_ms``, ``.download_ms``, ``.rtt_ms``,
  ``.queue_ms``, ``.cloud_ms``, ``.bytes``, ``.sent_bytes`` (hop 0, the first and last tier, sums over hops);
  ``.value`` is what the objective minimises. ``path.solve_path(tables, PathConditions(hops, loads, queue_ms),
  *, objective, power, codecs, cuts=[per hop], same_codec=False) -> Plan``, ``evaluate_path(tables,
  "c3@fp16>c12@fp16", cond)``; the string form stops at the first ``device`` hop (``c5@fp32>device``,
  ``device``) and ``parse_path(text, hops=N)`` pads it back. PlanError on bad input.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from splitrt.errors import PlanError
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, MS_PER_BYTE_AT_1MBPS, CostTable, FloatArray, Link, Power
from splitrt.plan.objective import check_objective, objective_value

IntArray = npt.NDArray[np.intp]


@dataclass(frozen=True, kw_only=True)
class PathConditions:
    """One link per hop, one load multiplier per tier, the expected queue at each receiving tier (ms)."""

    hops: tuple[Link, ...]
    loads: tuple[float, ...]
    queue_ms: tuple[float, ...] = ()  # one per hop (the wait at tier h + 1); empty: none

    def __post_init__(self) -> None:
        if len(self.loads) != len(self.hops) + 1:
            raise PlanError(f"expected {len(self.hops) + 1} loads (one per tier), got {len(self.loads)}")
        if self.queue_ms and len(self.queue_ms) != len(self.hops):
            raise PlanError(f"expected {len(self.hops)} queue_ms (one per hop), got {len(self.queue_ms)}")
        for name, values in (("loads", self.loads), ("queue_ms", self.queue_ms)):
            if not all(math.isfinite(v) and (v > 0 if name == "loads" else v >= 0) for v in values):
                raise PlanError(f"{name} must be finite and {'> 0' if name == 'loads' else '>= 0'}, got {values}")
        for h, link in enumerate(self.hops):
            if not link.bandwidth_mbps > 0:
                raise PlanError(f"hop {h}: bandwidth must be > 0 Mbit/s, got {link.bandwidth_mbps!r}")

    def queue(self, hop: int) -> float:
        return self.queue_ms[hop] if self.queue_ms else 0.0


class HopTerms:
    """A plan's per-hop time terms summed over its hops (``Plan``, ``Decision``): the wire up and down, the
    wait for a worker, the sender's encode and call, the receiver's decode."""

    hop_upload_ms: tuple[float, ...]
    hop_download_ms: tuple[float, ...]
    hop_queue_ms: tuple[float, ...]
    hop_encode_ms: tuple[float, ...]
    hop_call_ms: tuple[float, ...]
    hop_decode_ms: tuple[float, ...]

    @property
    def transfer_ms(self) -> float:
        return sum(self.hop_upload_ms)

    @property
    def download_ms(self) -> float:
        return sum(self.hop_download_ms)

    @property
    def queue_ms(self) -> float:
        return sum(self.hop_queue_ms)

    @property
    def encode_ms(self) -> float:
        return sum(self.hop_encode_ms)

    @property
    def call_ms(self) -> float:
        return sum(self.hop_call_ms)

    @property
    def decode_ms(self) -> float:
        return sum(self.hop_decode_ms)


@dataclass(frozen=True, kw_only=True)
class Plan(HopTerms):
    """Chosen cuts and codecs over a path of tiers (one per hop), and what they are predicted to cost.

    The terms add up: ``sum(tier_ms) + sum(hop_upload_ms) + sum(hop_download_ms) + sum(hop_rtt_ms) + sum(hop_queue_ms)
    + sum(hop_encode_ms) + sum(hop_call_ms) + sum(hop_decode_ms) == predicted_ms``; a hop that carries nothing has 0
    in every hop term. Two tiers read through the convenience properties (``cut``, ``codec``, ``device_ms``,
    ``transfer_ms``, ...), which are hop 0's (or the sum over hops, for the time terms) and the first and last tier's.
    """

    cuts: tuple[str, ...]
    codecs: tuple[str, ...]
    objective: str
    predicted_ms: float  # end-to-end latency of one request
    energy_mj: float  # device energy per request
    period_ms: float  # pipelined frame period (1000 / throughput)
    tier_ms: tuple[float, ...]  # compute on each tier (the device first)
    hop_upload_ms: tuple[float, ...]  # each hop: the crossing tensors, after its codec
    hop_download_ms: tuple[float, ...]  # each hop: the reply
    hop_rtt_ms: tuple[float, ...]  # each hop's round trip (0 when it carries nothing)
    hop_queue_ms: tuple[float, ...]  # the expected wait for a worker at the tier after each hop
    hop_bytes: tuple[int, ...]  # raw crossing bytes of each hop
    hop_sent_bytes: tuple[int, ...]  # after its codec
    reply_bytes: int = 0  # the graph outputs the servers make (those the head made stay on the device)
    # What sending costs beyond the wire, per hop (0 where it carries nothing; empty: not priced): the
    # sending tier encodes, pays one call's fixed cost, the receiving tier decodes.
    hop_encode_ms: tuple[float, ...] = ()
    hop_call_ms: tuple[float, ...] = ()
    hop_decode_ms: tuple[float, ...] = ()

    @functools.cached_property
    def key(self) -> str:  # read several times per decision: formatted once
        return format_path(self.cuts, self.codecs)

    @property
    def value(self) -> float:
        """What ``objective`` minimises (ms, mJ or ms per frame)."""
        return objective_value(
            self.objective, latency_ms=self.predicted_ms, energy_mj=self.energy_mj, period_ms=self.period_ms
        )

    # -- two-tier reading: hop 0, the first and the last tier, the sums ---------------------------------
    @property
    def cut(self) -> str:
        return self.cuts[0]

    @property
    def codec(self) -> str:
        return self.codecs[0]

    @property
    def device_ms(self) -> float:
        return self.tier_ms[0]

    @property
    def cloud_ms(self) -> float:
        return self.tier_ms[-1]

    @property
    def rtt_ms(self) -> float:
        return sum(self.hop_rtt_ms)

    @property
    def bytes(self) -> int:
        return self.hop_bytes[0]

    @property
    def sent_bytes(self) -> int:
        return self.hop_sent_bytes[0]

    def __str__(self) -> str:
        return self.key


def format_plan(cut: str, codec: str) -> str:
    """One hop: ``c12@fp16``, or ``device`` when it carries nothing."""
    return cut if cut == DEVICE_CUT else f"{cut}@{codec}"


def parse_plan(text: str, default_codec: str = "fp32") -> tuple[str, str]:
    """``"c12@fp16"`` -> ``("c12", "fp16")``; ``"device"`` -> ``("device", default_codec)``."""
    cut, sep, codec = text.strip().partition("@")
    if not cut or (sep and not codec) or ">" in cut:
        raise PlanError(f"expected a plan like 'c12@fp16' or 'device', got {text!r}")
    return cut, codec if sep else default_codec


def format_path(cuts: Sequence[str], codecs: Sequence[str]) -> str:
    """Hops up to the first ``device`` (the hops after it carry nothing): ``c3@fp16>c12@int8``,
    ``c5@fp32>device``, ``device``."""
    words = []
    for c, k in zip(cuts, codecs, strict=True):
        words.append(format_plan(c, k))
        if c == DEVICE_CUT:
            break
    return ">".join(words)


def parse_path(
    text: str, default_codec: str = "fp32", hops: int | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``"c3@fp16>c12@int8"`` -> ``(("c3", "c12"), ("fp16", "int8"))``; ``"device"`` -> one hop, or
    ``hops`` of them (a form that ends in ``device`` is padded with ``device``: nothing goes further)."""
    parsed = [parse_plan(part, default_codec) for part in text.strip().split(">")]
    if hops is not None and len(parsed) < hops and parsed[-1][0] == DEVICE_CUT:
        parsed += [(DEVICE_CUT, default_codec)] * (hops - len(parsed))
    return tuple(c for c, _ in parsed), tuple(k for _, k in parsed)


@dataclass(frozen=True)
class _Stages:
    """Per-stage costs of one objective, for the DP and for re-costing a plan."""

    tier: list[FloatArray]  # the first and the last tier's compute (weighted), (n,) each
    mid: list[FloatArray]  # the head times of middle tiers (weighted), (n,)
    hop: list[FloatArray]  # (n, codecs) per hop


def _check(tables: Sequence[CostTable], cond: PathConditions, objective: str) -> None:
    check_objective(objective)
    if len(tables) < 2:
        raise PlanError(f"a path needs at least 2 tiers, got {len(tables)}")
    if len(cond.hops) != len(tables) - 1:
        raise PlanError(f"expected {len(tables) - 1} hops for {len(tables)} tiers, got {len(cond.hops)}")
    first = tables[0]
    for t, table in enumerate(tables[1:], start=1):
        if table.ids != first.ids or table.codecs != first.codecs:
            raise PlanError(f"tier {t}: expected the same cuts and codecs as tier 0, got a different table")


def _terms(tables: Sequence[CostTable], cond: PathConditions) -> dict[str, list[FloatArray]]:
    """Unweighted ms terms: compute per tier, and per hop upload / reply / rtt+queue (masked by ``sends``),
    the sender's encode + call (``enc``) and the receiver's decode (``dec``), (cuts, codecs) each."""
    base = tables[0]
    sends = base.sends
    reply = np.broadcast_to(np.asarray(base.reply_bytes, dtype=np.float64), sends.shape)
    up, back, fixed, enc, dec = [], [], [], [], []
    for h, link in enumerate(cond.hops):
        up.append(base.sent_bytes * MS_PER_BYTE_AT_1MBPS / link.bandwidth_mbps)
        back.append(np.where(sends, reply * MS_PER_BYTE_AT_1MBPS / link.bandwidth_mbps, 0.0))
        fixed.append(np.where(sends, link.rtt_ms + cond.queue(h), 0.0))
        sender, receiver = tables[h], tables[h + 1]
        enc.append((sender.encode_ms + sender.call_ms * sends[:, None]) * cond.loads[h])
        dec.append(receiver.decode_ms * cond.loads[h + 1])
    compute = [tables[0].head_ms * cond.loads[0]]
    compute += [t.head_ms * load for t, load in zip(tables[1:-1], cond.loads[1:-1], strict=True)]
    compute.append(tables[-1].tail_ms * cond.loads[-1])
    return {"compute": compute, "up": up, "back": back, "fixed": fixed, "enc": enc, "dec": dec}


def _argmin_first(values: FloatArray) -> int:
    best = float(values.min())
    if not math.isfinite(best):
        raise PlanError("no feasible plan: every candidate is excluded or infinite")
    return int(np.flatnonzero(values <= best + abs(best) * 1e-12)[0])


def _codec_choice(hop_cost: FloatArray, allowed: npt.NDArray[np.bool_]) -> tuple[FloatArray, IntArray]:
    masked = np.where(allowed[None, :], hop_cost, np.inf)
    k = np.argmin(masked, axis=1)
    return masked[np.arange(len(masked)), k], k


def _advance(prev: FloatArray, seg_of: FloatArray, additive: bool) -> tuple[FloatArray, IntArray]:
    """Best over a <= b of ``prev[a] (+ or max) seg(a, b)``, with the arg a, for a middle tier whose
    (weighted) head times are ``seg_of``: seg(a, b) = max(seg_of[b] - seg_of[a], 0)."""
    n = len(prev)
    if additive and bool(np.all(np.diff(seg_of) >= 0)):
        u = prev - seg_of
        running = np.minimum.accumulate(u)
        before = np.concatenate([[np.inf], running[:-1]])
        arg = np.maximum.accumulate(np.where(u < before, np.arange(n), 0))
        return running + seg_of, arg
    seg = np.clip(seg_of[None, :] - seg_of[:, None], 0.0, None)  # (a, b)
    cand = prev[:, None] + seg if additive else np.maximum(prev[:, None], seg)
    cand = np.where(np.triu(np.ones((n, n), dtype=bool)), cand, np.inf)
    arg = np.argmin(cand, axis=0)
    return cand[arg, np.arange(n)], arg


def _stage_weights(terms: dict[str, list[FloatArray]], objective: str, power: Power) -> _Stages:
    """Each stage's contribution to the objective: latency and energy add, throughput takes the max."""
    compute, up, back, fixed = terms["compute"], terms["up"], terms["back"], terms["fixed"]
    enc, dec = terms["enc"], terms["dec"]
    if objective == "throughput":
        # the link is busy, the RTT is not; a sender that encodes, a receiver that decodes are busy too
        # (hop h's sender is tier h: the device's compute joins its encode on the first hop)
        hops = [
            np.maximum(np.maximum(u + b[:, None], e + (compute[0][:, None] if h == 0 else 0.0)), d)
            for h, (u, b, e, d) in enumerate(zip(up, back, enc, dec, strict=True))
        ]
        hops[-1] = np.maximum(hops[-1], dec[-1] + compute[-1][:, None])
        return _Stages(tier=[compute[0], compute[-1]], mid=compute[1:-1], hop=hops)
    if objective == "latency":
        hops = [u + e + d + (b + f)[:, None] for u, b, f, e, d in zip(up, back, fixed, enc, dec, strict=True)]
        return _Stages(tier=[compute[0], compute[-1]], mid=compute[1:-1], hop=hops)
    idle = power.idle_w
    hops = [idle * (u + e + d + (b + f)[:, None]) for u, b, f, e, d in zip(up, back, fixed, enc, dec, strict=True)]
    hops[0] = power.send_w * up[0] + power.active_w * enc[0] + idle * (dec[0] + (back[0] + fixed[0])[:, None])
    return _Stages(
        tier=[power.active_w * compute[0], idle * compute[-1]], mid=[idle * m for m in compute[1:-1]], hop=hops
    )


def _dp(
    st: _Stages, allowed_k: npt.NDArray[np.bool_], cut_masks: list[FloatArray | None], additive: bool
) -> tuple[float, list[int], list[int]]:
    """(best value, cut index per hop, codec index per hop) by the stage-by-stage programme."""
    combine = np.add if additive else np.maximum
    back_args: list[IntArray] = []
    chosen_k: list[IntArray] = []
    best: FloatArray = st.tier[0]
    for h, mask in enumerate(cut_masks):
        if h > 0:
            best, arg = _advance(best, st.mid[h - 1], additive)
            back_args.append(arg)
        hop_cost, k = _codec_choice(st.hop[h], allowed_k)
        chosen_k.append(k)
        best = combine(best, hop_cost)
        if mask is not None:
            best = best + mask
    best = combine(best, st.tier[1])
    # Walk back from the last hop's cut.
    idx = [_argmin_first(best)]
    for arg in reversed(back_args):
        idx.append(int(arg[idx[-1]]))
    idx.reverse()
    return float(best[idx[-1]]), idx, [int(chosen_k[h][i]) for h, i in enumerate(idx)]


def solve_path(
    tables: Sequence[CostTable],
    cond: PathConditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
    cuts: Sequence[Sequence[str] | None] | None = None,
    same_codec: bool = False,
) -> Plan:
    """The best cuts and codecs over the path (see the module's docstring). ``codecs`` restricts every
    hop's codec; ``cuts[h]`` (None: any) restricts hop h's cut (e.g. ``[None, ["device"]]``: the middle
    tier finishes); ``same_codec``: one codec on every hop (near-ties -> lower latency, fewer bytes)."""
    _check(tables, cond, objective)
    base = tables[0]
    ks = [base.codec_index(c) for c in (base.codecs if codecs is None else codecs)]
    if not ks:
        raise PlanError("no codec to plan with")
    cut_masks: list[FloatArray | None] = [None] * (len(tables) - 1)
    for h, allowed in enumerate(cuts or ()):
        if allowed is not None:
            cut_masks[h] = np.full(len(base), np.inf)
            cut_masks[h][[base.index(c) for c in allowed]] = 0.0  # type: ignore[index]
    st = _stage_weights(_terms(tables, cond), objective, power)
    codec_sets = [[k] for k in ks] if same_codec else [ks]
    found: list[tuple[float, list[int], list[int]]] = []
    for subset in codec_sets:
        allowed_k = np.zeros(len(base.codecs), dtype=bool)
        allowed_k[subset] = True
        try:
            found.append(_dp(st, allowed_k, cut_masks, objective != "throughput"))
        except PlanError:
            continue  # nothing feasible with this codec
    if not found:
        raise PlanError("no feasible plan: every candidate is excluded or infinite")
    low = min(v for v, _, _ in found)
    plans = [
        evaluate_path(
            tables,
            (tuple(base.ids[i] for i in idx), tuple(base.codecs[k] for k in kk)),
            cond,
            objective=objective,
            power=power,
        )
        for v, idx, kk in found
        if v <= low + abs(low) * 1e-12
    ]
    return min(plans, key=lambda p: (p.predicted_ms, sum(p.hop_sent_bytes)))


def evaluate_path(
    tables: Sequence[CostTable],
    plan: str | tuple[Sequence[str], Sequence[str]],
    cond: PathConditions,
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
) -> Plan:
    """What a given plan (``"c3@fp16>c12@int8"`` or ``(cuts, codecs)``) costs under ``cond``."""
    _check(tables, cond, objective)
    base = tables[0]
    hops = len(tables) - 1
    plan_cuts, plan_codecs = parse_path(plan, base.codecs[0], hops) if isinstance(plan, str) else plan
    if len(plan_cuts) != hops or len(plan_codecs) != len(plan_cuts):
        raise PlanError(f"expected {hops} hops, got the plan {format_path(plan_cuts, plan_codecs)!r}")
    idx = [base.index(c) for c in plan_cuts]
    if any(b < a for a, b in itertools.pairwise(idx)):
        raise PlanError(f"expected non-decreasing cuts, got {'>'.join(plan_cuts)}")
    # A hop that carries nothing has no codec: recorded as the tables' first, as ``parse_path`` reads it.
    plan_codecs = tuple(base.codecs[0] if c == DEVICE_CUT else k for c, k in zip(plan_cuts, plan_codecs, strict=True))
    ks = [base.codec_index(k) for k in plan_codecs]
    terms = _terms(tables, cond)
    compute = terms["compute"]
    tier = [float(compute[0][idx[0]])]
    tier += [max(float(compute[t][idx[t]] - compute[t][idx[t - 1]]), 0.0) for t in range(1, len(idx))]
    tier.append(float(compute[-1][idx[-1]]))
    up = tuple(float(terms["up"][h][i, k]) for h, (i, k) in enumerate(zip(idx, ks, strict=True)))
    down = tuple(float(terms["back"][h][i]) for h, i in enumerate(idx))
    sends = [bool(base.sends[i]) for i in idx]
    rtt = tuple(cond.hops[h].rtt_ms if s else 0.0 for h, s in enumerate(sends))
    queue = tuple(cond.queue(h) if s else 0.0 for h, s in enumerate(sends))
    encode = tuple(
        float(tables[h].encode_ms[i, k] * cond.loads[h]) for h, (i, k) in enumerate(zip(idx, ks, strict=True))
    )
    call = tuple(tables[h].call_ms * cond.loads[h] if s else 0.0 for h, s in enumerate(sends))
    decode = tuple(
        float(tables[h + 1].decode_ms[i, k] * cond.loads[h + 1]) for h, (i, k) in enumerate(zip(idx, ks, strict=True))
    )
    latency = sum(tier) + sum(up) + sum(down) + sum(rtt) + sum(queue) + sum(encode) + sum(call) + sum(decode)
    busy = tier[0] + encode[0] + call[0]  # the device computing
    waiting = latency - busy - up[0]
    reply = np.broadcast_to(np.asarray(base.reply_bytes), (len(base),))
    # as the solver's stages: a hop is busy on the wire, at its sender (encode + call; the device's compute
    # joins its first hop) and at its receiver (decode; the last tier's compute joins the last hop's)
    hop_busy = [
        max(u + d, e + c + (tier[0] if h == 0 else 0.0), x)
        for h, (u, d, e, c, x) in enumerate(zip(up, down, encode, call, decode, strict=True))
    ]
    return Plan(
        cuts=tuple(plan_cuts),
        codecs=tuple(plan_codecs),
        objective=objective,
        predicted_ms=latency,
        energy_mj=power.active_w * busy + power.send_w * up[0] + power.idle_w * waiting,
        period_ms=max([*tier, *hop_busy, decode[-1] + tier[-1]]),
        tier_ms=tuple(tier),
        hop_upload_ms=up,
        hop_download_ms=down,
        hop_rtt_ms=rtt,
        hop_queue_ms=queue,
        hop_bytes=tuple(int(base.bytes[i]) for i in idx),
        hop_sent_bytes=tuple(int(base.sent_bytes[i, k]) for i, k in zip(idx, ks, strict=True)),
        reply_bytes=int(reply[idx[0]]),
        hop_encode_ms=encode,
        hop_call_ms=call,
        hop_decode_ms=decode,
    )


__all__ = [
    "PathConditions",
    "Plan",
    "evaluate_path",
    "format_path",
    "format_plan",
    "parse_path",
    "parse_plan",
    "solve_path",
]
