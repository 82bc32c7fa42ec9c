"""How tensors travel between device and cloud: codecs, the hand-framed gRPC messages, the generated
stubs of ``proto/splitrt.proto``, and zeroconf discovery of servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splitrt._lazy import exports

if TYPE_CHECKING:
    from splitrt.transport.codec import Codec, Encoded, decode, encode

_NAMES = {
    "Codec": "codec",
    "Encoded": "codec",
    "decode": "codec",
    "encode": "codec",
    "codec": "",
    "discovery": "",
    "wire": "",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = exports(__name__, _NAMES)
