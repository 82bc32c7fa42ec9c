"""Every kind of cut serves: real-weights models (tests/realmodels.py) and the dynamic zoo, split on this
device and served by a real `splitrt serve` over 127.0.0.1, equal the whole model at two input shapes and
none finishes locally. Crossing tensors the model leaves unshaped are declared with their rank (onnxruntime
reads "no shape" as a scalar), a graph output whose declaration is wrong does not break the ``device`` cut,
and the server checks a request against the segment's declarations, a scalar included."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from splitrt.cli import app as cli
from splitrt.device.client import Device, DeviceConfig
from splitrt.device.daemon import select_cost_table
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import CloudError
from splitrt.graph import model as graph
from splitrt.graph import partition, shapes, zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire
from tests.cli.test_serve import serve_checkout
from tests.conftest import rel_err
from tests.realmodels import MODELS, fetch

# slow: real-weights models served at every cut kind (make test-slow)
pytestmark = pytest.mark.slow

REAL = {m.name: m for m in MODELS}


def _text_image(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Dark strokes on a light page: the detector's map then spans [0, 1]. On noise it stays near 0
    (max 6e-4), where onnxruntime's Conv+BatchNorm folding alone moves it by 3e-4 of that scale."""
    img = np.ones(shape, np.float32)
    for r in range(shape[2] // 8, shape[2] - 16, shape[2] // 8):
        img[:, :, r : r + 12, 30 : shape[3] - 30 : 3] = -1.0
    return {"x": img}


@dataclass(frozen=True)
class Case:
    name: str
    path: Callable[[], Path]
    a: shapes.ShapeBinding
    b: shapes.ShapeBinding
    feeds: Callable[[graph.ModelGraph, shapes.ShapeBinding], dict[str, np.ndarray]] | None = None


def _bind(flags: tuple[str, ...], sample: dict[str, np.ndarray]) -> shapes.ShapeBinding:
    return shapes.binding_from(flags) if flags else shapes.ShapeBinding(sample=sample)


def _real(name: str) -> Case:
    m = REAL[name]
    return Case(
        name,
        lambda: fetch(m),
        _bind(m.shapes_a, m.sample_a),
        _bind(m.shapes_b, m.sample_b),
        (lambda mg, b: _text_image(shapes.resolve(mg.path.name, list(mg.model.graph.input), b)["x"]))
        if name == "ocr_det"
        else None,
    )


CASES = {
    c.name: c
    for c in [
        _real("ocr_rec"),
        _real("ocr_cls"),
        _real("silero_vad"),
        _real("ocr_det"),
        Case(
            "bert_tiny",
            lambda: zoo.get("bert_tiny"),
            shapes.ShapeBinding(dims={"seq": 16}),
            shapes.ShapeBinding(shapes={"input_ids": (2, 40), "attention_mask": (2, 40)}),
        ),
        Case(
            "yolo_tiny",
            lambda: zoo.get("yolo_tiny"),
            shapes.ShapeBinding(dims={"height": 96, "width": 128}),
            shapes.ShapeBinding(shapes={"images": (1, 3, 64, 160)}),
        ),
        Case(
            "vit_tiny",
            lambda: zoo.get("vit_tiny"),
            shapes.ShapeBinding(),
            shapes.ShapeBinding(shapes={"pixel_values": (3, 3, 32, 32)}),
        ),
    ]
}


def _feeds(case: Case, mg: graph.ModelGraph, b: shapes.ShapeBinding) -> dict[str, np.ndarray]:
    if case.feeds is not None:
        return case.feeds(mg, b)
    inputs = list(mg.model.graph.input)
    return shapes.valid_inputs(inputs, shapes.resolve(mg.path.name, inputs, b), b.sample, seed=1)


def _cuts(mg: graph.ModelGraph, k: int = 4) -> list[str]:
    """cloud, device, k inner cuts spread over the model, the first frontier cut (several tensors cross)
    and the last inner cut (after every reshape: the tensors onnx inference leaves unshaped)."""
    inner = [c for c in mg.cuts() if c.id not in ("cloud", "device")]
    picked = inner[:: max(1, len(inner) // k)][:k]
    picked += [c for c in inner if len(c.tensors) > 1][:1] + inner[-1:]
    return ["cloud", *dict.fromkeys(c.id for c in picked), "device"]


def _wrong_output(src: Path, out: Path) -> Path:
    """The OCR recogniser with the output declaration some exporters write: rank 2 ([1, seqlen]) for a
    rank-3 tensor."""
    m = onnx.load(str(src))
    o = m.graph.output[0]
    o.CopyFrom(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, [1, "seqlen"]))
    onnx.save(m, str(out))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    models = tmp_path_factory.mktemp("served-models")
    for case in CASES.values():
        shutil.copyfile(case.path(), models / f"{case.name}.onnx")
    _wrong_output(fetch(REAL["ocr_rec"]), models / "ocr_rec_wrong_output.onnx")
    shutil.copyfile(zoo.get("multi_io"), models / "multi_io.onnx")
    server = serve_checkout(str(models), "--workers", "2")
    try:
        yield f"127.0.0.1:{server.event('listening')['port']}", models
    finally:
        assert server.stop() == 0


def _device(mg: graph.ModelGraph, address: str) -> Device:
    return Device(mg, address, config=DeviceConfig(intra_op_threads=1, timeout_s=60, upload=False))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_cut_kind_serves_the_whole_model_at_two_shapes(name: str, served: tuple[str, Path]) -> None:
    case, (address, models) = CASES[name], served
    mg = graph.load(models / f"{name}.onnx", case.a)  # bound at A, it serves B too
    cuts = _cuts(mg)
    with _device(mg, address) as dev:
        for b in (case.a, case.b):
            feeds = _feeds(case, mg, b)
            ref = dev.run_local(feeds)
            for cut in cuts:
                r = dev.run_detailed(feeds, cut=cut)
                assert r.where == ("local" if cut == "device" else "cloud"), cut
                assert (r.bytes_up == 0) == (cut == "device")
                for k, want in ref.items():
                    assert r.outputs[k].shape == want.shape, (cut, k)
                    assert rel_err(want, r.outputs[k]) < 1e-4, (name, cut, k)


@pytest.mark.parametrize("name", ["ocr_rec", "bert_tiny"])
def test_the_adaptive_runtime_never_falls_back_on_a_served_cut(name: str, served: tuple[str, Path]) -> None:
    """``run --cut auto`` and ``--cut cN`` in stream mode: the runtime's own plan, and the last inner cut
    (whose crossing tensors onnx leaves unshaped), answered by the cloud, not finished locally."""
    case, (address, models) = CASES[name], served
    mg = graph.load(models / f"{name}.onnx", case.a)
    table, _ = select_cost_table(mg, profile_device=None, profile_cloud=None, board=None)
    feeds = _feeds(case, mg, case.a)
    last = [c.id for c in mg.cuts()][-2]
    for policy in ("adaptive", f"fixed:{last}@fp32"):
        with AdaptiveDevice(
            mg,
            table,
            [address],
            config=RuntimeConfig(policy=policy, warm_sessions=False),
            device_config=DeviceConfig(intra_op_threads=1, upload=False),
            start_prober=False,
        ) as dev:
            ref = dev.local.run_local(feeds)
            for i in range(2):
                out = dev.infer(feeds, request=str(i), deadline_ms=30_000)
                assert not out.fallback, (policy, out.plan)
                assert out.plan == "device" or out.server == address
                assert all(rel_err(ref[k], out.outputs[k]) < 1e-4 for k in ref)


def test_unshaped_crossing_tensors_are_declared_with_their_rank() -> None:
    path = fetch(REAL["ocr_rec"])
    unbound, bound = graph.load(path), graph.load(path, CASES["ocr_rec"].a)
    last = bound.cuts()[-2]
    names = last.tensor_names
    assert any(unbound.generic_shape(n) is None for n in names), "the case this test is about"
    _, tail = partition.head_tail(bound, last.id)
    declared = {n: s for n, _, s in partition.declared_inputs(tail.model)}
    for n in names:
        assert declared[n] is not None and len(declared[n]) == len(bound.tensor(n).shape or ()), n
        # measured at one binding, no dim is pinned to it: symbols where the model said nothing
        if unbound.generic_shape(n) is None:
            assert all(isinstance(d, str) for d in declared[n]), (n, declared[n])


def test_a_wrong_output_declaration_is_corrected_and_device_runs_no_tail(
    served: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    address, models = served
    path = models / "ocr_rec_wrong_output.onnx"
    mg = graph.load(path, CASES["ocr_rec"].a)
    out = mg.outputs[0].name
    assert graph.load(path).generic_shape(out) == (1, "seqlen")
    assert mg.generic_shape(out) is not None and len(mg.generic_shape(out) or ()) == 3
    base = ["run", str(path), "--random", "--shape", "x=1x3x48x320", "--cloud", address, "--json"]
    assert cli.main([*base, "--cut", "device"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["where"] == "local" and doc["outputs"][out]["shape"] == [1, 40, 6625]
    assert cli.main([*base, "--cut", mg.cuts()[-2].id]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["where"] == "cloud" and doc["outputs"][out]["shape"] == [1, 40, 6625]


def test_the_server_checks_a_scalar_as_a_scalar(served: tuple[str, Path]) -> None:
    """silero's ``sr`` is declared rank 0: [] passes, [1] is refused naming both shapes."""
    address, models = served
    case = CASES["silero_vad"]
    # unbound, not specialised on the sample (then sr steers nothing left and never crosses): sr crosses here
    mg = graph.load(models / "silero_vad.onnx")
    feeds = _feeds(case, mg, case.a)
    with _device(mg, address) as dev:
        head = dev.run_head(feeds, "cloud")
        assert "sr" in head.crossing
        assert dev.send(head).where == "cloud"
        bad = type(head)(cut_id="cloud", crossing=dict(head.crossing, sr=np.array([16000], np.int64)), head_ms=0)
        with pytest.raises(CloudError) as info:
            dev.send(bad)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "tensor 'sr': expected shape [], got [1]" in str(info.value)


def test_the_server_runs_no_tail_for_cut_device(served: tuple[str, Path]) -> None:
    address, models = served
    mg = graph.load(models / "vit_tiny.onnx", CASES["vit_tiny"].a)
    with _device(mg, address) as dev:
        request = wire.Framed(
            header=pb.InferRequest(model_sha256=mg.sha256, cut_id="device", codec="fp32", request_id="r1"), tensors=[]
        )
        with pytest.raises(CloudError) as info:
            dev._link().infer(request, timeout_s=30)
    assert info.value.code == "INVALID_ARGUMENT" and "leaves nothing to run on a server" in str(info.value)


def test_a_multi_output_model_sends_only_what_the_tail_needs(served: tuple[str, Path]) -> None:
    """multi_io's output ``early`` is made early and read by one later node: once that node is in the head
    too, ``early`` is neither sent nor replied; the device assembles it with the reply's ``late``."""
    address, models = served
    mg = graph.load(models / "multi_io.onnx", shapes.ShapeBinding())
    feeds = shapes.valid_inputs(list(mg.model.graph.input), mg.input_shapes or {}, None, seed=2)
    kept = [c.id for c in mg.cuts() if "early" in c.kept and "early" not in c.tensor_names and c.id != "device"]
    assert kept
    with _device(mg, address) as dev:
        ref = dev.run_local(feeds)
        for cut in ["cloud", *kept]:
            c = mg.cut(cut)
            head = dev.run_head(feeds, cut)
            r = dev.send(head)
            assert r.where == "cloud" and all(rel_err(ref[k], r.outputs[k]) < 1e-4 for k in ref)
            # on the wire: the tensors the tail reads, and the outputs the tail made; nothing else
            assert r.bytes_up == c.bytes == sum(v.nbytes for v in head.crossing.values())
            assert r.bytes_down == c.reply_bytes == sum(v.nbytes for k, v in ref.items() if k not in c.kept)
            if cut != "cloud":
                assert set(head.crossing).isdisjoint(ref) and set(head.kept) == {"early"}
                assert r.bytes_down == ref["late"].nbytes < ref["late"].nbytes + ref["early"].nbytes
