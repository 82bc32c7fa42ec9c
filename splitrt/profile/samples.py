"""Samples for the accuracy guard: a folder of images or ``.npz`` files, made into a model's feeds.

- ``load(source, g, *, limit=DEFAULT_LIMIT, mean=None, std=None) -> Samples``: ``source`` is a folder, or
  ``zoo`` (``ZOO``: the photographs shipped in ``splitrt/data/samples``, ``paths.samples_dir()``; see the
  README there for authors and licences). Files are taken in name order, at most ``limit``.
  ``.npz`` files: each is one sample, arrays keyed by input name (every graph input). Images (``.jpg``,
  ``.jpeg``, ``.png``, ``.webp``, ``.bmp``): the model must have one input, 4-D with 3 channels (NCHW or
  NHWC, whichever axis is 3); each image is centre-cropped to that input's aspect ratio, resized to its
  height and width (bicubic) and given as uint8 pixels to a uint8 input, else as ``(pixels / 255 -
  mean) / std`` per channel (RGB, or BGR with ``bgr``, the order ``mean`` and ``std`` follow too; default
  mean 0, std 1: pixels in [0, 1]). A folder mixing both kinds
  reads only the ``.npz`` files. ``ProfileError`` names the folder and what it expected and found.
- ``Samples(feeds, source, kind)``: ``feeds`` one dict of arrays per sample; ``kind`` ``images`` or ``npz``.
- ``IMAGENET_MEAN`` / ``IMAGENET_STD``: the usual normalisation (the zoo's default with ``zoo``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitrt import paths
from splitrt.errors import ProfileError
from splitrt.graph import model as graph_mod

ZOO = "zoo"
DEFAULT_LIMIT = 50
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True, kw_only=True)
class Samples:
    feeds: list[dict[str, np.ndarray]]
    source: str  # the folder, or ``zoo``
    kind: str  # ``images`` or ``npz``


def folder(source: str | Path) -> Path:
    """The folder ``source`` names (``zoo``: the shipped photographs)."""
    return paths.samples_dir() if str(source) == ZOO else Path(source)


def _image_input(g: graph_mod.ModelGraph) -> tuple[str, tuple[int, ...], np.dtype, bool]:
    """(name, shape, dtype, nhwc) of the model's one image input."""
    if len(g.inputs) != 1:
        raise ProfileError(
            f"{g.path.name}: image samples need a model with one input, got {len(g.inputs)} "
            f"({', '.join(t.name for t in g.inputs)}): give .npz samples keyed by input name"
        )
    t = g.inputs[0]
    shape = (g.input_shapes or {}).get(t.name) or t.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ProfileError(
            f"{g.path.name}: image samples need a 4-D input of known size, got {t.name} {shape}: bind it with --shape"
        )
    dims = tuple(int(d) for d in shape)
    if dims[1] == 3:
        nhwc = False
    elif dims[3] == 3:
        nhwc = True
    else:
        raise ProfileError(f"{g.path.name}: image samples need 3 channels (NCHW or NHWC), got {t.name} {list(dims)}")
    return t.name, dims, np.dtype(t.dtype), nhwc


def _fit(path: Path, height: int, width: int) -> np.ndarray:
    """RGB uint8 (height, width, 3): the image centre-cropped to the aspect ratio, then resized."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            rgb = im.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise ProfileError(f"sample {path}: expected an image file, got {exc}") from exc
    w, h = rgb.size
    if w * height > h * width:  # too wide
        cw, ch = h * width // height, h
    else:
        cw, ch = w, w * height // width
    left, top = (w - cw) // 2, (h - ch) // 2
    crop = rgb.crop((left, top, left + max(cw, 1), top + max(ch, 1)))
    return np.asarray(crop.resize((width, height), Image.Resampling.BICUBIC), dtype=np.uint8)


def _image_feeds(
    files: Sequence[Path], g: graph_mod.ModelGraph, mean: Sequence[float], std: Sequence[float], bgr: bool
) -> list[dict[str, np.ndarray]]:
    name, dims, dtype, nhwc = _image_input(g)
    n, height, width = dims[0], *((dims[1], dims[2]) if nhwc else (dims[2], dims[3]))
    if len(mean) != 3 or len(std) != 3 or not all(s > 0 for s in std):
        raise ProfileError(f"sample normalisation: expected 3 means and 3 positive stds, got {list(mean)}, {list(std)}")
    out = []
    for f in files:
        px = _fit(f, height, width)  # H, W, 3
        px = px[:, :, ::-1] if bgr else px
        if dtype == np.uint8:
            x: np.ndarray = px
        else:
            x = (px.astype(np.float32) / 255 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        x = x if nhwc else x.transpose(2, 0, 1)
        batch = np.broadcast_to(x[None], (n, *x.shape))  # a batch of n: the same photo n times
        out.append({name: np.ascontiguousarray(batch, dtype=dtype if dtype.kind in "fu" else np.float32)})
    return out


def _npz_feeds(files: Sequence[Path], g: graph_mod.ModelGraph) -> list[dict[str, np.ndarray]]:
    want = {t.name for t in g.inputs}
    out = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as z:
                feeds = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise ProfileError(f"sample {f}: expected an .npz file of arrays, got {exc}") from exc
        if set(feeds) != want:
            raise ProfileError(f"sample {f}: expected arrays {sorted(want)}, got {sorted(feeds)}")
        out.append(feeds)
    return out


def load(
    source: str | Path,
    g: graph_mod.ModelGraph,
    *,
    limit: int = DEFAULT_LIMIT,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    bgr: bool = False,
) -> Samples:
    """The samples in ``source`` as feeds of ``g`` (see the module docstring)."""
    d = folder(source)
    if limit < 1:
        raise ProfileError(f"samples: expected a limit >= 1, got {limit}")
    if not d.is_dir():
        raise ProfileError(f"samples {d}: expected a folder of images or .npz files, got no such folder")
    entries = sorted(p for p in d.iterdir() if p.is_file())
    npz = [p for p in entries if p.suffix.lower() == ".npz"][:limit]
    images = [p for p in entries if p.suffix.lower() in IMAGE_SUFFIXES][:limit]
    if npz:
        return Samples(feeds=_npz_feeds(npz, g), source=str(source), kind="npz")
    if images:
        if str(source) == ZOO:
            mean, std = mean or IMAGENET_MEAN, std or IMAGENET_STD
        feeds = _image_feeds(images, g, mean or (0.0, 0.0, 0.0), std or (1.0, 1.0, 1.0), bgr)
        return Samples(feeds=feeds, source=str(source), kind="images")
    raise ProfileError(
        f"samples {d}: expected images ({', '.join(IMAGE_SUFFIXES)}) or .npz files, got none of {len(entries)} files"
    )
