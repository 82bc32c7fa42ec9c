"""From profiles to the pure planner's inputs: the per-cut ``CostTable``, nested cut pairs, and the
node-level DAG for the DADS min-cut."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.plan.costmodel import CODEC_RATIOS, MAX_CODEC_RATIO, CodecRatio, CostTable
from splitrt.plan.mincut import Dag, DagTensor
from splitrt.profile.accuracy import MIN_AGREEMENT
from splitrt.profile.store import Profile
from splitrt.transport.codec import Codec


def cost_table(
    device: Profile,
    cloud: Profile,
    *,
    device_speed_factor: float = 1.0,
    cloud_speed_factor: float = 1.0,
    codecs: Mapping[str, CodecRatio] | None = None,
    min_agreement: float = MIN_AGREEMENT,
    device_codec_factor: float | None = None,
) -> CostTable:
    """Per-cut costs for planning: head times from ``device``, tail times from ``cloud``.

    ``*_speed_factor`` scale measured times (e.g. a board's ``cpu_speed_factor`` to emulate it from a
    host profile). Both profiles must be of the same model (sha256) and list the same cuts.
    ``codecs`` None: the fixed ratios, plus the per-cut ratios the device profile measured (the device
    encodes), lossy ones guarded by the device profile's output agreement (``measured_codecs``). The device
    profile's encode times and call cost (x ``device_codec_factor``, default ``device_speed_factor``) and the
    cloud profile's decode times (x ``cloud_speed_factor``) are priced where the profiles measured them
    (``profile.codectime``), 0 otherwise. A codec factor of its own is for a device whose short single-threaded
    work slows otherwise than a model's run (the rig's CPU quota: ``rig.runner``).
    """
    if device.sha256 != cloud.sha256:
        raise ProfileError(
            f"device profile is for sha256 {device.sha256[:12]}... ({device.model.get('name')}), cloud profile "
            f"for {cloud.sha256[:12]}... ({cloud.model.get('name')}): expected the same model"
        )
    if device.cut_ids != cloud.cut_ids:
        raise ProfileError(
            f"device and cloud profiles list different cuts ({len(device.cuts)} vs {len(cloud.cuts)}): "
            "re-profile both with the same splitrt version"
        )
    codec_factor = device_speed_factor if device_codec_factor is None else device_codec_factor
    return CostTable(
        ids=device.cut_ids,
        head_ms=np.array([c.head_ms for c in device.cuts]) * device_speed_factor,
        tail_ms=np.array([c.tail_ms for c in cloud.cuts]) * cloud_speed_factor,
        bytes=[c.bytes for c in device.cuts],
        float_bytes=[c.float_bytes for c in device.cuts],
        reply_bytes=[device.reply_bytes if c.reply_bytes is None else c.reply_bytes for c in device.cuts],
        codecs=codecs if codecs is not None else measured_codecs(device, min_agreement=min_agreement),
        encode_ms=_scaled(device.codec_encode_ms, codec_factor),
        decode_ms=_scaled(cloud.codec_decode_ms, cloud_speed_factor),
        call_ms=(device.call_ms or 0.0) * codec_factor,
    )


def _scaled(times: dict[str, list[float]] | None, factor: float) -> dict[str, CodecRatio] | None:
    return None if times is None else {c: [t * factor for t in ts] for c, ts in times.items()}


def measured_codecs(profile: Profile, *, min_agreement: float = MIN_AGREEMENT) -> dict[str, CodecRatio]:
    """The fixed ratios, then the profile's per-cut ones, with the accuracy guard: a lossy codec is priced at
    ``MAX_CODEC_RATIO`` (above fp32's 1: never chosen while a lossless codec is allowed) at every cut where
    the samples' output agreement (``Profile.codec_agreement``, ``profile.accuracy``) is below
    ``min_agreement`` or was not measured, which is every cut of a profile made without samples.
    ``min_agreement <= 0`` turns the guard off (every lossy codec priced by its bytes alone)."""
    out: dict[str, CodecRatio] = dict(CODEC_RATIOS)
    # at most MAX_CODEC_RATIO: a one-float tensor sends 4.5x its bytes as int8+zstd (headers and all),
    # which the table refuses; priced at the cap instead
    measured = profile.codec_ratios or {}
    out.update({name: [min(r, MAX_CODEC_RATIO) for r in ratios] for name, ratios in measured.items()})
    if min_agreement <= 0:
        return out
    agreement = profile.codec_agreement or {}
    cut_ids = profile.cut_ids
    for name, ratio in out.items():
        if Codec.parse(name).lossless:
            continue
        per_cut = [float(ratio)] * len(cut_ids) if isinstance(ratio, int | float) else list(ratio)
        shares = agreement.get(name) or [None] * len(cut_ids)
        out[name] = [
            r if cut == "device" or (s is not None and s >= min_agreement) else MAX_CODEC_RATIO
            for cut, r, s in zip(cut_ids, per_cut, shares, strict=True)
        ]
    return out


def guard_note(profile: Profile, *, min_agreement: float = MIN_AGREEMENT) -> dict[str, object]:
    """What the accuracy guard allowed, for ``plan``'s output and the decision log: ``min_agreement``, how
    the agreement was measured (``accuracy``, None without samples) and per lossy codec the cuts where it
    is allowed."""
    table = measured_codecs(profile, min_agreement=min_agreement)
    base = dict(CODEC_RATIOS) | (profile.codec_ratios or {})
    allowed: dict[str, list[str]] = {}
    for name, ratios in table.items():
        if Codec.parse(name).lossless or isinstance(ratios, int | float):
            continue
        priced = base[name]
        orig = [float(priced)] * len(ratios) if isinstance(priced, int | float) else list(priced)
        allowed[name] = [c for c, r, o in zip(profile.cut_ids, ratios, orig, strict=True) if c != "device" and r == o]
    return {"min_agreement": min_agreement, "accuracy": profile.accuracy, "allowed_cuts": allowed}


def guard_summary(profile: Profile, *, min_agreement: float = MIN_AGREEMENT) -> str:
    """The accuracy guard in a few words, for a table's source (and so every decision-log line)."""
    acc = profile.accuracy
    if min_agreement <= 0:
        return "accuracy guard off"
    if not acc:
        return "accuracy guard: no samples, lossless codecs only"
    return f"accuracy guard: min agreement {min_agreement:g} on {acc.get('samples')} samples ({acc.get('metric')})"


def nested_matrix(profile: Profile) -> np.ndarray:
    """``m[i, j]`` is True when cut i's head is inside cut j's head (pairs usable in a chain)."""
    masks = [int(c.head_mask or "0", 16) for c in profile.cuts]
    n = len(masks)
    m = np.zeros((n, n), dtype=bool)
    for i, a in enumerate(masks):
        for j, b in enumerate(masks):
            m[i, j] = a & ~b == 0
    return m


def dag(
    g: graph_mod.ModelGraph,
    device: Profile,
    cloud: Profile,
    *,
    device_speed_factor: float = 1.0,
    cloud_speed_factor: float = 1.0,
) -> Dag:
    """The node-level DAG with effective per-node times for the DADS min-cut (``splitrt.plan.mincut``)."""
    for prof in (device, cloud):
        if prof.sha256 != g.sha256:
            raise ProfileError(
                f"profile of {prof.model.get('name')!r} has sha256 {prof.sha256[:12]}..., the model "
                f"{g.path.name} has {g.sha256[:12]}...: expected the same model"
            )
        if len(prof.nodes) != len(g.nodes):
            raise ProfileError(f"profile has {len(prof.nodes)} per-node costs, the model {len(g.nodes)} nodes")
    outputs = {o.name for o in g.outputs}
    tensors: list[DagTensor] = []
    seen: set[str] = set()
    for t in g.inputs:
        cons = tuple(sorted(set(g.consumers.get(t.name, []))))
        if cons or t.name in outputs:
            tensors.append(
                DagTensor(name=t.name, bytes=max(t.bytes, 0), producer=-1, consumers=cons, is_output=t.name in outputs)
            )
        seen.add(t.name)
    for i, node in enumerate(g.nodes):
        for name in node.output:
            if not name or name in seen:
                continue
            seen.add(name)
            cons = tuple(sorted(set(g.consumers.get(name, []))))
            if not cons and name not in outputs:
                continue
            tensors.append(
                DagTensor(
                    name=name,
                    bytes=max(g.tensor(name).bytes, 0),
                    producer=i,
                    consumers=cons,
                    is_output=name in outputs,
                )
            )
    return Dag(
        device_ms=tuple(n.ms * device_speed_factor for n in device.nodes),
        cloud_ms=tuple(n.ms * cloud_speed_factor for n in cloud.nodes),
        tensors=tuple(tensors),
    )
