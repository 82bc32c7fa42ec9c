"""One tensor as the graph sees it (``TensorInfo``: name, dtype, shape, bytes): a model's inputs and
outputs (``graph.model``) and the tensors crossing a cut (``graph.cuts``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TensorInfo"]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: numpy dtype name (``"float32"``), shape, size in bytes.

    Bound (``load(path, binding)``), the shape is concrete and ``source`` says how it was sized
    (``static``, ``bound``, ``measured``: see ``splitrt.graph.shapes``); unbound, a symbolic batch
    dimension counts as 1 for ``bytes``. ``shape`` is ``None`` when shape inference could not tell; then
    ``bytes`` is -1.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None
    bytes: int
    source: str = "static"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape or ()),
            "bytes": self.bytes,
            "sized_by": self.source if self.bytes >= 0 else "unknown",
        }
