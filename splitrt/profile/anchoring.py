"""The anchored method's direct measurements: pick ~``segments`` - 1 anchor cuts of equal kernel time, and
time each anchor's head and tail as its own session, as a deployment runs them (see ``profiler``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitrt.graph import model as graph_mod
from splitrt.graph import partition
from splitrt.profile.host import default_threads, pick_providers
from splitrt.profile.timing import Progress, p90, rss_mb, run, run_overhead_ms, session, time_runs, warm


def _prefix_cuts(g: graph_mod.ModelGraph) -> list[tuple[int, graph_mod.Cut]]:
    """(number of head nodes, cut) for every cut that is a prefix of the topological order."""
    out = []
    for c in g.cuts():
        m = c.head_mask
        if m & (m + 1) == 0:
            out.append((m.bit_count(), c))
    return out


def choose_boundaries(
    g: graph_mod.ModelGraph, kernel_ms: Sequence[float], segments: int, avoid: frozenset[str] = frozenset()
) -> list[str]:
    """Interior prefix cut ids splitting the model into ~``segments`` pieces of equal kernel time, never
    at a cut crossing a tensor of ``avoid`` (fused away: the chain would pay an unfused kernel there)."""
    prefixes = [
        (k, c)
        for k, c in _prefix_cuts(g)
        if c.id not in ("cloud", "device") and not any(t.name in avoid for t in c.tensors)
    ]
    if segments <= 1 or not prefixes:
        return []
    w = np.asarray(kernel_ms, dtype=np.float64)
    if w.sum() <= 0:
        w = np.ones_like(w)
    cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
    chosen: list[str] = []
    last_k = 0
    targets = [j / segments for j in range(1, segments)]
    for target in targets:
        best = min(prefixes, key=lambda kc: abs(cum[kc[0]] - target))
        if best[0] > last_k and best[1].id not in chosen:
            chosen.append(best[1].id)
            last_k = best[0]
    return chosen


@dataclass(frozen=True, kw_only=True)
class AnchorTimes:
    """Run times (ms) of the anchored method's sessions, as measured."""

    head_runs: list[list[float]]  # per anchor
    tail_runs: list[list[float]]  # per anchor
    rss_mb: list[float]  # per anchor: RSS growth when its head session was created and run
    overhead_ms: float  # median of an empty run() call
    full_runs: list[float]  # the whole model: the timing (before or after the anchors) with the lower median
    peak_rss_mb: float  # highest RSS read after an anchor (0 without anchors)

    @property
    def full_ms(self) -> float:
        return float(np.median(self.full_runs))

    @property
    def full_p90_ms(self) -> float:
        return max(p90(self.full_runs), self.full_ms)


def time_anchors(
    g: graph_mod.ModelGraph,
    anchors: Sequence[str],
    inputs: Mapping[str, np.ndarray],
    *,
    threads: int,
    providers: Sequence[str],
    runs: int,
    warmup: int,
    progress: Progress,
) -> AnchorTimes:
    """Time the whole model, each anchor's head and tail, an empty run() call, then the whole model again."""
    # The whole model as one session, timed before and after the anchors (the lower median is kept: a
    # burst of load from other jobs during one of them would otherwise scale every cut).
    full = session(g.model, threads, providers)
    warm(full, inputs, warmup)
    full_first = time_runs(full, inputs, max(runs, 10))
    # Each anchor's head and tail, timed directly as they run in deployment: one session each, timed back
    # to back (two live sessions' intra-op thread pools spin against each other) and then dropped.
    head_t: list[list[float]] = []
    tail_t: list[list[float]] = []
    seg_rss: list[float] = []
    peak = 0.0
    for n_a, a in enumerate(anchors):
        head_seg, tail_seg = partition.head_tail(g, a)
        before = rss_mb()
        h_sess = session(head_seg.model, threads, providers)
        h_feeds = {n: inputs[n] for n in head_seg.inputs}
        h_out = dict(zip(head_seg.outputs, run(h_sess, head_seg.outputs, h_feeds, f"the head of {a}"), strict=True))
        warm(h_sess, h_feeds, warmup)
        head_t.append(time_runs(h_sess, h_feeds, runs))
        seg_rss.append(max(rss_mb() - before, 0.0))
        del h_sess
        t_sess = session(tail_seg.model, threads, providers)
        avail = {**inputs, **h_out}
        t_feeds = {n: avail[n] for n in tail_seg.inputs}
        warm(t_sess, t_feeds, warmup)
        tail_t.append(time_runs(t_sess, t_feeds, runs))
        peak = max(peak, rss_mb())
        del t_sess
        progress(
            f"anchor {n_a + 1}/{len(anchors)} ({a}): head {np.median(head_t[-1]):.2f} ms, "
            f"tail {np.median(tail_t[-1]):.2f} ms"
        )
    # The fixed cost of one run() call (feeding inputs, returning outputs): what the smallest head pays.
    overhead = run_overhead_ms(threads=threads, providers=providers, runs=runs, warmup=warmup)
    warm(full, inputs, warmup)
    full_times = time_runs(full, inputs, max(runs, 10))
    if np.median(full_first) < np.median(full_times):
        full_times = full_first
    del full
    return AnchorTimes(
        head_runs=head_t,
        tail_runs=tail_t,
        rss_mb=seg_rss,
        overhead_ms=overhead,
        full_runs=full_times,
        peak_rss_mb=peak,
    )


def measure_direct(
    g: graph_mod.ModelGraph,
    cut_id: str,
    feeds: Mapping[str, np.ndarray],
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
) -> tuple[float, float]:
    """Median head and tail time (ms) of one cut, each run as its own session (for validation)."""
    threads = threads or default_threads()
    provs = pick_providers(providers)
    head, tail = partition.head_tail(g, cut_id)
    out: list[float] = []
    h_feeds = {k: feeds[k] for k in head.inputs}
    h_sess = session(head.model, threads, provs)
    h_out = dict(zip(head.outputs, run(h_sess, head.outputs, h_feeds, f"the head of {cut_id}"), strict=True))
    t_sess = session(tail.model, threads, provs)
    avail = {**feeds, **h_out}
    t_feeds = {k: avail[k] for k in tail.inputs}
    for sess, f in ((h_sess, h_feeds), (t_sess, t_feeds)):
        warm(sess, f, warmup)
        out.append(float(np.median(time_runs(sess, f, runs))))
    if cut_id == "cloud":
        out[0] = 0.0
    if cut_id == "device":
        out[1] = 0.0
    return out[0], out[1]
