"""The server's models: the ``*.onnx`` files of a directory, keyed by the sha256 of their bytes."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from splitrt.cloud.common import RpcFailure
from splitrt.errors import ConfigError, ModelError


def _sha256_file(path: Path) -> str:
    """The model's identity exactly as the device computes it (external data included)."""
    from splitrt.graph.model import model_sha256

    return model_sha256(path)


@dataclass
class _ModelEntry:
    sha256: str
    path: Path
    bytes: int
    graph: Any = None


class ModelStore:
    """The models of a directory, by sha256 of their bytes; graphs are loaded on first use."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigError(f"models directory {self.root}: expected a directory, got "
                              f"{'a file' if self.root.exists() else 'nothing'}")
        self._lock = threading.Lock()
        self._by_sha: dict[str, _ModelEntry] = {}
        self._seen: dict[Path, tuple[float, int, str]] = {}
        self._graph_locks: dict[str, threading.Lock] = {}
        self.scan()

    def scan(self) -> None:
        """Index new or changed ``*.onnx`` files (hashes only what changed)."""
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
                sha = _sha256_file(path)
                self._seen[path] = (st.st_mtime, st.st_size, sha)
                if sha not in self._by_sha:
                    self._by_sha[sha] = _ModelEntry(sha256=sha, path=path, bytes=st.st_size)
            for path in set(self._seen) - present:
                sha = self._seen.pop(path)[2]
                entry = self._by_sha.get(sha)
                if entry is not None and entry.path == path:
                    del self._by_sha[sha]

    def models(self) -> list[_ModelEntry]:
        with self._lock:
            return sorted(self._by_sha.values(), key=lambda e: e.path.name)

    def has(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._by_sha

    def entry(self, sha256: str) -> _ModelEntry:
        with self._lock:
            entry = self._by_sha.get(sha256)
        if entry is None:
            self.scan()
            with self._lock:
                entry = self._by_sha.get(sha256)
        if entry is None:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND,
                             f"model sha256 {sha256!r} not found: expected one of {len(self._by_sha)} "
                             f"models in {self.root}")
        return entry

    def graph(self, sha256: str) -> Any:
        entry = self.entry(sha256)
        if entry.graph is not None:
            return entry.graph
        with self._lock:
            glock = self._graph_locks.setdefault(sha256, threading.Lock())
        with glock:
            if entry.graph is None:
                from splitrt.graph import model as graph_mod

                try:
                    entry.graph = graph_mod.load(entry.path)
                except ModelError as exc:
                    raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"model {entry.path.name} cannot be loaded: {exc}") from exc
        return entry.graph

    def add(self, sha256: str, path: Path) -> None:
        st = path.stat()
        with self._lock:
            self._seen[path] = (st.st_mtime, st.st_size, sha256)
            self._by_sha.setdefault(sha256, _ModelEntry(sha256=sha256, path=path, bytes=st.st_size))
