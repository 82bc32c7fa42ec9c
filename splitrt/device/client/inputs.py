"""A request's inputs on the device: checked against the model (names, dtypes, shapes the model declares),
random ones of the right kind for tests and probes, and whether a graph specialised on its binding's sample
(``graph.specialise``) may be split for them; a request that takes another branch runs the whole original
model. ``InputChecks`` gives a ``Device`` these as methods."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from splitrt.device.client.messages import SplitResult
from splitrt.errors import CutError, InputError, SplitrtError
from splitrt.plan.costmodel import DEVICE_CUT
from splitrt.transport import wire

__all__ = ["InputChecks", "check_inputs", "random_inputs"]


def check_inputs(graph: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``inputs`` as arrays, or ``InputError`` naming the expected and actual name/dtype/shape."""
    expected = {t.name: t for t in graph.inputs}
    if set(inputs) != set(expected):
        raise InputError(f"model {graph.path.name}: expected inputs {sorted(expected)}, got {sorted(inputs)}")
    out: dict[str, np.ndarray] = {}
    for name, info in expected.items():
        arr = np.asarray(inputs[name])
        if arr.dtype.name != info.dtype:
            raise InputError(f"input {name!r}: expected dtype {info.dtype}, got {arr.dtype.name}")
        # The shape the model declares (a free dim takes any size), not the one a bound graph was sized
        # at: the binding is where costs were computed, not the only shape served.
        shape = graph.generic_shape(name) if hasattr(graph, "generic_shape") else info.shape
        if shape is not None and not wire.shape_matches(tuple(shape), tuple(arr.shape)):
            raise InputError(
                f"input {name!r}: expected shape {wire.describe_shape(tuple(shape))}, got {list(arr.shape)}"
            )
        out[name] = arr
    return out


def random_inputs(graph: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right dtype and shape for ``graph``: its bound shapes, or free dims as 1 if unbound."""
    rng = np.random.default_rng(seed)
    result: dict[str, np.ndarray] = {}
    for t in graph.inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (t.shape or ()))
        dt = np.dtype(t.dtype)
        if dt.kind == "f":
            result[t.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            result[t.name] = rng.integers(0, 2, shape).astype(dt)
        else:
            result[t.name] = rng.integers(0, 10, shape).astype(dt)
    return result


class InputChecks:
    """A Device's checks of a request's inputs: names, dtypes and shapes, and whether a graph specialised
    on its binding's sample (``graph.specialise``) may be split for them; a request that takes another
    branch than the graph was specialised for runs the whole original model."""

    graph: Any
    run_local: Callable[[Mapping[str, Any]], dict[str, np.ndarray]]

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs as arrays, or ``InputError`` naming the expected and actual name/dtype/shape."""
        return check_inputs(self.graph, inputs)

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the right dtype and shape (symbolic dimensions as 1)."""
        return random_inputs(self.graph, seed)

    def diverges(self, feeds: Mapping[str, np.ndarray]) -> str | None:
        """Why ``feeds`` may not be split with this (specialised) graph: they take another branch of an
        If the binding's sample fixed. None when they may (always, for a graph not specialised)."""
        spec = getattr(self.graph, "specialisation", None)
        if spec is None:
            return None
        try:
            return spec.holds(feeds)
        except SplitrtError as exc:  # onnxruntime's, mapped: a request the guard cannot even evaluate
            return f"the specialisation guard does not evaluate on this request ({str(exc)[:300]})"

    def run_original(self, inputs: Mapping[str, Any], *, request_id: str = "") -> SplitResult:
        """The whole (original) model here, as a result: what a request that diverges runs."""
        t0 = time.perf_counter()
        outputs = self.run_local(inputs)
        ms = (time.perf_counter() - t0) * 1e3
        return SplitResult(
            outputs=outputs,
            cut_id=DEVICE_CUT,
            codec="fp32",
            where="local",
            request_id=request_id,
            head_ms=ms,
            total_ms=ms,
        )

    def _refuse_diverging(self, feeds: Mapping[str, np.ndarray], cut: str) -> None:
        why = self.diverges(feeds)
        if why is not None:
            raise CutError(f"cut {cut!r} of {self.graph.path.name}: {why}; run the whole model (cut device)")
