"""Tail segments made in a child process (``children``): there the model is loaded, split and the segment
written to a file, holding none of the server's GIL; the server only opens that file.

``Builder.make(path, root, sha256, cut_id, max_nodes) -> Made`` (the caller deletes ``Made.path``) raises
what the in-process build would (NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT; RESOURCE_EXHAUSTED if
the child was killed). Failures that cannot change (``LASTING``) and unknown cut ids are answered again
without the child (``check_known``, before a worker slot is taken). ``close`` stops the children.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cachetools import LRUCache

from splitrt.cloud.common import RpcFailure, disk_failure
from splitrt.cloud.models.children import Children
from splitrt.errors import CutError
from splitrt.graph.memory import tensor_bytes

__all__ = ["Builder", "Made", "segment_of"]

MAX_MODELS_INDEXED = 256  # models whose cut ids are remembered (LRU)
# Failures the same request meets again (a model's content is its name), remembered up to ``MAX_FAILED``.
LASTING = frozenset(("NOT_FOUND", "FAILED_PRECONDITION", "INVALID_ARGUMENT"))
MAX_FAILED = 1024


@dataclass(frozen=True)
class Made:
    path: Path
    inputs: list[tuple[str, str, tuple[int | str | None, ...] | None]]
    skeleton: bytes  # ``peak.skeleton`` of the segment, serialised (small: no large weights)
    weights_bytes: int
    # Both made in the child: over a 60 000-node upload each holds the GIL 0.07-0.25 s (2026-12).
    # (shapes sorted by name, ``peak.peak_bytes``) at the declared shapes; None when a dim is free.
    static_peak: tuple[tuple[tuple[str, tuple[int, ...]], ...], Any] | None = None
    sizing: frozenset[str] | None = None


def segment_of(graph: Any, sha256: str, cut_id: str, root: Path) -> Any:
    """The segment a server runs for ``cut_id`` (``"A>B"``: between two cuts, a server with a next hop)."""
    from splitrt.cloud.models.store import scrub
    from splitrt.graph import partition

    try:
        first, _, second = cut_id.partition(">")
        segment = partition.split(graph, [first, second])[1] if second else partition.split(graph, [cut_id])[-1]
    except CutError as exc:
        raise RpcFailure(
            grpc.StatusCode.NOT_FOUND, f"cut {cut_id!r} of model {sha256[:12]}: {scrub(root, str(exc))}"
        ) from exc
    except Exception as exc:  # a model that loads but does not split (a bad upload): not the server's fault
        raise RpcFailure(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"model {sha256[:12]} cannot be split at cut {cut_id!r}: {scrub(root, str(exc))}",
        ) from exc
    if not segment.outputs:  # cut ``device``: its head made every output, nothing is left to run
        raise RpcFailure(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"cut {cut_id!r} of model {sha256[:12]} leaves nothing to run on a server: expected a cut before 'device'",
        )
    return segment


def _make(path: str, root: str, sha256: str, cut_id: str, max_nodes: int | None, out: str) -> tuple[Any, ...]:
    """In the child: ("ok", inputs, skeleton bytes, weights bytes, static peak, sizing inputs, cut ids) with the segment
    written to ``out``, or ("error", code name, message, cut ids or None)."""
    from splitrt.cloud.models.store import load_graph, specialised
    from splitrt.graph import partition
    from splitrt.graph.peak import skeleton
    from splitrt.graph.sizing import sizing_inputs

    ids: list[str] | None = None
    try:
        graph = load_graph(Path(path), Path(root), max_nodes)
        base, steps, key = sha256.partition("~")
        if steps:  # "<sha256>~<steps>": the model specialised by those steps (``store.ModelStore.graph``)
            graph = specialised(graph, base, key)
        ids = [c.id for c in graph.cuts()]
        segment = segment_of(graph, sha256, cut_id, Path(root))
        del graph
        model = segment.model
        weights = sum(tensor_bytes(t) for t in model.graph.initializer)
        skel_model = skeleton(model)
        inputs = partition.declared_inputs(model)
        try:
            with open(out, "wb") as f:
                f.write(model.SerializeToString())
        except OSError as exc:  # a full temporary directory: the server's state, said without its paths
            Path(out).unlink(missing_ok=True)
            raise disk_failure(exc, f"building the tail of cut {cut_id!r}") from exc
        del model, segment
        static = _static_peak(skel_model, inputs)
        return ("ok", inputs, skel_model.SerializeToString(), weights, static, sorted(sizing_inputs(skel_model)), ids)
    except RpcFailure as exc:
        return ("error", exc.code.name, exc.message, ids)


def _static_peak(skel: Any, inputs: list[tuple[str, str, Any]]) -> Any:
    """(shapes, ``peak.peak_bytes``) at the declared input shapes if every dim is a number, else None."""
    from splitrt.graph.peak import peak_bytes

    if not all(shape is not None and all(isinstance(d, int) for d in shape) for _, _, shape in inputs):
        return None
    shapes = {name: tuple(int(d) for d in shape) for name, _, shape in inputs}
    return tuple(sorted(shapes.items())), peak_bytes(skel, shapes)


class Builder:
    """Segments made by ``max_workers`` child processes (started on first use or ``children.warm``)."""

    def __init__(self, max_workers: int = 1) -> None:
        self.children = Children("building a tail", max_workers=max_workers, imports=("onnx",))
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._closed = False
        # Cut ids per model (``~steps`` included): made-up cuts are refused without a load in the child.
        self._cut_ids: LRUCache[str, frozenset[str]] = LRUCache(MAX_MODELS_INDEXED)
        # (sha256, cut id, or "" for every cut of a model that did not load) -> (code name, message).
        self._failed: LRUCache[tuple[str, str], tuple[str, str]] = LRUCache(MAX_FAILED)

    def _directory(self) -> str:
        with self._lock:
            if self._closed:  # a call still running after the server stopped: no new directory
                raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the server is shutting down: no tail is built now")
            if self._dir is None:
                try:
                    self._dir = tempfile.mkdtemp(prefix="splitrt-segments-")
                except OSError as exc:
                    raise disk_failure(exc, "building a tail") from exc
            return self._dir

    def make(self, path: Path, root: Path, sha256: str, cut_id: str, max_nodes: int | None) -> Made:
        self.check_known(path, sha256, cut_id)
        out = Path(self._directory()) / f"{uuid.uuid4().hex}.onnx"
        what = f"building the tail of cut {cut_id!r}"
        try:
            result = self.children.run(_make, str(path), str(root), sha256, cut_id, max_nodes, str(out), what=what)
        except BaseException:
            out.unlink(missing_ok=True)
            raise
        with self._lock:
            if result[-1] is not None:
                self._cut_ids[sha256] = frozenset(result[-1])
            if result[0] != "ok" and result[1] in LASTING:
                self._failed[(sha256, "" if result[-1] is None else cut_id)] = (result[1], result[2])
        if result[0] != "ok":
            out.unlink(missing_ok=True)
            raise RpcFailure(grpc.StatusCode[result[1]], result[2])
        return Made(
            path=out,
            inputs=result[1],
            skeleton=result[2],
            weights_bytes=int(result[3]),
            static_peak=result[4],
            sizing=frozenset(result[5]),
        )

    def check_known(self, path: Path, sha256: str, cut_id: str) -> None:
        """Raise the child's ``LASTING`` answer for this model or cut, or NOT_FOUND for a cut it lacks."""
        with self._lock:
            failed = self._failed.get((sha256, "")) or self._failed.get((sha256, cut_id))
            ids = self._cut_ids.get(sha256)
        if failed is not None:
            raise RpcFailure(grpc.StatusCode[failed[0]], failed[1])
        if ids is None:
            return
        for part in cut_id.split(">"):
            if part not in ids:
                raise RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    f"cut {cut_id!r} of model {sha256[:12]}: {path.name}: no cut {part!r}; expected one of "
                    f"{len(ids)} cut ids",
                )

    def close(self) -> None:
        """Stop the children for good (a build in progress fails UNAVAILABLE) and remove the directory."""
        self.children.stop(terminate=True, final=True)
        with self._lock:
            directory, self._dir = self._dir, None
            self._closed = True
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
