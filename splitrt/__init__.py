"""splitrt: run one ONNX model split across an edge device and a cloud server."""

from __future__ import annotations

from splitrt.errors import SplitrtError

__version__ = "0.1.0"

__all__ = ["SplitrtError", "__version__"]
