"""The rig benchmark's arithmetic, pure (no I/O): what a trace delivers, when a device load (device-burst,
device-busy) is on, the statistics of a run, the costs measured in it, and the oracle computed from them.

- ``rigstats.oracle``: per adaptive request, the plan with the lowest modelled cost (measured costs + the
  bandwidth met, from the trace); latency = adaptive's measured latency + model(pick) - model(plan that ran).
  Never above adaptive on any request; never below it just because a model has no jitter.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from splitrt.errors import RigError
from splitrt.rig import traces
from splitrt.rig.protocol import Record


def transfer_ms(trace: traces.Trace, start_s: float, nbytes: float, min_mbps: float = 0.05) -> float:
    """Time to push ``nbytes`` through a link following ``trace`` from ``start_s`` (ideal: no RTT)."""
    if nbytes <= 0:
        return 0.0
    left_bits = nbytes * 8.0
    t = max(0.0, start_s)
    for _ in range(100_000):
        idx = trace.index_at(t)
        period = t - t % trace.duration_s  # consistent with index_at (t % duration): floor() can disagree
        end = period + (trace.times_s[idx + 1] if idx + 1 < len(trace.times_s) else trace.duration_s)
        rate = max(trace.rates_mbps[idx], min_mbps) * 1e6
        if end <= t:  # float edge: step past it
            end = t + 1e-9
        can = rate * (end - t)
        if can >= left_bits:
            return (t + left_bits / rate - start_s) * 1e3
        left_bits -= can
        t = end
    raise RigError("transfer_ms: trace too slow to deliver the bytes")


#: Busy processes in the device's cgroup, next to its one compute thread, per load scenario: device-burst
#: one (~2x slower) in bursts; device-busy three for the whole run (~4x: a board other work holds at 3/4).
DEVICE_HOGS = {"device-burst": 1, "device-busy": 3}


def burst_util(load: str) -> float:
    """Other processes' share of the device's CPU while ``load`` is on (its hogs beside our one thread:
    device-burst 1/2, device-busy 3/4), as the simulator plays it; 0.5 for none (no interval is loaded)."""
    hogs = DEVICE_HOGS.get(load, 1)
    return hogs / (hogs + 1)


def burst_intervals(load: str, duration_s: float) -> list[tuple[float, float]]:
    """When the device is loaded: device-burst 20 s on of every 60 s (from 20 s), a shorter run its middle
    third; device-busy the whole run."""
    if load == "device-busy":
        return [(0.0, float(duration_s))]
    if load != "device-burst":
        return []
    if duration_s < 60:
        return [(duration_s / 3, 2 * duration_s / 3)]
    return [(float(t), min(t + 20.0, duration_s)) for t in range(20, math.ceil(duration_s), 60)]


def in_intervals(t: float, ivs: Sequence[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in ivs)


def plan_cut(plan: str) -> str:
    return plan.split("@", 1)[0]


def energy_mj(rec: Record, played: traces.Trace, power: Any) -> float:
    """Device energy of one request: active while computing, idle + radio while sending, idle while waiting."""
    dev_ms = rec.head_ms + (rec.tail_ms if rec.where == "local" else 0.0)
    send = min(rec.rpc_ms, transfer_ms(played, rec.t_s + dev_ms / 1e3, rec.bytes_up)) if rec.where == "cloud" else 0.0
    wait = max(0.0, rec.latency_ms - dev_ms - send)
    return float(power.active_w * dev_ms + power.send_w * send + power.idle_w * wait)


def summarize(
    latencies: Sequence[float], plans: Sequence[str], failed: int, energies: Sequence[float], fallbacks: int = 0
) -> dict[str, Any]:
    import numpy as np

    p50, p95, p99 = np.percentile(np.asarray(latencies, dtype=float), [50, 95, 99]) if latencies else [math.nan] * 3
    return {
        "mean_ms": statistics.fmean(latencies) if latencies else math.nan,
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "completed": len(latencies),
        "failed": failed,
        "switches": sum(1 for a, b in itertools.pairwise(plans) if a != b),
        "fallbacks": fallbacks,
        "energy_mj": statistics.fmean(energies) if energies else math.nan,
        "plans": dict(sorted({p: plans.count(p) for p in set(plans)}.items())),
    }


@dataclass(frozen=True)
class MeasuredCosts:
    """What the oracle knows, all measured in this rig (medians over every strategy's requests)."""

    # measured head time / cost-table head time, outside load bursts and during them; None: no plan that ran
    # computed on the device, so its speed is unknown and the oracle picks no plan that does
    device_ratio_idle: float | None
    device_ratio_burst: float | None
    cloud_ratio: float  # (cloud queue + tail) / cost-table tail
    net_overhead_ms: float  # rpc - tail - queue - ideal transfer (+ encode/decode beyond their price): RTT, gRPC, TCP
    local_overhead_ms: float  # device plan: latency - head time
    # measured / cost-table encode (device) and decode (cloud) time of the plans that ran: a candidate pays its
    # own codec's times (a WebP encode 40x a JPEG's at the same bytes), not the mean of the plans that ran
    encode_ratio: float = 1.0
    decode_ratio: float = 1.0


def measured_costs(
    table: Any, records: Iterable[Record], played: traces.Trace, bursts: Sequence[tuple[float, float]], rtt_ms: float
) -> MeasuredCosts:
    idle, burst, cloud, net, local = [list[float]() for _ in range(5)]
    short: dict[bool, list[tuple[float, float]]] = {False: [], True: []}  # heads under 20 ms: (measured, table)
    coded: list[tuple[float, float, float, float]] = []  # measured encode and decode, their prices
    for r in records:
        if r.error:
            continue
        cut = plan_cut(r.plan)
        i = table.index(cut)
        if r.where == "cloud":
            coded.append((r.encode_ms, r.decode_ms, *_codec_price(table, r.plan)))
        th = float(table.head_ms[i])
        if th >= 20.0 and r.head_ms:
            (burst if in_intervals(r.t_s, bursts) else idle).append(r.head_ms / th)
        elif th > 0 and r.head_ms:
            short[in_intervals(r.t_s, bursts)].append((r.head_ms, th))
        if r.where == "cloud":
            tt = float(table.tail_ms[i])
            if tt >= 5.0:
                cloud.append((r.tail_ms + r.queue_ms) / tt)
            ideal = transfer_ms(played, r.t_s + r.head_ms / 1e3, r.bytes_up + r.bytes_down)
            net.append(r.rpc_ms - r.tail_ms - r.queue_ms - ideal + r.encode_ms + r.decode_ms)
        elif cut == "device":
            local.append(r.latency_ms - r.head_ms)
    med = statistics.fmean  # means: the oracle's mean must not drop the measured jitter's share
    # ratios of sums (a quota runs a short encode at full speed, a long one at the board's): 1 where the table
    # prices no codec time, which then stays in the network overhead as measured
    enc, dec, enc_price, dec_price = (sum(c[k] for c in coded) for k in range(4))
    encode_ratio = enc / enc_price if enc_price > 0 else 1.0
    decode_ratio = dec / dec_price if dec_price > 0 else 1.0
    priced = sum(encode_ratio * c[2] + decode_ratio * c[3] for c in coded) / len(coded) if coded else 0.0

    def ratio(long: list[float], heads: list[tuple[float, float]]) -> float | None:
        """Heads of 20 ms or more when some ran (a short one is a quota's full speed or a whole period);
        else the short ones' ratio of sums; else unknown."""
        if long:
            return med(long)
        return sum(m for m, _ in heads) / sum(t for _, t in heads) if heads else None

    idle_ratio = ratio(idle, short[False])
    burst_ratio = ratio(burst, short[True])
    return MeasuredCosts(
        device_ratio_idle=idle_ratio,
        device_ratio_burst=burst_ratio if burst_ratio is not None else idle_ratio,
        cloud_ratio=med(cloud) if cloud else 1.0,
        net_overhead_ms=med(net) - priced if net else rtt_ms,
        local_overhead_ms=med(local) if local else 0.0,
        encode_ratio=encode_ratio,
        decode_ratio=decode_ratio,
    )


def _codec_price(table: Any, plan: str) -> tuple[float, float]:
    """The table's encode and decode ms of ``plan`` (0, 0: a codec it does not price)."""
    cut, _, codec = plan.partition("@")
    if not codec or codec not in table.codecs or cut not in table.ids:
        return 0.0, 0.0
    i, k = table.index(cut), table.codec_index(codec)
    return float(table.encode_ms[i, k]), float(table.decode_ms[i, k])


def oracle(
    table: Any,
    costs: MeasuredCosts,
    times_s: Sequence[float],
    played: traces.Trace,
    bursts: Sequence[tuple[float, float]],
    codecs: Sequence[str] | None,
    realized: Sequence[tuple[str, float] | None] | None = None,
    cuts: Sequence[str] | None = None,
) -> list[tuple[str, float]]:
    """Per request start time: the cheapest (plan, latency ms) in hindsight.

    Every (cut, codec) is costed from the measured per-cut costs (``MeasuredCosts``, its codec's encode and
    decode times included) and the bandwidth
    the request would have met (the trace, from the end of its head on); the oracle picks the cheapest.
    ``realized[i]`` is the plan the reference run actually used for request ``i`` and its measured
    latency. The oracle's latency is that measured latency, moved by the modelled difference between
    its pick and the plan that ran: the request's luck (the host's jitter at that moment) carries over.
    So the oracle is never above the reference run on any request, and not below it merely because a
    model has no jitter (taking the lesser of a measured latency and a noise-free model would put the
    oracle's tail below anything a real run can reach). ``cuts`` restricts the picks (``oracle-route``:
    device and cloud; the reference run should then be one that used only those).
    """
    allowed = [k for k in table.codecs if codecs is None or k in codecs]
    reply = table.reply_bytes  # per cut
    out = []
    for n, t in enumerate(times_s):
        ratio = costs.device_ratio_burst if in_intervals(t, bursts) else costs.device_ratio_idle
        real = realized[n] if realized is not None else None
        real_key: tuple[str, float] | None = None
        if real is not None and real[0] != "device" and "@" in real[0]:
            rc, rk = real[0].split("@", 1)
            if rk in table.codecs and rc in table.ids:
                real_key = (rc, float(table.sent_bytes[table.index(rc), table.codec_index(rk)]))
        best: tuple[str, float] | None = None
        real_model: float | None = None
        for i, cut in enumerate(table.ids):
            if cuts is not None and cut not in cuts:
                continue
            if table.head_ms[i] > 0 and ratio is None:  # the device's speed is unknown: not a plan to cost
                continue
            h, tail = float(table.head_ms[i]) * (ratio or 0.0), float(table.tail_ms[i]) * costs.cloud_ratio
            cands = [("device", 0.0, h + costs.local_overhead_ms)] if cut == "device" else []
            for k in allowed if cut != "device" else ():
                j = table.codec_index(k)
                sent = float(table.sent_bytes[i, j])
                wire = transfer_ms(played, t + h / 1e3, sent + float(reply[i]))
                enc, dec = float(table.encode_ms[i, j]), float(table.decode_ms[i, j])
                coding = costs.encode_ratio * enc + costs.decode_ratio * dec
                cands.append((f"{cut}@{k}", sent, h + coding + wire + costs.net_overhead_ms + tail))
            for plan, sent, ms in cands:
                if real is not None and (plan == real[0] or (cut, sent) == real_key):
                    real_model = ms if real_model is None else min(real_model, ms)
                if best is None or ms < best[1]:
                    best = (plan, ms)
        assert best is not None
        if real is None:
            out.append(best)
        elif real_model is None:  # a plan the table cannot cost: the better of it and the pick
            out.append(real if real[1] <= best[1] else best)
        elif best[1] >= real_model:
            out.append(real)
        else:
            out.append((best[0], max(0.0, real[1] + best[1] - real_model)))
    return out
