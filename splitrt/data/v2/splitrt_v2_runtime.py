"""MLServer runtime for splitrt tails: ``splitrt export-repository`` copies this file to the root of the
model repository it writes, and each tail's ``model-settings.json`` names ``splitrt_v2_runtime.OnnxTail``.

It runs inside MLServer (which puts the repository root on ``sys.path``) and needs only mlserver,
onnxruntime and numpy, not splitrt. Requests are checked against the tensors declared in
``model-settings.json`` (v2 datatypes, shapes with -1 for a free dim), as Triton checks ``config.pbtxt``:
a mismatch is INVALID_ARGUMENT naming the expected and the actual value, before onnxruntime runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.utils import get_model_uri

NUMPY_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
DATATYPES = {v: k for k, v in NUMPY_DTYPES.items()}


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))  # MLServer's Datatype is an Enum


def _shape_fits(expected: list[int], actual: list[int]) -> bool:
    return len(expected) == len(actual) and all(e < 0 or e == a for e, a in zip(expected, actual, strict=True))


class BadRequest(MLServerError):
    """Served as INVALID_ARGUMENT (HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=400)


class OnnxTail(MLModel):
    """One tail segment (``parameters.uri``) on onnxruntime's CPU provider."""

    async def load(self) -> bool:
        path = await get_model_uri(self.settings)
        extra = (self.settings.parameters.extra or {}) if self.settings.parameters else {}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(extra.get("intra_op_threads", 0))
        self._session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self._declared = {t.name: t for t in self.settings.inputs}
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    def _feed(self, inp: Any) -> np.ndarray:
        declared = self._declared.get(inp.name)
        if declared is None:
            raise BadRequest(f"model {self.name}: expected inputs {sorted(self._declared)}, got {inp.name!r}")
        want, got = _text(declared.datatype), _text(inp.datatype)
        if want != got:
            raise BadRequest(f"model {self.name} input {inp.name!r}: expected datatype {want}, got {got}")
        if not _shape_fits(list(declared.shape), list(inp.shape)):
            raise BadRequest(
                f"model {self.name} input {inp.name!r}: expected shape {list(declared.shape)} "
                f"(-1: any size), got {list(inp.shape)}"
            )
        data = getattr(inp.data, "root", inp.data)
        return np.asarray(data, dtype=NUMPY_DTYPES[got]).reshape(list(inp.shape))

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {inp.name: self._feed(inp) for inp in payload.inputs}
        missing = sorted(set(self._declared) - set(feeds))
        if missing:
            raise BadRequest(
                f"model {self.name}: expected inputs {sorted(self._declared)}, got {sorted(feeds)} (missing {missing})"
            )
        values = self._session.run(self._outputs, feeds)
        outputs = [
            ResponseOutput(
                name=name,
                shape=list(arr.shape),
                datatype=DATATYPES[arr.dtype.name],
                data=np.asarray(arr).ravel().tolist(),
            )
            for name, arr in zip(self._outputs, values, strict=True)
        ]
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=outputs)
