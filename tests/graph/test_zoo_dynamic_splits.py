"""The dynamic zoo models (bert_tiny, vit_tiny, yolo_tiny) split: bound at one shape every cut is kept and
sized with the bytes its head really emits, segments split at that binding compose to the full model at
that shape and at another (batch, sequence, image size), and a split runs over real gRPC with int64 inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes, zoo
from tests.conftest import rel_err

MODELS = ("bert_tiny", "vit_tiny", "yolo_tiny")
# The binding segments are split at (the zoo's default; vit's batch defaults to 1) ...
BOUND: dict[str, shapes.ShapeBinding] = {
    "bert_tiny": shapes.ShapeBinding(dims={"seq": 16}),
    "vit_tiny": shapes.ShapeBinding(),
    "yolo_tiny": shapes.ShapeBinding(dims={"height": 320, "width": 320}),
}
# ... and the other input shapes the same segments must serve: (batch, seq) or NCHW.
OTHER: dict[str, tuple[int, ...]] = {"bert_tiny": (4, 128), "vit_tiny": (4, 3, 32, 32), "yolo_tiny": (1, 3, 256, 416)}
YOLO_LARGE = (2, 3, 640, 640)  # one cut only: the largest shape is the slowest


def _feeds(name: str, shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "bert_tiny":
        # Real token ids, and a mask with padding (zeros) on every row but the first, each of another length:
        # the mask bias and the Shape->Gather->Concat head reshapes must follow the runtime shape.
        batch, seq = shape
        mask = np.ones(shape, np.int64)
        for row in range(1, batch):
            mask[row, seq - row * seq // (2 * batch) :] = 0
        return {"input_ids": rng.integers(0, 1000, size=shape).astype(np.int64), "attention_mask": mask}
    key = "pixel_values" if name == "vit_tiny" else "images"
    return {key: rng.random(shape).astype(np.float32)}


def _plain(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    """No graph optimisations: fusions that differ between the whole model and a segment change the last
    bits, which would hide a real error (as in test_realmodels)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _sample_cuts(mg: graph.ModelGraph, k: int = 8) -> list[graph.Cut]:
    """~k interior cuts: evenly spaced, plus the first two that send a non-float activation (bert's shape
    tensors and int64 positions, vit's CLS shape), which must be recomputed at the runtime shape."""
    inner = [c for c in mg.cuts() if c.id not in ("cloud", "device")]
    inputs = {t.name for t in mg.inputs}
    odd = [c for c in inner if any(t.dtype != "float32" and t.name not in inputs for t in c.tensors)][:2]
    spaced = inner[:: max(1, len(inner) // (k - len(odd)))][: k - len(odd)]
    return sorted({c.id: c for c in spaced + odd}.values(), key=lambda c: inner.index(c))


@pytest.fixture(scope="module")
def bound() -> dict[str, graph.ModelGraph]:
    return {name: graph.load(zoo.get(name), BOUND[name]) for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_bound_every_cut_is_kept_and_sized(name: str, bound: dict[str, graph.ModelGraph]) -> None:
    mg = bound[name]
    unbound = graph.load(mg.path)
    assert [c.id for c in mg.cuts()] == [c.id for c in unbound.cuts()], "ids must not depend on the binding"
    assert mg.excluded == [] and mg.sized
    for c in mg.cuts():
        for t in c.tensors:
            assert all(isinstance(d, int) for d in t.shape), (c.id, t.name, t.shape)
            assert t.bytes == int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize, (c.id, t.name)
    # free dims were really bound: some crossing tensor got its size from the binding, not the model alone
    assert any(t.source in ("bound", "measured") for c in mg.cuts() for t in c.tensors)


def _compose(
    head: partition.Segment,
    tail: partition.Segment,
    sessions: tuple[ort.InferenceSession, ...],
    feeds: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    env = dict(feeds)
    for seg, sess in zip((head, tail), sessions, strict=True):
        env.update(zip(seg.outputs, sess.run(list(seg.outputs), {k: env[k] for k in seg.inputs}), strict=True))
    return env


@pytest.mark.parametrize("name", MODELS)
def test_segments_split_at_one_binding_are_exact_at_it_and_at_another(
    name: str, bound: dict[str, graph.ModelGraph]
) -> None:
    mg = bound[name]
    assert mg.input_shapes is not None
    full = _plain(mg.path)
    outputs = [o.name for o in mg.outputs]
    first = mg.inputs[0].name
    shape_sets = [_feeds(name, mg.input_shapes[first], seed=1), _feeds(name, OTHER[name], seed=2)]
    assert shape_sets[1][first].shape != mg.input_shapes[first], "the second shape must be another one"
    refs = [full.run(outputs, f) for f in shape_sets]
    cuts = _sample_cuts(mg)
    assert len(cuts) >= 6
    for cut in cuts:
        head, tail = partition.head_tail(mg, cut.id)
        sessions = (_plain(head.model), _plain(tail.model))
        for k, (feeds, ref) in enumerate(zip(shape_sets, refs, strict=True)):
            env = _compose(head, tail, sessions, feeds)
            if k == 0:  # at the binding, the bytes a cut reports are the bytes its head really emits
                assert sum(np.asarray(env[t]).nbytes for t in cut.tensor_names) == cut.bytes, cut.id
            for n, want in zip(outputs, ref, strict=True):
                assert env[n].shape == want.shape, (cut.id, n)
                assert rel_err(want, env[n]) < 1e-5, (cut.id, n, feeds[first].shape)
    if name == "yolo_tiny":  # batch 2 at 640x640 through one mid cut
        cut = cuts[len(cuts) // 2]
        head, tail = partition.head_tail(mg, cut.id)
        feeds = _feeds(name, YOLO_LARGE, seed=3)
        env = _compose(head, tail, (_plain(head.model), _plain(tail.model)), feeds)
        (want,) = full.run(outputs, feeds)
        assert want.shape == (2, 84, 80 * 80 + 40 * 40 + 20 * 20)
        assert rel_err(want, env[outputs[0]]) < 1e-5, cut.id


def test_bert_split_over_grpc_with_int64_inputs_equals_local(
    bound: dict[str, graph.ModelGraph], tmp_path: Path
) -> None:
    mg = bound["bert_tiny"]
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(mg.path, models / mg.path.name)
    feeds = _feeds("bert_tiny", (1, 16), seed=4)
    feeds["attention_mask"][0, 12:] = 0  # padding on the wire too
    inputs = {t.name for t in mg.inputs}
    # one cut that sends the int64 ids/mask themselves, one that sends an int64 activation (a shape)
    sends_input = next(c for c in mg.cuts()[1:-1] if any(t.name in inputs for t in c.tensors))
    sends_shape = next(
        c
        for c in mg.cuts()[1:-1]
        if c.id != sends_input.id and any(t.dtype == "int64" and t.name not in inputs for t in c.tensors)
    )
    with CloudServer(
        ServerConfig(models_dir=models, host="127.0.0.1", port=0, workers=1, intra_op_threads=1)
    ) as server:
        port = server.start()
        with Device(mg, f"127.0.0.1:{port}", config=DeviceConfig(intra_op_threads=1, timeout_s=20)) as dev:
            local = dev.run_local(feeds)
            for cut in (sends_input, sends_shape):
                res = dev.run_detailed(feeds, cut=cut.id)
                assert res.where == "cloud" and res.bytes_up > 0, cut.id
                for k, ref in local.items():
                    assert res.outputs[k].shape == ref.shape
                    assert rel_err(ref, res.outputs[k]) < 1e-5, (cut.id, k)
