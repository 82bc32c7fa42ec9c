"""Device runtime against a real cloud server: split runs equal local runs, CLI, server death."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from splitrt.cli import app as cli
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import CloudError, ConfigError, CutError, InputError
from splitrt.graph import zoo
from splitrt.rig.cloudserver import start_server
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import wire
from tests.loopback import reap

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

SPLIT_MODELS = ("tiny_chain", "multi_io", "branchy", "squeezenet")
TOKEN = "upl0ad-t0ken"  # uploads need a bearer token (secure by default)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.max(np.abs(a))) or 1.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / scale


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name in SPLIT_MODELS:
        shutil.copyfile(zoo.get(name), d / f"{name}.onnx")
    return d


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[CloudServer]:
    s = CloudServer(ServerConfig(models_dir=models_dir, workers=2, segment_cache_size=8, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=1.0)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "squeezenet" else n for n in SPLIT_MODELS]
)
def test_split_at_every_cut_equals_local_run(server: CloudServer, name: str) -> None:
    with Device(zoo.get(name), server.address, config=DeviceConfig(intra_op_threads=1)) as dev:
        x = dev.random_inputs(seed=3)
        ref = dev.run_local(x)
        cuts = [c.id for c in dev.graph.cuts()]
        assert cuts[0] == "cloud" and cuts[-1] == "device"
        for cut in cuts:
            res = dev.run_detailed(x, cut=cut)
            assert res.where == ("local" if cut == "device" else "cloud")
            assert set(res.outputs) == set(ref)
            for out, value in ref.items():
                assert res.outputs[out].shape == value.shape
                assert rel_err(value, res.outputs[out]) <= 1e-5, (name, cut, out)
            if cut != "device":
                assert res.bytes_up > 0 and res.tail_ms >= 0 and res.load is not None


@pytest.mark.parametrize(
    "spec,tol",
    [("fp16", 5e-3), ("int8+zlib", 0.1), ("int8c", 0.1), ("fp32+zlib", 1e-6), ("int8c+zstd", 0.1), ("fp32+zstd", 1e-6)],
)
def test_lossy_codecs_drift_a_little(server: CloudServer, spec: str, tol: float) -> None:
    with Device(zoo.get("squeezenet"), server.address, config=DeviceConfig(codec=spec)) as dev:
        x = dev.random_inputs(seed=1)
        ref = dev.run_local(x)
        cut = dev.graph.cuts()[len(dev.graph.cuts()) // 2].id
        lossy = dev.run_detailed(x, cut=cut)
        exact = dev.run_detailed(x, cut=cut, codec_spec="fp32")
        for name in ref:
            assert rel_err(ref[name], lossy.outputs[name]) <= tol
        if not spec.startswith("fp32+"):
            assert lossy.bytes_up < exact.bytes_up / 1.9
        if spec.endswith("+zstd"):  # the entropy coder shrinks even the lossless payload (ReLU zeros)
            assert lossy.bytes_up < exact.bytes_up


@pytest.mark.parametrize("spec", ["jpeg75", "webp75"])
def test_image_codecs_send_the_input_and_feature_maps_over_grpc(server: CloudServer, spec: str) -> None:
    """At ``cloud`` the server runs the model on exactly what the codec decodes (a real photo's pixels, as a
    router would send them); at an inner cut a tiled feature map crosses in fewer bytes than int8c."""
    import matplotlib.cbook
    from PIL import Image

    from splitrt.transport import codec

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        photo = np.asarray(Image.open(f).convert("RGB").resize((224, 224)), dtype=np.float32) / 255
    with Device(zoo.get("squeezenet"), server.address, config=DeviceConfig(intra_op_threads=1)) as dev:
        (name,) = [i.name for i in dev.graph.inputs]
        x = {name: np.ascontiguousarray(((photo - 0.45) / 0.22).transpose(2, 0, 1)[None])}
        sent = dev.run_detailed(x, cut="cloud", codec_spec=spec)
        assert sent.bytes_up < x[name].nbytes / 20  # a photo as an image: ~0.01-0.03 x fp32
        received = codec.decode(codec.encode(name, x[name], spec))
        ref = dev.run_local({name: received})
        for out, value in ref.items():
            assert rel_err(value, sent.outputs[out]) <= 1e-5, out
        cut = dev.graph.cuts()[len(dev.graph.cuts()) // 3].id
        image = dev.run_detailed(x, cut=cut, codec_spec=spec)
        int8c = dev.run_detailed(x, cut=cut, codec_spec="int8c")
        assert image.bytes_up < int8c.bytes_up
        assert all(np.all(np.isfinite(v)) and v.shape == ref[k].shape for k, v in image.outputs.items())


def test_finish_locally_is_the_fallback(server: CloudServer) -> None:
    with Device(zoo.get("multi_io"), server.address) as dev:
        x = dev.random_inputs()
        ref = dev.run_local(x)
        for cut in ("cloud", "c2", "c4", "device"):
            head = dev.run_head(x, cut)
            local = dev.finish_locally(head)
            remote = dev.send(head)
            assert local.where == "local" and remote.where == ("local" if cut == "device" else "cloud")
            for name in ref:
                assert rel_err(ref[name], local.outputs[name]) <= 1e-5
                assert rel_err(ref[name], remote.outputs[name]) <= 1e-5


def test_inputs_are_checked_on_the_device(server: CloudServer) -> None:
    with Device(zoo.get("tiny_chain"), server.address) as dev:
        x = dev.random_inputs()
        with pytest.raises(InputError, match=r"expected inputs \['x'\], got \['z'\]"):
            dev.run({"z": x["x"]}, cut="c1")
        with pytest.raises(InputError, match="expected dtype float32, got float64"):
            dev.run({"x": x["x"].astype(np.float64)}, cut="c1")
        with pytest.raises(InputError, match=r"expected shape \[N, 3, 32, 32\], got \[1, 3, 16, 16\]"):
            dev.run({"x": np.zeros((1, 3, 16, 16), np.float32)}, cut="c1")
        with pytest.raises(CutError):
            dev.run(x, cut="c999")


def test_probe_and_status(server: CloudServer) -> None:
    with Device(zoo.get("tiny_chain"), server.address) as dev:
        p = dev.probe(100_000, 2_000)
        assert p.up_bytes == 100_000 and p.down_bytes == 2_000 and p.seconds > 0
        assert p.load.workers == 2
        assert any(m.sha256 == dev.sha256 for m in dev.status().models)


def test_unreachable_cloud_is_a_retryable_cloud_error() -> None:
    with (
        Device(zoo.get("tiny_chain"), "127.0.0.1:1", config=DeviceConfig(timeout_s=2)) as dev,
        pytest.raises(CloudError) as info,
    ):
        dev.run(dev.random_inputs(), cut="c2")
    assert info.value.code == "UNAVAILABLE" and info.value.retryable


def test_run_cli_saves_every_output(server: CloudServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = zoo.get("multi_io")
    out = tmp_path / "out.npz"
    rc = cli.main(
        [
            "run",
            str(model),
            "--cloud",
            server.address,
            "--cut",
            "c3",
            "--random",
            "--seed",
            "4",
            "--output",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cut_id"] == "c3" and doc["where"] == "cloud" and doc["bytes_up"] > 0
    with Device(model) as dev, np.load(out) as saved:
        ref = dev.run_local(dev.random_inputs(4))
        assert sorted(saved.files) == sorted(ref)
        for name in ref:
            assert rel_err(ref[name], saved[name]) <= 1e-5
    # a .npy input for a one-input model, table output
    x = tmp_path / "x.npy"
    np.save(x, np.ones((1, 3, 32, 32), np.float32))
    rc = cli.main(
        ["run", "zoo:tiny_chain", "--cloud", server.address, "--cut", "c2", "--input", str(x), "--codec", "fp16"]
    )
    assert rc == 0
    table = capsys.readouterr().out
    assert "fp16" in table and "output y" in table
    assert cli.main(["run", "zoo:tiny_chain", "--cloud", server.address, "--cut", "c77", "--random"]) == 2


def _start(code: str, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "srv.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line.split()[1])


def test_server_killed_mid_request_gives_a_clear_error(models_dir: Path, tmp_path: Path) -> None:
    proc, port = _start(
        f"""
        import sys, time
        from pathlib import Path
        from splitrt.cloud import CloudServer
        from splitrt.cloud import ServerConfig
        s = CloudServer(ServerConfig(models_dir=Path({str(models_dir)!r})))
        def hold(request):
            print("HOLDING", flush=True)
            time.sleep(120)
        s.handler.before_tail = hold
        print("PORT", s.start(), flush=True)
        time.sleep(300)
    """,
        tmp_path,
    )
    try:
        with Device(zoo.get("tiny_chain"), f"127.0.0.1:{port}", config=DeviceConfig(timeout_s=60)) as dev:
            x = dev.random_inputs()
            head = dev.run_head(x, "c3")
            errors: list[BaseException] = []

            def call() -> None:
                try:
                    dev.send(head)
                except BaseException as exc:
                    errors.append(exc)

            t = threading.Thread(target=call)
            t.start()
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "HOLDING"
            proc.send_signal(signal.SIGKILL)
            t.join(30)
            assert not t.is_alive()
            assert len(errors) == 1 and isinstance(errors[0], CloudError)
            err = errors[0]
            assert err.code == "UNAVAILABLE" and err.retryable
            assert f"127.0.0.1:{port}" in str(err)
            # the request can still be finished here
            assert rel_err(dev.run_local(x)["y"], dev.finish_locally(head).outputs["y"]) <= 1e-5
    finally:
        reap(proc)


def test_serve_cli_subprocess_serves_and_stops_on_sigterm(models_dir: Path) -> None:
    server = start_server(models_dir, "--host", "127.0.0.1", "--workers", "1", port=0)
    try:
        # Lines before it (the warm file read at construction) are the server's too; "listening" comes once.
        listening = server.event("listening")
        assert len(server.named("listening")) == 1 and listening["models"] == len(SPLIT_MODELS)
        with Device(zoo.get("tiny_chain"), server.address) as dev:
            x = dev.random_inputs()
            assert rel_err(dev.run_local(x)["y"], dev.run(x, cut="c2")["y"]) <= 1e-5
    finally:
        assert server.stop() == 0  # SIGTERM: it drains and exits 0
    events = [e["event"] for e in server.events]
    assert "infer" in events and events[-1] == "stopped"
    assert all(line.startswith("{") for line in server.tail), list(server.tail)  # every line a JSON event


def test_run_cli_cut_auto_plans_from_profiles_and_a_probe(
    server: CloudServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiler = pytest.importorskip("splitrt.profile.profiler", reason="--cut auto needs splitrt.profile.profiler")
    model = zoo.get("tiny_chain")
    prof = tmp_path / "p.json"
    profiler.save_profile(profiler.measure(model, runs=2, warmup=1, segments=2, progress=lambda m: None), prof)
    rc = cli.main(
        [
            "run",
            str(model),
            "--cloud",
            server.address,
            "--cut",
            "auto",
            "--random",
            "--json",
            "--device-profile",
            str(prof),
            "--cloud-profile",
            str(prof),
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    cut = doc["auto"]["plan"].split("@")[0]
    assert doc["cut_id"] == cut and doc["auto"]["bandwidth_mbps"] > 0 and doc["auto"]["rtt_ms"] > 0
    # without profiles (none shipped for tiny_chain): the same table `plan` would use, from FLOPs priors, said
    assert cli.main(["run", str(model), "--cloud", server.address, "--cut", "auto", "--random", "--json"]) == 0
    captured = capsys.readouterr()
    assert "FLOPs prior" in captured.err and json.loads(captured.out)["auto"]["plan"]


def test_device_is_exported_lazily() -> None:
    import splitrt

    assert splitrt.Device is Device


class _SilentStatus:
    """A server whose Status records the deadline it was given, then never answers (until released)."""

    def __init__(self) -> None:
        self.deadlines_s: list[float] = []
        self.release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))

        def status(request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
            self.deadlines_s.append(float(context.time_remaining() or 0.0))
            self.release.wait(5)
            context.abort(grpc.StatusCode.UNAVAILABLE, "released")

        handler = grpc.unary_unary_rpc_method_handler(
            status,
            request_deserializer=pb.StatusRequest.FromString,
            response_serializer=pb.StatusReply.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(wire.SERVICE_NAME, {"Status": handler}),)
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self) -> None:
        self.release.set()
        self.server.stop(None)


def test_request_deadline_covers_the_model_check_and_a_failed_check_is_remembered() -> None:
    silent = _SilentStatus()
    cfg = DeviceConfig(timeout_s=30, check_backoff_s=60)
    try:
        with Device(zoo.get("tiny_chain"), silent.address, config=cfg) as dev:
            head = dev.run_head(dev.random_inputs(), "c2")
            with pytest.raises(CloudError) as info:
                dev.send(head, timeout_s=0.3)
            assert info.value.code == "DEADLINE_EXCEEDED" and info.value.retryable
            # the request's 0.3 s, not the 30 s default (gRPC's deadline on the wire may read 0.3007 s)
            assert len(silent.deadlines_s) == 1 and silent.deadlines_s[0] < 1.0
            with pytest.raises(CloudError) as again:
                dev.send(head, timeout_s=0.3)
            assert again.value.code == "DEADLINE_EXCEEDED" and "remembered" in str(again.value)
            assert len(silent.deadlines_s) == 1  # no second Status call within the backoff
    finally:
        silent.close()


def test_missing_model_is_uploaded_in_the_background_not_within_a_request(tmp_path: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=(TOKEN,))) as s,
        Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(check_backoff_s=0.05, token=TOKEN)) as dev,
    ):
        x = dev.random_inputs()
        head = dev.run_head(x, "c2")
        with pytest.raises(CloudError) as info:
            dev.send(head, timeout_s=5)
        assert info.value.code == "UNAVAILABLE" and info.value.retryable
        assert "upload in progress" in str(info.value)
        for _ in range(600):  # the upload has its own (long) deadline
            if not dev.upload_in_progress():
                break
            time.sleep(0.05)
        assert (tmp_path / f"{dev.sha256}.onnx").read_bytes() == zoo.get("tiny_chain").read_bytes()
        res = dev.send(head, timeout_s=5)
        assert res.where == "cloud" and rel_err(dev.run_local(x)["y"], res.outputs["y"]) <= 1e-5
        # a fresh Device (as the runtime makes after a failure) finds the model there
        with Device(dev.graph, s.address, config=DeviceConfig(token=TOKEN)) as fresh:
            assert fresh.send(head, timeout_s=5).where == "cloud"


def test_explicit_ensure_model_uploads_inline(tmp_path: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=(TOKEN,))) as s,
        Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=TOKEN)) as dev,
    ):
        dev.ensure_model()
        assert not dev.upload_in_progress()
        assert [p.name for p in tmp_path.iterdir()] == [f"{dev.sha256}.onnx"]
        assert dev.send(dev.run_head(dev.random_inputs(), "c1"), timeout_s=5).where == "cloud"


def test_blocking_send_gets_its_full_timeout_after_an_inline_upload(tmp_path: Path) -> None:
    with (
        CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=(TOKEN,))) as s,
        Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(timeout_s=2, token=TOKEN)) as dev,
    ):
        put_model = s.put_model

        def slow_put_model(chunks: Any, *rest: Any) -> pb.PutModelReply:
            time.sleep(2.5)  # longer than the call's timeout: the upload has its own
            return put_model(chunks, *rest)

        s.put_model = slow_put_model  # type: ignore[method-assign]
        x = dev.random_inputs()
        res = dev.run_detailed(x, cut="c2")  # no timeout_s: uploads inline, then calls
        assert res.where == "cloud" and rel_err(dev.run_local(x)["y"], res.outputs["y"]) <= 1e-5


def test_a_reply_claiming_a_huge_tensor_is_refused_unread() -> None:
    claimed = (1 << 22,)  # 16 MiB of float32 in a 16 KB zlib stream; the device's cap is 4 x 1 MiB
    bomb = pb.Tensor(name="y", dtype="float32", shape=claimed, codec="fp32+zlib", payload=zlib.compress(bytes(4 << 22)))

    def infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        return pb.InferReply(request_id="r", outputs=[bomb]).SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                wire.SERVICE_NAME, {"Infer": grpc.unary_unary_rpc_method_handler(infer)}
            ),
        )
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        with Device(zoo.get("tiny_chain"), address, config=DeviceConfig(max_message_bytes=1 << 20)) as dev:
            dev._model_checked = True  # this server has no Status
            with pytest.raises(CloudError) as info:
                dev.send(dev.run_head(dev.random_inputs(), "c2"), timeout_s=10)
            assert info.value.code == "DATA_LOSS" and f"expected at most {4 << 20}" in str(info.value)
    finally:
        server.stop(None)


def test_device_token_file_must_be_private_and_never_shows_in_repr(tmp_path: Path) -> None:
    from splitrt.device.client import read_token

    f = tmp_path / "token"
    f.write_text("s3cret-token\n")
    os.chmod(f, 0o644)
    with pytest.raises(ConfigError, match=r"permissions 0644 are too open.*chmod 600"):
        read_token(f)
    os.chmod(f, 0o600)
    assert read_token(f) == "s3cret-token"
    assert "s3cret" not in repr(DeviceConfig(token="s3cret-token"))
