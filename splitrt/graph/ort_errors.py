"""onnxruntime's exceptions mapped into splitrt's tree, in one place (as httpx maps its transport layer's).

Every place that builds or runs an onnxruntime session wraps just that call::

    with onnxruntime_errors("the tail of cut 'c3'", stage="build"):
        session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    with onnxruntime_errors("the tail of cut 'c3'", stage="run", feeds=feeds):
        values = session.run(outputs, feeds)

onnxruntime raises its own types (``onnxruntime.capi.onnxruntime_pybind11_state``: ``InvalidArgument``,
``Fail``, ``NoSuchFile``, ``InvalidGraph``, ``RuntimeException``, ``NotImplemented``, ...), none of them a
subclass of anything but ``Exception``, and its Python wrapper raises ``ValueError``/``TypeError``/
``RuntimeError`` (missing feeds, wrong feed types). They become:

- building a session: ``ModelError`` ("does not load in onnxruntime: expected a model it can build");
- running one: ``ModelError`` when the model is at fault (an op not implemented, an invalid graph),
  else ``InputError`` (inputs the declarations let through that a node refuses, e.g. an image too small
  for its pooling, or a wrong feed), with the feeds' shapes.

The message names what failed, what was expected and what came (the onnxruntime type and its first
lines). ``error=`` forces the class (e.g. ``ModelError`` where a run on the model's own sample fails).
Anything else (our own errors, ``MemoryError``, ``KeyboardInterrupt``) passes through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np

from splitrt.errors import InputError, ModelError, SplitrtError

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations only
    from typing_extensions import Unpack

# onnxruntime's exception types that say the model (not the inputs) is at fault when a run fails.
_MODEL_AT_FAULT = {
    "NotImplemented",
    "InvalidGraph",
    "InvalidProtobuf",
    "NoModel",
    "NoSuchFile",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "EngineError",
    "EPFail",
}
# What onnxruntime's Python wrapper raises itself (and pybind11 for a feed it cannot convert).
_WRAPPER = (ValueError, TypeError, RuntimeError)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")
_MAX_DETAIL = 400


def is_onnxruntime_error(exc: BaseException) -> bool:
    """An exception onnxruntime raised: one of its own types, or what its wrapper raises."""
    return type(exc).__module__.startswith("onnxruntime") or (
        isinstance(exc, _WRAPPER) and not isinstance(exc, SplitrtError)
    )


def describe(exc: BaseException) -> str:
    """``Kind: detail``: onnxruntime's type name and its message without the ``[ONNXRuntimeError] : 2 :
    INVALID_ARGUMENT :`` prefix, on one line, bounded."""
    detail = _PREFIX.sub("", " ".join(str(exc).split()))
    return f"{type(exc).__name__}: {detail[:_MAX_DETAIL]}" if detail else type(exc).__name__


def shapes_of(feeds: Mapping[str, Any]) -> str:
    """``x=[1, 3, 224, 224], mask=[1, 7]``: the feeds as a run saw them."""
    return ", ".join(f"{k}={list(np.shape(v))}" for k, v in feeds.items()) or "no inputs"


def mapped(
    exc: BaseException,
    what: str,
    *,
    stage: Literal["build", "run"],
    feeds: Mapping[str, Any] | None = None,
    where: str = "",
    error: type[SplitrtError] | None = None,
) -> SplitrtError:
    """The splitrt error for onnxruntime's ``exc`` raised while ``what`` was built or run."""
    cause = describe(exc)
    if stage == "build":
        text = f"{what} does not load in onnxruntime{where}: expected a model it can build, got {cause}"
        return (error or ModelError)(text)
    at = f" at {shapes_of(feeds)}" if feeds is not None else ""
    cls = error or (ModelError if type(exc).__name__ in _MODEL_AT_FAULT else InputError)
    expected = "a model whose every op it runs" if cls is ModelError else "inputs every node accepts"
    return cls(f"{what} failed in onnxruntime{where}{at}: expected {expected}, got {cause}")


class _Stage(TypedDict):
    stage: Literal["build", "run"]


class Context(_Stage, total=False):
    """``mapped``'s keywords after ``what``: ``stage`` (required), ``feeds``, ``where``, ``error``."""

    feeds: Mapping[str, Any] | None
    where: str
    error: type[SplitrtError] | None


@contextmanager
def onnxruntime_errors(what: str, **context: Unpack[Context]) -> Iterator[None]:
    """Map onnxruntime's exceptions raised in the block (see the module doc); ``what`` names the model or
    segment, ``where`` the machine (``" on this device"``), ``feeds`` what a run was given."""
    try:
        yield
    except Exception as exc:
        if not is_onnxruntime_error(exc):
            raise
        raise mapped(exc, what, **context) from exc
