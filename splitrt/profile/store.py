"""Profiles as data: the ``splitrt.profile/1`` dataclasses and their JSON files (write, read, check)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from splitrt import paths
from splitrt.errors import ProfileError

SCHEMA = "splitrt.profile/1"


@dataclass(frozen=True, kw_only=True)
class CutProfile:
    cut: str
    head_ms: float
    tail_ms: float
    head_p90_ms: float
    tail_p90_ms: float
    bytes: int
    float_bytes: int  # the part of ``bytes`` codecs may shrink: float32, uint8 frames (``graph.cuts.codec_tensor``)
    head_mask: str  # hex bitset of head node indices
    # what splitting here costs beyond one more run() call (head_ms + tail_ms = total_ms + run overhead +
    # split_ms): writing out and reading back the crossing tensors, and, at a cut that separates a producer
    # from the consumer onnxruntime fuses into it (e.g. Conv | Relu), the consumer run unfused in the tail
    split_ms: float = 0.0
    # the graph outputs the tail makes (the reply); None in profiles made before it was per cut: then
    # ``Profile.reply_bytes`` (every output) applies
    reply_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class NodeProfile:
    index: int
    name: str
    op: str
    kernel_ms: float  # median kernel time in the profiling run (0 when fused into another node)
    ms: float  # effective time: segment wall time × kernel share


@dataclass(frozen=True, kw_only=True)
class SegmentProfile:
    start: str  # cut id the segment starts at
    end: str  # cut id it ends at
    median_ms: float
    p90_ms: float
    rss_mb: float  # RSS growth when its session was created and first run


@dataclass(frozen=True, kw_only=True)
class Profile:
    schema: str
    model: dict[str, Any]  # name, sha256, nodes, flops
    host: dict[str, Any]
    runtime: dict[str, Any]  # onnxruntime version, provider, threads, runs, warmup, method
    total_ms: float
    total_p90_ms: float
    peak_rss_mb: float
    reply_bytes: int  # every graph output; the reply of each cut is ``CutProfile.reply_bytes``
    cuts: tuple[CutProfile, ...]
    nodes: tuple[NodeProfile, ...]
    segments: tuple[SegmentProfile, ...]
    created: str = ""
    notes: str = ""
    # measured power and energy (``profile.energy.EnergyProfile.to_dict()``) when profiled with a power
    # reader; None (absent from the file) otherwise
    energy: dict[str, Any] | None = None
    # per codec, its size ratio at each cut (``profile.codecratio``), for codecs whose size depends on the
    # values; None (absent from the file) in profiles made before it: plans then price only the fixed ratios
    codec_ratios: dict[str, list[float]] | None = None
    # per lossy codec, the relative RMS error of the decoded cut tensors at each cut (None: not measured)
    codec_errors: dict[str, list[float]] | None = None
    # per lossy codec, at each cut: the share (0..1) of the samples whose final output under that (cut,
    # codec) agrees with the whole model's uncompressed output (``accuracy["metric"]`` says how), None at a
    # cut not measured. None (absent from the file): profiled without samples, so plans use only lossless
    # codecs. Field names shared with the planner: ``codec_agreement`` and ``accuracy``.
    codec_agreement: dict[str, list[float | None]] | None = None
    # how ``codec_agreement`` was measured: ``metric`` ("top1", "boxes" or "rel_err"), ``samples`` (count),
    # ``source`` (the samples' folder, or "zoo-default"), ``output`` (the graph output compared)
    accuracy: dict[str, Any] | None = None
    # per codec, at each cut: the ms to encode the cut's tensors here (the device's part) and to decode them
    # (the server's), and one remote call's fixed cost beyond its round trip (``profile.codectime``); None
    # (absent from the file) in profiles made before them: plans then price these terms at 0
    codec_encode_ms: dict[str, list[float]] | None = None
    codec_decode_ms: dict[str, list[float]] | None = None
    call_ms: float | None = None
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        return str(self.model["sha256"])

    @property
    def cut_ids(self) -> tuple[str, ...]:
        return tuple(c.cut for c in self.cuts)

    def cut(self, cut_id: str) -> CutProfile:
        if not self._index:
            self._index.update({c.cut: i for i, c in enumerate(self.cuts)})
        try:
            return self.cuts[self._index[cut_id]]
        except KeyError:
            raise ProfileError(f"profile of {self.model.get('name')!r} has no cut {cut_id!r}") from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_index", None)
        for key in (
            "energy",
            "codec_ratios",
            "codec_errors",
            "codec_agreement",
            "accuracy",
            "codec_encode_ms",
            "codec_decode_ms",
            "call_ms",
        ):
            if d.get(key) is None:
                d.pop(key, None)
        return d


def save_profile(profile: Profile, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(p)


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ProfileError(f"{where}: missing key {key!r}")
    return d[key]


def resolve_profile(path: str | Path) -> Path:
    """``path`` if it exists; else a shipped profile (``paths.profiles_dir()``) named by it: a bare file name
    (``x86_64-2core__resnet50.json``, ``.json`` optional) or ``profiles/NAME`` as the docs write it, so
    the same commands work from a checkout and from an installed wheel."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    parts = p.parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "profiles"):
        name = parts[-1] if parts[-1].endswith(".json") else f"{parts[-1]}.json"
        shipped = paths.profiles_dir() / name
        if shipped.is_file():
            return shipped
    return p


def _short(sha: str) -> str:
    """``1a153a22f450...`` (``1a153a22f450...~0t1t`` for a specialised model's id)."""
    base, sep, key = sha.partition("~")
    return f"{base[:12]}...{sep}{key}"


def load_profile(path: str | Path, *, sha256: str | None = None) -> Profile:
    """Read a profile (a file, or a shipped one by name: ``resolve_profile``); ``ProfileError`` if missing,
    corrupt, of another schema, or (given ``sha256``) of another model."""
    p = resolve_profile(path)
    data: dict[str, Any]
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        d = paths.profiles_dir()
        shipped = sorted(f.name for f in d.glob("*.json")) if d.is_dir() else []
        raise ProfileError(
            f"{p}: no such profile (expected a file, or a shipped one in {d}: {', '.join(shipped) or 'none'})"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{p}: not a JSON profile ({exc})") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{p}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ProfileError(f"{p}: expected schema {SCHEMA!r}, got {schema!r}")
    where = str(p)
    try:
        model = _req(data, "model", where)
        got_sha = str(_req(model, "sha256", where))
        if sha256 is not None and got_sha != sha256:
            raise ProfileError(
                f"{p}: profile is for model {model.get('name')!r} with sha256 {_short(got_sha)}, "
                f"expected sha256 {_short(sha256)} (profile the model you plan for"
                + (
                    "; a '~' id is the model specialised on its sample's If branches: profile and plan with "
                    "samples that take the same branches)"
                    if "~" in got_sha + sha256
                    else ")"
                )
            )
        cuts = tuple(
            CutProfile(
                cut=str(c["cut"]),
                head_ms=float(c["head_ms"]),
                tail_ms=float(c["tail_ms"]),
                head_p90_ms=float(c.get("head_p90_ms", c["head_ms"])),
                tail_p90_ms=float(c.get("tail_p90_ms", c["tail_ms"])),
                bytes=int(c["bytes"]),
                float_bytes=int(c.get("float_bytes", c["bytes"])),
                head_mask=str(c.get("head_mask", "")),
                split_ms=float(c.get("split_ms", 0.0)),
                reply_bytes=int(c["reply_bytes"]) if c.get("reply_bytes") is not None else None,
            )
            for c in _req(data, "cuts", where)
        )
        nodes = tuple(NodeProfile(**n) for n in data.get("nodes", []))
        segments = tuple(SegmentProfile(**s) for s in data.get("segments", []))
        prof = Profile(
            schema=SCHEMA,
            model=dict(model),
            host=dict(_req(data, "host", where)),
            runtime=dict(_req(data, "runtime", where)),
            total_ms=float(_req(data, "total_ms", where)),
            total_p90_ms=float(data.get("total_p90_ms") or data["total_ms"]),
            peak_rss_mb=float(data.get("peak_rss_mb", 0.0)),
            reply_bytes=int(data.get("reply_bytes", 0)),
            cuts=cuts,
            nodes=nodes,
            segments=segments,
            created=str(data.get("created", "")),
            notes=str(data.get("notes", "")),
            energy=dict(data["energy"]) if data.get("energy") else None,
            codec_ratios=_codec_ratios(data.get("codec_ratios"), len(cuts), where),
            codec_errors=_codec_ratios(data.get("codec_errors"), len(cuts), where, what="errors", zero_ok=True),
            codec_agreement=_agreement(data.get("codec_agreement"), len(cuts), where),
            accuracy=dict(data["accuracy"]) if data.get("accuracy") else None,
            codec_encode_ms=_codec_ratios(
                data.get("codec_encode_ms"), len(cuts), where, what="encode_ms", zero_ok=True
            ),
            codec_decode_ms=_codec_ratios(
                data.get("codec_decode_ms"), len(cuts), where, what="decode_ms", zero_ok=True
            ),
            call_ms=float(data["call_ms"]) if data.get("call_ms") is not None else None,
        )
    except ProfileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"{p}: corrupt profile ({type(exc).__name__}: {exc})") from exc
    if not cuts:
        raise ProfileError(f"{p}: profile lists no cuts")
    for c in cuts:
        values = (c.head_ms, c.tail_ms, c.bytes)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ProfileError(f"{p}: cut {c.cut!r} has a negative or non-finite cost: {values}")
    return prof


def _codec_ratios(
    data: Any, n: int, where: str, *, what: str = "ratios", zero_ok: bool = False
) -> dict[str, list[float]] | None:
    if data is None:
        return None
    key = f"codec_{what}"
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: {key}: expected an object of per-cut lists, got {type(data).__name__}")
    out: dict[str, list[float]] = {}
    for name, ratios in data.items():
        values = [float(r) for r in ratios]
        if len(values) != n or not all(math.isfinite(r) and (r >= 0 if zero_ok else r > 0) for r in values):
            sign = "non-negative" if zero_ok else "positive"
            raise ProfileError(f"{where}: {key}[{name!r}]: expected {n} {sign} {what} (one per cut), got {len(values)}")
        out[str(name)] = values
    return out


def _agreement(data: Any, n: int, where: str) -> dict[str, list[float | None]] | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: codec_agreement: expected an object of per-cut lists, got {type(data).__name__}")
    out: dict[str, list[float | None]] = {}
    for name, shares in data.items():
        values = [None if v is None else float(v) for v in shares]
        if len(values) != n or not all(v is None or 0.0 <= v <= 1.0 for v in values):
            raise ProfileError(
                f"{where}: codec_agreement[{name!r}]: expected {n} shares in [0, 1] or null (one per cut), "
                f"got {len(values)}: {values[:4]}"
            )
        out[str(name)] = values
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
