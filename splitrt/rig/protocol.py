"""The typed protocol between the rig and its device workers (``python -m splitrt.rig.worker``): one
dataclass per command and per reply, a JSON line each (``{"type": NAME, **fields}``), and the one request
record every topology reports. Nothing here does I/O beyond ``ask`` writing to and reading from a worker."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from splitrt.device.client.messages import StageTimes
from splitrt.errors import RigError

if TYPE_CHECKING:
    from splitrt.rig.processes import JsonWorker


@dataclass(frozen=True, kw_only=True)
class Spec:
    """How a worker starts: the model, where the servers are (per server tier, as this device reaches
    them: ``[clouds]`` or ``[edges, clouds]``) and the cuts whose sessions it builds before any timing."""

    model_path: str
    profile_path: str = ""
    board: str = "rpi4"
    servers: tuple[tuple[str, ...], ...] = ()
    codecs: tuple[str, ...] | None = None
    cuts: tuple[str, ...] | None = None  # the cuts the adaptive strategies' plans may use (constraints)
    objective: str = "latency"
    deadline_ms: float = 5000.0
    seed: int = 0
    pad_factor: float = 1.0  # userspace emulation of a slower board: compute padded with sleep
    warm_cuts: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Time:
    """Time the whole model: on this device (``address`` empty, under its quota) or on a server (its
    segment time; ``next_cut`` "device" makes an edge finish the model itself). ``codec``: instead, the
    device's encoding of its inputs with that codec, each run ``gap_s`` after the last (as requests come)."""

    runs: int = 3
    address: str = ""
    next_cut: str | None = None
    pad_factor: float = 1.0
    codec: str = ""
    gap_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Warm:
    """One request per plan (a chain plan through the edge, a one-hop plan to every last-tier server) so
    the servers build those segments before the timed part."""

    plans: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Prepare:
    """Build one strategy's runtime over ``tiers`` tiers with tables scaled by ``factors`` (device speed,
    then each server tier's), then warm it up (uncounted requests at ``rate_hz``, closed loop when 0)."""

    name: str
    policy: str
    tiers: int
    factors: tuple[float, ...]
    rate_hz: float
    warmup_s: float
    codec_factor: float | None = None  # the device's encode and call (None: its speed factor, ``factors[0]``)


@dataclass(frozen=True, kw_only=True)
class Settle:
    """Uncounted requests of strategy ``name`` for ``seconds`` at ``rate_hz`` with the device's run-queue
    probe on (``tasks_file``), after ``Prepare`` and the compute threads' throttle: its estimators learn
    under the load the run starts with (a board busy for the whole run was busy when it learnt its speed)."""

    name: str
    seconds: float
    rate_hz: float
    tasks_file: str | None = None


@dataclass(frozen=True, kw_only=True)
class Roles:
    """Which threads compute (throttled) and which are the control plane (probers, gRPC)."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One turn: window position ``from_s`` is played at monotonic ``t0``; requests start until
    ``until_s``; ``rate_hz`` 0 is a closed loop (back to back)."""

    name: str
    t0: float
    from_s: float
    until_s: float
    rate_hz: float
    tasks_file: str | None = None


@dataclass(frozen=True, kw_only=True)
class Quit:
    pass


@dataclass(frozen=True, kw_only=True)
class Ack:
    """A command done; ``wall_ms``/``cpu_ms`` for ``Time``, ``count`` for ``Warm``."""

    wall_ms: float = math.nan
    cpu_ms: float = math.nan
    count: int = 0
    compute_tids: tuple[int, ...] = ()
    other_tids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Record(StageTimes):
    """One request as measured on the device, for every topology and strategy."""

    i: int
    t_s: float
    latency_ms: float
    plan: str
    error: str | None = None
    fallback: bool = False
    where: str = "local"  # local | cloud (the request left the device)
    server: str | None = None  # the first server that answered; None: completed on the device
    finished_by: str = "device"  # device | edge | cloud
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    predicted_ms: float = math.nan
    match: bool | None = None  # outputs equal to the full model's
    # the prediction by term (``predicted_terms``): head, encode (+ call), wire (up, down, RTT), server
    # (decode, queue, tail), correction; empty for a record without a decision
    predicted_by: dict[str, float] = field(default_factory=dict)


def predicted_terms(d: Any) -> dict[str, float]:
    """A ``Decision``'s price by the terms a ``Record`` measures (see ``Record.predicted_by``)."""
    return {
        "head": float(d.tier_ms[0]) if d.tier_ms else 0.0,
        "encode": float(sum(d.hop_encode_ms) + sum(d.hop_call_ms)),
        "wire": float(sum(d.hop_upload_ms) + sum(d.hop_download_ms) + sum(d.hop_rtt_ms)),
        "server": float(sum(d.hop_decode_ms) + sum(d.hop_queue_ms) + sum(d.tier_ms[1:])),
        "correction": float(d.correction_ms),
    }


# the ``Record`` fields copied as they are from the device's ``SplitResult``, and from the runtime's ``Outcome``
RESULT_FIELDS = (*(f.name for f in fields(StageTimes)), "bytes_up", "bytes_down")
OUTCOME_FIELDS = ("latency_ms", "plan", "fallback", "server", "finished_by")


@dataclass(frozen=True, kw_only=True)
class Done:
    end_s: float
    records: tuple[Record, ...]
    stats: dict[str, float] = field(default_factory=dict)


MESSAGES = {c.__name__: c for c in (Spec, Time, Warm, Prepare, Settle, Roles, Run, Quit, Ack, Done)}
M = TypeVar("M")


def encode(msg: Any) -> str:
    return json.dumps({"type": type(msg).__name__, **asdict(msg)}, default=float)


def decode(line: str | dict[str, Any]) -> Any:
    """The dataclass of a line; lists become tuples where the field is one, records become ``Record``."""
    d = json.loads(line) if isinstance(line, str) else dict(line)
    cls = MESSAGES.get(str(d.pop("type", "")))
    if cls is None:
        raise RigError(f"worker protocol: expected one of {sorted(MESSAGES)}, got {d!r:.200}")
    kw: dict[str, Any] = {
        f.name: _tuple(d[f.name]) if isinstance(d[f.name], list) else d[f.name] for f in fields(cls) if f.name in d
    }
    if cls is Done:
        kw["records"] = tuple(Record(**r) for r in d["records"])
    return cls(**kw)


def _tuple(v: list[Any]) -> tuple[Any, ...]:
    return tuple(_tuple(x) if isinstance(x, list) else x for x in v)


def ask(workers: Sequence[JsonWorker], msgs: Sequence[Any], reply: type[M], timeout_s: float) -> list[M]:
    """Send each worker its message (all at once), then read every reply as ``reply`` (a ``RigError``
    names a wrong one)."""
    for w, m in zip(workers, msgs, strict=True):
        w.send(encode(m))
    out = [(w, decode(w.reply(timeout_s))) for w in workers]
    for w, got in out:
        if not isinstance(got, reply):
            raise RigError(f"{w.name} worker: expected {reply.__name__}, got {type(got).__name__}")
    return [got for _, got in out]
