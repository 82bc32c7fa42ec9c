"""The model: load and normalise ONNX, enumerate the cuts and the bytes crossing each, materialise
segments, the zoo of test/demo models, and onnxruntime's errors mapped into splitrt's tree
(``onnxruntime_errors``). Imports only ``splitrt.errors`` (and onnx, onnxruntime)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.graph.cuts import Cut, parse_cut_ids
    from splitrt.graph.model import ModelGraph, load, model_sha256
    from splitrt.graph.ort_errors import onnxruntime_errors
    from splitrt.graph.partition import Segment, SegmentCache, head_tail, split
    from splitrt.graph.tensors import TensorInfo

_NAMES = {
    "Cut": "cuts",
    "ModelGraph": "model",
    "TensorInfo": "tensors",
    "load": "model",
    "model_sha256": "model",
    "parse_cut_ids": "cuts",
    "onnxruntime_errors": "ort_errors",
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
