"""Measured energy in a profile, and the power figures a plan uses.

``measure_energy`` runs with a ``PowerReader`` (``power``): the idle baseline (sleeping), the whole model
back to back (busy power), and each span between the profile's anchor cuts as its own session on the
real tensors (energy per run). The result is the profile's ``energy`` object, ``source: measured``.

``plan_power`` gives the planner's ``Power``: the profile's measured idle and busy power when it has
them (and was measured on the board's kind of machine), else the board file's figures (``estimated``);
the radio's figure always comes from the board file, with the source it cites.

- ``measure_interval(reader, work | None, *, min_s, ...) -> Interval(energy_uj, duration_s, runs)``;
  ``energy.measure_energy(graph, anchors, feeds, reader, ...) -> EnergyProfile(source="measured", reader,
  idle_w, busy_w, whole_model_mj, whole_model_ms, window_s, segments=(SegmentEnergy(start, end, runs, ms,
  energy_mj, power_w), ...))``. ``energy.plan_power(device_profile, board) -> PowerFigures(power, source,
  reader, origin, radio_source, note)``: the profile's measured idle/busy power (radio from the board) unless
  the profile's ``host.machine`` differs from the board's arch (a host standing in for it), else the board's (or
  ``DEFAULT_POWER``), ``estimated``. Every energy figure says ``measured`` or ``estimated``: ``plan --json`` has
  ``power.{source, reader, origin, idle_w, active_w, radio_w, radio_uj_per_byte, radio_source}`` and
  ``energy_source`` on ``best`` and every row; the table prints one ``energy measured|estimated: ...`` line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod
from splitrt.graph import partition
from splitrt.graph.ort_errors import onnxruntime_errors
from splitrt.plan.costmodel import DEFAULT_POWER, Power
from splitrt.profile.boards import Board
from splitrt.profile.power import ESTIMATED, MEASURED, Interval, PowerReader, measure_interval
from splitrt.profile.store import Profile
from splitrt.profile.timing import Progress, run, session, warm

#: Radio figure used without a board (DEFAULT_POWER is a Raspberry Pi 4 class device).
DEFAULT_RADIO_SOURCE = "devices/rpi4.toml figure (DEFAULT_POWER): Wi-Fi transmit increment ~1 W"


@dataclass(frozen=True, kw_only=True)
class SegmentEnergy:
    start: str  # cut id the span starts at
    end: str  # cut id it ends at
    runs: int
    ms: float  # mean wall time per run while measured
    energy_mj: float  # per run, idle baseline included
    power_w: float


@dataclass(frozen=True, kw_only=True)
class EnergyProfile:
    source: str  # "measured"
    reader: str
    idle_w: float
    busy_w: float  # whole model back to back
    whole_model_mj: float  # per run
    whole_model_ms: float
    window_s: float  # each figure's minimum measuring time
    segments: tuple[SegmentEnergy, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> EnergyProfile:
        try:
            segs = tuple(SegmentEnergy(**s) for s in data.get("segments", ()))
            fields = {
                k: data[k]
                for k in ("source", "reader", "idle_w", "busy_w", "whole_model_mj", "whole_model_ms", "window_s")
            }
            out = cls(**fields, segments=segs)
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"{where}: corrupt energy object ({type(exc).__name__}: {exc})") from exc
        if out.source not in (MEASURED, ESTIMATED):
            raise ProfileError(f"{where}: energy source must be {MEASURED!r} or {ESTIMATED!r}, got {out.source!r}")
        if not (out.idle_w >= 0 and out.busy_w >= 0):
            raise ProfileError(f"{where}: energy idle_w and busy_w must be >= 0, got {out.idle_w}, {out.busy_w}")
        return out


def _sig(x: float) -> float:
    """6 significant digits: a tiny span's millijoules keep their precision, JSON stays short."""
    return float(f"{x:.6g}")


def profile_energy(profile: Profile) -> EnergyProfile | None:
    """The profile's measured energy, or None when it was profiled without a reader."""
    if not profile.energy:
        return None
    return EnergyProfile.from_dict(profile.energy, f"profile of {profile.model.get('name')!r}")


def measure_energy(
    g: graph_mod.ModelGraph,
    anchors: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    reader: PowerReader,
    *,
    threads: int,
    providers: Sequence[str],
    window_s: float = 1.0,
    warmup: int = 2,
    progress: Progress | None = None,
) -> EnergyProfile:
    """Idle and busy power and the energy per run of each span between ``anchors`` (see module doc)."""
    say = progress or (lambda _m: None)
    idle = measure_interval(reader, None, min_s=window_s)
    say(f"energy ({reader.name}): idle {idle.power_w:.2f} W over {idle.duration_s:.1f} s")
    busy = _run_measured(session(g.model, threads, providers), dict(feeds), reader, window_s, warmup)
    say(f"energy ({reader.name}): busy {busy.power_w:.2f} W, whole model {busy.energy_per_run_mj:.1f} mJ/run")
    ids = ["cloud", *anchors, "device"]
    pieces = partition.split(g, list(anchors)) if anchors else None
    values = dict(feeds)
    segs = []
    for i, seg in enumerate(pieces or []):
        sess = session(seg.model, threads, providers)
        seg_feeds = {name: values[name] for name in seg.inputs}
        values.update(zip(seg.outputs, run(sess, seg.outputs, seg_feeds, f"segment {i}"), strict=True))
        iv = _run_measured(sess, seg_feeds, reader, window_s, warmup)
        segs.append(
            SegmentEnergy(
                start=ids[i],
                end=ids[i + 1],
                runs=iv.runs,
                ms=_sig(iv.duration_s * 1e3 / max(iv.runs, 1)),
                energy_mj=_sig(iv.energy_per_run_mj),
                power_w=_sig(iv.power_w),
            )
        )
    if segs:
        say(f"energy ({reader.name}): {len(segs)} spans measured")
    return EnergyProfile(
        source=MEASURED,
        reader=reader.name,
        idle_w=_sig(idle.power_w),
        busy_w=_sig(busy.power_w),
        whole_model_mj=_sig(busy.energy_per_run_mj),
        whole_model_ms=_sig(busy.duration_s * 1e3 / max(busy.runs, 1)),
        window_s=window_s,
        segments=tuple(segs),
    )


def _run_measured(
    sess: Any, feeds: dict[str, np.ndarray], reader: PowerReader, window_s: float, warmup: int
) -> Interval:
    """Warm ``sess`` up, then run it back to back for ``window_s`` under the reader."""
    warm(sess, feeds, warmup)

    def once() -> object:
        return sess.run(None, feeds)

    with onnxruntime_errors("the segment", stage="run", feeds=feeds):
        return measure_interval(reader, once, min_s=window_s)


@dataclass(frozen=True, kw_only=True)
class PowerFigures:
    """The power a plan is costed with, and where each figure came from."""

    power: Power
    source: str  # MEASURED: idle/active from a reader (profile); ESTIMATED: the board file's figures
    reader: str | None
    origin: str  # the profile or board file the idle/active figures came from
    radio_source: str
    note: str = ""

    def as_dict(self, bandwidth_mbps: float) -> dict[str, Any]:
        # Energy per byte sent = radio power x time per byte at the link's bandwidth.
        uj_per_byte = self.power.radio_w * 8.0 / bandwidth_mbps
        return {
            "source": self.source,
            "reader": self.reader,
            "origin": self.origin,
            "idle_w": self.power.idle_w,
            "active_w": self.power.active_w,
            "radio_w": self.power.radio_w,
            "radio_uj_per_byte": _sig(uj_per_byte),
            "radio_source": self.radio_source,
            "note": self.note,
        }


def plan_power(device: Profile, board: Board | None, *, profile_label: str = "device profile") -> PowerFigures:
    """Measured figures from ``device`` when it has them, else the board's (or DEFAULT_POWER)."""
    base = board.power if board is not None else DEFAULT_POWER
    origin = str(board.path) if board is not None else "DEFAULT_POWER (a Raspberry Pi 4 class device)"
    radio_source = DEFAULT_RADIO_SOURCE
    if board is not None:
        radio_source = board.radio_source or f"{board.path} [power] radio_w"
    measured = profile_energy(device)
    machine = str(device.host.get("machine", ""))
    estimated = ""  # why the board's figures stand, not the profile's
    if measured is None or measured.source != MEASURED:
        estimated = "the device profile has no measured energy"
    elif board is not None and board.arch and machine and machine != board.arch:
        # a host profile standing in for the board: its power is the host's, not the board's
        estimated = f"the profile's energy was measured on {machine}, the board is {board.arch}"
    if measured is None or estimated:
        return PowerFigures(
            power=base, source=ESTIMATED, reader=None, origin=origin, radio_source=radio_source, note=estimated
        )
    power = Power(idle_w=measured.idle_w, active_w=measured.busy_w, radio_w=base.radio_w)
    return PowerFigures(
        power=power,
        source=MEASURED,
        reader=measured.reader,
        origin=profile_label,
        radio_source=radio_source,
        note="idle and busy power measured while profiling",
    )
