"""Image codecs (JPEG, WebP) on 4-D tensors: round trips, layouts, fallbacks, and hostile payloads refused
before they are decoded."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from splitrt.errors import CodecError
from splitrt.transport import codec, imagecodec
from splitrt.transport.codec import Codec, Encoded

IMAGE_SPECS = ("jpeg95", "jpeg75", "jpeg50", "webp75")


def _photo() -> np.ndarray:
    """A real photograph (matplotlib's sample grace_hopper.jpg), 96 x 128 RGB uint8."""
    import matplotlib.cbook

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        return np.asarray(Image.open(f).convert("RGB").resize((128, 96)))


@st.composite
def four_d(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 2, 3, 4, 5, 16]))
    h = draw(st.integers(1, 20))
    w = draw(st.integers(1, 20))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16, np.uint8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == np.uint8:
        return rng.integers(0, 256, (n, c, h, w), dtype=np.uint8)
    scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
    return (scale * rng.standard_normal((n, c, h, w)) + draw(st.floats(-10, 10))).astype(dtype)


@pytest.mark.parametrize("text", ["jpeg1", "jpeg75", "jpeg100", "webp50"])
def test_image_specs_parse_back_and_are_lossy(text: str) -> None:
    c = Codec.parse(text)
    assert str(c) == text and Codec.parse(str(c)) == c
    assert not c.lossless and c.image is not None


@pytest.mark.parametrize("text", ["jpeg0", "jpeg101", "jpeg075", "jpeg75+zstd", "webp"])
def test_bad_image_specs_are_refused(text: str) -> None:
    with pytest.raises(CodecError):
        Codec.parse(text)


@settings(max_examples=60, deadline=None)
@given(arr=four_d(), spec=st.sampled_from(IMAGE_SPECS), nhwc=st.booleans())
def test_round_trip_keeps_dtype_shape_and_range(arr: np.ndarray, spec: str, nhwc: bool) -> None:
    if nhwc:
        arr = np.ascontiguousarray(arr.transpose(0, 2, 3, 1))
    enc = codec.encode("x", arr, spec)
    assert enc.codec == spec
    out = codec.decode(enc)
    assert out.shape == arr.shape and out.dtype == arr.dtype
    if arr.dtype == np.uint8:
        return  # sent as the image it is: JPEG's colour conversion may leave the tensor's own range
    # 8-bit quantisation per channel, then a lossy image: every value stays within its tensor's range
    # (slack for float16's rounding of the range itself)
    x, y = arr.astype(np.float64), out.astype(np.float64)
    span = float(np.ptp(x)) if x.size else 0.0
    assert np.all(y >= x.min() - span / 255 - 1e-3 * abs(x.min()) - 1e-6)
    assert np.all(y <= x.max() + span / 255 + 1e-3 * abs(x.max()) + 1e-6)
    # the payload is bounded by what the shape implies
    assert codec.decoded_bytes(enc) >= out.nbytes


@pytest.mark.parametrize("spec", ["jpeg95", "jpeg75", "webp75"])
def test_a_photo_survives_in_both_layouts_and_as_uint8(spec: str) -> None:
    photo = _photo()  # H, W, 3
    nchw = (photo.transpose(2, 0, 1)[None].astype(np.float32) / 255 - 0.45) / 0.22
    nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))
    for arr, layout in ((nchw, "nchw"), (nhwc, "nhwc"), (photo[None], "nhwc")):
        assert imagecodec.layout(arr.shape) == layout
        enc = codec.encode("frame", arr, spec)
        out = codec.decode(enc)
        err = np.sqrt(np.mean((out.astype(np.float64) - arr) ** 2)) / np.ptp(arr.astype(np.float64))
        assert err < 0.05, (spec, layout, err)
        assert enc.nbytes < photo.nbytes / 4, (spec, layout, enc.nbytes)  # < 1/4 of the raw uint8 frame
    # quality orders the bytes: q95 sends more than q50 of the same photo
    assert codec.encode("f", nchw, "jpeg95").nbytes > codec.encode("f", nchw, "jpeg50").nbytes


def test_feature_map_channels_are_tiled_not_mixed() -> None:
    # 10 channels each a constant: tiles padded to 8 x 8 blocks decode each channel back to its constant.
    arr = np.broadcast_to(np.arange(10, dtype=np.float32)[None, :, None, None] * 3.0, (2, 10, 13, 11)).copy()
    out = codec.decode(codec.encode("fm", arr, "jpeg75"))
    np.testing.assert_allclose(out, arr, atol=0.1)


@pytest.mark.parametrize(
    "arr",
    [
        np.ones((1, 10), np.float32),  # not 4-D
        np.ones((2, 3, 4, 5, 6), np.float32),
        np.ones((1, 0, 4, 4), np.float32),  # empty
    ],
)
def test_tensors_an_image_cannot_hold_fall_back_to_lossless(arr: np.ndarray) -> None:
    enc = codec.encode("x", arr, "jpeg75")
    assert enc.codec == imagecodec.FALLBACK
    np.testing.assert_array_equal(codec.decode(enc), arr)


def test_integer_tensors_other_than_4d_uint8_stay_raw() -> None:
    for arr in (np.arange(24, dtype=np.int64).reshape(1, 2, 3, 4), np.ones((1, 3, 4), np.uint8)):
        enc = codec.encode("idx", arr, "jpeg50")
        assert enc.codec == "raw"
        np.testing.assert_array_equal(codec.decode(enc), arr)


def test_non_finite_values_are_refused() -> None:
    arr = np.zeros((1, 3, 8, 8), np.float32)
    arr[0, 1, 2, 3] = np.nan
    with pytest.raises(CodecError, match="non-finite"):
        codec.encode("x", arr, "jpeg75")


# ---- hostile payloads ---------------------------------------------------------------------------------


def _good(spec: str = "jpeg75") -> Encoded:
    rng = np.random.default_rng(0)
    return codec.encode("t", rng.standard_normal((1, 4, 16, 16)).astype(np.float32), spec)


def _with(enc: Encoded, **kw: object) -> Encoded:
    return Encoded(**{**enc.__dict__, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["jpeg75", "webp75"])
@pytest.mark.parametrize("cut", [0, 1, 5, 33, 40, 0.5, 0.9])
def test_truncated_payloads_are_refused(spec: str, cut: float) -> None:
    enc = _good(spec)
    n = int(cut * enc.nbytes) if isinstance(cut, float) else cut
    with pytest.raises(CodecError):
        codec.decode(_with(enc, payload=bytes(enc.payload)[:n]))


@pytest.mark.parametrize("spec", ["jpeg75", "webp75"])
def test_an_image_of_other_dimensions_is_refused_before_decoding(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = _good(spec)  # 4 channels of 16 x 16: a 2 x 2 grid, 32 x 32 grey
    big = codec.encode("t", np.zeros((1, 4, 64, 64), np.float32), spec)
    header = bytes(enc.payload)[: 1 + 8 * 4]
    hostile = _with(enc, payload=header + bytes(big.payload)[1 + 8 * 4 :])

    def no_decoding(*_a: object, **_k: object) -> None:
        raise AssertionError("the image was opened although its header disagrees with the shape")

    monkeypatch.setattr(Image, "open", no_decoding)
    with pytest.raises(CodecError, match=r"expected a \w+ image 32x32"):
        codec.decode(hostile)


def test_a_jpeg_header_claiming_a_huge_image_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    enc = _good("jpeg75")
    body = bytearray(bytes(enc.payload)[1 + 8 * 4 :])
    sof = next(i for i in range(len(body) - 1) if body[i] == 0xFF and body[i + 1] in (0xC0, 0xC1, 0xC2))
    body[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)  # height, width
    hostile = _with(enc, payload=bytes(enc.payload)[: 1 + 8 * 4] + bytes(body))
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("opened a 60000 x 60000 image"))
    with pytest.raises(CodecError, match="60000x60000"):
        codec.decode(hostile)


def test_a_huge_declared_shape_is_refused_before_anything_is_read() -> None:
    big = _with(_good(), shape=(1, 4, 4000, 4000))  # one 8000 x 8000 image: fits JPEG, not the cap
    assert codec.decoded_bytes(big) >= 4 * 4000 * 4000 * 4
    with pytest.raises(CodecError, match="expected at most"):
        codec.decode(big, max_bytes=1 << 27)
    huge = _with(_good(), shape=(1, 4, 60000, 60000))  # no image holds it
    with pytest.raises(CodecError, match="fit one image"):
        codec.decode(huge)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: bytes([3]) + p[1:],  # flags: NHWC on an NCHW shape
        lambda p: bytes([0]) + p[1:],  # flags: not quantised, for a float tensor
        lambda p: p[:1] + struct.pack("<f", float("nan")) + p[5:],  # an offset that is NaN
        lambda p: p[:17] + struct.pack("<f", 0.0) + p[21:],  # a zero scale
        lambda p: p[:33] + b"\x89PNG\r\n\x1a\n" + p[41:],  # another format
        lambda p: p[:-40] + bytes(40),  # garbage in the entropy-coded data's tail
    ],
)
def test_garbage_payloads_are_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    enc = _good()
    with pytest.raises(CodecError):
        codec.decode(_with(enc, payload=mutate(bytes(enc.payload))))


def test_a_grey_jpeg_where_colour_is_declared_is_refused() -> None:
    grey = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(grey, format="JPEG")
    enc = Encoded(name="f", dtype="uint8", shape=(1, 8, 8, 3), codec="jpeg75", payload=bytes([1]) + grey.getvalue())
    with pytest.raises(CodecError, match="3 components, got 8x8 with 1"):
        codec.decode(enc)


def test_uint8_frames_are_sent_as_the_image_they_are() -> None:
    photo = _photo()[None]  # 1, H, W, 3 uint8
    enc = codec.encode("frame", photo, "jpeg90")
    payload = bytes(enc.payload)
    assert payload[0] == 1  # NHWC, not quantised: no parameters, the JPEG follows
    with Image.open(io.BytesIO(payload[1:])) as im:
        assert im.format == "JPEG" and im.size == (128, 96) and im.mode == "RGB"


@settings(max_examples=150, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 2), st.sampled_from([1, 3, 4]), st.integers(1, 24), st.integers(1, 24)),
    spec=st.sampled_from(["jpeg75", "webp75"]),
    data=st.data(),
)
def test_any_payload_decodes_to_the_declared_shape_or_is_refused(
    shape: tuple[int, int, int, int], spec: str, data: st.DataObject
) -> None:
    """Fuzz: a real payload of one shape, mutated (bytes flipped, cut, grown), declared with another
    shape: decode gives exactly the declared shape and dtype, or CodecError; never another exception, and
    what it may allocate is bounded by the declared shape (decoded_bytes)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    src_shape = data.draw(st.sampled_from([shape, (1, 3, 16, 16), (1, 8, 8, 8)]))
    enc = codec.encode("x", rng.standard_normal(src_shape).astype(np.float32), spec)
    payload = bytearray(bytes(enc.payload))
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    payload = payload[:cut] + bytes(data.draw(st.integers(0, 3)))
    hostile = Encoded(name="x", dtype="float32", shape=shape, codec=spec, payload=bytes(payload))
    bound = codec.decoded_bytes(hostile)
    assert bound <= 64 * 8 * int(np.prod(shape)) * 4 + 4096  # tiles padded to 8 x 8, RGBA twice over: linear
    try:
        out = codec.decode(hostile)
    except CodecError:
        return
    assert out.shape == shape and out.dtype == np.float32


def test_warm_sets_up_every_format_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # a server's first jpeg50 input took 35 ms where the next took 12: Pillow's import and codec set-up
    assert imagecodec.warm() == 2  # JPEG and WebP: the Pillow wheel has both

    def broken(*_: object) -> bytes:
        raise OSError("encoder jpeg not available")

    monkeypatch.setattr(imagecodec, "encode", broken)
    assert imagecodec.warm() == 0  # a codec Pillow lacks fails its own requests, not the server's start
