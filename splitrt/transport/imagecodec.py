"""Image codecs for 4-D cut tensors: JPEG and WebP at a chosen quality (Pillow). Pure: no I/O.

What a router sends is the camera frame as a JPEG; these codecs let a plan send the input that way, and
inner feature maps too. Specs are ``jpegQ`` and ``webpQ``, ``Q`` a quality in 1..100 (``NAMES``: the ones
profiles measure). ``splitrt.transport.codec`` owns the spec grammar and calls in here.

Which tensors: 4-D, float or uint8, whose image fits the format (JPEG <= 65500 px a side, WebP <= 16383,
and <= ``PIL.Image.MAX_IMAGE_PIXELS`` pixels in all; ``applies``). Any other tensor under an image spec is
sent ``FALLBACK`` (lossless ``fp32+zstd``; a non-float one raw), and its ``Encoded.codec`` says so.

Layout (``layout``): NCHW unless the tensor looks NHWC, i.e. axes 1 and 2 are nearer in size than axes
2 and 3 (``[1, 224, 224, 3]``, ``[1, 7, 7, 512]``; a tie is NCHW). Three channels make a colour (RGB)
image; any other count, one grey image of every (batch, channel) plane tiled row-major on a grid of
``ceil(sqrt(planes))`` columns; three channels with several batch items tile the colour images alike.
Each tile is padded to a multiple of 8 pixels by repeating its edge, so JPEG's 8 x 8 blocks never mix two
planes. Float tensors are quantised to 8 bits per channel first (``x ~ lo[c] + q * scale[c]``, as
``int8c``); uint8 tensors go as they are.

Payload (little-endian): one flags byte (bit 0: NHWC, bit 1: quantised; both must be what the declared
shape and dtype imply), then if quantised ``lo[C]: f32,
scale[C]: f32``, then one image file of exactly ``image_size(shape, layout)`` pixels, mode ``L`` or
``RGB``. ``decode`` checks the flags against the dtype, the parameters (finite, scales > 0), and the
image header's format, size and mode against the declared shape BEFORE decoding a pixel, so a hostile
payload never allocates more than the shape implies (``decoded_bytes``); a truncated or corrupt image
raises ``CodecError`` naming what was expected and what came.
"""

from __future__ import annotations

import functools
import io
import math
import re
import warnings
from dataclasses import dataclass

import numpy as np

from splitrt.errors import CodecError

#: The image codecs a profile measures (and ``codec.names()`` lists). Other qualities parse and work too.
NAMES: tuple[str, ...] = ("jpeg95", "jpeg90", "jpeg75", "jpeg50", "webp75")
#: What a tensor an image codec does not apply to is sent with (lossless; non-float tensors go raw).
FALLBACK = "fp32+zstd"
_FORMATS = {"jpeg": ("JPEG", 65500), "webp": ("WEBP", 16383)}
_SPEC = re.compile(r"(jpeg|webp)(\d{1,3})")
_NHWC = 1
_QUANTISED = 2
_TILE = 8  # JPEG's block: tiles are padded to a multiple of it
_LE_F32 = np.dtype("<f4")


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """``fmt`` ``jpeg`` or ``webp``, ``quality`` 1..100."""

    fmt: str
    quality: int

    def __str__(self) -> str:
        return f"{self.fmt}{self.quality}"


@functools.lru_cache(maxsize=64)
def parse(text: str) -> ImageSpec | None:
    """The image spec ``text`` names, None if it names none; ``CodecError`` on a quality outside 1..100."""
    m = _SPEC.fullmatch(text)
    if m is None:
        return None
    q = int(m.group(2))
    if not 1 <= q <= 100 or m.group(2) != str(q):
        raise CodecError(f"image codec {text!r}: expected a quality in 1..100 without leading zeros, got {m.group(2)}")
    return ImageSpec(fmt=m.group(1), quality=q)


def layout(shape: tuple[int, ...]) -> str:
    """``nchw`` or ``nhwc`` for a 4-D shape (see the module docstring)."""
    _n, a, b, c = (max(int(d), 1) for d in shape)
    return "nhwc" if abs(math.log(a / b)) < abs(math.log(b / c)) else "nchw"


@dataclass(frozen=True, kw_only=True)
class _Geometry:
    nhwc: bool
    channels: int  # of the tensor
    height: int
    width: int
    colour: bool
    tiles: int
    cols: int
    rows: int
    tile_h: int  # padded
    tile_w: int

    @property
    def image_size(self) -> tuple[int, int]:
        """(width, height) of the image, as Pillow gives it."""
        return self.cols * self.tile_w, self.rows * self.tile_h

    @property
    def image_bytes(self) -> int:
        w, h = self.image_size
        return w * h * (3 if self.colour else 1)


def _geometry(shape: tuple[int, ...], nhwc: bool) -> _Geometry:
    n, c, h, w = (shape[0], shape[3], shape[1], shape[2]) if nhwc else shape
    colour = c == 3
    tiles = n if colour else n * c
    cols = max(1, math.ceil(math.sqrt(tiles)))
    rows = max(1, math.ceil(tiles / cols))
    pad = lambda d: max(_TILE, -(-d // _TILE) * _TILE)  # noqa: E731
    return _Geometry(
        nhwc=nhwc,
        channels=c,
        height=h,
        width=w,
        colour=colour,
        tiles=tiles,
        cols=cols,
        rows=rows,
        tile_h=pad(h),
        tile_w=pad(w),
    )


def _fits(g: _Geometry, fmt: str) -> bool:
    from PIL import Image

    w, h = g.image_size
    limit = _FORMATS[fmt][1]
    pixels = Image.MAX_IMAGE_PIXELS or 0
    return g.tiles > 0 and g.height > 0 and g.width > 0 and w <= limit and h <= limit and w * h <= pixels


def applies(dtype: np.dtype, shape: tuple[int, ...], spec: ImageSpec) -> bool:
    """Whether ``spec`` encodes a tensor of ``dtype``/``shape`` as an image (else ``FALLBACK``)."""
    if len(shape) != 4 or not (dtype.kind == "f" or dtype == np.uint8):
        return False
    return _fits(_geometry(tuple(int(d) for d in shape), layout(shape) == "nhwc"), spec.fmt)


def payload_bound(dtype: np.dtype, shape: tuple[int, ...], spec: ImageSpec) -> int:
    """Bytes of the header plus the decoded image of a tensor an image codec applies to (what decoding
    allocates besides the output array; WebP decodes to RGBA twice over, grey or not)."""
    g = _geometry(shape, layout(shape) == "nhwc")
    params = 8 * g.channels if dtype.kind == "f" else 0
    w, h = g.image_size
    return 1 + params + (8 * w * h if spec.fmt == "webp" else g.image_bytes)


# ---- encode ------------------------------------------------------------------------------------------


def _quantise(name: str, x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = x.astype(np.float32)
    if not np.all(np.isfinite(t)):
        bad = int(np.count_nonzero(~np.isfinite(t)))
        raise CodecError(f"tensor {name!r}: an image codec needs finite values, got {bad} non-finite of {x.size}")
    axes = tuple(i for i in range(4) if i != axis)
    lo = t.min(axis=axes).astype(_LE_F32)
    span = t.max(axis=axes).astype(np.float64) - lo.astype(np.float64)
    # A constant channel gets the smallest normal scale: whatever the lossy image does to its q, the value
    # moves by < 255 * 1.2e-38 (a scale of 1 would move it by whole units).
    scale = np.where(span > 0, span / 255.0, np.finfo(np.float32).tiny).astype(_LE_F32)
    bshape = [1, 1, 1, 1]
    bshape[axis] = lo.shape[0]
    np.subtract(t, lo.reshape(bshape), out=t)
    np.divide(t, scale.reshape(bshape), out=t)
    np.rint(t, out=t)
    np.clip(t, 0, 255, out=t)
    return lo, scale, t.astype(np.uint8)


def _tile(q: np.ndarray, g: _Geometry) -> np.ndarray:
    """The NCHW/NHWC uint8 tensor as one image array (H, W) or (H, W, 3)."""
    planes = q if g.nhwc else q.transpose(0, 2, 3, 1)  # N, H, W, C
    # colour: the N images as they are; grey: every (n, c) plane its own tile
    tiles = planes if g.colour else planes.transpose(0, 3, 1, 2).reshape(g.tiles, g.height, g.width, 1)
    ph, pw = g.tile_h - g.height, g.tile_w - g.width
    if ph or pw:
        tiles = np.pad(tiles, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="edge")
    spare = g.rows * g.cols - g.tiles
    if spare:
        tiles = np.concatenate([tiles, np.zeros((spare, *tiles.shape[1:]), np.uint8)])
    depth = tiles.shape[3]
    grid = tiles.reshape(g.rows, g.cols, g.tile_h, g.tile_w, depth).transpose(0, 2, 1, 3, 4)
    img = grid.reshape(g.rows * g.tile_h, g.cols * g.tile_w, depth)
    return np.ascontiguousarray(img if g.colour else img[:, :, 0])


def encode(name: str, arr: np.ndarray, spec: ImageSpec) -> bytes:
    """The payload of one tensor ``applies`` accepted."""
    from PIL import Image

    shape = tuple(int(d) for d in arr.shape)
    g = _geometry(shape, layout(shape) == "nhwc")
    flags = _NHWC if g.nhwc else 0
    head = b""
    if arr.dtype.kind == "f":
        lo, scale, q = _quantise(name, arr, 3 if g.nhwc else 1)
        flags |= _QUANTISED
        head = lo.tobytes() + scale.tobytes()
    else:
        q = np.asarray(arr, dtype=np.uint8)
    buf = io.BytesIO()
    buf.write(bytes([flags]) + head)
    Image.fromarray(_tile(q, g)).save(buf, format=_FORMATS[spec.fmt][0], quality=spec.quality)
    return buf.getvalue()


def warm() -> int:
    """Encode and decode one small image in every format, so that no request pays Pillow's import and its
    codecs' set-up. Returns how many formats worked; never raises (a missing codec fails its own request)."""
    # a real server's first jpeg50 input took 35 ms, the next 12
    done = 0
    for fmt in _FORMATS:
        spec = ImageSpec(fmt=fmt, quality=75)
        x = np.zeros((1, 3, 8, 8), dtype=np.float32)
        x[0, :, 2:6, 2:6] = 1.0
        try:
            if decode("warm", encode("warm", x, spec), x.dtype, x.shape, spec).shape == x.shape:
                done += 1
        except Exception:  # Pillow without this format: its own requests say so
            continue
    return done


# ---- decode ------------------------------------------------------------------------------------------


def _untile(img: np.ndarray, g: _Geometry) -> np.ndarray:
    depth = 3 if g.colour else 1
    grid = img.reshape(g.rows, g.tile_h, g.cols, g.tile_w, depth).transpose(0, 2, 1, 3, 4)
    tiles = grid.reshape(g.rows * g.cols, g.tile_h, g.tile_w, depth)[: g.tiles, : g.height, : g.width]
    if g.colour:
        nhwc = tiles
    else:
        n = g.tiles // g.channels
        nhwc = tiles.reshape(n, g.channels, g.height, g.width).transpose(0, 2, 3, 1)
    return nhwc if g.nhwc else nhwc.transpose(0, 3, 1, 2)


def _jpeg_header(data: memoryview) -> tuple[int, int, int] | None:
    """(width, height, components) from a JPEG's first SOF marker; None if there is none."""
    i, n = 2, len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # no length
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if length < 8 or i + 10 > n:
                return None
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            return width, height, data[i + 9]
        if length < 2:
            return None
        i += 2 + length
    return None


def _webp_header(data: memoryview) -> tuple[int, int, int] | None:
    """(width, height, 3) from a WebP's first image chunk (VP8, VP8L or VP8X); None if there is none."""
    if len(data) < 30 or bytes(data[0:4]) != b"RIFF" or bytes(data[8:12]) != b"WEBP":
        return None
    kind, body = bytes(data[12:16]), data[20:]
    if kind == b"VP8 " and bytes(body[3:6]) == b"\x9d\x01\x2a":
        return (body[6] | body[7] << 8) & 0x3FFF, (body[8] | body[9] << 8) & 0x3FFF, 3
    if kind == b"VP8L" and body[0] == 0x2F:
        bits = int.from_bytes(bytes(body[1:5]), "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 3
    if kind == b"VP8X":
        return int.from_bytes(bytes(body[4:7]), "little") + 1, int.from_bytes(bytes(body[7:10]), "little") + 1, 3
    return None


def _check_header(name: str, data: memoryview, spec: ImageSpec, g: _Geometry) -> None:
    """Refuse an image whose own header disagrees with the declared shape (before any decoder runs)."""
    want_w, want_h = g.image_size
    want_c = 3 if g.colour or spec.fmt == "webp" else 1
    got = _jpeg_header(data) if spec.fmt == "jpeg" else _webp_header(data)
    if got != (want_w, want_h, want_c):
        what = "no readable header" if got is None else f"{got[0]}x{got[1]} with {got[2]} components"
        raise CodecError(
            f"tensor {name!r} ({spec}): expected a {spec.fmt} image {want_w}x{want_h} with {want_c} "
            f"components, got {what} ({len(data)} bytes)"
        )


def _open(name: str, data: memoryview, spec: ImageSpec, g: _Geometry) -> np.ndarray:
    """The image's pixels (H, W) or (H, W, 3), after its header matched ``g``."""
    from PIL import Image, UnidentifiedImageError

    _check_header(name, data, spec, g)
    fmt = _FORMATS[spec.fmt][0]
    # WebP has no grey images: a grey tile grid comes back RGB (three equal planes).
    want_mode = "RGB" if g.colour or spec.fmt == "webp" else "L"
    want_w, want_h = g.image_size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=[fmt])
        with im:
            if im.format != fmt or im.size != (want_w, want_h) or im.mode != want_mode:
                raise CodecError(
                    f"tensor {name!r} ({spec}): expected a {fmt} image {want_w}x{want_h} {want_mode}, "
                    f"got {im.format} {im.size[0]}x{im.size[1]} {im.mode}"
                )
            im.load()
            pixels = np.asarray(im)
    except CodecError:
        raise
    except (OSError, ValueError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
        raise CodecError(
            f"tensor {name!r} ({spec}): expected a complete {fmt} image {want_w}x{want_h} {want_mode}, got "
            f"corrupt or truncated data ({len(data)} bytes: {exc})"
        ) from exc
    want_shape = (want_h, want_w, 3) if want_mode == "RGB" else (want_h, want_w)
    if pixels.shape != want_shape or pixels.dtype != np.uint8:
        raise CodecError(
            f"tensor {name!r} ({spec}): expected pixels {want_shape} uint8, got {pixels.shape} {pixels.dtype}"
        )
    return pixels if g.colour or pixels.ndim == 2 else pixels[:, :, 0]


def decode(
    name: str, payload: bytes | memoryview, dtype: np.dtype, shape: tuple[int, ...], spec: ImageSpec
) -> np.ndarray:
    """The tensor of ``dtype``/``shape`` one payload holds; ``CodecError`` on anything that does not match.
    The caller has bounded ``shape`` (``payload_bound``) already."""
    data = memoryview(payload).cast("B")
    quantised = dtype.kind == "f"
    if not (quantised or dtype == np.uint8) or len(shape) != 4:
        raise CodecError(
            f"tensor {name!r} ({spec}): expected a 4-D float or uint8 tensor, got {dtype.name} {list(shape)}"
        )
    if len(data) < 1:
        raise CodecError(f"tensor {name!r} ({spec}): expected a flags byte and an image, got 0 bytes")
    flags = data[0]
    nhwc = layout(shape) == "nhwc"
    want = (_NHWC if nhwc else 0) | (_QUANTISED if quantised else 0)
    if flags != want:
        raise CodecError(
            f"tensor {name!r} ({spec}): expected flags {want:#04x} (layout {layout(shape)}, quantised={quantised}), "
            f"got {flags:#04x}"
        )
    g = _geometry(shape, nhwc)
    if not _fits(g, spec.fmt):
        raise CodecError(
            f"tensor {name!r} ({spec}): shape {list(shape)} makes a {g.image_size[0]}x{g.image_size[1]} image, "
            f"expected one {spec.fmt} can hold"
        )
    start = 1 + (8 * g.channels if quantised else 0)
    if len(data) < start:
        raise CodecError(f"tensor {name!r} ({spec}): expected at least {start} header bytes, got {len(data)}")
    pixels = _open(name, data[start:], spec, g)
    q = _untile(pixels, g)
    if not quantised:
        return np.ascontiguousarray(q)
    params = np.frombuffer(data[1:start], dtype=_LE_F32)
    lo, scale = params[: g.channels], params[g.channels :]
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
        raise CodecError(
            f"tensor {name!r} ({spec}): expected finite offsets and positive scales, "
            "got garbage quantisation parameters"
        )
    bshape = [1, 1, 1, g.channels] if g.nhwc else [1, g.channels, 1, 1]
    work = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    out = q.astype(work)
    np.multiply(out, scale.astype(work).reshape(bshape), out=out)
    np.add(out, lo.astype(work).reshape(bshape), out=out)
    return out.astype(dtype, copy=False)
