"""The one exception tree of splitrt.

Every error a user can meet is a ``SplitrtError``. Errors from onnx, onnxruntime, grpc, zeroconf and
the OS are mapped at the boundary (``raise ... from exc``) so callers never catch third-party types,
and a message names what was expected and what came::

    SplitrtError
    ├── ModelError       graph: a model file is missing, not ONNX, truncated, fails the checker
    ├── CutError         graph: a cut id is unknown, or cut ids do not nest into a chain
    ├── ProfileError     profile: a profile is corrupt, of another schema, or for another model
    │   └── PowerError   profile: a power reader is missing, unreadable or prints garbage
    ├── PlanError        plan: no plan can be made (objective, empty candidates, bad inputs)
    ├── CodecError       transport: a payload cannot be encoded/decoded (codec, truncated, garbage)
    ├── ConfigError      everywhere: a config file key or flag has a wrong value
    ├── InputError       device/cloud: inputs do not match the model (name, dtype, shape)
    ├── CloudError       device: the cloud answered an error or is unreachable (.code, .retryable)
    ├── DiscoveryError   transport: mDNS advertising or browsing failed
    └── RigError         rig: namespaces, qdiscs, cgroups or rig processes could not be set up

Where third-party errors are mapped: onnx load errors in ``graph.model`` (ModelError); onnxruntime's,
wherever a session is built or run, by one context manager, ``graph.ort_errors.onnxruntime_errors``
(ModelError when the model is at fault, InputError when the inputs are); ``grpc.RpcError``
in the transport the device uses (CloudError with the gRPC status name); zeroconf errors in
``transport.discovery`` (DiscoveryError); ``OSError``/``subprocess`` failures in ``rig`` (RigError).
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


class PowerError(ProfileError):
    """A power reader cannot read: its sysfs file or command is missing, unreadable, or prints garbage."""


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
    server is gone; ``retryable`` says whether running the tail locally or on another cloud can help;
    ``retry_after_ms`` is the server's hint when it refused a request because its queue was full
    (RESOURCE_EXHAUSTED), else None.
    """

    def __init__(
        self, message: str, *, code: str = "UNKNOWN", retryable: bool = False, retry_after_ms: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms


class DiscoveryError(SplitrtError):
    """mDNS advertisement or browsing failed."""


class RigError(SplitrtError):
    """The hardware-in-the-loop rig could not set up or tear down namespaces, qdiscs or cgroups."""
