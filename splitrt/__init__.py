"""splitrt: run one ONNX model split across an edge device and a cloud server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from splitrt.errors import SplitrtError

__version__ = "0.1.0"

__all__ = ["Device", "SplitrtError", "__version__"]

if TYPE_CHECKING:
    from splitrt.device.client import Device


def __getattr__(name: str) -> Any:
    # Lazy: `import splitrt` stays light (no grpc/onnxruntime) until splitrt.Device is used.
    if name == "Device":
        from splitrt.device.client import Device

        return Device
    raise AttributeError(f"module 'splitrt' has no attribute {name!r}")
