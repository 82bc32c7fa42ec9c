"""Codec round trips (hypothesis), error bounds and refusal of truncated or garbage payloads."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from splitrt.errors import CodecError
from splitrt.transport import codec
from splitrt.transport.codec import Codec, Encoded

SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
FINITE32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)
HALF_RANGE = st.floats(-6e4, 6e4, width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("text", codec.names())
def test_codec_string_form_parses_back(text: str) -> None:
    c = Codec.parse(text)
    assert str(c) == text
    assert Codec.parse(str(c)) == c


def test_raw_is_an_alias_of_fp32_and_bad_specs_are_refused() -> None:
    assert Codec.parse("raw") == Codec(quant="fp32")
    with pytest.raises(CodecError, match="unknown quantisation 'int4'"):
        Codec.parse("int4")
    with pytest.raises(CodecError, match="unknown compression 'lzma'"):
        Codec.parse("fp16+lzma")
    with pytest.raises(CodecError, match="3 parts"):
        Codec.parse("fp16+zlib+zlib")


@settings(max_examples=60, deadline=None)
@given(arr=hnp.arrays(np.float32, SHAPES, elements=FINITE32), z=st.sampled_from(["", "+zlib", "+zstd"]))
def test_fp32_is_lossless(arr: np.ndarray, z: str) -> None:
    enc = codec.encode("x", arr, "fp32" + z)
    out = codec.decode(enc)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


@settings(max_examples=60, deadline=None)
@given(arr=hnp.arrays(np.float32, SHAPES, elements=HALF_RANGE), z=st.booleans())
def test_fp16_relative_error_bound(arr: np.ndarray, z: bool) -> None:
    enc = codec.encode("x", arr, "fp16+zlib" if z else "fp16")
    out = codec.decode(enc)
    assert out.dtype == np.float32 and out.shape == arr.shape
    # half precision: 11 significant bits; subnormals lose relative precision, hence the 2**-24 floor
    assert np.all(np.abs(out - arr) <= np.abs(arr) * 2.0**-11 + 2.0**-24)


@settings(max_examples=80, deadline=None)
@given(
    arr=hnp.arrays(np.float32, SHAPES, elements=FINITE32),
    quant=st.sampled_from(["int8", "int8c"]),
    z=st.sampled_from(["", "+zlib", "+zstd"]),
)
def test_int8_absolute_error_is_half_a_step(arr: np.ndarray, quant: str, z: str) -> None:
    spec = quant + z
    enc = codec.encode("x", arr, spec)
    out = codec.decode(enc)
    assert isinstance(out, np.ndarray) and out.dtype == arr.dtype and out.shape == arr.shape
    err = np.abs(out.astype(np.float64) - arr.astype(np.float64))
    if arr.size:
        assert float(err.max()) <= codec.error_bound(arr, spec)


def test_int8_per_channel_beats_per_tensor_on_channels_of_different_scale() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    x *= np.logspace(-3, 2, 8, dtype=np.float32).reshape(1, 8, 1, 1)
    err_t = np.abs(codec.decode(codec.encode("x", x, "int8")) - x)[:, 0].max()
    err_c = np.abs(codec.decode(codec.encode("x", x, "int8c")) - x)[:, 0].max()
    assert err_c < err_t / 100


@settings(max_examples=40, deadline=None)
@given(
    arr=hnp.arrays(st.sampled_from([np.int64, np.int32, np.uint8, np.bool_]), SHAPES),
    spec=st.sampled_from(codec.names()),
)
def test_non_float_tensors_are_always_raw_and_exact(arr: np.ndarray, spec: str) -> None:
    # the one exception, a 4-D uint8 tensor (a camera frame) under an image codec: tests/transport/test_imagecodec.py
    if Codec.parse(spec).image is not None and arr.dtype == np.uint8 and arr.ndim == 4 and arr.size:
        return
    enc = codec.encode("idx", arr, spec)
    assert enc.codec == "raw"
    out = codec.decode(enc)
    assert out.dtype == arr.dtype
    np.testing.assert_array_equal(out, arr)


def test_float64_and_float16_keep_their_dtype() -> None:
    x64 = np.linspace(-1, 1, 10)
    out = codec.decode(codec.encode("a", x64, "fp32"))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, x64)
    x16 = np.linspace(-1, 1, 10).astype(np.float16)
    assert codec.decode(codec.encode("b", x16, "int8")).dtype == np.float16


def test_zlib_and_quantisation_shrink_payloads() -> None:
    x = np.maximum(np.random.default_rng(1).standard_normal((1, 64, 28, 28)), 0).astype(np.float32)
    sizes = {s: codec.encode("x", x, s).nbytes for s in ("fp32", "fp16", "int8", "fp32+zlib", "int8+zlib")}
    assert sizes["fp32"] == x.nbytes
    assert sizes["fp16"] == x.nbytes // 2
    assert sizes["int8"] == x.size + 8
    assert sizes["fp32+zlib"] < sizes["fp32"]  # ReLU output: half zeros
    assert sizes["int8+zlib"] < sizes["int8"]


@pytest.mark.parametrize("spec", codec.names())
def test_scalars_decode_to_0d_arrays(spec: str) -> None:
    out = codec.decode(codec.encode("s", np.array(1.5, np.float32), spec))
    assert isinstance(out, np.ndarray) and out.shape == () and abs(float(out) - 1.5) < 1e-2


def test_int8_refuses_non_finite_values() -> None:
    with pytest.raises(CodecError, match="non-finite"):
        codec.encode("x", np.array([1.0, np.nan], np.float32), "int8")


def _enc(spec: str, shape: tuple[int, ...] = (2, 3, 4)) -> Encoded:
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return codec.encode("t", x, spec)


def _replace(e: Encoded, payload: bytes) -> Encoded:
    return Encoded(name=e.name, dtype=e.dtype, shape=e.shape, codec=e.codec, payload=payload)


@pytest.mark.parametrize("spec", ["fp32", "fp16", "int8", "int8c"])
def test_truncated_payload_names_expected_and_actual(spec: str) -> None:
    e = _enc(spec)
    with pytest.raises(CodecError, match=rf"expected {e.nbytes} payload bytes, got {e.nbytes - 3}"):
        codec.decode(_replace(e, e.payload[:-3]))


@pytest.mark.parametrize("spec", ["fp32+zlib", "fp16+zlib", "int8+zlib", "int8c+zlib"])
def test_truncated_or_garbage_zlib_is_refused(spec: str) -> None:
    e = _enc(spec)
    with pytest.raises(CodecError, match=r"truncated|corrupt"):
        codec.decode(_replace(e, e.payload[: len(e.payload) // 2]))
    with pytest.raises(CodecError, match="corrupt"):
        codec.decode(_replace(e, b"\x00garbage" * 5))
    with pytest.raises(CodecError, match="trailing"):
        codec.decode(_replace(e, e.payload + b"xx"))


@pytest.mark.parametrize("spec", ["fp32+zstd", "fp16+zstd", "int8+zstd", "int8c+zstd"])
def test_truncated_trailing_or_garbage_zstd_is_refused(spec: str) -> None:
    e = _enc(spec)
    with pytest.raises(CodecError, match=r"truncated"):
        codec.decode(_replace(e, e.payload[: len(e.payload) - 3]))
    with pytest.raises(CodecError, match="corrupt"):
        codec.decode(_replace(e, b"\x00garbage" * 5))
    with pytest.raises(CodecError, match="trailing"):
        codec.decode(_replace(e, e.payload + b"xx"))


def test_zstd_frame_of_another_size_or_none_is_refused_before_inflating() -> None:
    import zstandard

    e = _enc("fp32+zstd", (4,))
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (1 << 24))
    with pytest.raises(CodecError, match=f"expected a zstd frame of 16 bytes, got a frame of {1 << 24} bytes"):
        codec.decode(_replace(e, bomb))
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * 16)
    with pytest.raises(CodecError, match="expected a zstd frame of 16 bytes, got no content size"):
        codec.decode(_replace(e, unsized))


def test_zstd_sends_what_zlib_sends_on_relu_activations() -> None:
    # ReLU output: half zeros. Both entropy coders shrink int8 well below its 0.25 x fp32, zstd to no more
    # than zlib sends (plans price +zstd; +zlib costs 5-15x the CPU for those bytes: bench_codec.py).
    x = np.maximum(np.random.default_rng(3).standard_normal((1, 16, 32, 32)), 0).astype(np.float32)
    z = {s: codec.encode("x", x, s).nbytes / x.nbytes for s in ("int8+zstd", "int8+zlib", "int8")}
    assert z["int8+zstd"] < 0.2 < z["int8"]
    assert z["int8+zstd"] <= 1.02 * z["int8+zlib"]


def test_zlib_bomb_is_bounded_by_the_expected_size() -> None:
    e = _enc("fp32+zlib", (4,))
    bomb = zlib.compress(b"\x00" * (1 << 24))
    with pytest.raises(CodecError, match="expected 16 bytes after zlib, got more"):
        codec.decode(_replace(e, bomb))


def test_garbage_int8_parameters_are_refused() -> None:
    e = _enc("int8")
    bad = np.array([0.0, -1.0], np.float32).tobytes() + e.payload[8:]
    with pytest.raises(CodecError, match="positive scales"):
        codec.decode(_replace(e, bad))


def test_codec_mismatch_with_dtype_is_refused() -> None:
    e = codec.encode("i", np.arange(4), "fp32")
    with pytest.raises(CodecError, match="sent raw"):
        codec.decode(Encoded(name="i", dtype="int64", shape=(4,), codec="fp16", payload=e.payload))
    with pytest.raises(CodecError, match="unknown dtype"):
        codec.decode(Encoded(name="i", dtype="float7", shape=(4,), codec="raw", payload=e.payload))
    with pytest.raises(CodecError, match="non-negative"):
        codec.decode(Encoded(name="i", dtype="int64", shape=(-4,), codec="raw", payload=e.payload))
    with pytest.raises(CodecError, match="at most"):
        codec.decode(Encoded(name="i", dtype="int64", shape=(1 << 40,), codec="raw", payload=e.payload))


def test_decoded_size_cap_is_checked_before_inflating() -> None:
    # A garbage zlib stream claiming 4 MiB: over the cap it is refused for its size, not inflated.
    bomb = Encoded(name="b", dtype="float32", shape=(1 << 20,), codec="fp32+zlib", payload=b"\x00garbage")
    assert codec.decoded_bytes(bomb) == 4 << 20
    with pytest.raises(CodecError, match=rf"decodes to {4 << 20} bytes, expected at most {1 << 20}"):
        codec.decode(bomb, max_bytes=1 << 20)
    with pytest.raises(CodecError, match="corrupt"):
        codec.decode(bomb)  # under the default cap the stream is read (and found corrupt)
    # the cap counts the decoded array: int8 payloads decode to 4 bytes per element (float32)
    e = codec.encode("q", np.ones((4, 256), np.float32), "int8")
    assert codec.decoded_bytes(e) == 4 * 1024 > e.nbytes
    with pytest.raises(CodecError, match="at most 2048"):
        codec.decode(e, max_bytes=2048)
    np.testing.assert_array_equal(codec.decode(e, max_bytes=4096), np.ones((4, 256), np.float32))


@pytest.mark.parametrize("spec", ["int8", "int8c"])
def test_int8_decode_needs_no_more_than_its_output(spec: str) -> None:
    """Decoding allocates the output (4 B per float32 element), not float64 temporaries (16 B more)."""
    import tracemalloc

    x = np.random.default_rng(3).standard_normal((1, 16, 256, 256)).astype(np.float32)
    enc = codec.encode("x", x, spec)
    tracemalloc.start()
    try:
        out = codec.decode(enc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.dtype == np.float32 and out.shape == x.shape
    assert peak < 1.5 * x.nbytes, f"decode peaked at {peak} bytes for a {x.nbytes}-byte output"
    assert float(np.max(np.abs(out - x))) <= codec.error_bound(x, spec)


@pytest.mark.parametrize("spec", ["int8", "int8c"])
def test_int8_encode_works_in_the_tensors_precision(spec: str) -> None:
    """Encoding on a device: one float32 working copy plus the bytes, not float64 temporaries."""
    import tracemalloc

    x = np.random.default_rng(4).standard_normal((1, 16, 256, 256)).astype(np.float32)
    tracemalloc.start()
    try:
        enc = codec.encode("x", x, spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * x.nbytes, f"encode peaked at {peak} bytes for a {x.nbytes}-byte tensor"
    assert float(np.max(np.abs(codec.decode(enc) - x))) <= codec.error_bound(x, spec)


@pytest.mark.parametrize("shape", [(1, 1000), (1, 512, 1, 1), (1, 2048, 1, 1), (4, 100)])
def test_int8c_on_one_value_per_channel_goes_per_tensor(shape: tuple[int, ...]) -> None:
    """[1, C] and [1, C, 1, 1] (logits, pooled features): per channel would send 9 bytes a value (2.25x
    fp32); per tensor sends what int8 does."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    enc = codec.encode("x", x, "int8c")
    assert len(enc.payload) == len(codec.encode("x", x, "int8").payload) == x.size + 8
    assert len(enc.payload) < 0.3 * x.nbytes
    np.testing.assert_allclose(codec.decode(enc), x, atol=codec.error_bound(x, "int8c") + 1e-7)


@pytest.mark.parametrize(
    ("shape", "axis"),
    [((1, 32, 40, 3), 3), ((1, 3, 32, 40), 1), ((1, 15, 20, 512), 3), ((1, 512, 15, 20), 1), ((1, 400, 40), 2)],
)
def test_int8c_finds_the_channels_of_nhwc_and_frames_by_features(shape: tuple[int, ...], axis: int) -> None:
    """Channels of very different scales on the layout's channel axis: per channel keeps each to its own
    scale (per row or per frame would mix them)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    scales = np.logspace(-3, 2, shape[axis], dtype=np.float32)
    x *= scales.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    enc = codec.encode("x", x, "int8c")
    assert len(enc.payload) == x.size + 8 * shape[axis]
    small = np.take(np.abs(codec.decode(enc) - x), [0], axis=axis).max()  # the smallest-scale channel
    assert small <= 2 * scales[0] * 6 / 255
