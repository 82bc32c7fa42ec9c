"""The server's models: the ``*.onnx`` files of a directory, keyed by the sha256 of their bytes, graphs
loaded on first use into an LRU under the memory budget. A model whose external data leaves the directory,
names a hidden file or another model (or an upload naming any), or a file that is not ONNX, is refused,
logged once (``model_refused``) and skipped until it changes. Leftover ``.upload-*.part`` files are removed.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from splitrt.cloud.capacity.admission import current_client
from splitrt.cloud.capacity.memory import LOAD_PEAK_FACTOR, MemoryBudget, graph_bytes, trim
from splitrt.cloud.common import RpcFailure, log_event, redact
from splitrt.errors import ConfigError
from splitrt.graph.walk import count_nodes, external_locations

#: Temporary files of uploads in progress (never served, never listed).
PART_GLOB = ".upload-*.part"
#: An unknown sha256 rescans the directory at most this often.
RESCAN_S = 1.0


_HEX = frozenset("0123456789abcdef")


def is_upload_name(path: Path) -> bool:
    """A file named as the store names uploads: ``<64 hex>.onnx``."""
    return path.suffix == ".onnx" and len(path.stem) == 64 and set(path.stem) <= _HEX


def location_refused(root: Path, model_file: Path, locations: list[str]) -> tuple[str, str] | None:
    """``(location, why)`` for the first location the model in ``model_file`` may not read, or None."""
    base = root.resolve()
    for loc in locations:
        if is_upload_name(model_file):
            return loc, "an uploaded model names no file (an upload is one self-contained file)"
        try:  # absolute, empty or with a NUL: refused as ``base`` itself is
            target = base if not loc or "\0" in loc or Path(loc).is_absolute() else (base / loc).resolve()
        except (OSError, RuntimeError, ValueError):
            target = base
        if target == base or not target.is_relative_to(base):
            return loc, f"expected external data inside {root}"
        parts = target.relative_to(base).parts
        if any(p.startswith(".") for p in parts):
            return loc, "expected a data file of the model, got a hidden file (the server's own)"
        if target.suffix == ".onnx":
            return loc, "expected a data file of the model, got another model"
    return None


def _identify(path: Path, root: Path) -> str:
    """The model's sha256 as the device computes it, once it is ONNX with its data in ``root``; else
    ``ValueError``."""
    import onnx

    from splitrt.graph.model import model_sha256

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ValueError(f"expected an ONNX model, got a file that does not parse ({type(exc).__name__})") from exc
    if not model.graph.node and not model.graph.output:
        raise ValueError("expected an ONNX model, got no graph (an empty file, or not ONNX)")
    bad = location_refused(root, path, external_locations(model))
    if bad is not None:
        raise ValueError(f"{bad[1]}, got external-data location {bad[0]!r}")
    try:
        return model_sha256(path, model)
    except OSError as exc:
        raise ValueError(f"external data unreadable: {exc.strerror or exc}") from exc


def scrub(root: Path, text: str) -> str:
    """``text`` for a client: the models directory (as configured, absolute, resolved) -> ``<server path>``."""
    return redact(text, [str(root), str(root.absolute()), str(root.resolve())])


def load_graph(path: Path, root: Path, max_nodes: int | None) -> Any:
    """The model's ``ModelGraph`` with its cuts enumerated; FAILED_PRECONDITION over ``max_nodes`` (counted
    before the load) or when it does not load."""
    import onnx

    from splitrt.graph import model as graph_mod

    if max_nodes is not None:
        try:
            nodes = count_nodes(onnx.load(str(path), load_external_data=False))
        except Exception:  # protobuf's errors: the load below reports them
            nodes = 0
        if nodes > max_nodes:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model {path.name}: expected at most {max_nodes} nodes (max_nodes), got {nodes}",
            )
    try:
        graph = graph_mod.load(path)
    except Exception as exc:  # ModelError, or whatever onnx raises on a strange file
        raise RpcFailure(
            grpc.StatusCode.FAILED_PRECONDITION, f"model {path.name} cannot be loaded: {scrub(root, str(exc))}"
        ) from exc
    graph.cuts()  # enumerated now (cached on the graph), inside whatever reservation the caller holds
    return graph


def specialised(graph: Any, base: str, key: str) -> Any:
    """``graph`` specialised by the steps ``key`` (``<sha256>~<steps>``, ``graph.specialise``); NOT_FOUND for
    steps that do not apply."""
    from splitrt.graph import model as graph_mod

    try:
        return graph_mod.derived(graph, key)
    except Exception as exc:  # ModelError (steps that do not apply), or onnx on a strange model
        raise RpcFailure(
            grpc.StatusCode.NOT_FOUND, f"model sha256 {base[:12]} has no specialisation {key!r}: {exc}"
        ) from exc


@dataclass
class _ModelEntry:
    sha256: str
    path: Path
    bytes: int
    graph: Any = None
    graph_bytes: int = 0  # what the budget holds for the loaded graph


class ModelStore:
    """The models of a directory, by sha256 of their bytes."""

    def __init__(self, root: Path, *, budget: MemoryBudget | None = None, max_nodes: int | None = None) -> None:
        self.root = Path(root)
        self.budget = budget if budget is not None else MemoryBudget(None)
        self.budget.add_evictor(self.evict)
        self.max_nodes = max_nodes
        self._loaded: OrderedDict[str, _ModelEntry] = OrderedDict()  # graphs in memory, least recent first
        self._pending_bytes = self._pending_models = 0  # uploads in progress (``claim``)
        if not self.root.is_dir():
            raise ConfigError(
                f"models directory {self.root}: expected a directory, got "
                f"{'a file' if self.root.exists() else 'nothing'}"
            )
        self._lock = threading.Lock()
        self._scanned_s = 0.0  # when an unknown sha256 last rescanned the directory (monotonic)
        self._by_sha: dict[str, _ModelEntry] = {}
        # path -> (mtime, size, sha256 or "" when refused)
        self._seen: dict[Path, tuple[float, int, str]] = {}
        self._graph_locks: dict[str, threading.Lock] = {}
        # Graphs a tail build is splitting (``pinned``): never evicted meanwhile.
        self._pins: dict[str, int] = {}
        # "<sha256>~<steps>" -> (weak ref to its base graph, the specialised graph); one per valid steps.
        self._specialised: dict[str, tuple[weakref.ref[Any], Any]] = {}
        for part in self.root.glob(PART_GLOB):  # uploads a killed server left half-written
            part.unlink(missing_ok=True)
        self.scan()

    def scan(self) -> None:
        """Index new or changed ``*.onnx`` files (hashes only what changed; a refused file is logged
        once and skipped until it changes)."""
        with self._lock:
            present = set()
            for path in sorted(self.root.glob("*.onnx")):
                try:
                    st = path.stat()
                except OSError:
                    continue
                present.add(path)
                key = (st.st_mtime, st.st_size)
                seen = self._seen.get(path)
                if seen is not None and seen[:2] == key:
                    continue
                if seen is not None and seen[2]:
                    self._forget(path, seen[2])
                try:
                    sha = _identify(path, self.root)
                except ValueError as exc:
                    self._seen[path] = (st.st_mtime, st.st_size, "")
                    log_event("model_refused", logging.WARNING, file=path.name, error=str(exc))
                    continue
                self._seen[path] = (st.st_mtime, st.st_size, sha)
                if sha not in self._by_sha:
                    self._by_sha[sha] = _ModelEntry(sha256=sha, path=path, bytes=st.st_size)
            for path in set(self._seen) - present:
                self._forget(path, self._seen.pop(path)[2])

    def _forget(self, path: Path, sha: str) -> None:
        entry = self._by_sha.get(sha)
        if entry is not None and entry.path == path:
            del self._by_sha[sha]
            if self._loaded.pop(sha, None) is not None:
                self.budget.release(entry.graph_bytes)
                entry.graph, entry.graph_bytes = None, 0

    def models(self) -> list[_ModelEntry]:
        with self._lock:
            return sorted(self._by_sha.values(), key=lambda e: e.path.name)

    def has(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._by_sha

    def entry(self, sha256: str) -> _ModelEntry:
        with self._lock:
            entry = self._by_sha.get(sha256)
            # A model copied in since: look again, at most every RESCAN_S (floods of unknown names).
            rescan = entry is None and time.monotonic() - self._scanned_s >= RESCAN_S
            if rescan:
                self._scanned_s = time.monotonic()
        if rescan:
            self.scan()
            with self._lock:
                entry = self._by_sha.get(sha256)
        if entry is None:
            raise RpcFailure(
                grpc.StatusCode.NOT_FOUND,
                f"model sha256 {sha256[:80]!r} not found: expected one of the {len(self._by_sha)} models "
                "the server holds",
            )
        return entry

    def graph(self, sha256: str) -> Any:
        """The model's graph, loaded once; ``<sha256>~<steps>``: specialised (``specialised``), kept too."""
        base, sep, key = sha256.partition("~")
        if sep:
            return self._derived(base, key)
        entry = self.entry(sha256)
        with self._lock:
            graph = entry.graph
            if graph is not None:
                self._loaded[sha256] = entry
                self._loaded.move_to_end(sha256)
                return graph
            glock = self._graph_locks.setdefault(sha256, threading.Lock())
        with glock:
            if entry.graph is None:
                self._load(entry)
            with self._lock:
                self._loaded[sha256] = entry
            return entry.graph

    def _load(self, entry: _ModelEntry) -> None:
        """Load the graph under a reservation of the load's peak, then keep what the graph holds."""
        who = current_client()  # a new cache entry: it does not push out tails other clients use now
        peak = self.budget.reserve(entry.bytes * LOAD_PEAK_FACTOR, f"loading model {entry.path.name}", build_for=who)
        try:
            graph = load_graph(entry.path, self.root, self.max_nodes)
            cost = graph_bytes(graph.model.ByteSize(), len(graph.nodes))
            self.budget.reserve(cost, f"model {entry.path.name}'s graph", build_for=who)
        finally:
            self.budget.release(peak)
            trim()
        entry.graph, entry.graph_bytes = graph, cost

    @contextmanager
    def pinned(self, sha256: str) -> Iterator[None]:
        """The model's graph (``<sha256>~<steps>``: its base's) is not evicted while this is held."""
        base = sha256.partition("~")[0]
        with self._lock:
            self._pins[base] = self._pins.get(base, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._pins[base] -= 1
                if not self._pins[base]:
                    del self._pins[base]

    def evict(self, nbytes: int, build_for: str | None = None) -> int:
        """The budget's evictor: drop LRU graphs not being loaded or ``pinned`` until ``nbytes`` are freed."""
        freed = 0
        with self._lock:
            for sha in list(self._loaded):
                if freed >= nbytes:
                    break
                entry = self._loaded.pop(sha)
                glock = self._graph_locks.get(sha)
                if (glock is not None and glock.locked()) or sha in self._pins:  # being loaded or split
                    self._loaded[sha] = entry
                    continue
                freed += entry.graph_bytes
                entry.graph, entry.graph_bytes = None, 0
                log_event("graph_evicted", model=sha[:12])
        self.budget.release(freed)
        return freed

    def scrub(self, text: str) -> str:
        """``text`` for a client: the models directory becomes ``<models>`` (``scrub``)."""
        return scrub(self.root, text)

    def _derived(self, base: str, key: str) -> Any:
        graph = self.graph(base)
        name = f"{base}~{key}"
        with self._lock:
            hit = self._specialised.get(name)
            glock = self._graph_locks.setdefault(name, threading.Lock())
        if hit is not None and hit[0]() is graph:
            return hit[1]
        with glock:
            with self._lock:
                hit = self._specialised.get(name)
            if hit is None or hit[0]() is not graph:  # new, or its base was evicted and loaded again
                try:
                    derived = specialised(graph, base, key)
                except RpcFailure:
                    with self._lock:
                        self._graph_locks.pop(name, None)  # made-up steps must not grow this dict
                    raise
                hit = (weakref.ref(graph), derived)
                with self._lock:
                    self._specialised[name] = hit
        return hit[1]

    def claim(self, nbytes: int, models: int, check: Callable[[int, int], None]) -> None:
        """Hold ``nbytes`` and ``models`` for an upload until ``unclaim``, once ``check(held bytes, models)``
        passes under the same lock (concurrent uploads cannot all pass a quota only one fits)."""
        with self._lock:
            held = sum(e.bytes for e in self._by_sha.values()) + self._pending_bytes
            check(held, len(self._by_sha) + self._pending_models)
            self._pending_bytes += nbytes
            self._pending_models += models

    def unclaim(self, nbytes: int, models: int) -> None:
        with self._lock:
            self._pending_bytes -= nbytes
            self._pending_models -= models

    def add(self, sha256: str, path: Path) -> None:
        st = path.stat()
        with self._lock:
            self._seen[path] = (st.st_mtime, st.st_size, sha256)
            self._by_sha.setdefault(sha256, _ModelEntry(sha256=sha256, path=path, bytes=st.st_size))
