"""The device daemon serves a real-weights model with free dims end to end (issue 22): the MiniLM encoder
(self-attention, three int64 inputs, batch and sequence free) configured by path and the sequence length
it is priced at, with the adaptive policy (``--cut auto``) and no profile, so it plans from the FLOPs
prior at the board's speed; an app's ``LocalInference.Infer`` at two shapes gets the whole model's output,
split with a real cloud on 127.0.0.1, never finished locally."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig, parse_config
from splitrt.errors import ConfigError
from tests.conftest import rel_err, session
from tests.realmodels import MODELS, fetch

# slow: a real attention encoder through the daemon (make test-slow)
pytestmark = pytest.mark.slow

MINILM = {m.name: m for m in MODELS}["minilm"]


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CloudServer, Path]]:
    d = tmp_path_factory.mktemp("daemon-realmodels")
    path = d / "minilm.onnx"
    shutil.copyfile(fetch(MINILM), path)
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s, path
    s.stop(grace_s=0.5)


def test_the_daemon_serves_the_attention_encoder_at_two_shapes(tmp_path: Path, cloud: tuple[CloudServer, Path]) -> None:
    server, path = cloud
    model = ModelConfig(name="minilm", path=str(path), dims=("sequence=8",))
    cfg = DaemonConfig(
        models=(model,),
        clouds=(server.address,),
        board="rpi4",
        policy="adaptive",
        api_address="127.0.0.1:0",
        api_socket_path=None,
        metrics_port=None,
        intra_op_threads=1,
        upload=False,
        deadline_ms=60_000,
    )  # the first request waits for the cloud to build its tail
    whole = session(path)
    with Daemon(cfg) as d:
        assert d.api_address is not None
        assert "FLOPs prior" in d.models["minilm"].table_source  # no profile: the prior plans
        with LocalClient(d.api_address) as app:
            for i, x in enumerate((MINILM.sample_a, MINILM.sample_b)):
                r = app.infer(x, request_id=f"r{i}")
                ref = whole.run(None, x)[0]
                out = r.outputs["last_hidden_state"]
                assert out.shape == ref.shape == (*x["input_ids"].shape, 384)
                assert rel_err(ref, out) < 1e-4, (i, r.plan)
                # a device 17x slower than this host and 0.2 KB of token ids: the first plan (priors only) is
                # served; the next follows the link the runtime measured (loopback on a loaded host)
                assert not r.fallback and (r.server == server.address) == (r.plan != "device"), r
                assert r.plan != "device" or i > 0, r
            assert app.plan("minilm").completed == 2


def test_the_binding_keys_parse_and_a_wrong_one_names_the_model() -> None:
    cfg = parse_config(
        {
            "model": [
                {"name": "m", "path": "m.onnx", "dims": ["sequence=8"], "shapes": ["x=1x4"], "sample_path": "s.npz"}
            ]
        },
        base_dir=Path("/srv"),
    )
    assert cfg.models[0].dims == ("sequence=8",) and cfg.models[0].shapes == ("x=1x4",)
    assert cfg.models[0].sample_path == Path("/srv/s.npz")
    with pytest.raises(ConfigError, match=r"model\[0\]: .*sequence"):
        parse_config({"model": [{"name": "m", "path": "m.onnx", "dims": ["sequence"]}]}, base_dir=Path("/srv"))
    with pytest.raises(ConfigError, match=r"model\[0\]: key 'dims': expected a list of SYMBOL=N strings"):
        parse_config({"model": [{"name": "m", "path": "m.onnx", "dims": [8]}]}, base_dir=Path("/srv"))
