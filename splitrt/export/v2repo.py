"""``splitrt export-repository``: a model's tails as a model repository that standard serving engines load.

Per cut, one directory named ``transport.v2.model_name(sha256, cut)`` (``<sha256[:12]>-<cut>``) holding
- ``config.pbtxt``: Triton's model configuration (platform ``onnxruntime_onnx``, ``max_batch_size: 0``,
  every input/output with its data type and dims, -1 for a free dim);
- ``1/model.onnx``: the tail segment (``graph.partition``), version 1;
- ``model-settings.json``: the same model for MLServer, run by ``splitrt_v2_runtime.OnnxTail``.

At the root: ``splitrt_v2_runtime.py`` (the MLServer runtime, a copy of ``splitrt/data/v2/``) and
``splitrt-repository.json`` (which model, which cuts, which names). So one directory serves Triton
(``tritonserver --model-repository DIR``, or a KServe InferenceService over it) and MLServer
(``mlserver start DIR``); devices reach either with ``--cloud v2://host:port``.

Dims are the tail's declared shapes (segments stay shape-generic: any input shape the model accepts),
or, with ``fixed_shapes``, the bound graph's concrete shapes: the server then refuses other shapes
(INVALID_ARGUMENT) and the device finishes such requests locally.

- ``export_repository(graph, cut_ids, out_dir, *, fixed_shapes=False, intra_op_threads=0) -> [ExportedTail(name,
  cut_id, directory, inputs, outputs, nodes)]``: a scalar is dims ``[1]`` + ``reshape: { shape: [ ] }``; the
  runtime needs only mlserver + onnxruntime + numpy and checks each input's datatype and shape against
  ``model-settings.json`` (INVALID_ARGUMENT naming expected and got). Cut ``device`` and an empty list are
  ``ConfigError``, an unknown cut ``CutError``; other models in ``out_dir`` are left alone, these replaced.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from splitrt import __version__
from splitrt.errors import ConfigError
from splitrt.paths import PACKAGE_DIR
from splitrt.transport import v2

RUNTIME_SOURCE = PACKAGE_DIR / "data" / "v2" / "splitrt_v2_runtime.py"
RUNTIME_CLASS = "splitrt_v2_runtime.OnnxTail"
MANIFEST = "splitrt-repository.json"
PLATFORM = "onnxruntime_onnx"
VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class V2Tensor:
    name: str
    datatype: str  # v2: "FP32", "INT64", ...
    dims: tuple[int, ...]  # -1: free

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.dims)}


@dataclass(frozen=True, kw_only=True)
class ExportedTail:
    name: str
    cut_id: str
    directory: Path
    inputs: tuple[V2Tensor, ...]
    outputs: tuple[V2Tensor, ...]
    nodes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cut": self.cut_id,
            "directory": str(self.directory),
            "nodes": self.nodes,
            "inputs": [t.as_dict() for t in self.inputs],
            "outputs": [t.as_dict() for t in self.outputs],
        }


def _declared_dims(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    tt = info.type.tensor_type
    if not tt.HasField("shape"):
        raise ConfigError(
            f"tensor {info.name!r}: expected a declared rank for the v2 config, got none "
            "(bind the model's free dims with --shape/--dim and --fixed-shapes)"
        )
    return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)


def _tensor(graph: Any, info: onnx.ValueInfoProto, fixed_shapes: bool) -> V2Tensor:
    t = graph.tensor(info.name)
    bound = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in t.shape)
    dims = bound if fixed_shapes else _declared_dims(info)
    return V2Tensor(name=info.name, datatype=v2.datatype(t.dtype), dims=dims)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pbtxt_tensor(t: V2Tensor) -> str:
    # Triton wants a non-empty dims; a scalar is dims [1] reshaped to [].
    dims = ", ".join(str(d) for d in t.dims) if t.dims else "1"
    reshape = "\n    reshape: { shape: [ ] }" if not t.dims else ""
    return f"  {{\n    name: {_quoted(t.name)}\n    data_type: TYPE_{t.datatype}\n    dims: [ {dims} ]{reshape}\n  }}"


def config_pbtxt(tail: ExportedTail) -> str:
    """Triton's ``config.pbtxt`` for ``tail`` (text protobuf of ``inference.ModelConfig``)."""
    ins = ",\n".join(_pbtxt_tensor(t) for t in tail.inputs)
    outs = ",\n".join(_pbtxt_tensor(t) for t in tail.outputs)
    return (
        f"# Written by splitrt {__version__} export-repository: the tail of cut {tail.cut_id}.\n"
        f"name: {_quoted(tail.name)}\nplatform: {_quoted(PLATFORM)}\nmax_batch_size: 0\n"
        f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
    )


def model_settings(tail: ExportedTail, *, intra_op_threads: int = 0) -> dict[str, Any]:
    """MLServer's ``model-settings.json`` for ``tail``."""
    return {
        "name": tail.name,
        "implementation": RUNTIME_CLASS,
        "platform": PLATFORM,
        "versions": [VERSION],
        "inputs": [t.as_dict() for t in tail.inputs],
        "outputs": [t.as_dict() for t in tail.outputs],
        "parameters": {
            "uri": f"./{VERSION}/model.onnx",
            "version": VERSION,
            "extra": {"intra_op_threads": intra_op_threads},
        },
    }


def export_repository(
    graph: Any, cut_ids: Sequence[str], out_dir: str | Path, *, fixed_shapes: bool = False, intra_op_threads: int = 0
) -> list[ExportedTail]:
    """Write the tails of ``cut_ids`` of ``graph`` (a ``graph.ModelGraph``) as a model repository in
    ``out_dir`` (created; other models already there are left alone, these ones are replaced)."""
    from splitrt.graph import partition

    if not cut_ids:
        raise ConfigError("export-repository: expected at least one cut id, got none")
    if "device" in cut_ids:
        raise ConfigError(
            "export-repository: expected cuts with a tail on the server, got 'device' "
            "(it runs everything on the device)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tails = []
    for cut_id in dict.fromkeys(cut_ids):
        _, seg = partition.head_tail(graph, cut_id)
        name = v2.model_name(graph.sha256, cut_id)
        tail = ExportedTail(
            name=name,
            cut_id=cut_id,
            directory=out / name,
            nodes=seg.node_count,
            inputs=tuple(_tensor(graph, i, fixed_shapes) for i in seg.model.graph.input),
            outputs=tuple(_tensor(graph, o, fixed_shapes) for o in seg.model.graph.output),
        )
        if tail.directory.exists():
            shutil.rmtree(tail.directory)
        (tail.directory / VERSION).mkdir(parents=True)
        onnx.save_model(seg.model, str(tail.directory / VERSION / "model.onnx"))
        (tail.directory / "config.pbtxt").write_text(config_pbtxt(tail))
        settings = model_settings(tail, intra_op_threads=intra_op_threads)
        (tail.directory / "model-settings.json").write_text(json.dumps(settings, indent=2) + "\n")
        tails.append(tail)
    shutil.copyfile(RUNTIME_SOURCE, out / RUNTIME_SOURCE.name)
    manifest = {
        "splitrt": __version__,
        "model": str(graph.path),
        "sha256": graph.sha256,
        "fixed_shapes": fixed_shapes,
        "models": [t.as_dict() | {"directory": t.name} for t in tails],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return tails
