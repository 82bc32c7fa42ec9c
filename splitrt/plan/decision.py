"""One decision of the controller and everything it was made from (pure): the ``Decision`` record, its
JSON line (``.to_json()`` / ``Decision.from_json``, also two-tier logs of before hops) and its one-line
string form (``str()`` / ``Decision.parse``, words such as ``down=``/``reply=``).

Inputs are per hop (``link_mbps``, ``link_rtt_ms``, ``link_confidence``), per tier (``loads``) and per server
(``waits_ms``, ``up``), with the ``route`` (empty: the whole path), the reason and the terms of ``predicted_ms``
(compute per tier; upload, download, round trip, queue, encode, call and decode per hop). ``cloud_queue_ms`` is the
queue input (0 in logs made before it existed); ``download_ms`` is 0 in older logs, whose ``transfer_ms`` holds the
reply. ``correction_ms`` is what the plan's requests measured over its price (``plan.correction``; 0 before
corrections), a term of ``predicted_ms`` like the others; ``seen`` the observations fed before it.
``plan.replay.replay`` feeds a log back through a controller.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from splitrt.errors import ConfigError
from splitrt.plan.path import HopTerms, parse_path

__all__ = ["Decision", "Floats"]

Floats = tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class Decision(HopTerms):
    """One decision and everything it was made from (one JSON line in the decision log), for any
    number of tiers. Inputs are per hop (``link_*``), per tier (``loads``: the device's factor first)
    and per server (``waits_ms``, ``up``); the predicted terms per tier and per hop add up to
    ``predicted_ms``. Two tiers read through the properties (``bandwidth_mbps``, ``device_ms``, ...)."""

    t_s: float
    request: str
    link_mbps: Floats  # one per hop
    link_rtt_ms: Floats
    link_confidence: Floats
    loads: Floats  # one per tier: the device's factor, then each server's
    waits_ms: Floats  # one per server: the expected wait for a worker there (``LoadEstimate.queue_ms``)
    up: tuple[bool, ...]  # one per server: reachable
    previous: str | None  # plan key in use before this request
    plan: str  # plan key chosen (hops over ``route``)
    best: str  # the solver's best (differs from plan while hysteresis holds)
    predicted_ms: float
    objective_value: float
    switched: bool
    reason: str
    route: tuple[int, ...] = ()  # the tiers the plan's hops go through (empty: the whole path)
    actual_ms: float | None = None
    fallback: bool = False
    server: str | None = None
    seq: int = 0  # decision order (log lines are written in completion order)
    extra: dict[str, object] = field(default_factory=dict)
    # The predicted terms of predicted_ms: compute per tier of the route, and per hop the upload, the
    # reply (``reply_bytes`` of it on hop 0), the round trip and the wait at the next tier (0 where a
    # hop carries nothing).
    tier_ms: Floats = ()
    hop_upload_ms: Floats = ()
    hop_download_ms: Floats = ()
    hop_rtt_ms: Floats = ()
    hop_queue_ms: Floats = ()
    reply_bytes: int = 0
    # What sending costs beyond the wire, per hop (empty in logs of before they were priced): the
    # sender's encode, one call's fixed cost, the receiver's decode.
    hop_encode_ms: Floats = ()
    hop_call_ms: Floats = ()
    hop_decode_ms: Floats = ()
    # What the requests of this plan measured beyond its price (``plan.correction``), a term of predicted_ms;
    # ``seen``: how many observations the corrections had been fed (``replay``).
    correction_ms: float = 0.0
    seen: int = 0

    # -- two tiers: hop 0, the device and the last tier, sums over hops -------------------------------
    @property
    def bandwidth_mbps(self) -> float:
        return self.link_mbps[0]

    @property
    def rtt_ms(self) -> float:
        return self.link_rtt_ms[0]

    @property
    def confidence(self) -> float:
        return self.link_confidence[0]

    @property
    def device_load(self) -> float:
        return self.loads[0]

    @property
    def cloud_load(self) -> float:
        return self.loads[-1]

    @property
    def cloud_available(self) -> bool:
        return any(self.up)

    @property
    def cloud_queue_ms(self) -> float:
        return self.waits_ms[0] if self.waits_ms else 0.0

    @property
    def device_ms(self) -> float:
        return self.tier_ms[0] if self.tier_ms else 0.0

    @property
    def cloud_ms(self) -> float:
        return self.tier_ms[-1] if len(self.tier_ms) > 1 else 0.0

    @property
    def round_trip_ms(self) -> float:
        return sum(self.hop_rtt_ms)

    @property
    def cuts(self) -> tuple[str, ...]:
        """The plan's cut per hop of its route."""
        return parse_path(self.plan)[0]

    # -- JSON and the compact string form ---------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> Decision:
        """A JSON line of ``to_json``, or of a two-tier decision of before this type had hops."""
        d = _migrate(json.loads(line))
        for f in fields(Decision):
            if isinstance(d.get(f.name), list):
                d[f.name] = tuple(d[f.name])
        return Decision(**d)

    def __str__(self) -> str:
        """One compact line for logs and tables; ``Decision.parse`` reads it back exactly, e.g.
        ``#3 c12@fp32 switched t=1.5 prev=c9@fp32 best=c12@fp32 bw=8.0 rtt=20.0 conf=0.9 load=1.0,1.0
        up=1 wait=0.0 pred=23.1 obj=23.1 tiers=5.0,3.0 upload=12.1 ... req=r3 reason='gain ...'``
        (tuples comma-separated, one value per hop, tier or server)."""
        words = [f"#{self.seq}", self.plan, "switched" if self.switched else "held"]
        if self.fallback:
            words.append("fallback")
        for short, name, kind in _WORDS:
            value = getattr(self, name)
            if value is None or (name in ("route", "extra") and not value):
                continue
            words.append(f"{short}={shlex.quote(_encode(kind, value))}")
        return " ".join(words)

    @staticmethod
    def parse(text: str) -> Decision:
        """The inverse of ``str(decision)``; raises ``ConfigError`` naming the word it cannot read."""
        try:
            words = shlex.split(text)
            kv = dict(w.split("=", 1) for w in words[3:] if "=" in w)
            values: dict[str, Any] = {name: _decode(kind, kv[short]) for short, name, kind in _WORDS if short in kv}
            return Decision(
                seq=int(words[0].removeprefix("#")),
                plan=words[1],
                switched=words[2] == "switched",
                fallback="fallback" in words[3:4],
                previous=values.pop("previous", None),
                **values,
            )
        except (IndexError, KeyError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"decision: expected the form of str(Decision) ('#SEQ PLAN switched|held t=... "
                f"best=...'), got {text!r} ({exc!r})"
            ) from exc


# The string form's words after "#SEQ PLAN switched|held [fallback]": (short name, field, kind).
_WORDS = (
    ("t", "t_s", "f"),
    ("prev", "previous", "s"),
    ("best", "best", "s"),
    ("bw", "link_mbps", "fs"),
    ("rtt", "link_rtt_ms", "fs"),
    ("conf", "link_confidence", "fs"),
    ("load", "loads", "fs"),
    ("wait", "waits_ms", "fs"),
    ("up", "up", "bs"),
    ("route", "route", "is"),
    ("pred", "predicted_ms", "f"),
    ("obj", "objective_value", "f"),
    ("tiers", "tier_ms", "fs"),
    ("upload", "hop_upload_ms", "fs"),
    ("down", "hop_download_ms", "fs"),
    ("rtts", "hop_rtt_ms", "fs"),
    ("queue", "hop_queue_ms", "fs"),
    ("reply", "reply_bytes", "i"),
    ("enc", "hop_encode_ms", "fs"),
    ("call", "hop_call_ms", "fs"),
    ("dec", "hop_decode_ms", "fs"),
    ("corr", "correction_ms", "f"),
    ("seen", "seen", "i"),
    ("actual", "actual_ms", "f"),
    ("server", "server", "s"),
    ("req", "request", "s"),
    ("reason", "reason", "s"),
    ("extra", "extra", "json"),
)


def _encode(kind: str, value: Any) -> str:
    if kind == "fs":
        return ",".join(repr(float(v)) for v in value)
    if kind == "is":
        return ",".join(str(int(v)) for v in value)
    if kind == "bs":
        return ",".join("1" if v else "0" for v in value)
    if kind == "json":
        return json.dumps(value, sort_keys=True)
    return repr(value) if kind == "f" else str(value)


def _decode(kind: str, text: str) -> Any:
    parts = text.split(",") if text else []
    if kind == "fs":
        return tuple(float(p) for p in parts)
    if kind == "is":
        return tuple(int(p) for p in parts)
    if kind == "bs":
        return tuple(p == "1" for p in parts)
    if kind == "json":
        return json.loads(text)
    return {"f": float, "i": int}.get(kind, str)(text)


def _migrate(d: dict[str, Any]) -> dict[str, Any]:
    """A two-tier decision of before hops (scalar fields) as this type's fields."""
    if "link_mbps" in d:
        return d
    old = dict(d)
    out = {k: v for k, v in old.items() if k in {f.name for f in fields(Decision)}}
    out.update(
        link_mbps=(old["bandwidth_mbps"],),
        link_rtt_ms=(old["rtt_ms"],),
        link_confidence=(old["confidence"],),
        loads=(old["device_load"], old["cloud_load"]),
        waits_ms=(old.get("cloud_queue_ms", 0.0),),
        up=(old["cloud_available"],),
        tier_ms=(old.get("device_ms", 0.0), old.get("cloud_ms", 0.0)),
        hop_upload_ms=(old.get("transfer_ms", 0.0),),
        hop_download_ms=(old.get("download_ms", 0.0),),
        hop_rtt_ms=(old.get("round_trip_ms", 0.0),),
        hop_queue_ms=(old.get("queue_ms", 0.0),),
    )
    return out
