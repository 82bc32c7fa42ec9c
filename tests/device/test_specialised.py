"""A graph specialised on its sample (silero-vad at 16 kHz: the branch of its top-level If inlined) served
by a real `splitrt serve` holding only the original file: its inner cuts split exactly over gRPC, the
server derives the same cuts, and a request at 8 kHz (the other branch) runs the whole original model
here, on the Device API and through the adaptive runtime, never a wrong split."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from splitrt.cloud.common import RpcFailure
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import CutError
from splitrt.profile.priors import flops_table
from tests.conftest import rel_err
from tests.realmodels import MODELS, bound, fetch

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

VAD = {m.name: m for m in MODELS}["silero_vad"]
TOKEN = "specialise-t0ken"


def _at8k() -> dict[str, np.ndarray]:
    return dict(VAD.sample_a, sr=np.array(8000, np.int64), input=VAD.sample_a["input"][:, :256])


def _original(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(fetch(VAD)), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def _close(ref: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> float:
    return max(rel_err(ref[k], np.asarray(out[k])) for k in ref)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> CloudServer:
    d = tmp_path_factory.mktemp("vad-models")
    shutil.copyfile(fetch(VAD), d / "silero_vad.onnx")  # the original file only
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s  # type: ignore[misc]
    s.stop(grace_s=0.5)


def test_inner_cuts_serve_exactly_and_the_other_branch_runs_the_original(server: CloudServer) -> None:
    mg = bound("silero_vad")
    inner = [c.id for c in mg.cuts() if c.id not in ("cloud", "device")]
    # the server derives the specialised graph from the file it holds: the same cut ids
    assert [c.id for c in server.store.graph(mg.sha256).cuts()] == [c.id for c in mg.cuts()]
    with pytest.raises(RpcFailure) as info:
        server.store.graph(mg.file_sha256 + "~9t")
    assert info.value.code == grpc.StatusCode.NOT_FOUND and "no specialisation '9t'" in str(info.value)
    ref = _original(VAD.sample_a)
    with Device(mg, server.address, config=DeviceConfig(intra_op_threads=1, timeout_s=20)) as dev:
        for cut in ["cloud", *inner[5::12]]:
            res = dev.run_detailed(VAD.sample_a, cut=cut)
            assert res.where == "cloud" and _close(ref, res.outputs) < 1e-4, cut
        at8k = _at8k()
        res = dev.run_detailed(at8k, cut=inner[20])
        assert res.where == "local" and res.cut_id == "device" and _close(_original(at8k), res.outputs) < 1e-6
        with pytest.raises(CutError, match=r"takes the else branch .*sr=8000.*specialised for its then branch"):
            dev.run_head(at8k, inner[20])


def test_the_runtime_splits_16k_and_runs_8k_whole(server: CloudServer) -> None:
    mg = bound("silero_vad")
    cut = [c.id for c in mg.cuts()][30]
    cfg = RuntimeConfig(policy=f"fixed:{cut}@fp32", deadline_ms=10000)
    with AdaptiveDevice(
        mg,
        flops_table(mg, device_gflops=5, cloud_gflops=100),
        [server.address],
        config=cfg,
        device_config=DeviceConfig(intra_op_threads=1, timeout_s=20),
        start_prober=False,
    ) as dev:
        split = dev.infer(VAD.sample_a)
        assert split.server == server.address and not split.fallback and split.plan == f"{cut}@fp32"
        assert _close(_original(VAD.sample_a), split.outputs) < 1e-4
        at8k = _at8k()
        whole = dev.infer(at8k)
        assert whole.server is None and whole.fallback and whole.plan == "device"
        assert _close(_original(at8k), whole.outputs) < 1e-6
        assert dev.stats["diverged"] == 1 and "sr=8000" in dev.last_diverged
        assert "sr=8000" in str(whole.decision.extra["diverged"]) and whole.fallback_reason.startswith("diverged: ")
        again = dev.infer(VAD.sample_b)  # batch 2 at 16 kHz: the same branches, split again
        assert again.server == server.address and _close(_original(VAD.sample_b), again.outputs) < 1e-4


def test_an_upload_sends_the_original_file(tmp_path: Path) -> None:
    mg = bound("silero_vad")
    with CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=(TOKEN,), workers=1)) as s:
        s.start()
        with Device(mg, s.address, config=DeviceConfig(token=TOKEN, timeout_s=20, intra_op_threads=1)) as dev:
            res = dev.run_detailed(VAD.sample_a, cut=[c.id for c in mg.cuts()][25])
        assert res.where == "cloud" and _close(_original(VAD.sample_a), res.outputs) < 1e-4
        assert [m.sha256 for m in s.store.models()] == [mg.file_sha256]


def test_run_with_input_files_splits_at_the_specialised_cuts(
    server: CloudServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --input vad16k.npz` binds (and specialises) on the file, like `inspect --sample` shows it."""
    import json

    from splitrt.cli import app as cli

    f = tmp_path / "vad16k.npz"
    np.savez(f, **VAD.sample_a)
    cut = [c.id for c in bound("silero_vad").cuts()][40]
    assert (
        cli.main(
            [
                "run",
                str(fetch(VAD)),
                "--cloud",
                server.address,
                "--cut",
                cut,
                "--input",
                str(f),
                "--output",
                str(tmp_path / "out.npz"),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["cut_id"] == cut and doc["where"] == "cloud"
    with np.load(tmp_path / "out.npz") as out:
        assert _close(_original(VAD.sample_a), {k: out[k] for k in out.files}) < 1e-4
