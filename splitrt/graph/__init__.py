"""The model: load and normalise ONNX, enumerate the cuts and the bytes crossing each, materialise
segments, and the zoo of test/demo models. Imports only ``splitrt.errors`` (and onnx, onnxruntime)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.graph.cuts import Cut, parse_cut_ids
    from splitrt.graph.model import ModelGraph, TensorInfo, load, model_sha256
    from splitrt.graph.partition import Segment, SegmentCache, head_tail, split

_NAMES = {
    "Cut": "cuts",
    "ModelGraph": "model",
    "TensorInfo": "model",
    "load": "model",
    "model_sha256": "model",
    "parse_cut_ids": "cuts",
    "Segment": "partition",
    "SegmentCache": "partition",
    "head_tail": "partition",
    "split": "partition",
    "cuts": "",
    "model": "",
    "normalise": "",
    "partition": "",
    "zoo": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES, legacy="model")
