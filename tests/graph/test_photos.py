"""A real photograph as an image model's input (the rig, the demo and profiles feed it to such models)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitrt.graph import model as graph
from splitrt.graph import photos, zoo
from splitrt.transport import codec


@dataclass
class T:
    name: str
    shape: tuple[object, ...]
    dtype: str


def test_image_inputs_get_the_photo_in_their_layout_and_dtype() -> None:
    got = photos.photo_inputs([T("x", (1, 3, 64, 48), "float32"), T("y", ("n", 32, 40, 3), "uint8")])
    assert got is not None
    x, y = got["x"], got["y"]
    assert x.shape == (1, 3, 64, 48) and x.dtype == np.float32 and y.shape == (1, 32, 40, 3) and y.dtype == np.uint8
    assert -3.0 < float(x.min()) < float(x.max()) < 3.0  # ImageNet-normalised
    assert np.array_equal(y[0], photos.photo(32, 40))


def test_other_models_keep_their_random_inputs() -> None:
    assert photos.photo_inputs([T("ids", (1, 128), "int64")]) is None
    assert photos.photo_inputs([T("x", (1, 3, 64, 64), "float32"), T("mask", (1, 64), "float32")]) is None
    assert photos.photo_inputs(graph.load(zoo.get("bert_tiny")).inputs) is None


def test_a_photo_compresses_as_a_camera_frame_and_noise_does_not() -> None:
    g = graph.load(zoo.get("squeezenet"))
    real = photos.photo_inputs(g.inputs)
    assert real is not None
    name, x = next(iter(real.items()))
    noise = zoo.random_inputs(g.path)[name]

    def ratio(a: np.ndarray, spec: str) -> float:
        return codec.encode(name, a, spec).nbytes / a.nbytes

    assert ratio(x, "fp32+zstd") < 0.6 < ratio(noise, "fp32+zstd")
    assert ratio(x, "jpeg75") < 0.6 * ratio(noise, "jpeg75")
