"""A model's every graph (subgraphs and functions), node count and tensor, and which tensors keep their
bytes in external files.

onnx's loader reads external data for every tensor it finds, not only the top graph's initializers: a
``Constant`` node's ``value`` attribute, an initializer inside an ``If``/``Loop``/``Scan`` body, a sparse
tensor's values or indices, a function's nodes. A model naming a file in the models directory had that
file's bytes as a tensor and so in its outputs (a 187-byte upload returned the server's warm file).

- ``graphs(model)``: ``(where, graph)`` for the model's graph, every subgraph in any node attribute (at any
  depth) and every function; ``count_nodes(model)``: their nodes.
- ``all_tensors(model)``: every ``TensorProto`` of an ``onnx.ModelProto`` (graph and subgraph initializers,
  sparse ones' values and indices, node attributes, functions), with where it is.
- ``external_locations(model)``: the ``location`` of each external-data tensor among them.
- ``sparse_initializers(model)``: names of sparse initializers anywhere (the server cannot split them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["all_tensors", "count_nodes", "external_locations", "graphs", "sparse_initializers"]


def graphs(model: Any) -> Iterator[tuple[str, Any]]:
    """The model's graph, every subgraph in any node attribute, and functions' node lists (as graphs)."""
    import onnx

    stack: list[tuple[str, Any]] = [("graph", model.graph)]
    stack += [(f"function {f.name}", f) for f in model.functions]
    while stack:
        where, g = stack.pop()
        yield where, g
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append((f"{where} > {node.op_type} {node.name or '?'}.{a.name}", a.g))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    stack += [(f"{where} > {node.op_type} {node.name or '?'}.{a.name}", sg) for sg in a.graphs]


def count_nodes(model: Any) -> int:
    """Nodes of an ``onnx.ModelProto``: its graph's, its subgraphs' (If/Loop/Scan bodies) and its functions'."""
    return sum(len(g.node) for _, g in graphs(model))


def all_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """``(where, TensorProto)`` for every tensor the model carries, subgraphs and functions included."""
    import onnx

    A = onnx.AttributeProto
    for where, g in graphs(model):
        for t in getattr(g, "initializer", ()):
            yield f"{where} initializer {t.name!r}", t
        for s in getattr(g, "sparse_initializer", ()):
            yield f"{where} sparse initializer {s.values.name!r}", s.values
            yield f"{where} sparse initializer {s.values.name!r} indices", s.indices
        for node in g.node:
            for a in node.attribute:
                at = f"{where} node {node.op_type} {node.name or '?'} attribute {a.name!r}"
                if a.type == A.TENSOR:
                    yield at, a.t
                elif a.type == A.TENSORS:
                    yield from ((at, t) for t in a.tensors)
                elif a.type == A.SPARSE_TENSOR:
                    yield at, a.sparse_tensor.values
                    yield at, a.sparse_tensor.indices
                elif a.type == A.SPARSE_TENSORS:
                    for s in a.sparse_tensors:
                        yield at, s.values
                        yield at, s.indices


def external_locations(model: Any) -> list[str]:
    """The ``location`` of every external-data tensor anywhere in the model (first-use order; a tensor
    marked external without a location counts as ``""``)."""
    import onnx

    seen: dict[str, None] = {}
    for _, t in all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((kv.value for kv in t.external_data if kv.key == "location"), "")
            seen.setdefault(loc, None)
    return list(seen)


def sparse_initializers(model: Any) -> list[str]:
    """Names of the sparse initializers of the graph and its subgraphs."""
    return [s.values.name for _, g in graphs(model) for s in getattr(g, "sparse_initializer", ())]
