"""``--codec`` values for every command: any codec the registry (``splitrt.transport.codec``) parses,
so every codec the planner can choose (``int8c+zstd`` ...) is accepted everywhere."""

from __future__ import annotations

import argparse

from splitrt.errors import CodecError
from splitrt.transport import codec


def codec_arg(text: str) -> str:
    """An argparse ``type``: the codec's canonical name; argparse's error lists the registry's names."""
    try:
        return str(codec.Codec.parse(text))
    except CodecError as exc:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(codec.names())}, got {text!r}") from exc


def codec_or_all(text: str) -> str:
    """``codec_arg``, or ``all`` (every codec the cost table prices)."""
    return "all" if text == "all" else codec_arg(text)


HELP = "one of " + ", ".join(codec.names())
