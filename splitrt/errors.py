"""The one exception tree of splitrt.

Every error a user can meet is a ``SplitrtError``. Errors from onnx, onnxruntime, grpc and zeroconf
are mapped at the boundary (``raise ... from exc``) so callers never catch third-party types, and a
message names what was expected and what came.
"""

from __future__ import annotations


class SplitrtError(Exception):
    """Base of every error splitrt raises on purpose."""


class ModelError(SplitrtError):
    """A model file cannot be used: missing, not ONNX, truncated, fails the checker, unknown shapes."""


class CutError(SplitrtError):
    """A cut id does not name a valid cut of the model, or a set of cuts does not form a chain."""


class ProfileError(SplitrtError):
    """A profile is corrupt, of another schema, or measured for another model."""


class PlanError(SplitrtError):
    """No plan can be made: unknown objective, empty candidate set, inconsistent inputs."""


class CodecError(SplitrtError):
    """A tensor payload cannot be encoded or decoded (unknown codec, truncated or garbage bytes)."""


class ConfigError(SplitrtError):
    """A configuration file or flag has a wrong value."""


class InputError(SplitrtError):
    """Inputs given to a model do not match it: wrong name, dtype or shape."""


class CloudError(SplitrtError):
    """The cloud answered with an error, or could not be reached.

    ``code`` is the gRPC status code name (e.g. ``"NOT_FOUND"``), or ``"UNAVAILABLE"`` when the
    server is gone; ``retryable`` says whether running the tail locally or on another cloud can help.
    """

    def __init__(self, message: str, *, code: str = "UNKNOWN", retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class DiscoveryError(SplitrtError):
    """mDNS advertisement or browsing failed."""


class RigError(SplitrtError):
    """The hardware-in-the-loop rig could not set up or tear down namespaces, qdiscs or cgroups."""
