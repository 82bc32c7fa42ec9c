"""Tensor <-> bytes codecs for the tensors that cross a cut. Pure: no I/O.

A codec spec is a quantisation, optionally followed by ``+zstd`` or ``+zlib`` (lossless compression of the
quantised bytes), or an image codec ``jpegQ`` / ``webpQ`` (quality Q in 1..100; ``splitrt.transport.imagecodec``:
4-D tensors as JPEG or WebP images, what a router sends for a camera frame). Its short string form parses
back: ``Codec.parse(str(c)) == c``.

``+zstd`` (Zstandard level 1) is what plans use: it sends what ``+zlib`` level 1 sends in several times
less CPU time (``bench/bench_codec.py``), so pricing the bytes alone stays honest. ``+zlib`` stays for
peers that cannot install ``zstandard``.

=========  ===================================================================================
``fp32``   raw bytes of the tensor's own float dtype (lossless; float64 stays float64)
``fp16``   cast to IEEE half (relative error <= 2**-11 within +-65504; larger values become inf)
``int8``   affine uint8, one (offset, scale) per tensor: ``x ~ lo + q * scale``, ``q`` in 0..255,
           absolute error <= scale / 2 where ``scale = (max - min) / 255``
``int8c``  like ``int8`` with one (offset, scale) per channel; the channel axis from the shape (NCHW,
           NHWC, [N, frames, features]: ``_channel_axis``), per tensor when a channel holds fewer
           than ``MIN_PER_CHANNEL`` elements (the parameters would outweigh the data) or ndim < 2
=========  ===================================================================================

Tensors that are not floating point (int64 indices, bool masks, ...) are always sent ``raw``
whatever the spec, so a codec can never change an integer, with one exception: an image codec sends a 4-D
uint8 tensor (a camera frame) as the image it is. A tensor an image codec does not apply to (not 4-D, too
big for one image) is sent ``imagecodec.FALLBACK`` (``fp32+zstd``, lossless). Each encoded tensor names the
codec it was encoded with (``Encoded.codec``): ``raw``, the fallback or the spec.

Payload layout (little-endian): ``raw``/``fp32`` and ``fp16`` are the element bytes; ``int8`` is
``lo: f32, scale: f32`` then the uint8 elements; ``int8c`` is ``lo[C]: f32, scale[C]: f32`` then the
uint8 elements (original layout); image codecs: ``splitrt.transport.imagecodec``. ``+zlib`` wraps the
whole payload in a zlib stream, ``+zstd`` in one Zstandard frame that records its content size. A payload is
``bytes`` or a read-only byte ``memoryview`` (``encode(..., copy=False)``, and tensors parsed off the wire
by ``splitrt.transport.wire``): big tensors then cross without a copy. Decoding checks
every length against the one implied by dtype and shape and raises ``CodecError`` naming both, so a
truncated or garbage payload never turns into a wrong tensor silently.

- ``Codec.parse("int8c+zlib")`` / ``str(codec)`` round-trip; quants ``fp32`` (raw, lossless), ``fp16``, ``int8``
  (affine per tensor), ``int8c`` (per channel, axis from the shape), each optionally ``+zlib``; ``names()`` lists them.
- ``encode(name, array, codec, *, copy=True) -> Encoded(name, dtype, shape, codec, payload)``; non-float tensors
  are always ``codec="raw"``. ``payload`` is ``bytes`` or a read-only byte ``memoryview``: with ``copy=False`` a
  raw/fp32 payload is a view of ``array`` (which must not change while the ``Encoded`` is in use); tensors
  parsed by ``splitrt.wire`` carry views of the received message.
- ``decode(Encoded, *, max_bytes=MAX_TENSOR_BYTES) -> np.ndarray`` (may be a read-only view) raises
  ``CodecError`` naming expected vs actual byte counts on truncated/garbage payloads, and refuses a tensor whose
  ``decoded_bytes(Encoded)`` (max of decoded array and inflated payload, from dtype/shape/codec alone) exceed
  ``max_bytes`` before inflating anything; zlib is inflated at most to the implied size. ``error_bound(array,
  codec)``.
"""

from __future__ import annotations

import functools
import math
import threading
import zlib
from dataclasses import dataclass, field

import numpy as np
import zstandard

from splitrt.errors import CodecError
from splitrt.transport import imagecodec

QUANTS: tuple[str, ...] = ("fp32", "fp16", "int8", "int8c")
COMPRESSIONS: tuple[str, ...] = ("zstd", "zlib")
RAW = "raw"
# Default cap of ``decode``: refuse tensors claiming more than this many bytes (garbage shapes). A server
# passes a much smaller ``max_bytes`` (``ServerConfig.max_decoded_bytes``).
MAX_TENSOR_BYTES = 1 << 33
ZLIB_LEVEL = 1
ZSTD_LEVEL = 1

_LE_F32 = np.dtype("<f4")
_LE_F16 = np.dtype("<f2")
_NATIVE_LE = np.little_endian


@dataclass(frozen=True, kw_only=True)
class Codec:
    """A codec spec: ``quant`` in ``QUANTS``, ``compress`` ``None``, ``"zstd"`` or ``"zlib"``."""

    quant: str = "fp32"
    compress: str | None = None
    # ``image``, worked out once (read per tensor of every request).
    _image: imagecodec.ImageSpec | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_image", imagecodec.parse(self.quant))
        if self._image is not None:
            if self.compress is not None:
                raise CodecError(f"image codec {self.quant!r}: expected no compression after it, got {self.compress!r}")
            return
        if self.quant not in QUANTS:
            raise CodecError(
                f"unknown quantisation {self.quant!r}: expected one of {', '.join(QUANTS)}, jpegQ or webpQ (Q 1..100)"
            )
        if self.compress is not None and self.compress not in COMPRESSIONS:
            raise CodecError(f"unknown compression {self.compress!r}: expected one of {', '.join(COMPRESSIONS)}")

    def __str__(self) -> str:
        return self.quant if self.compress is None else f"{self.quant}+{self.compress}"

    @property
    def lossless(self) -> bool:
        return self.quant == "fp32"

    @property
    def image(self) -> imagecodec.ImageSpec | None:
        """The image codec this spec is (``jpeg75``, ...), None for a quantisation."""
        return self._image

    @classmethod
    def parse(cls, text: str | Codec) -> Codec:
        """Parse ``fp32``, ``fp16+zlib``, ``int8c``, ...; ``raw`` means ``fp32``."""
        if isinstance(text, Codec):
            return text
        return _parse_text(text)

    @classmethod
    def _parse(cls, text: str) -> Codec:
        parts = text.strip().lower().split("+")
        quant = parts[0] or "fp32"
        if quant == RAW:
            quant = "fp32"
        if len(parts) > 2:
            raise CodecError(f"codec {text!r}: expected QUANT or QUANT+COMPRESSION, got {len(parts)} parts")
        return cls(quant=quant, compress=parts[1] if len(parts) == 2 else None)


# Every request parses its codec strings (device and server, both ways): parse each spelling once. Bounded:
# the strings come from clients; a spelling that does not parse raises and is not cached.
@functools.lru_cache(maxsize=64)
def _parse_text(text: str) -> Codec:
    return Codec._parse(text)


_FP32 = Codec()
_FALLBACK = Codec.parse(imagecodec.FALLBACK)


def names() -> list[str]:
    """Every codec spec profiles measure, in a stable order (for benches and CLI help); other image
    qualities (``jpeg60``) parse too."""
    return [q for q in QUANTS] + [f"{q}+{c}" for c in COMPRESSIONS for q in QUANTS] + list(imagecodec.NAMES)


@dataclass(frozen=True, kw_only=True)
class Encoded:
    """One encoded tensor: what travels. ``dtype``/``shape`` describe the decoded tensor."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    codec: str
    payload: bytes | memoryview  # a memoryview is read-only, format "B"

    @property
    def nbytes(self) -> int:
        return len(self.payload)


@functools.lru_cache(maxsize=64)
def _name(dtype: np.dtype) -> str:
    """``dtype.name`` (numpy computes it in Python on every access: a few microseconds a tensor)."""
    return dtype.name


#: ``int8c`` goes per channel only when each channel holds at least this many elements: its 8 bytes of
#: parameters then add at most 1/8 to the int8 payload. A [1, C] or [1, C, 1, 1] tensor (one element per
#: channel) would send 9 bytes per value, 2.25x fp32, where per tensor sends 0.25x.
MIN_PER_CHANNEL = 64


def _channel_axis(shape: tuple[int, ...]) -> int | None:
    """``int8c``'s channel axis from the shape alone (encoder and decoder agree without a header), or
    None (per tensor) when per channel would cost more than 1/8 more bytes.

    4-D: the channels are the end axis (1 or 3) away from the two spatial ones, which are the pair of
    neighbours nearest in size (NCHW [1, 512, 15, 20] -> 1, NHWC [1, 480, 640, 3] -> 3; a tie -> 1);
    3-D [N, A, B]: the smaller of A and B ([1, frames, features] -> features, [1, C, T] -> C); else 1."""
    if len(shape) < 2:
        return None
    d = [max(int(x), 1) for x in shape]
    axis = 1
    if len(d) == 4:
        axis = 3 if abs(math.log(d[1] / d[2])) < abs(math.log(d[2] / d[3])) else 1
    elif len(d) == 3 and d[2] < d[1]:
        axis = 2
    per_channel = math.prod(d) // d[axis]
    return axis if per_channel >= MIN_PER_CHANNEL else None


def _affine_params(x: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and scales (float32, rounded as they travel) per channel (or one of each)."""
    if x.size == 0:
        n = 1 if axis is None else x.shape[axis]
        return np.zeros(n, _LE_F32), np.ones(n, _LE_F32)
    if axis is None:
        lo = np.array([x.min()], dtype=np.float64)
        hi = np.array([x.max()], dtype=np.float64)
    else:
        reduce_axes = tuple(i for i in range(x.ndim) if i != axis)
        lo = x.min(axis=reduce_axes).astype(np.float64)
        hi = x.max(axis=reduce_axes).astype(np.float64)
    lo32 = lo.astype(_LE_F32)
    span = hi - lo32.astype(np.float64)
    scale = np.where(span > 0, span / 255.0, 1.0).astype(_LE_F32)
    # float32 rounding may have shrunk the scale below span/255: nudge it up so q never clips by > 1 ulp.
    short = lo32.astype(np.float64) + 255.0 * scale.astype(np.float64) < hi
    if np.any(short):
        scale = np.where(short, np.nextafter(scale, np.float32(np.inf)), scale).astype(_LE_F32)
    return lo32, scale


def _broadcast(v: np.ndarray, axis: int | None, ndim: int) -> np.ndarray:
    if axis is None:
        return v.reshape(()) if v.size == 1 else v
    shape = [1] * ndim
    shape[axis] = v.shape[0]
    return v.reshape(shape)


def _quantise(x: np.ndarray, axis: int | None, name: str, quant: str) -> bytes:
    # One working copy in the tensor's precision (float32 unless it is float64), updated in place: a
    # device encoding a 16 MB activation needs 16 MB more, not the 64 MB of float64 temporaries.
    work = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    t = x.astype(work)
    if not np.all(np.isfinite(t)):
        bad = int(np.count_nonzero(~np.isfinite(t)))
        raise CodecError(f"tensor {name!r}: {quant} needs finite values, got {bad} non-finite of {x.size}")
    lo, scale = _affine_params(t, axis)
    np.subtract(t, _broadcast(lo.astype(work), axis, x.ndim), out=t)
    np.divide(t, _broadcast(scale.astype(work), axis, x.ndim), out=t)
    np.rint(t, out=t)
    np.clip(t, 0, 255, out=t)
    return lo.tobytes() + scale.tobytes() + t.astype(np.uint8).tobytes()


def _plain(arr: np.ndarray, copy: bool) -> bytes | memoryview:
    """The bytes of a C-contiguous array: a copy, or a read-only view."""
    return arr.tobytes() if copy else arr.reshape(-1).view(np.uint8).data.toreadonly()


def encode(name: str, array: np.ndarray, codec: Codec | str = "fp32", *, copy: bool = True) -> Encoded:
    """Encode one tensor with ``codec`` (a non-float tensor is always sent raw).

    ``copy=False``: a ``raw`` or ``fp32`` payload is a read-only view of ``array`` when its layout allows
    (C-contiguous, little-endian), so the array must not change while the result is in use.
    """
    spec = Codec.parse(codec)
    arr = np.asarray(array)
    dtype = arr.dtype
    shape = tuple(map(int, arr.shape))
    if dtype.kind not in "fiub" or dtype.itemsize == 0:
        raise CodecError(f"tensor {name!r}: expected a numeric or bool array, got dtype {dtype}")
    # Little-endian already (the usual case): no new dtype to build, and a C-contiguous array is used as is.
    le = dtype if dtype.byteorder in "<|" or (dtype.byteorder == "=" and _NATIVE_LE) else dtype.newbyteorder("<")
    image = spec._image
    if image is not None:
        if imagecodec.applies(dtype, shape, image):
            image_payload = imagecodec.encode(name, arr, image)
            return Encoded(name=name, dtype=_name(dtype), shape=shape, codec=str(spec), payload=image_payload)
        spec = _FALLBACK
    if dtype.kind != "f":
        payload = _plain(np.ascontiguousarray(arr, dtype=le), copy)
        return Encoded(name=name, dtype=_name(dtype), shape=shape, codec=RAW, payload=payload)
    body: bytes | memoryview
    if spec.quant == "fp32":
        body = _plain(np.ascontiguousarray(arr, dtype=le), copy)
    elif spec.quant == "fp16":
        body = np.ascontiguousarray(arr, dtype=_LE_F16).tobytes()
    else:
        axis = _channel_axis(shape) if spec.quant == "int8c" else None
        body = _quantise(arr, axis, name, spec.quant)
    if spec.compress == "zlib":
        body = zlib.compress(body, ZLIB_LEVEL)
    elif spec.compress == "zstd":
        body = _zstd_compressor().compress(body)
    return Encoded(name=name, dtype=_name(dtype), shape=shape, codec=str(spec), payload=body)


class _NotNumeric(Exception):
    pass


@functools.lru_cache(maxsize=64)
def _numeric_dtype(dtype: str) -> np.dtype:
    # Cached: np.dtype(str) is looked up three times per tensor decoded; errors raise and are not cached.
    dt = np.dtype(dtype)
    if dt.kind not in "fiub" or dt.itemsize == 0:
        raise _NotNumeric
    return dt


def _dtype(name: str, dtype: str) -> np.dtype:
    try:
        return _numeric_dtype(dtype)
    except TypeError as exc:
        raise CodecError(f"tensor {name!r}: unknown dtype {dtype!r}") from exc
    except _NotNumeric:
        raise CodecError(f"tensor {name!r}: expected a numeric or bool dtype, got {dtype!r}") from None


def expected_bytes(dtype: str, shape: tuple[int, ...], codec: str, *, name: str = "?") -> int:
    """Length of the (uncompressed) payload for a tensor of ``dtype``/``shape`` under ``codec``."""
    dt = _dtype(name, dtype)
    shape = tuple(map(int, shape))  # Python ints: exact products (no genexprs: per tensor of every request)
    if shape and min(shape) < 0:
        raise CodecError(f"tensor {name!r}: expected non-negative dimensions, got shape {shape}")
    size = math.prod(shape)  # 10x faster than np.prod
    if codec == RAW:
        if dt.kind == "f":
            raise CodecError(f"tensor {name!r}: float tensors carry a float codec, got {codec!r}")
        return size * dt.itemsize
    spec = _parse_text(codec)  # a str here: no ``Codec.parse`` call per tensor
    image = spec._image
    if image is not None:
        if not imagecodec.applies(dt, tuple(shape), image):
            raise CodecError(
                f"tensor {name!r}: {image} takes 4-D float or uint8 tensors that fit one image, "
                f"got {dt.name} {list(shape)}"
            )
        return imagecodec.payload_bound(dt, tuple(shape), image)
    if dt.kind != "f":
        raise CodecError(f"tensor {name!r}: {dt.name} tensors are sent raw, got codec {codec!r}")
    if spec.quant == "fp32":
        return size * dt.itemsize
    if spec.quant == "fp16":
        return size * 2
    axis = _channel_axis(tuple(shape)) if spec.quant == "int8c" else None
    channels = int(shape[axis]) if axis is not None else 1
    return 8 * channels + size


def decoded_bytes(enc: Encoded) -> int:
    """Memory ``decode(enc)`` needs: the larger of the decoded array and the (inflated) payload, from
    dtype, shape and codec alone (nothing is inflated). Raises ``CodecError`` on a bad dtype/shape/codec."""
    shape = tuple(map(int, enc.shape))
    dt = _dtype(enc.name, enc.dtype)
    want = expected_bytes(enc.dtype, shape, enc.codec, name=enc.name)
    return max(want, math.prod(shape) * dt.itemsize)


def decode(enc: Encoded, *, max_bytes: int = MAX_TENSOR_BYTES) -> np.ndarray:
    """Decode one tensor; raises ``CodecError`` naming the expected and actual sizes on bad input.

    A tensor whose ``decoded_bytes`` exceed ``max_bytes`` is refused before anything is inflated or
    allocated (a zlib stream is inflated at most to the size its dtype and shape imply). The result may
    be a read-only view of the payload (no copy for raw tensors).
    """
    name, shape = enc.name, tuple(map(int, enc.shape))
    dt = _dtype(name, enc.dtype)
    want = expected_bytes(enc.dtype, shape, enc.codec, name=name)
    need = max(want, math.prod(shape) * dt.itemsize)  # decoded_bytes(enc), without parsing it all again
    if need > max_bytes:
        raise CodecError(
            f"tensor {name!r}: shape {list(shape)} {dt.name} ({enc.codec}) decodes to {need} "
            f"bytes, expected at most {max_bytes}"
        )
    spec = Codec.parse(enc.codec) if enc.codec != RAW else _FP32
    image = spec._image
    if image is not None:  # the image's own header is checked against the shape before decoding
        return imagecodec.decode(name, enc.payload, dt, shape, image)
    body = enc.payload
    if enc.codec != RAW and spec.compress == "zlib":
        body = _inflate(name, body, want)
    elif enc.codec != RAW and spec.compress == "zstd":
        body = _unzstd(name, body, want)
    if len(body) != want:
        raise CodecError(
            f"tensor {name!r} ({enc.codec}, {dt.name} {list(shape)}): expected {want} payload bytes, got {len(body)}"
        )
    if enc.codec == RAW or spec.quant == "fp32":
        return np.frombuffer(body, dtype=dt.newbyteorder("<")).reshape(shape).astype(dt, copy=False)
    if spec.quant == "fp16":
        return np.frombuffer(body, dtype=_LE_F16).reshape(shape).astype(dt)
    axis = _channel_axis(shape) if spec.quant == "int8c" else None
    channels = shape[axis] if axis is not None else 1
    params = np.frombuffer(body, dtype=_LE_F32, count=2 * channels)
    lo, scale = params[:channels].astype(np.float64), params[channels:].astype(np.float64)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
        raise CodecError(
            f"tensor {name!r} ({enc.codec}): expected finite offsets and positive scales, "
            "got garbage quantisation parameters"
        )
    q = np.frombuffer(body, dtype=np.uint8, offset=8 * channels).reshape(shape)
    # In place, in the output's precision (float64 only for float64 tensors): no float64 temporaries,
    # so decoding takes the output's size and the payload, not 16 more bytes per element.
    work = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    out = q.astype(work)
    np.multiply(out, _broadcast(scale.astype(work), axis, len(shape)), out=out)
    np.add(out, _broadcast(lo.astype(work), axis, len(shape)), out=out)
    return np.asarray(out.astype(dt, copy=False))  # asarray: a 0-d result stays an array


def _inflate(name: str, payload: bytes | memoryview, want: int) -> bytes:
    d = zlib.decompressobj()
    try:
        body = d.decompress(payload, want + 1)
    except zlib.error as exc:
        raise CodecError(
            f"tensor {name!r}: expected a zlib stream of {want} bytes, got corrupt data ({len(payload)} bytes: {exc})"
        ) from exc
    if len(body) > want:
        raise CodecError(f"tensor {name!r}: expected {want} bytes after zlib, got more")
    if not d.eof:
        raise CodecError(
            f"tensor {name!r}: expected a complete zlib stream of {want} bytes, "
            f"got a truncated one ({len(body)} bytes decoded)"
        )
    if d.unused_data:
        raise CodecError(
            f"tensor {name!r}: expected nothing after the zlib stream, got {len(d.unused_data)} trailing bytes"
        )
    return body


_ZSTD = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    # One per thread (a compressor is not thread-safe); it writes the content size in the frame header,
    # which the decoder checks before inflating anything.
    c = getattr(_ZSTD, "compressor", None)
    if c is None:
        c = _ZSTD.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return c


def _unzstd(name: str, payload: bytes | memoryview, want: int) -> bytes:
    """Inflate one Zstandard frame that must hold exactly ``want`` bytes; nothing larger is allocated."""
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise CodecError(
            f"tensor {name!r}: expected a zstd frame of {want} bytes, got corrupt data ({len(payload)} bytes: {exc})"
        ) from exc
    if size != want:
        got = "no content size" if size < 0 else f"a frame of {size} bytes"
        raise CodecError(f"tensor {name!r}: expected a zstd frame of {want} bytes, got {got}")
    try:
        # A fresh context per call: contexts are not thread-safe and servers decode on many threads.
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=want, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CodecError(
            f"tensor {name!r}: expected a complete zstd frame of {want} bytes, got corrupt, truncated or "
            f"trailing data ({len(payload)} bytes: {exc})"
        ) from exc


def encode_all(tensors: dict[str, np.ndarray], codec: Codec | str = "fp32") -> list[Encoded]:
    spec = Codec.parse(codec)
    return [encode(name, arr, spec) for name, arr in tensors.items()]


def decode_all(encoded: list[Encoded]) -> dict[str, np.ndarray]:
    return {e.name: decode(e) for e in encoded}


def error_bound(array: np.ndarray, codec: Codec | str) -> float:
    """Worst-case absolute reconstruction error of ``codec`` on ``array`` (for tests and benches)."""
    spec = Codec.parse(codec)
    x = np.asarray(array)
    if spec.image is not None and x.size and imagecodec.applies(x.dtype, tuple(x.shape), spec.image):
        return float(np.ptp(x.astype(np.float64)))  # no useful bound: any value within the range
    if x.dtype.kind != "f" or spec.quant == "fp32" or x.size == 0 or spec.image is not None:
        return 0.0
    xf = x.astype(np.float64)
    if spec.quant == "fp16":
        return float(np.max(np.abs(xf))) * 2.0**-11 + 2.0**-24
    axis = _channel_axis(x.shape) if spec.quant == "int8c" else None
    _lo, scale = _affine_params(xf, axis)
    mag = float(np.max(np.abs(xf)))
    return float(np.max(scale.astype(np.float64))) / 2 + mag * 2.0**-22
