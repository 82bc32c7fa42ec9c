"""zoo_dynamic: BERT/ViT/YOLO-style zoo models keep their free dims and run at several shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from splitrt.graph import zoo
from tests.conftest import session

# Per model: each input's dims (a str is a free dim that must stay a dim_param), then feed shapes to run.
INPUT_DIMS: dict[str, dict[str, list[int | str]]] = {
    "bert_tiny": {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]},
    "vit_tiny": {"pixel_values": ["batch", 3, 32, 32]},
    "yolo_tiny": {"images": ["batch", 3, "height", "width"]},
}
SHAPES: dict[str, list[tuple[int, ...]]] = {
    "bert_tiny": [(1, 7), (4, 16), (2, 128)],
    "vit_tiny": [(1, 3, 32, 32), (4, 3, 32, 32)],
    "yolo_tiny": [(1, 3, 320, 320), (1, 3, 256, 416), (2, 3, 640, 640)],
}


def _feeds(name: str, shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "bert_tiny":
        mask = np.ones(shape, np.int64)
        mask[-1, shape[1] // 2 + 1 :] = 0  # the last sequence is padded: the mask bias must not break anything
        return {"input_ids": rng.integers(0, 1000, size=shape).astype(np.int64), "attention_mask": mask}
    key = "pixel_values" if name == "vit_tiny" else "images"
    return {key: rng.random(shape).astype(np.float32)}


def _expected(name: str, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    if name == "bert_tiny":
        return [(*shape, 64), (shape[0], 64)]
    if name == "vit_tiny":
        return [(shape[0], 10)]
    h, w = shape[2:]
    return [(shape[0], 84, sum((h // s) * (w // s) for s in (8, 16, 32)))]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo-dynamic")
    return {name: zoo.get(name, root / f"{name}.onnx") for name in INPUT_DIMS}


def test_registered_after_the_existing_names() -> None:
    assert zoo.names()[-3:] == ["bert_tiny", "vit_tiny", "yolo_tiny"]


@pytest.mark.parametrize("name", list(INPUT_DIMS))
def test_checks_and_keeps_free_dims(name: str, built: dict[str, Path]) -> None:
    m = onnx.load(str(built[name]))
    onnx.checker.check_model(m, full_check=True)
    dims = {
        i.name: [
            d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in i.type.tensor_type.shape.dim
        ]
        for i in m.graph.input
    }
    assert dims == INPUT_DIMS[name]


@pytest.mark.parametrize("name", list(INPUT_DIMS))
def test_runs_at_several_shapes(name: str, built: dict[str, Path]) -> None:
    s = session(built[name])
    for shape in SHAPES[name]:
        outs = s.run(None, _feeds(name, shape, seed=1))
        assert [o.shape for o in outs] == _expected(name, shape), shape
        for o in outs:
            assert np.all(np.isfinite(o)) and float(np.std(o)) > 0, shape
        other = s.run(None, _feeds(name, shape, seed=2))
        assert not np.allclose(outs[0], other[0]), f"{name} at {shape}: the output ignores the input"


def test_bert_ignores_padded_tokens(built: dict[str, Path]) -> None:
    s = session(built["bert_tiny"])
    feeds = _feeds("bert_tiny", (2, 16), seed=3)
    hidden, pooled = s.run(None, feeds)
    ids = feeds["input_ids"].copy()
    ids[-1, 9:] = (ids[-1, 9:] + 1) % 1000  # change only tokens the mask hides
    hidden2, pooled2 = s.run(None, {**feeds, "input_ids": ids})
    np.testing.assert_allclose(hidden2[:, :9], hidden[:, :9], atol=1e-5)
    np.testing.assert_allclose(pooled2, pooled, atol=1e-5)
    assert not np.allclose(hidden2[-1, 9:], hidden[-1, 9:])


@pytest.mark.parametrize("name", list(INPUT_DIMS))
def test_get_is_deterministic(name: str, built: dict[str, Path], tmp_path: Path) -> None:
    again = zoo.get(name, tmp_path / f"{name}.onnx")
    assert again.read_bytes() == built[name].read_bytes()
