"""Measure what a model's segments cost on this machine with onnxruntime; read and write profiles.

Fast profiling ("anchored" method). Timing the head and the tail of every cut directly needs two sessions
per cut (350 for resnet50). Instead the profiler

1. runs the whole model once in a profiling session (``enable_profiling``, NchwcTransformer disabled so
   kernel events keep node names; every node is renamed ``splitrt_n<index>`` so fused kernels map back
   to the first node they contain) to get each node's kernel time;
2. lists the tensors onnxruntime fuses away (``fused_tensors``: e.g. a Conv output its Relu consumes in
   the same kernel) and picks ~``segments`` - 1 anchor cuts: prefix cuts of equal kernel time that cross
   none of them;
3. times each anchor's head and tail directly, each as its own session on the real tensors after a
   warm-up, exactly as a deployment runs them (so the per-``run()`` cost, thread-pool wake-ups and the
   write-out of the crossing tensors are in the figure), plus the whole model and an empty ``run()``;
4. between two neighbouring anchors shares the head's growth (and the tail's shrink) out to the nodes by
   kernel time. A cut's head is one run() call plus its nodes' shares; its tail one run() call plus the
   rest, plus, for a cut that separates a fused pair (a candidate all the same), the consumer run unfused
   (timed once per shape as a small session: ``CutProfile.split_ms``).

The profile reproduces the anchors' measurements exactly and interpolates by kernel time between them.
An earlier "chain" method (time the segments between anchors and add them up) was 2x cheaper but each
segment pays its own run() call and boundary layout conversions: at 2 intra-op threads the chain summed
to 22-100 % more than the whole model and cut errors reached p90 32-54 %. ``measure_direct`` times a
cut's head and tail as their own sessions, which ``bench/bench_profiler.py`` uses to report the error.

The steps live in their own modules: ``timing`` (sessions, warm-up, timed runs, kernel events), ``fusion``
(fused-away tensors, split costs), ``anchoring`` (anchor choice, direct head/tail timing), ``interpolate``
(anchors to every cut), ``store`` (the Profile dataclasses and files), ``host`` (host and runtime facts) and
``costs`` (profiles to the planner's inputs). This module runs them in order and re-exports their public
names, which callers import from here.

- ``measure(model_path, *, runs=10, warmup=2, threads=None, providers=None, segments=16, progress=...) ->
  Profile``; ``save_profile(p, path)``; ``load_profile(path, *, sha256=None)`` raises ``ProfileError`` (corrupt,
  schema != ``splitrt.profile/1``, other model's sha256). ``cost_table(device, cloud, *, device_speed_factor=1,
  cloud_speed_factor=1) -> CostTable``; ``measure_direct(graph, cut, feeds)``; ``host_class()``
  (``x86_64-2core``): shipped profiles are ``profiles/<hostclass>__<model>.json``.
- ``measure(..., power: PowerReader | None = None, energy_window_s=1.0)``: with a reader the profile gains
  ``Profile.energy`` (a dict, absent from the file without one; ``energy.EnergyProfile``). ``splitrt profile
  --board NAME`` records ``host.board``; ``plan --board NAME`` then does not apply the speed factor to it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from splitrt.errors import ModelError as ModelError
from splitrt.errors import ProfileError, SplitrtError
from splitrt.graph import model as graph_mod
from splitrt.graph import shapes
from splitrt.graph.shapes import ShapeBinding
from splitrt.plan.costmodel import CostTable as CostTable
from splitrt.plan.mincut import Dag as Dag
from splitrt.plan.mincut import DagTensor as DagTensor
from splitrt.profile import codecratio, codectime
from splitrt.profile.anchoring import AnchorTimes, measure_direct, time_anchors
from splitrt.profile.anchoring import choose_boundaries as choose_boundaries
from splitrt.profile.costs import cost_table, dag, nested_matrix
from splitrt.profile.energy import measure_energy
from splitrt.profile.fusion import fused_tensors as fused_tensors
from splitrt.profile.fusion import split_costs
from splitrt.profile.fusion import unfused_tail_nodes as unfused_tail_nodes
from splitrt.profile.host import PROVIDER_PREFERENCE as PROVIDER_PREFERENCE
from splitrt.profile.host import default_threads as default_threads
from splitrt.profile.host import host_class, host_facts
from splitrt.profile.host import pick_providers as pick_providers
from splitrt.profile.interpolate import Interpolated, interpolate
from splitrt.profile.power import PowerReader
from splitrt.profile.store import SCHEMA, CutProfile, NodeProfile, Profile, SegmentProfile, load_profile, save_profile
from splitrt.profile.store import file_sha256 as file_sha256
from splitrt.profile.timing import WARMUP_MAX_RUNS as WARMUP_MAX_RUNS
from splitrt.profile.timing import WARMUP_MIN_S as WARMUP_MIN_S
from splitrt.profile.timing import Progress as Progress
from splitrt.profile.timing import node_kernel_ms as node_kernel_ms
from splitrt.profile.timing import rss_mb
from splitrt.profile.timing import run_overhead_ms as run_overhead_ms
from splitrt.profile.timing import stderr_progress as stderr_progress

# The step modules' names stay importable from here (``X as X``: an explicit re-export); the old private
# name of ``unfused_tail_nodes`` too, which the tests use.
_unfused_tail_nodes = unfused_tail_nodes


def measure(
    model_path: str | Path,
    *,
    runs: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    providers: Sequence[str] | None = None,
    segments: int = 16,
    feeds: Mapping[str, np.ndarray] | None = None,
    progress: Progress = stderr_progress,
    name: str | None = None,
    binding: ShapeBinding | None = None,
    power: PowerReader | None = None,
    energy_window_s: float = 1.0,
    codec_feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> Profile:
    """Profile every candidate cut of ``model_path`` on this machine (anchored method, see module doc).
    With a ``power`` reader, also idle/busy power and each anchor span's energy (``energy.measure_energy``,
    each figure over at least ``energy_window_s``). The codecs are measured on ``codec_feeds`` (real
    samples: ratios their mean, errors and times on the first; ``codecratio.measure_pass``), else on the
    inputs the segments are timed with."""
    if runs < 1 or warmup < 0:
        raise ProfileError(f"expected runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    import onnxruntime as ort

    t_start = time.perf_counter()
    threads = threads or default_threads()
    provs = pick_providers(providers)
    g = graph_mod.load(model_path, binding, notice=progress)
    cuts = g.cuts()
    inputs = dict(feeds) if feeds is not None else _inputs(g, model_path, binding)
    rss0 = rss_mb()
    peak = rss0
    progress(f"{Path(model_path).name}: {len(g.nodes)} nodes, {len(cuts)} cuts, provider {provs[0]}, {threads} threads")

    kernel = node_kernel_ms(g, inputs, threads=threads, providers=provs, runs=min(max(runs, 1), 5))
    peak = max(peak, rss_mb())
    fused = fused_tensors(g, threads=threads, providers=provs)
    anchors = choose_boundaries(g, kernel, segments, avoid=fused)
    progress(f"per-node kernel times done; {len(fused)} fused-away tensors; {len(anchors)} anchor cuts")

    times = time_anchors(
        g, anchors, inputs, threads=threads, providers=provs, runs=runs, warmup=warmup, progress=progress
    )
    peak = max(peak, times.peak_rss_mb)
    # Cuts that separate a fused pair: the tail runs the consumer(s) unfused; time them once per shape.
    split_ms = split_costs(
        g,
        cuts,
        fused,
        threads=threads,
        providers=provs,
        runs=runs,
        warmup=warmup,
        overhead=times.overhead_ms,
        progress=progress,
    )
    result = interpolate(g, cuts, kernel, anchors, times, split_ms)
    energy = None
    if power is not None:
        energy = measure_energy(
            g,
            anchors,
            inputs,
            power,
            threads=threads,
            providers=provs,
            window_s=energy_window_s,
            warmup=warmup,
            progress=progress,
        ).to_dict()
    timed = codecratio.measure_pass(g, list(codec_feeds or [inputs]), progress=progress)
    full_ms = times.full_ms
    elapsed = time.perf_counter() - t_start
    progress(f"done in {elapsed:.1f} s: full model {full_ms:.2f} ms (median), peak RSS +{peak - rss0:.0f} MB")
    return Profile(
        schema=SCHEMA,
        model={
            "name": name or Path(model_path).stem,
            "sha256": g.sha256,
            "nodes": len(g.nodes),
            "flops": g.flops,
            # the binding as applied: with the defaults it took and the Ifs its sample specialised
            **(
                {
                    "binding": (g.binding or binding).as_dict(),
                    "input_shapes": {k: list(v) for k, v in g.input_shapes.items()},
                }
                if binding is not None and g.input_shapes is not None
                # unbound: the shapes of the inputs it ran (a model with free dims is re-priced from them)
                else {"input_shapes": {k: list(np.shape(v)) for k, v in inputs.items()}}
            ),
        },
        host=host_facts(),
        runtime={
            "onnxruntime": ort.__version__,
            "provider": provs[0],
            "providers": provs,
            "intra_op_threads": threads,
            "runs": runs,
            "warmup": warmup,
            **_method_facts(result, times, len(fused), len(split_ms), elapsed),
        },
        total_ms=round(full_ms, 5),
        total_p90_ms=round(times.full_p90_ms, 5),
        peak_rss_mb=round(peak - rss0, 2),
        reply_bytes=sum(max(o.bytes, 0) for o in g.outputs),
        cuts=result.cuts,
        nodes=result.nodes,
        segments=result.segments,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        energy=energy,
        codec_ratios=timed.facts.ratios,
        codec_errors=timed.facts.errors,
        codec_encode_ms=timed.encode_ms,
        codec_decode_ms=timed.decode_ms,
        call_ms=codectime.call_ms(),
    )


def _inputs(g: graph_mod.ModelGraph, model_path: str | Path, binding: ShapeBinding | None) -> dict[str, np.ndarray]:
    from splitrt.graph import photos, zoo

    if binding is not None and g.input_shapes is not None:
        return shapes.valid_inputs(list(g.model.graph.input), g.input_shapes, binding.sample)
    # an image model: a real photograph (codec ratios and times on noise are not a camera frame's)
    return photos.photo_inputs(g.inputs) or zoo.random_inputs(model_path)


def with_codec_ratios(
    profile: Profile,
    model_path: str | Path,
    *,
    binding: ShapeBinding | None = None,
    progress: Progress = stderr_progress,
) -> Profile:
    """``profile`` with its per-cut codec ratios and codec times (re-)measured (``profile.codecratio``,
    ``profile.codectime``) and nothing else changed: a profile made before them, or on a busy host, keeps
    its segment timings."""
    g = graph_mod.load(model_path, binding, notice=progress)
    if g.sha256 != profile.sha256:
        raise ProfileError(
            f"{Path(model_path).name} has sha256 {g.sha256[:12]}..., the profile is for "
            f"{profile.sha256[:12]}... ({profile.model.get('name')}): expected the same model"
        )
    if tuple(c.id for c in g.cuts()) != profile.cut_ids:
        raise ProfileError(f"{Path(model_path).name}: the profile lists other cuts: re-profile it")
    timed = codecratio.measure_pass(g, [_inputs(g, model_path, binding)], progress=progress)
    return dataclasses.replace(
        profile,
        codec_ratios=timed.facts.ratios,
        codec_errors=timed.facts.errors,
        codec_encode_ms=timed.encode_ms,
        codec_decode_ms=timed.decode_ms,
        call_ms=codectime.call_ms(),
    )


def _method_facts(
    result: Interpolated, times: AnchorTimes, n_fused: int, n_split: int, elapsed_s: float
) -> dict[str, Any]:
    """The anchored method's part of ``Profile.runtime`` (same keys, in the same order, as ever)."""
    ids = result.values.ids
    return {
        "method": "anchored",
        "segments": len(ids) - 1,
        "anchors": list(ids[1:-1]),
        # each anchor's directly measured (head, tail) medians: the profile reproduces them
        "anchor_ms": result.values.anchor_ms(),
        "run_overhead_ms": round(times.overhead_ms, 5),
        "whole_model_ms": round(times.full_ms, 5),
        "fused_tensors": n_fused,
        "split_cost_cuts": n_split,
        "profiling_s": round(elapsed_s, 2),
    }


__all__ = [
    "SCHEMA",
    "CutProfile",
    "NodeProfile",
    "Profile",
    "SegmentProfile",
    "SplitrtError",
    "cost_table",
    "dag",
    "host_class",
    "host_facts",
    "load_profile",
    "measure",
    "measure_direct",
    "nested_matrix",
    "save_profile",
    "with_codec_ratios",
]
