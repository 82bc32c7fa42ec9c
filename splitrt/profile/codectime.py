"""What sending costs the two sides beyond the wire, measured on the cut tensors of one run.

Per codec and cut: the time to encode the cut's crossing tensors (what the device pays before a request
leaves: ``codec.encode`` as the client calls it, a view for fp32) and to decode them (what the server
pays before its tail runs), each the sum over the cut's tensors of the fastest of at most ``repeats``
timings, fewer once two agree within ``codecratio.AGREE`` (tensors shared by cuts are timed once; the
timing pass is ``codecratio.measure_pass``'s, which sizes each tensor with the same encode).
And ``call_ms``, one remote call's fixed cost on the device beyond the round trip: framing a request of
one small tensor and reading a reply of one (the gRPC call itself is what the runtime's probes time as
the link's round trip, so it is not priced twice).

These figures are this machine's: ``profile.costs.cost_table`` scales the device's (encode, call) by the
device speed factor and the cloud's (decode) by the cloud's, as it scales compute. The inputs are the
profile's (a real photograph for an image model, ``graph.photos``): an image codec or zstd takes longer on
a photo than on noise.

- ``measure(g, feeds, *, codecs=fp32 + codecratio.MEASURED, repeats=3) -> CodecTimes(encode_ms, decode_ms,
  call_ms)``:
  ``encode_ms[codec]`` / ``decode_ms[codec]`` one value per cut of ``g.cuts()`` (0 where nothing a codec
  touches is sent: float32 tensors and uint8 frames, ``graph.cuts.codec_tensor``), rounded to ``DIGITS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from splitrt.graph import model as graph_mod
from splitrt.profile.codecratio import MEASURED, TIME_DIGITS, TIMINGS, measure_pass
from splitrt.transport import codec, wire
from splitrt.transport import splitrt_pb2 as pb

DIGITS = TIME_DIGITS
CALL_TIMINGS = 50


@dataclass(frozen=True)
class CodecTimes:
    encode_ms: dict[str, list[float]]
    decode_ms: dict[str, list[float]]
    call_ms: float


def call_ms(repeats: int = CALL_TIMINGS) -> float:
    """Framing an ``InferRequest`` of one small tensor and reading an ``InferReply`` of one: the median."""
    x = np.zeros((1, 1000), dtype=np.float32)
    reply = wire.serialize(wire.Framed(header=pb.InferReply(), tensors=[codec.encode("out", x, "fp32")]))
    parse = wire.deserializer(pb.InferReply)

    def once() -> None:
        header = pb.InferRequest(model_sha256="0" * 64, cut_id="c1", codec="fp32", request_id="0" * 16)
        wire.serialize(wire.Framed(header=header, tensors=[codec.encode("in", x, "fp32", copy=False)]))
        for e in parse(reply).tensors:
            codec.decode(e)

    once()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        samples.append((time.perf_counter() - t0) * 1e3)
    return round(float(np.median(samples)), DIGITS)


def measure(
    g: graph_mod.ModelGraph,
    feeds: Mapping[str, np.ndarray],
    *,
    codecs: Sequence[str] | None = None,
    repeats: int = TIMINGS,
    progress: Callable[[str], None] | None = None,
) -> CodecTimes:
    """Encode and decode times of every codec at every cut, and one call's fixed cost (see the module)."""
    # the codecs profiles price (not +zlib: zstd's bytes at 5-15x its time, and the slowest to time)
    wanted = codecs if codecs is not None else ["fp32", *MEASURED]
    got = measure_pass(g, [feeds], codecs=wanted, repeats=repeats, progress=progress)
    return CodecTimes(encode_ms=got.encode_ms, decode_ms=got.decode_ms, call_ms=call_ms())
