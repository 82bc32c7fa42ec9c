"""Input arrays from the command line: ``NAME=FILE.npy`` or ``FILE.npz`` (arrays keyed by input name)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from splitrt.device.client import Device
from splitrt.errors import InputError


def load_inputs(dev: Device, specs: list[str]) -> dict[str, np.ndarray]:
    names = [t.name for t in dev.graph.inputs]
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
