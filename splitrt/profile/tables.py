"""The one cost table of a model on a board, for every command and the daemon.

``plan``, ``plan --explain``, ``run`` (one request and ``--count``), ``sim``, ``bench``'s profiles and the
daemon all call :func:`build`, so the same (profiles, board, model) gives the same device figures
everywhere (issue 33: the daemon's table once dropped the board's speed when profiles were passed).

- ``build(graph, *, device=None, cloud=None, board=None, directory=None) -> Costs``: the table from
  the two profiles when given (paths; both or neither: ``ConfigError``), else a shipped profile of this
  model (``<hostclass>__<stem>.json`` in ``directory`` or ``paths.profiles_dir()``, matching the
  model's sha256, this host class first) as device and cloud, else the FLOPs prior
  (``priors.flops_table`` at ``HOST_GFLOPS / factor`` on the device, ``HOST_GFLOPS`` on the cloud).
- The board's speed: a device profile measured on the board itself (``splitrt profile --board NAME``
  records ``host.board``) is taken as measured; any other device profile stands in for the board and
  its head times are multiplied by ``board.cpu_speed_factor`` (``device_factor``). No board: factor 1.
- A measured table is re-priced at the graph's binding when the profiles were measured at other shapes
  (``reprice.table_at``; ``Costs.pricing``; an unbound graph: as profiled, ``pricing`` None).
- Lossy codecs are guarded by the device profile's output agreement on samples (``min_agreement``,
  ``profile.costs.measured_codecs``); the source names the guard (``profile.costs.guard_summary``).
- ``Costs.summary()``: what every command prints as its ``cost_table`` (JSON): source, factor and the
  whole model's device and cloud milliseconds; the cross-command test compares these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitrt import paths
from splitrt.errors import ConfigError, ProfileError
from splitrt.plan.costmodel import CLOUD_CUT, DEVICE_CUT, CostTable
from splitrt.profile.accuracy import MIN_AGREEMENT

#: GFLOP/s of the build host that measured profiles/ (resnet50: 8.2 GFLOP in ~94 ms, squeezenet 0.7
#: GFLOP in ~6.4 ms): the FLOPs prior's reference, divided by a board's cpu_speed_factor.
HOST_GFLOPS = 80.0


@dataclass(frozen=True, kw_only=True)
class Costs:
    """A model's cost table and where it came from."""

    table: CostTable
    source: str  # human-readable: which profiles, the factor applied
    kind: str  # "profiles" | "shipped" | "prior"
    device_speed_factor: float  # applied to the device profile's head times (1: measured on the board)
    device_profile: Any = None  # the Profile heads came from (None: FLOPs prior)
    cloud_profile: Any = None
    pricing: Any = None  # reprice.Pricing for measured tables

    def summary(self) -> dict[str, Any]:
        """``{source, kind, device_speed_factor, device_ms, cloud_ms}``: the whole model on each side."""
        t = self.table
        return {
            "source": self.source,
            "kind": self.kind,
            "device_speed_factor": self.device_speed_factor,
            "device_ms": round(float(t.head_ms[t.index(DEVICE_CUT)]), 4),
            "cloud_ms": round(float(t.tail_ms[t.index(CLOUD_CUT)]), 4),
        }


def device_factor(profile: Any, board: Any) -> float:
    """How much slower the board is than the machine ``profile`` was measured on (1: no board, or the
    profile was measured on this board)."""
    if board is None:
        return 1.0
    if profile is not None and profile.host.get("board") == board.name:
        return 1.0
    return float(board.cpu_speed_factor)


def _label(factor: float, board: Any) -> str:
    if board is None:
        return ""
    if factor == 1.0 and board.cpu_speed_factor != 1.0:
        return f", measured on board {board.name} (not scaled)"
    return f", device head times x{factor:g} (board {board.name})"


def _measured(mg: Any, dev: Any, cloud: Any, board: Any, source: str, kind: str, min_agreement: float) -> Costs:
    from splitrt.profile import profiler, reprice
    from splitrt.profile.costs import guard_summary

    factor = device_factor(dev, board)
    table = profiler.cost_table(dev, cloud, device_speed_factor=factor, min_agreement=min_agreement)
    pricing = None
    if mg.input_shapes is not None:  # bound (the CLI's graphs): priced at its shapes
        table, pricing = reprice.table_at(mg, dev, cloud, table)
    return Costs(
        table=table,
        source=source + _label(factor, board) + f"; {guard_summary(dev, min_agreement=min_agreement)}",
        kind=kind,
        device_speed_factor=factor,
        device_profile=dev,
        cloud_profile=cloud,
        pricing=pricing,
    )


def shipped_profile(mg: Any, directory: Path | None = None) -> Path | None:
    """The shipped profile of this model (``*__<stem>.json`` with its sha256; this host class first)."""
    from splitrt.profile import profiler

    d = directory or paths.profiles_dir()
    stem = Path(mg.path).stem
    candidates = sorted(d.glob(f"*__{stem}.json")) if d.is_dir() else []
    mine = f"{profiler.host_class()}__{stem}.json"
    candidates.sort(key=lambda p: p.name != mine)
    for path in candidates:
        try:
            profiler.load_profile(path, sha256=mg.sha256)
        except ProfileError:
            continue  # another model of the same name
        return path
    return None


def build(
    mg: Any,
    *,
    device: Path | str | None = None,
    cloud: Path | str | None = None,
    board: Any = None,
    directory: Path | None = None,
    min_agreement: float = MIN_AGREEMENT,
) -> Costs:
    """The cost table of ``mg`` (bound: priced at its binding) on ``board`` (None: this machine); lossy
    codecs guarded by the device profile's output agreement (``profile.costs.measured_codecs``)."""
    from splitrt.profile import priors, profiler

    if (device is None) != (cloud is None):
        raise ConfigError(
            "profiles: expected both a device and a cloud profile, got only "
            f"{'the device' if cloud is None else 'the cloud'} one"
        )
    if device is not None and cloud is not None:
        dev = profiler.load_profile(Path(device), sha256=mg.sha256)
        cld = dev if Path(cloud) == Path(device) else profiler.load_profile(Path(cloud), sha256=mg.sha256)
        return _measured(
            mg, dev, cld, board, f"profiles {device} (device) and {cloud} (cloud)", "profiles", min_agreement
        )
    found = shipped_profile(mg, directory)
    if found is not None:
        prof = profiler.load_profile(found, sha256=mg.sha256)
        return _measured(mg, prof, prof, board, f"shipped profile {found}", "shipped", min_agreement)
    factor = device_factor(None, board)
    table = priors.flops_table(mg, device_gflops=HOST_GFLOPS / factor, cloud_gflops=HOST_GFLOPS)
    d = directory or paths.profiles_dir()
    return Costs(
        table=table,
        source=(
            f"FLOPs prior (device {HOST_GFLOPS / factor:g} GFLOP/s, cloud {HOST_GFLOPS:g} GFLOP/s): "
            f"no profile of {Path(mg.path).stem} in {d}"
        ),
        kind="prior",
        device_speed_factor=factor,
    )


def with_codecs(table: CostTable, names: Any) -> CostTable:
    """``table`` pricing every codec in ``names`` (any name ``transport.codec`` parses): one the table
    lacks (a profile without its measured ratios) is priced at its quantisation's fixed ratio, i.e. as
    if its compression bought nothing (never cheaper than it may be), and no encode or decode time; the
    others keep theirs. ``ConfigError`` names the codecs for a name the codec registry does not know."""
    from splitrt.errors import CodecError
    from splitrt.plan.costmodel import CODEC_RATIOS
    from splitrt.transport import codec

    missing = [n for n in (names or ()) if n not in table.codecs]
    if not missing:
        return table
    ratios = table.codec_map()
    for n in missing:
        try:
            spec = codec.Codec.parse(n)
        except CodecError as exc:
            raise ConfigError(f"codec: expected one of {', '.join(codec.names())}, got {n!r}") from exc
        ratios[n] = CODEC_RATIOS.get(spec.quant, 1.0)  # an image codec unmeasured: as fp32
    return CostTable(
        ids=table.ids,
        head_ms=table.head_ms,
        tail_ms=table.tail_ms,
        bytes=table.bytes.astype("int64"),
        float_bytes=table.float_bytes.astype("int64"),
        reply_bytes=table.reply_bytes,
        codecs=ratios,
        # the measured codecs keep their encode, decode and call terms
        encode_ms=table.codec_time_map(table.encode_ms),
        decode_ms=table.codec_time_map(table.decode_ms),
        call_ms=table.call_ms,
    )
