"""A real photograph as an image model's input: what the rig, the demo and the profiles feed such models.

Random tensors neither compress like images (a JPEG of noise is 20x a photo's, zstd gains nothing on it)
nor tell what a lossy codec does to the answer. A model whose every input is a 4-D image of three
channels (NCHW or NHWC, any height and width) gets the shipped photograph (``splitrt/data/photos``),
centre-cropped and resized to the input's size: float inputs ImageNet-normalised, uint8 as pixels.

- ``photo_inputs(inputs) -> dict[name, array] | None``: ``inputs`` the graph's ``TensorInfo``s (name, shape,
  dtype); None when any input is not such an image (a text or audio model keeps its random inputs).
- ``photo(height, width) -> uint8 array (height, width, 3)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from splitrt.paths import PACKAGE_DIR

PHOTO = PACKAGE_DIR / "data" / "photos" / "grace_hopper.jpg"
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


@functools.lru_cache(maxsize=8)
def photo(height: int, width: int) -> np.ndarray:
    """The photograph as (height, width, 3) uint8 pixels (read-only)."""
    from PIL import Image

    with Image.open(PHOTO) as im:
        img = np.asarray(im.convert("RGB").resize((width, height), Image.Resampling.BILINEAR))
    img.setflags(write=False)
    return img


def _layout(shape: Sequence[Any]) -> str | None:
    """``nchw`` / ``nhwc`` for a 4-D three-channel image shape with known height and width, else None."""
    if len(shape) != 4:
        return None
    dims = [d if isinstance(d, int) and d > 0 else None for d in shape]
    if dims[1] == 3 and dims[2] and dims[3]:
        return "nchw"
    if dims[3] == 3 and dims[1] and dims[2]:
        return "nhwc"
    return None


def photo_inputs(inputs: Sequence[Any]) -> dict[str, np.ndarray] | None:
    """The photograph as every input (see the module), or None when one is not a three-channel image."""
    out: dict[str, np.ndarray] = {}
    for t in inputs:
        shape = tuple(t.shape or ())
        layout = _layout(shape)
        dtype = np.dtype(t.dtype)
        if layout is None or dtype.kind not in "fu":
            return None
        h, w = (shape[2], shape[3]) if layout == "nchw" else (shape[1], shape[2])
        px = photo(int(h), int(w))
        x = px.astype(dtype) if dtype.kind == "u" else ((px.astype(np.float32) / 255.0 - _MEAN) / _STD).astype(dtype)
        x = x.transpose(2, 0, 1) if layout == "nchw" else x
        batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
        out[t.name] = np.ascontiguousarray(np.broadcast_to(x[None], (batch, *x.shape)))
    return out or None
