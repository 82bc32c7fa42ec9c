"""What the adaptive runtime learns from one request, as values: the estimators' samples (one
``plan.observe.RequestObservation``: the device's run, each server tier's reply, the answering server's load
report) and what it took beyond its price (a ``plan.correction.Observation``). The rules that turn them into
estimates live in ``plan`` (``plan.observe.observe_request``, ``Controller.observe``), where the simulator
uses them too; the runtime feeds both under its lock.

- ``observation(tables, cut, head, res, *, tier, next_cut, queue) -> RequestObservation``: ``tier`` the server
  tier that answered (None: finished here), ``next_cut`` the cut it was asked to forward from (a relay).
- ``correction(decision, head, res, *, answered, latency_ms, t_s, load_lag=0) -> Observation``.
"""

from __future__ import annotations

from collections.abc import Sequence

from splitrt.device.client.messages import HeadResult, Hops, SplitResult
from splitrt.plan.controller import Decision
from splitrt.plan.correction import Observation
from splitrt.plan.costmodel import DEVICE_CUT, MS_PER_BYTE_AT_1MBPS, CostTable
from splitrt.plan.observe import LocalRun, QueueReport, ReplyObservation, RequestObservation, TierReply

__all__ = ["correction", "observation", "tier_reply"]


def observation(
    tables: Sequence[CostTable],
    cut: str,
    head: HeadResult,
    res: SplitResult,
    *,
    tier: int | None,
    next_cut: str | None = None,
    queue: QueueReport | None = None,
) -> RequestObservation:
    """The samples of one request planned at ``cut`` with ``tables`` (one per tier, of its shape: another
    shape's times would read as a speed change)."""
    table = tables[0]
    # The device's real speed: the head (the whole model on the device plan) against the table.
    local = LocalRun(
        measured_ms=res.total_ms if cut == DEVICE_CUT else head.head_ms,
        profiled_ms=float(table.head_ms[table.index(cut)]),
    )
    if tier is None:
        return RequestObservation(local=local)
    if res.hops is not None:  # relayed by server tier 1: both hops and both tiers
        return RequestObservation(
            local=local, replies=_relayed(tables, res, res.hops, cut, next_cut or DEVICE_CUT), queue=queue
        )
    if tier == 1:
        # The wait for a worker is the plan's queue term (the cloud's queue, fed by the reply's load
        # report), not the tail's factor: it does not scale with the cut's tail (queue_wait_s=0).
        reply = ReplyObservation(
            bytes_up=res.bytes_up,
            bytes_down=res.bytes_down,
            net_s=res.network_ms / 1e3,
            tail_s=res.tail_ms / 1e3,
            profiled_tail_s=float(table.tail_ms[table.index(cut)]) / 1e3,
            probe_wait_s=res.probe_wait_ms / 1e3,
        )
        return RequestObservation(local=local, replies=(TierReply(tier=1, reply=reply),), queue=queue)
    # A later tier reached directly: its load, no one hop's sample.
    later = tier_reply(tables[tier], cut, tail_ms=res.tail_ms, queue_ms=res.queue_ms)
    return RequestObservation(local=local, replies=(TierReply(tier=tier, reply=later, hop=False),))


def _relayed(
    tables: Sequence[CostTable], res: SplitResult, hops: Hops, first: str, second: str
) -> tuple[TierReply, ...]:
    """Server tier 1 ran ``first`` -> ``second`` and forwarded the rest to tier 2: hop 0's and tier 1's
    samples, and, when it forwarded, hop 1's and tier 2's."""
    mid = tables[1]
    upto = second if hops.forwarded else DEVICE_CUT  # not forwarded: the relay ran the whole rest
    out = [
        TierReply(
            tier=1,
            reply=ReplyObservation(
                bytes_up=res.bytes_up,
                bytes_down=res.bytes_down,
                net_s=(res.rpc_ms - hops.edge_ms) / 1e3,
                tail_s=res.tail_ms / 1e3,
                profiled_tail_s=float(mid.head_ms[mid.index(upto)] - mid.head_ms[mid.index(first)]) / 1e3,
                queue_wait_s=res.queue_ms / 1e3,
            ),
        )
    ]
    if hops.forwarded:
        reply = tier_reply(
            tables[2],
            second,
            tail_ms=hops.next_tail_ms,
            queue_ms=hops.next_queue_ms,
            bytes=hops.next_bytes_up + hops.next_bytes_down,
            net_ms=hops.next_ms - hops.next_tail_ms - hops.next_queue_ms,
        )
        out.append(TierReply(tier=2, reply=reply))
    return tuple(out)


def tier_reply(
    table: CostTable, cut: str, *, tail_ms: float, queue_ms: float, bytes: int = 0, net_ms: float = 0.0
) -> ReplyObservation:
    """A server's part of a reply: its tail against ``table``'s (a direct reply to a later tier crosses
    several hops: no one hop's link sample, ``bytes`` 0)."""
    return ReplyObservation(
        bytes_up=bytes,
        bytes_down=0,
        net_s=net_ms / 1e3,
        tail_s=tail_ms / 1e3,
        profiled_tail_s=float(table.tail_ms[table.index(cut)]) / 1e3,
        queue_wait_s=queue_ms / 1e3,
    )


def correction(
    decision: Decision,
    head: HeadResult,
    res: SplitResult,
    *,
    answered: bool,
    latency_ms: float,
    t_s: float,
    load_lag: float = 0.0,
) -> Observation:
    """What the request took beyond its head and its RPC, against its price (``plan.correction``, as
    ``rig.sim`` feeds it): the decision's encode + call terms against what they measured, and the bytes it
    uploaded against those its upload term priced; ``load_lag`` the device load estimate's lag at ``t_s``."""
    sent = res.bytes_up if answered and decision.hop_upload_ms and decision.link_mbps else 0
    priced = decision.hop_upload_ms[0] * decision.link_mbps[0] / MS_PER_BYTE_AT_1MBPS if sent else 0.0
    return Observation.of_request(
        plan=decision.plan,
        priced_ms=decision.encode_ms + decision.call_ms,
        total_ms=latency_ms,
        head_ms=head.head_ms + (0.0 if answered else res.tail_ms),
        # the model check (once per cloud, the first request's hundreds of ms) is no cost of the plan
        round_trip_ms=res.rpc_ms + res.check_ms if answered else 0.0,
        t_s=t_s,
        price_ms=decision.predicted_ms - decision.correction_ms,
        sent_bytes=float(sent),
        priced_bytes=priced,
        # a cost of the plan: one whose uploads do not refresh bandwidth draws probes
        probe_wait_ms=res.probe_wait_ms if answered else 0.0,
        upload_ms=decision.hop_upload_ms[0] if decision.hop_upload_ms else None,
        rtt_ms=decision.hop_rtt_ms[0] if decision.hop_rtt_ms else 0.0,
        load_lag=load_lag,
    )
