"""Predicted cost of running a model split at a cut (pure: no I/O, no clocks, no onnxruntime).

The model, per candidate cut ``c`` and codec ``k`` (two tiers, device → cloud)::

    device_ms   = head_ms[c] × device_load                        (0 for the cut ``cloud``)
    encode_ms   = encode[c, k] × device_load                      (the device encodes the crossing tensors)
    call_ms     = call × device_load                              (one remote call's fixed cost on the device)
    decode_ms   = decode[c, k] × cloud_load                       (the cloud decodes them; all 0 for ``device``)
    transfer_ms = sent_bytes[c, k] × 8 / bandwidth                (upload; 0 for the cut ``device``)
    download_ms = reply_bytes[c] × 8 / bandwidth                  (the graph outputs the tail makes)
    queue_ms    = the expected wait for a worker at the cloud (``plan.queueing``; 0 for ``device``)
    latency_ms  = device_ms + encode_ms + call_ms + transfer_ms + download_ms + rtt_ms + queue_ms
                  + decode_ms + tail_ms[c] × cloud_load
                  (no RTT, no transfer, no codec, no call, no queue and no cloud for the cut ``device``)
    energy_mJ   = active_w × (device_ms + encode_ms + call_ms) + (idle_w + radio_w) × send_ms
                  + idle_w × (rtt_ms + queue_ms + decode_ms + cloud_ms + reply_ms)   (radio_w: what sending adds)
    period_ms   = max(device_ms + encode_ms + call_ms, transfer_ms + reply_ms, decode_ms + cloud_ms)

``sent_bytes[c, k] = float_bytes[c] × ratio[c, k] + (bytes[c] - float_bytes[c])``: a codec only shrinks
the float32 part of the crossing tensors, and (an image codec) uint8 frames of rank 4, which profiles
count in ``float_bytes`` with their measured ratios (1 for every other codec: a frame goes raw). A
codec's ratio is one number (fp16 = 0.5, int8-affine ≈ 0.25) or, for codecs whose size depends on the
values (``+zstd``, ``+zlib``), one per cut, measured on the cut's tensors when the model was profiled
(``profile.codecratio``). Everything is precomputed once per profile pair into numpy arrays
(``CostTable``), so evaluating every cut under new link and load estimates is a handful of vector
operations.

- ``Link(bandwidth_mbps, rtt_ms)``, ``Conditions(link, device_load=1, cloud_load=1, queue_ms=0)`` (loads >= 1
  multiply compute; ``queue_ms`` the expected wait for a cloud worker, ``plan.queueing``), ``Power(idle_w,
  active_w, radio_w)``; ``CODEC_RATIOS`` (fp32 1, fp16 .5, int8/int8c .25 of the float32 bytes).
  ``CostTable(ids, head_ms, tail_ms, bytes, float_bytes=None, reply_bytes=0, codecs=None)`` (``reply_bytes`` per
  cut, or one number for every cut as older tables and profiles have it; 0 for ``device``): numpy arrays built
  once per profile pair; ``.latency_ms/.energy_mj/.period_ms(cond[, power])`` give (cuts, codecs) matrices,
  ``.estimate(cut, codec, cond, power) -> Estimate``. Cut ``device``: no transfer, no RTT, no queue, no cloud;
  cut ``cloud``: head 0. Latency = head×dl + encode×dl + call×dl + sent/bw (transfer) + reply[cut]/bw
  (download) + rtt + queue_ms + decode×cl + tail×cl.
- What a remote call costs beyond the wire (``CostTable(..., encode_ms=, decode_ms=, call_ms=)``, 0 when a
  profile did not measure them): ``encode_ms[codec]`` per cut, the device's time to encode the cut's tensors
  and frame the request (``profile.codectime``); ``decode_ms[codec]`` per cut, the cloud's time to decode them;
  ``call_ms``, one remote call's fixed cost on the device (a request message, the call, the reply parsed).
  The device's two scale with its load like its compute (a throttled board encodes slower), the cloud's
  with the cloud's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from splitrt.errors import PlanError

#: How an image codec's name starts (``jpeg75``, ``webp75``; ``transport.imagecodec``): plan imports no
#: transport, and a name is all a cost table has.
IMAGE_CODECS = ("jpeg", "webp", "avif", "png")


def is_image_codec(name: str) -> bool:
    return name.split("+")[0].startswith(IMAGE_CODECS)


FloatArray = npt.NDArray[np.float64]

#: Size of the encoded float32 part relative to raw fp32, per codec (headers neglected).
CODEC_RATIOS: Mapping[str, float] = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25, "int8c": 0.25}
#: Largest ratio a codec may have at a cut: headers can outweigh a tiny tensor (int8c sends 8 bytes of
#: parameters per channel; a [1, 1000] tensor has 1000 channels of one element).
MAX_CODEC_RATIO = 4.0

#: A codec's ratio: one for every cut, or one per cut (in the table's cut order).
CodecRatio = float | Sequence[float]

DEVICE_CUT = "device"
CLOUD_CUT = "cloud"

# bytes × 8 bit / (Mbit/s × 1e6 bit/Mbit) × 1000 ms/s = bytes × MS_PER_BYTE_AT_1MBPS / Mbit/s
MS_PER_BYTE_AT_1MBPS = 8e-3


@dataclass(frozen=True, kw_only=True)
class Link:
    """One network hop: bandwidth (both directions) and round-trip time."""

    bandwidth_mbps: float
    rtt_ms: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_mbps > 0 and math.isfinite(self.bandwidth_mbps)):
            raise PlanError(f"bandwidth_mbps must be a positive finite number, got {self.bandwidth_mbps!r}")
        if not (self.rtt_ms >= 0 and math.isfinite(self.rtt_ms)):
            raise PlanError(f"rtt_ms must be a finite number >= 0, got {self.rtt_ms!r}")


@dataclass(frozen=True, kw_only=True)
class Power:
    """Device power figures for the energy objective (watts). ``radio_w`` is what transmitting adds to the
    idle draw (as the board files give it), so the device draws ``send_w`` while it uploads."""

    idle_w: float
    active_w: float
    radio_w: float

    @property
    def send_w(self) -> float:
        return self.idle_w + self.radio_w

    def __post_init__(self) -> None:
        for name in ("idle_w", "active_w", "radio_w"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise PlanError(f"{name} must be a finite number >= 0, got {value!r}")


#: Used when no board is given: a Raspberry Pi 4 class device (see devices/rpi4.toml).
DEFAULT_POWER = Power(idle_w=2.7, active_w=6.4, radio_w=1.0)


@dataclass(frozen=True, kw_only=True)
class Conditions:
    """What the solver is re-run for: the link and the load on each side (multipliers of the profiled
    compute times: > 1 loaded or slower than profiled, < 1 faster than profiled)."""

    link: Link
    device_load: float = 1.0
    cloud_load: float = 1.0
    # Expected wait for a worker at the cloud, ms: a term of its own for every cut that sends (the
    # queue does not scale with a cut's tail, so it is not part of cloud_load).
    queue_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("device_load", "cloud_load"):
            value = getattr(self, name)
            if not (value > 0.0 and math.isfinite(value)):
                raise PlanError(f"{name} must be a finite number > 0, got {value!r}")
        if not (self.queue_ms >= 0.0 and math.isfinite(self.queue_ms)):
            raise PlanError(f"queue_ms must be a finite number >= 0, got {self.queue_ms!r}")


@dataclass(frozen=True, kw_only=True)
class CutCost:
    """Measured cost of one candidate cut: device head time, cloud tail time, crossing bytes."""

    cut: str
    head_ms: float
    tail_ms: float
    bytes: int
    float_bytes: int | None = None  # the codec-compressible part of ``bytes`` (float32, uint8 frames); None = all


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Predicted cost of one (cut, codec) under given conditions."""

    cut: str
    codec: str
    device_ms: float
    transfer_ms: float
    rtt_ms: float
    cloud_ms: float
    latency_ms: float
    energy_mj: float
    period_ms: float
    bytes: int  # raw crossing bytes
    sent_bytes: int  # after the codec
    queue_ms: float = 0.0  # expected wait for a cloud worker (0 for ``device``)
    download_ms: float = 0.0  # the reply (``transfer_ms`` is the upload)
    reply_bytes: int = 0
    encode_ms: float = 0.0  # the device encodes the crossing tensors (0 for ``device``)
    decode_ms: float = 0.0  # the cloud decodes them
    call_ms: float = 0.0  # one remote call's fixed cost on the device


def _ratios(codec: str, ratio: CodecRatio, n: int) -> FloatArray:
    """A codec's ratio at each of ``n`` cuts; ``PlanError`` names the codec and the bad value."""
    per_cut = np.ndim(ratio) != 0
    arr = np.array(ratio, dtype=np.float64).reshape(-1)
    if per_cut and arr.shape != (n,):
        raise PlanError(f"codec {codec!r}: expected one ratio or {n} (one per cut), got {arr.shape[0]}")
    top = MAX_CODEC_RATIO if per_cut else 1.0
    if not np.all((arr > 0) & (arr <= top)):
        bad = arr[~((arr > 0) & (arr <= top))][0]
        raise PlanError(f"codec {codec!r}: ratio must be in (0, {top:g}], got {float(bad)!r}")
    return arr if per_cut else np.full(n, arr[0])


class CostTable:
    """Per-cut costs of one model for one (device, cloud) pair, as numpy arrays.

    ``ids`` in topological order (first ``cloud``, last ``device`` when present); ``head_ms`` is the
    unloaded head time on the device, ``tail_ms`` the unloaded tail time on the cloud, ``bytes`` the
    raw crossing bytes, ``float_bytes`` the part codecs may shrink (float32; uint8 frames in profiles).
    ``reply_bytes[c]`` (the graph outputs the tail of ``c`` makes; those the head made stay on the device)
    travel back for every cut but ``device``; a single number (tables and profiles made before it was per
    cut) applies to every cut.
    """

    def __init__(
        self,
        *,
        ids: Sequence[str],
        head_ms: Sequence[float] | FloatArray,
        tail_ms: Sequence[float] | FloatArray,
        bytes: Sequence[int] | npt.NDArray[np.int64],
        float_bytes: Sequence[int] | npt.NDArray[np.int64] | None = None,
        reply_bytes: int | Sequence[int] | npt.NDArray[np.int64] | FloatArray = 0,
        codecs: Mapping[str, CodecRatio] | None = None,
        encode_ms: Mapping[str, CodecRatio] | None = None,
        decode_ms: Mapping[str, CodecRatio] | None = None,
        call_ms: float = 0.0,
    ) -> None:
        n = len(ids)
        if n == 0:
            raise PlanError("a cost table needs at least one cut, got 0")
        if len(set(ids)) != n:
            raise PlanError(f"cut ids must be unique, got {list(ids)!r}")
        self.ids: tuple[str, ...] = tuple(ids)
        self._index = {cut: i for i, cut in enumerate(self.ids)}
        self.head_ms = self._vector("head_ms", head_ms, n)
        self.tail_ms = self._vector("tail_ms", tail_ms, n)
        self.bytes = self._vector("bytes", bytes, n)
        fb = self.bytes if float_bytes is None else self._vector("float_bytes", float_bytes, n)
        if np.any(fb > self.bytes):
            raise PlanError("float_bytes must not exceed bytes for any cut")
        self.float_bytes = fb
        reply = np.full(n, reply_bytes, dtype=np.float64) if np.ndim(reply_bytes) == 0 else reply_bytes
        self.reply_bytes = self._vector("reply_bytes", reply, n)
        codec_map = dict(CODEC_RATIOS if codecs is None else codecs)
        if not codec_map:
            raise PlanError("at least one codec is needed, got none")
        self.codecs: tuple[str, ...] = tuple(codec_map)
        # (cuts, codecs): every codec's ratio at every cut; which codecs were given per cut
        self.codec_ratio_matrix = np.stack([_ratios(c, codec_map[c], n) for c in self.codecs], axis=1)
        self._per_cut = frozenset(c for c in self.codecs if np.ndim(codec_map[c]) != 0)
        # One figure per codec (its median over the cuts that send floats, for per-cut codecs): for
        # summaries; the prices use the matrix.
        sending = self.float_bytes > 0
        rows = self.codec_ratio_matrix[sending] if np.any(sending) else self.codec_ratio_matrix
        self.codec_ratios = np.median(rows, axis=0)

        # Structural masks: the device cut sends nothing; the cloud cut runs nothing on the device.
        self.sends = np.array([cut != DEVICE_CUT for cut in self.ids], dtype=bool)
        self.reply_bytes = np.where(self.sends, self.reply_bytes, 0.0)
        self.head_ms = np.where(np.array([cut == CLOUD_CUT for cut in self.ids]), 0.0, self.head_ms)
        self.tail_ms = np.where(self.sends, self.tail_ms, 0.0)
        # sent bytes per (cut, codec), and the same in ms at 1 Mbit/s (reply included).
        other = self.bytes - self.float_bytes
        sent = self.float_bytes[:, None] * self.codec_ratio_matrix + other[:, None]
        self.sent_bytes = np.where(self.sends[:, None], np.ceil(sent), 0.0)
        self._send_ms_1mbps = self.sent_bytes * MS_PER_BYTE_AT_1MBPS
        self._reply_ms_1mbps = np.where(self.sends, self.reply_bytes * MS_PER_BYTE_AT_1MBPS, 0.0)
        self._rtt_mask = self.sends.astype(np.float64)
        if not (call_ms >= 0 and math.isfinite(call_ms)):
            raise PlanError(f"call_ms must be a finite number >= 0, got {call_ms!r}")
        self.call_ms = float(call_ms)
        self.encode_ms = self._codec_times("encode_ms", encode_ms, n)
        self.decode_ms = self._codec_times("decode_ms", decode_ms, n)
        # per (cut, codec), unloaded: what the device pays to send beyond its head (encode + one call)
        self._send_cpu_ms = self.encode_ms + self.call_ms * self._rtt_mask[:, None]
        for arr in (
            self.encode_ms,
            self.decode_ms,
            self._send_cpu_ms,
            self.head_ms,
            self.tail_ms,
            self.bytes,
            self.float_bytes,
            self.sent_bytes,
            self.reply_bytes,
            self.codec_ratio_matrix,
            self.codec_ratios,
        ):
            arr.setflags(write=False)

    def _codec_times(self, name: str, given: Mapping[str, CodecRatio] | None, n: int) -> FloatArray:
        """(cuts, codecs) ms from one figure or one per cut per codec (codecs not given: 0); 0 where
        nothing is sent."""
        out = np.zeros((n, len(self.codecs)))
        for codec, value in (given or {}).items():
            if codec not in self.codecs:
                continue  # a codec the table does not plan with
            arr = np.array(value, dtype=np.float64).reshape(-1)
            if arr.shape not in ((1,), (n,)):
                raise PlanError(f"{name}[{codec!r}]: expected one value or {n} (one per cut), got {arr.shape[0]}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise PlanError(f"{name}[{codec!r}]: every value must be finite and >= 0")
            out[:, self.codecs.index(codec)] = arr
        return np.where(self.sends[:, None], out, 0.0)

    def codec_time_map(self, times: FloatArray) -> dict[str, CodecRatio]:
        """``encode_ms`` or ``decode_ms`` as the constructor takes them (one list per codec)."""
        return {c: times[:, k].tolist() for k, c in enumerate(self.codecs)}

    def codec_times(self) -> dict[str, object]:
        """The ``encode_ms``, ``decode_ms`` and ``call_ms`` arguments that rebuild this table's times."""
        return {
            "encode_ms": self.codec_time_map(self.encode_ms),
            "decode_ms": self.codec_time_map(self.decode_ms),
            "call_ms": self.call_ms,
        }

    def codec_map(self) -> dict[str, CodecRatio]:
        """The ``codecs`` argument that rebuilds this table's ratios (per-cut lists where they were)."""
        return {
            c: self.codec_ratio_matrix[:, k].tolist() if c in self._per_cut else float(self.codec_ratio_matrix[0, k])
            for k, c in enumerate(self.codecs)
        }

    def with_ratio_cap(self, cut: str, ratio: float) -> CostTable:
        """This table with every codec sending at most ``ratio`` x fp32 at ``cut``: e.g. the input (cut
        ``cloud``) sent as the camera's compressed frame rather than as a tensor."""
        i = self.index(cut)
        m = self.codec_ratio_matrix.copy()
        m[i] = np.minimum(m[i], ratio)
        return CostTable.joined(self, self, codecs={c: m[:, k].tolist() for k, c in enumerate(self.codecs)})

    @classmethod
    def joined(cls, head: CostTable, tail: CostTable, *, codecs: Mapping[str, CodecRatio] | None = None) -> CostTable:
        """The sending side of ``head`` (head times, bytes, codec ratios or ``codecs``, encode and call costs)
        with the receiving side of ``tail`` (tail times, decode costs); both over the same cuts."""
        return cls(
            ids=head.ids,
            head_ms=head.head_ms,
            tail_ms=tail.tail_ms,
            bytes=head.bytes.astype(np.int64),
            float_bytes=head.float_bytes.astype(np.int64),
            reply_bytes=head.reply_bytes,
            codecs=head.codec_map() if codecs is None else codecs,
            encode_ms=head.codec_time_map(head.encode_ms),
            decode_ms=tail.codec_time_map(tail.decode_ms),
            call_ms=head.call_ms,
        )

    def per_cut_codecs(self) -> tuple[str, ...]:
        """The codecs priced per cut (measured on the cut tensors), in table order."""
        return tuple(c for c in self.codecs if c in self._per_cut)

    def to_dict(self) -> dict[str, object]:
        """The table's inputs as plain JSON values (a recorded decision log replays against them)."""
        return {
            "ids": list(self.ids),
            "head_ms": self.head_ms.tolist(),
            "tail_ms": self.tail_ms.tolist(),
            "bytes": [int(b) for b in self.bytes],
            "float_bytes": [int(b) for b in self.float_bytes],
            "reply_bytes": [int(b) for b in self.reply_bytes],
            "codecs": self.codec_map(),
            **self.codec_times(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostTable:
        """The inverse of ``to_dict``; ``PlanError`` names a missing key."""
        try:
            return cls(
                ids=data["ids"],
                head_ms=data["head_ms"],
                tail_ms=data["tail_ms"],
                bytes=data["bytes"],
                float_bytes=data["float_bytes"],
                reply_bytes=data["reply_bytes"],
                codecs=data["codecs"],
                # tables logged before the device's costs were priced: none
                encode_ms=data.get("encode_ms"),
                decode_ms=data.get("decode_ms"),
                call_ms=float(data.get("call_ms", 0.0)),
            )
        except KeyError as exc:
            raise PlanError(f"cost table: expected key {exc.args[0]!r}, got keys {sorted(data)}") from exc

    @staticmethod
    def _vector(name: str, values: object, n: int) -> FloatArray:
        arr = np.array(values, dtype=np.float64).reshape(-1)
        if arr.shape != (n,):
            raise PlanError(f"{name}: expected {n} values (one per cut), got {arr.shape[0]}")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise PlanError(f"{name}: every value must be finite and >= 0")
        return arr

    @classmethod
    def from_cuts(
        cls,
        cuts: Sequence[CutCost],
        *,
        reply_bytes: int | Sequence[int] = 0,
        codecs: Mapping[str, CodecRatio] | None = None,
    ) -> CostTable:
        return cls(
            ids=[c.cut for c in cuts],
            head_ms=[c.head_ms for c in cuts],
            tail_ms=[c.tail_ms for c in cuts],
            bytes=[c.bytes for c in cuts],
            float_bytes=[c.bytes if c.float_bytes is None else c.float_bytes for c in cuts],
            reply_bytes=reply_bytes,
            codecs=codecs,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, cut: str) -> int:
        try:
            return self._index[cut]
        except KeyError:
            raise PlanError(f"unknown cut {cut!r}; expected one of {self.ids[0]}..{self.ids[-1]}") from None

    def codec_index(self, codec: str) -> int:
        try:
            return self.codecs.index(codec)
        except ValueError:
            raise PlanError(f"unknown codec {codec!r}; expected one of {', '.join(self.codecs)}") from None

    # ---- vectorised components, shape (cuts, codecs) or (cuts,) ----------------------------------
    def device_ms(self, cond: Conditions) -> FloatArray:
        return self.head_ms * cond.device_load

    def cloud_ms(self, cond: Conditions) -> FloatArray:
        return self.tail_ms * cond.cloud_load

    def send_cpu_ms(self, cond: Conditions) -> FloatArray:
        """The device's encode plus one call's fixed cost, loaded, (cuts, codecs)."""
        return self._send_cpu_ms * cond.device_load

    def decode_cloud_ms(self, cond: Conditions) -> FloatArray:
        """The cloud's decode of what was sent, loaded, (cuts, codecs)."""
        return self.decode_ms * cond.cloud_load

    def send_ms(self, cond: Conditions) -> FloatArray:
        """Upload time of the crossing tensors, (cuts, codecs)."""
        return self._send_ms_1mbps / cond.link.bandwidth_mbps

    def reply_ms(self, cond: Conditions) -> FloatArray:
        """Download time of the reply, (cuts,)."""
        return self._reply_ms_1mbps / cond.link.bandwidth_mbps

    def rtt_ms(self, cond: Conditions) -> FloatArray:
        return self._rtt_mask * cond.link.rtt_ms

    def queue_ms(self, cond: Conditions) -> FloatArray:
        """The cloud's expected queueing delay, for every cut that sends, (cuts,)."""
        return self._rtt_mask * cond.queue_ms

    def latency_ms(self, cond: Conditions) -> FloatArray:
        """End-to-end latency of every (cut, codec), shape (cuts, codecs)."""
        per_cut = (
            self.device_ms(cond) + self.reply_ms(cond) + self.rtt_ms(cond) + self.queue_ms(cond) + self.cloud_ms(cond)
        )
        return per_cut[:, None] + self.send_ms(cond) + self.send_cpu_ms(cond) + self.decode_cloud_ms(cond)

    def energy_mj(self, cond: Conditions, power: Power) -> FloatArray:
        """Device energy per inference in millijoules (W × ms), shape (cuts, codecs)."""
        waiting = self.rtt_ms(cond) + self.queue_ms(cond) + self.cloud_ms(cond) + self.reply_ms(cond)
        per_cut = power.active_w * self.device_ms(cond) + power.idle_w * waiting
        return (
            per_cut[:, None]
            + power.send_w * self.send_ms(cond)
            + power.active_w * self.send_cpu_ms(cond)
            + power.idle_w * self.decode_cloud_ms(cond)
        )

    def period_ms(self, cond: Conditions) -> FloatArray:
        """Pipelined frame period (slowest of device, link, cloud), shape (cuts, codecs)."""
        link = self.send_ms(cond) + self.reply_ms(cond)[:, None]
        device = self.device_ms(cond)[:, None] + self.send_cpu_ms(cond)
        cloud = self.cloud_ms(cond)[:, None] + self.decode_cloud_ms(cond)
        return np.maximum(np.maximum(device, cloud), link)

    def estimate(self, cut: str, codec: str, cond: Conditions, power: Power = DEFAULT_POWER) -> Estimate:
        """All predicted figures of one (cut, codec)."""
        i, k = self.index(cut), self.codec_index(codec)
        bw = cond.link.bandwidth_mbps
        device = float(self.head_ms[i] * cond.device_load)
        cloud = float(self.tail_ms[i] * cond.cloud_load)
        send = float(self._send_ms_1mbps[i, k] / bw)
        reply = float(self._reply_ms_1mbps[i] / bw)
        rtt = float(self._rtt_mask[i] * cond.link.rtt_ms)
        queue = float(self._rtt_mask[i] * cond.queue_ms)
        encode = float(self.encode_ms[i, k] * cond.device_load)
        call = float(self._rtt_mask[i] * self.call_ms * cond.device_load)
        decode = float(self.decode_ms[i, k] * cond.cloud_load)
        return Estimate(
            cut=cut,
            codec=codec,
            device_ms=device,
            transfer_ms=send,
            download_ms=reply,
            rtt_ms=rtt,
            queue_ms=queue,
            cloud_ms=cloud,
            latency_ms=device + encode + call + reply + rtt + queue + decode + cloud + send,
            energy_mj=power.active_w * (device + encode + call)
            + power.idle_w * (rtt + queue + decode + cloud + reply)
            + power.send_w * send,
            period_ms=max(device + encode + call, decode + cloud, send + reply),
            bytes=int(self.bytes[i]),
            sent_bytes=int(self.sent_bytes[i, k]),
            reply_bytes=int(self.reply_bytes[i]),
            encode_ms=encode,
            decode_ms=decode,
            call_ms=call,
        )
