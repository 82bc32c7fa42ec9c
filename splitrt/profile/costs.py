"""From profiles to the pure planner's inputs: the per-cut ``CostTable``, nested cut pairs, and the
node-level DAG for the DADS min-cut."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.plan.costmodel import CLOUD_CUT, CODEC_RATIOS, MAX_CODEC_RATIO, CodecRatio, CostTable
from splitrt.plan.mincut import Dag, DagTensor
from splitrt.profile.codecratio import MAX_CODEC_ERROR
from splitrt.profile.store import Profile
from splitrt.transport import codec


def cost_table(
    device: Profile,
    cloud: Profile,
    *,
    device_speed_factor: float = 1.0,
    cloud_speed_factor: float = 1.0,
    codecs: Mapping[str, CodecRatio] | None = None,
) -> CostTable:
    """Per-cut costs for planning: head times from ``device``, tail times from ``cloud``.

    ``*_speed_factor`` scale measured times (e.g. a board's ``cpu_speed_factor`` to emulate it from a
    host profile). Both profiles must be of the same model (sha256) and list the same cuts.
    ``codecs`` None: the fixed ratios, plus the per-cut ratios the device profile measured (the device
    encodes), so a profile made before them plans as it always did. The device profile's encode times and
    call cost (x ``device_speed_factor``) and the cloud profile's decode times (x ``cloud_speed_factor``)
    are priced where the profiles measured them (``profile.codectime``), 0 otherwise.
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
    return CostTable(
        ids=device.cut_ids,
        head_ms=np.array([c.head_ms for c in device.cuts]) * device_speed_factor,
        tail_ms=np.array([c.tail_ms for c in cloud.cuts]) * cloud_speed_factor,
        bytes=[c.bytes for c in device.cuts],
        float_bytes=[c.float_bytes for c in device.cuts],
        reply_bytes=[device.reply_bytes if c.reply_bytes is None else c.reply_bytes for c in device.cuts],
        codecs=codecs if codecs is not None else measured_codecs(device),
        encode_ms=_scaled(device.codec_encode_ms, device_speed_factor),
        decode_ms=_scaled(cloud.codec_decode_ms, cloud_speed_factor),
        call_ms=(device.call_ms or 0.0) * device_speed_factor,
    )


def _scaled(times: dict[str, list[float]] | None, factor: float) -> dict[str, CodecRatio] | None:
    return None if times is None else {c: [t * factor for t in ts] for c, ts in times.items()}


def measured_codecs(profile: Profile, *, max_error: float = MAX_CODEC_ERROR) -> dict[str, CodecRatio]:
    """The fixed ratios, then the profile's per-cut ones; a lossy codec whose error on a cut's tensors
    exceeds ``max_error`` is priced there at ``MAX_CODEC_RATIO`` (above fp32's 1: never chosen while fp32
    is allowed), so bytes alone never pick a codec that changes the output. An image codec at the input
    (cut ``cloud``) is exempt: a JPEG of the frame is what every router sends, and whether it changes the
    answer is the model's output's to say (the accuracy guard), not the tensor's error."""
    out: dict[str, CodecRatio] = dict(CODEC_RATIOS)
    errors = profile.codec_errors or {}
    at_input = [c == CLOUD_CUT for c in profile.cut_ids]
    for name, ratios in (profile.codec_ratios or {}).items():
        errs = errors.get(name)
        image = codec.Codec.parse(name).image is not None
        out[name] = (
            list(ratios)
            if errs is None
            else [
                MAX_CODEC_RATIO if e > max_error and not (image and inp) else r
                for r, e, inp in zip(ratios, errs, at_input, strict=True)
            ]
        )
    return out


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
