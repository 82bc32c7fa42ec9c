"""From the anchors' direct measurements to every cut: between two neighbouring anchors, the head's
growth (and the tail's shrink) is shared out to the nodes by kernel time. A cut's head is one run() call
plus its nodes' shares, its tail one run() call plus the rest plus its split cost: exact at the anchors,
interpolated by kernel time between them. Pure: no sessions, no clocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitrt.graph import model as graph_mod
from splitrt.graph.cuts import mask_to_bool
from splitrt.profile.anchoring import AnchorTimes
from splitrt.profile.store import CutProfile, NodeProfile, SegmentProfile
from splitrt.profile.timing import p90


@dataclass(frozen=True, kw_only=True)
class AnchorValues:
    """Head and tail (median, p90) ms at ``ids``: ``cloud``, the anchors, ``device`` (topological order).
    A head grows from one run() call (cloud) to the whole model (device); a tail shrinks from the whole
    model to one run() call."""

    ids: list[str]
    h_med: np.ndarray
    h_p90: np.ndarray
    t_med: np.ndarray
    t_p90: np.ndarray

    def anchor_ms(self) -> dict[str, list[float]]:
        """Each anchor's directly measured (head, tail) medians: the profile reproduces them."""
        return {
            a: [round(float(self.h_med[k + 1]), 5), round(float(self.t_med[k + 1]), 5)]
            for k, a in enumerate(self.ids[1:-1])
        }


@dataclass(frozen=True, kw_only=True)
class NodeShares:
    """Effective per-node ms: each node's share of its span's head growth and tail shrink."""

    h: np.ndarray
    h90: np.ndarray
    t: np.ndarray
    t90: np.ndarray


@dataclass(frozen=True, kw_only=True)
class Interpolated:
    values: AnchorValues
    cuts: tuple[CutProfile, ...]
    nodes: tuple[NodeProfile, ...]
    segments: tuple[SegmentProfile, ...]


def anchor_values(anchors: Sequence[str], times: AnchorTimes) -> AnchorValues:
    overhead, full_ms, full90 = times.overhead_ms, times.full_ms, times.full_p90_ms
    h_med = np.array([overhead, *(float(np.median(t)) for t in times.head_runs), full_ms])
    h_p90 = np.array([overhead, *(p90(t) for t in times.head_runs), full90])
    t_med = np.array([full_ms, *(float(np.median(t)) for t in times.tail_runs), overhead])
    t_p90 = np.array([full90, *(p90(t) for t in times.tail_runs), overhead])
    h_p90, t_p90 = np.maximum(h_p90, h_med), np.maximum(t_p90, t_med)
    return AnchorValues(ids=["cloud", *anchors, "device"], h_med=h_med, h_p90=h_p90, t_med=t_med, t_p90=t_p90)


def share_out(
    g: graph_mod.ModelGraph, kernel: Sequence[float], v: AnchorValues, seg_rss: Sequence[float]
) -> tuple[NodeShares, list[SegmentProfile]]:
    """Share each span's wall time out to its nodes by kernel time; one ``SegmentProfile`` per span."""
    ids = v.ids
    bounds = [0] + [g.cut(a).head_mask.bit_count() for a in ids[1:-1]] + [len(g.nodes)]
    eff_h, eff_h90 = np.zeros(len(g.nodes)), np.zeros(len(g.nodes))
    eff_t, eff_t90 = np.zeros(len(g.nodes)), np.zeros(len(g.nodes))
    seg_profiles = []
    for s in range(len(ids) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        k = np.asarray(kernel[lo:hi], dtype=np.float64)
        share = k / k.sum() if k.sum() > 0 else np.full(hi - lo, 1.0 / max(hi - lo, 1))
        # a span may "cost" less than nothing (a head ending on a smaller tensor can be faster): kept, so
        # that every anchor's own measurement is reproduced exactly; per-node times are clipped at 0
        dh, dh90 = v.h_med[s + 1] - v.h_med[s], v.h_p90[s + 1] - v.h_p90[s]
        dt, dt90 = v.t_med[s] - v.t_med[s + 1], v.t_p90[s] - v.t_p90[s + 1]
        eff_h[lo:hi], eff_h90[lo:hi] = dh * share, dh90 * share
        eff_t[lo:hi], eff_t90[lo:hi] = dt * share, dt90 * share
        seg_profiles.append(
            SegmentProfile(
                start=ids[s],
                end=ids[s + 1],
                median_ms=round(max(dh, 0.0), 5),
                p90_ms=round(max(dh90, dh, 0.0), 5),
                rss_mb=round(seg_rss[s], 2) if s < len(seg_rss) else 0.0,
            )
        )
    return NodeShares(h=eff_h, h90=eff_h90, t=eff_t, t90=eff_t90), seg_profiles


def cut_profiles(
    g: graph_mod.ModelGraph,
    cuts: Sequence[graph_mod.Cut],
    eff: NodeShares,
    overhead: float,
    split_ms: Mapping[str, tuple[float, float]],
) -> list[CutProfile]:
    """A cut's head: one run() call plus its head nodes' shares; its tail: one run() call plus the rest,
    plus the unfused consumers it runs when it separates a fused pair (``split_ms``)."""
    out = []
    for c in cuts:
        mask = mask_to_bool(c.head_mask, len(g.nodes))
        if c.id == "cloud":
            head = head90 = 0.0
        else:
            head = max(overhead + float(eff.h[mask].sum()), overhead)
            head90 = max(overhead + float(eff.h90[mask].sum()), overhead)
        if c.id == "device":
            tail = tail90 = 0.0
        else:
            extra, extra90 = split_ms.get(c.id, (0.0, 0.0))
            tail = max(overhead + float(eff.t[~mask].sum()), overhead) + extra
            tail90 = max(overhead + float(eff.t90[~mask].sum()), overhead) + extra90
        out.append(
            CutProfile(
                cut=c.id,
                head_ms=round(head, 5),
                tail_ms=round(tail, 5),
                head_p90_ms=round(max(head90, head), 5),
                tail_p90_ms=round(max(tail90, tail), 5),
                bytes=c.bytes if c.id != "device" else 0,
                float_bytes=c.codec_bytes if c.id != "device" else 0,
                head_mask=format(c.head_mask, "x"),
                split_ms=round(split_ms.get(c.id, (0.0, 0.0))[0], 5),
                reply_bytes=c.reply_bytes,
            )
        )
    return out


def interpolate(
    g: graph_mod.ModelGraph,
    cuts: Sequence[graph_mod.Cut],
    kernel: Sequence[float],
    anchors: Sequence[str],
    times: AnchorTimes,
    split_ms: Mapping[str, tuple[float, float]],
) -> Interpolated:
    """Every cut's, node's and span's profile from the anchors' times and the per-node kernel times."""
    values = anchor_values(anchors, times)
    eff, seg_profiles = share_out(g, kernel, values, times.rss_mb)
    nodes = tuple(
        NodeProfile(
            index=i, name=n.name, op=n.op_type, kernel_ms=round(kernel[i], 5), ms=round(max(float(eff.h[i]), 0.0), 5)
        )
        for i, n in enumerate(g.nodes)
    )
    return Interpolated(
        values=values,
        cuts=tuple(cut_profiles(g, cuts, eff, times.overhead_ms, split_ms)),
        nodes=nodes,
        segments=tuple(seg_profiles),
    )
