"""Warm start: the (model, cut) pairs a server served, remembered in ``<models>/.splitrt-warm.json``
(``{"format": "splitrt-warm", "version": 1, "pairs": [[sha256, cut_id], ...]}``, most recent first, at
most ``limit``) and built again at start on a daemon thread through ``TailCache.get``. Reading the file
never raises; it is written atomically, off the request path, when a new pair is served (at most every
``min_interval_s``) and at stop. ``parse_spec``, ``match_model``, ``check_cuts``, ``choose`` are pure.
Operators: docs/operator/server.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import grpc
from pydantic import BaseModel, Field, ValidationError

from splitrt.cloud.common import RpcFailure, log_event
from splitrt.errors import ConfigError

WARM_FILE = ".splitrt-warm.json"
FORMAT = "splitrt-warm"
VERSION = 1
MAX_FILE_BYTES = 1 << 20
MIN_PREFIX = 4
DEFAULT_MIN_INTERVAL_S = 5.0
CUT_DEVICE = "device"

Pair = tuple[str, str]
_SHA = r"^[0-9a-f]{64}(~.+)?$"  # a model's sha256, ``~<steps>`` for a specialisation


class _WarmFile(BaseModel):
    format: Literal["splitrt-warm"]
    version: Literal[1]
    pairs: list[tuple[Annotated[str, Field(pattern=_SHA)], Annotated[str, Field(min_length=1, max_length=256)]]]


def read_pairs(path: Path, limit: int) -> list[Pair]:
    """The remembered pairs, most recent first, at most ``limit``; [] (and one log line) when the file is
    missing, unreadable, corrupt or not ours."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"expected at most {MAX_FILE_BYTES} bytes, got {path.stat().st_size}")
        doc = _WarmFile.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        log_event("warm_file", file=path.name, pairs=0, note="none yet: nothing remembered to warm")
        return []
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"])) or "the file"
        said = f"{where}: {err['msg']}"[:200]
        log_event("warm_file_ignored", logging.WARNING, file=path.name, error=f"expected a {FORMAT} file, got {said}")
        return []
    except (OSError, ValueError) as exc:
        log_event("warm_file_ignored", logging.WARNING, file=path.name, error=str(exc)[:300])
        return []
    return list(dict.fromkeys(doc.pairs))[:limit]


def write_pairs(path: Path, pairs: Sequence[Pair]) -> None:
    """Write the file atomically (a reader sees the old file or the new one, never half of one)."""
    data = json.dumps({"format": FORMAT, "version": VERSION, "pairs": [list(p) for p in pairs]}, indent=1)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Recorder:
    """The pairs served, most recent first, bounded by ``limit``; written to ``path`` rarely."""

    def __init__(
        self,
        path: Path,
        limit: int,
        *,
        remembered: Iterable[Pair] = (),
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        if limit < 1:
            raise ConfigError(f"warm-up pairs kept: expected >= 1, got {limit}")
        self.path = Path(path)
        self.limit = limit
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # snapshots reach the disk in the order they were taken
        # Least recent first (``move_to_end`` is the cheap direction); the file is most recent first.
        self._pairs: OrderedDict[Pair, None] = OrderedDict((p, None) for p in reversed(list(remembered)[:limit]))
        self._new = False  # a pair served for the first time is not on disk yet
        self._changed = False  # the order changed since the last write
        self._last_write = float("-inf")
        self._warned = False
        self._background = background
        self.writes = 0
        _remove_stale(self.path)

    def pairs(self) -> list[Pair]:
        with self._lock:
            return list(reversed(self._pairs))

    def served(self, sha256: str, cut_id: str) -> None:
        key = (sha256, cut_id)
        with self._lock:
            if self._pairs and next(reversed(self._pairs)) == key:
                return  # already the most recent: the common case, nothing changes
            new = key not in self._pairs
            self._pairs[key] = None
            self._pairs.move_to_end(key)
            while len(self._pairs) > self.limit:
                self._pairs.popitem(last=False)
            self._changed = True
            self._new = self._new or new
            due = self._new and self._clock() - self._last_write >= self.min_interval_s
            if due:  # decided here, under the lock: one write per interval however many threads serve
                self._new, self._last_write = False, self._clock()
        if due and self._background:
            threading.Thread(target=self._write, name="splitrt-warm-write", daemon=True).start()
        elif due:
            self._write()

    def flush(self) -> None:
        """Write what changed since the last write (the server's stop), after any write in progress."""
        self._write(only_changed=True)

    def _write(self, *, only_changed: bool = False) -> None:
        """Write the pairs as they are now, after any write in progress (``_lock`` not held while writing)."""
        with self._write_lock:
            with self._lock:
                if only_changed and not (self._changed or self._new):
                    return
                pairs = list(reversed(self._pairs))
                self._new = self._changed = False
                self._last_write = self._clock()
            try:
                write_pairs(self.path, pairs)
                self.writes += 1
            except OSError as exc:
                if not self._warned:  # a read-only models directory: say it once, serve on
                    self._warned = True
                    log_event("warm_file_unwritable", logging.WARNING, file=str(self.path), error=str(exc)[:300])


def _remove_stale(path: Path) -> None:
    """Remove the temporary files of ``write_pairs`` whose process is gone (a server killed mid-write)."""
    try:
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            pid = tmp.name[len(path.name) + 2 :].split(".")[0]
            if pid.isdigit() and not _alive(int(pid)):
                tmp.unlink(missing_ok=True)
    except OSError:
        pass  # a directory we cannot list or write: the write will say so


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


# -- what to warm (pure) ----------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """``"MODEL@CUT[,CUT...]"`` -> (MODEL, [CUT, ...])."""
    model, at, cuts_text = spec.rpartition("@")
    cuts = [c.strip() for c in cuts_text.split(",")]
    if not at or not model.strip() or not all(cuts):
        raise ConfigError(
            f"--warm {spec!r}: expected MODEL@CUT[,CUT...] (MODEL a file name in the models directory or a "
            f"sha256 prefix, e.g. squeezenet.onnx@c33,c40), got {'no @' if not at else 'an empty part'}"
        )
    return model.strip(), cuts


def match_model(spec: str, text: str, models: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The (file name, sha256) of ``models`` that ``text`` names: a file name, its stem, or a sha256
    prefix of at least ``MIN_PREFIX`` hex digits naming exactly one model."""
    by_name = [m for m in models if text in (m[0], Path(m[0]).stem)]
    if by_name:
        return by_name[0]
    low = text.lower()
    if len(low) >= MIN_PREFIX and re.fullmatch(r"[0-9a-f]+", low):
        hits = sorted({m[1]: m for m in models if m[1].startswith(low)}.values())
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            names = ", ".join(f"{n} ({s[:12]})" for n, s in hits[:4])
            raise ConfigError(
                f"--warm {spec!r}: expected a sha256 prefix naming one model, got {text!r} naming {names}"
            )
    names = ", ".join(sorted(n for n, _ in models)[:8]) or "none"
    raise ConfigError(
        f"--warm {spec!r}: expected a model file name in the models directory or a sha256 prefix of at least "
        f"{MIN_PREFIX} hex digits of one ({len(models)} models: {names}), got {text!r}"
    )


def check_cuts(spec: str, name: str, cuts: Sequence[str], ids: Sequence[str]) -> None:
    """Every cut (``A>B``: both) is one of the model's ``ids``, and none is ``device`` (nothing to run)."""
    known = set(ids)
    for cut in cuts:
        parts = cut.split(">")
        if cut == CUT_DEVICE:
            raise ConfigError(
                f"--warm {spec!r}: expected a cut before {CUT_DEVICE!r} (a tail to make), got {cut!r}: it "
                "leaves nothing to run on a server"
            )
        for part in parts:
            if part not in known:
                listed = [i for i in ids if i != CUT_DEVICE]
                shown = ", ".join(listed[:6]) + (f", ..., {listed[-1]}" if len(listed) > 6 else "")
                raise ConfigError(
                    f"--warm {spec!r}: model {name} has no cut {part!r}: expected one of its {len(listed)} cut "
                    f"ids ({shown})"
                )


def choose(explicit: Sequence[Pair], remembered: Sequence[Pair], *, known: frozenset[str], limit: int) -> list[Pair]:
    """The pairs to warm, in order: ``explicit`` first, then ``remembered`` (most recent first); each
    once; those whose model (``sha256`` before any ``~steps``) is not in ``known`` left out; at most
    ``limit``."""
    out: list[Pair] = []
    for pair in [*explicit, *remembered]:
        if pair not in out and pair[0].partition("~")[0] in known:
            out.append(pair)
    return out[:limit]


# -- with the store and the cache -------------------------------------------------------------------


def resolve(specs: Sequence[str], store: Any, limit: int) -> list[Pair]:
    """The (sha256, cut id) pairs ``--warm`` names, checked against ``store``'s models and cut ids;
    ``ConfigError`` for an unknown model or cut, or more than ``limit`` pairs."""
    if not specs:
        return []
    from splitrt.cloud.capacity.memory import trim
    from splitrt.cloud.models.store import load_graph

    entries = {m.sha256: m for m in store.models()}
    models = [(m.path.name, m.sha256) for m in entries.values()]
    ids_of: dict[str, list[str]] = {}
    out: list[Pair] = []
    for spec in specs:
        text, cuts = parse_spec(spec)
        name, sha = match_model(spec, text, models)
        if sha not in ids_of:
            try:
                graph = load_graph(entries[sha].path, store.root, store.max_nodes)
            except RpcFailure as exc:
                raise ConfigError(f"--warm {spec!r}: expected a model that loads, got {exc.message}") from exc
            ids_of[sha] = [c.id for c in graph.cuts()]
            del graph
            trim()
        check_cuts(spec, name, cuts, ids_of[sha])
        out.extend((sha, c) for c in cuts if (sha, c) not in out)
    if len(out) > limit:
        raise ConfigError(
            f"--warm: expected at most {limit} pairs (the segment cache, --segment-cache), got {len(out)}"
        )
    return out


def warm_up(
    pairs: Sequence[Pair],
    build: Callable[[str, str], Any],
    stopping: threading.Event,
    touch: Callable[[list[Pair]], None] | None = None,
) -> dict[str, int]:
    """Build each pair's tail in turn, then ``touch`` them (the first the most recently used); returns the
    counts logged in ``warm_done``."""
    t0 = time.monotonic()
    counts = {"built": 0, "failed": 0, "left": len(pairs)}
    for sha256, cut_id in pairs:
        if stopping.is_set():
            break
        try:
            build(sha256, cut_id)
            counts["built"] += 1
        except Exception as exc:  # a warm-up never takes the server down; say what failed
            if isinstance(exc, RpcFailure) and exc.code == grpc.StatusCode.UNAVAILABLE:  # the server is stopping
                break
            said = exc.message if isinstance(exc, RpcFailure) else f"{type(exc).__name__}: {exc}"
            code = exc.code.name if isinstance(exc, RpcFailure) else "UNKNOWN"
            counts["failed"] += 1
            log_event("warm_failed", logging.WARNING, model=sha256[:12], cut=cut_id, code=code, error=said[:300])
        counts["left"] -= 1
    if touch is not None:
        touch(list(pairs))
    log_event("warm_done", **counts, ms=round((time.monotonic() - t0) * 1e3, 1))
    return counts


class WarmStart:
    """The explicit pairs (``specs``, checked now: ``ConfigError``) and, with ``remember``, the file's, built
    from ``start`` on; a ``Recorder`` remembers every lease that ran. ``stop`` ends it and writes the file."""

    def __init__(
        self,
        specs: Sequence[str],
        *,
        store: Any,
        tails: Any,
        models_dir: Path,
        remember: bool,
        limit: int,
        deadline_s: float,
    ) -> None:
        self.pairs = resolve(specs, store, limit)
        self.store, self.tails, self.models_dir, self.remember = store, tails, Path(models_dir), remember
        self.limit, self.deadline_s = limit, deadline_s
        self.recorder: Recorder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        remembered: list[Pair] = []
        if self.remember:
            path = self.models_dir / WARM_FILE
            remembered = read_pairs(path, self.limit)
            self.recorder = Recorder(path, self.limit, remembered=remembered)
            self.tails.on_lease = self.recorder.served
        known = frozenset(m.sha256 for m in self.store.models())
        pairs = choose(self.pairs, remembered, known=known, limit=self.limit)
        if not pairs:
            return
        left_out = len({*self.pairs, *remembered}) - len(pairs)  # models gone from the store
        log_event("warm_started", pairs=len(pairs), explicit=len(self.pairs), left_out=left_out)

        def build(sha256: str, cut_id: str) -> object:  # per build: its wait for a heavy slot
            return self.tails.get(sha256, cut_id, timeout_s=self.deadline_s)

        args = (pairs, build, self._stop, self.tails.touch)
        self._thread = threading.Thread(target=warm_up, args=args, name="splitrt-warm", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # no further build; one in progress ends with the builder or its own run
        if self.recorder is not None:
            self.recorder.flush()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)  # a daemon: an in-process build cannot be cut short
