"""Inputs from the command line: the shapes a model is bound at (``--shape``, ``--dim``, ``--sample``)
and input arrays (``NAME=FILE.npy`` or ``FILE.npz``, arrays keyed by input name)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from splitrt.device.client import Device
from splitrt.errors import InputError
from splitrt.graph import model as graph
from splitrt.graph import shapes, zoo


def load_inputs(dev: Device, specs: list[str]) -> dict[str, np.ndarray]:
    return read_inputs([t.name for t in dev.graph.inputs], specs)


def read_inputs(names: list[str], specs: list[str]) -> dict[str, np.ndarray]:
    """``--input`` files as arrays by input name (``names``: the model's inputs, for a bare ``FILE.npy``)."""
    inputs: dict[str, np.ndarray] = {}
    for spec in specs:
        name, _, file = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(file)
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"input file {path}: expected a .npy or .npz array file ({exc})") from exc
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                inputs.update({k: loaded[k] for k in loaded.files})
            continue
        if not name:
            if len(names) != 1:
                raise InputError(f"model has inputs {names}: expected NAME=FILE.npy for each, got {spec!r}")
            name = names[0]
        inputs[name] = loaded
    return inputs


def add_shape_arguments(p: argparse.ArgumentParser) -> None:
    """``--shape/--dim/--sample``: the input shapes every size and cost is computed at."""
    g = p.add_argument_group("input shapes (models with free dims)")
    g.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=1x3x640x640",
        help="bind an input's whole shape (repeatable)",
    )
    g.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="SYMBOL=N",
        help="bind a named free dim everywhere it appears (repeatable)",
    )
    g.add_argument(
        "--sample",
        default=None,
        metavar="FILE.npz",
        help="arrays keyed by input name: shapes AND values (for inputs that steer the graph)",
    )


def binding(args: argparse.Namespace) -> shapes.ShapeBinding:
    return shapes.binding_from(
        getattr(args, "shape", ()) or (), getattr(args, "dim", ()) or (), getattr(args, "sample", None)
    )


def load_graph(args: argparse.Namespace, model: Any = None) -> graph.ModelGraph:
    """The model named on the command line, every tensor sized at the bound shapes: the flags', else
    (``--input`` files and no --shape/--dim/--sample) the input files' shapes and values."""
    path = zoo.resolve(model if model is not None else args.model)
    bound = binding(args)
    if bound.empty and getattr(args, "input", None):
        import onnx

        g = onnx.load(str(path), load_external_data=False).graph
        weights = {t.name for t in g.initializer}  # IR < 4 lists them as inputs too
        names = [vi.name for vi in g.input if vi.name not in weights]
        bound = shapes.ShapeBinding(sample=read_inputs(names, args.input), sample_path="--input")
    return graph.load(path, bound, notice=lambda msg: print(f"splitrt: {msg}", file=sys.stderr))
