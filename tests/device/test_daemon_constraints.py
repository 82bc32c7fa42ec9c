"""Device daemon with deployment constraints: the allowed cuts bound every plan against a real cloud, the
decision log records what they cost, and the split-vs-route verdict is logged once at start."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import Daemon, DaemonConfig, LocalClient, ModelConfig, parse_config
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from tests.conftest import rel_err, session

MODEL = "squeezenet"
GOOD = {"model": [{"name": "sq", "path": f"zoo:{MODEL}"}]}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    d = tmp_path_factory.mktemp("daemon-constraints")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    s = CloudServer(ServerConfig(models_dir=d, workers=1, intra_op_threads=1))
    s.start()
    yield s
    s.stop(grace_s=0.5)


def test_constraint_keys_are_checked() -> None:
    cfg = parse_config(
        {**GOOD, "min_head_flops": 0.25, "no_raw_input": True, "device_memory_mb": "board", "board": "rpi4"},
        base_dir=Path("/tmp"),
    )
    assert (cfg.min_head_flops, cfg.no_raw_input, cfg.device_memory_mb) == (0.25, True, "board")
    for extra, message in (
        ({"min_head_flops": 2}, r"min_head_flops: expected a share .* got 2"),
        (
            {"device_memory_mb": "lots"},
            r"'device_memory_mb': expected a number of MB > 0 or "
            r"\"board\" .*, got 'lots'",
        ),
        ({"device_memory_mb": "board"}, "needs a board key"),
        ({"no_raw_input": "yes"}, r"'no_raw_input': expected true or false"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config({**GOOD, **extra}, base_dir=Path("/tmp"))


def test_a_privacy_floor_keeps_the_input_home_and_every_plan_is_priced(
    tmp_path: Path, cloud: CloudServer, caplog: pytest.LogCaptureFixture
) -> None:
    log_path = tmp_path / "decisions.jsonl"
    cfg = DaemonConfig(
        models=(ModelConfig(name="sq", path=f"zoo:{MODEL}"),),
        clouds=(cloud.address,),
        api_address="127.0.0.1:0",
        metrics_port=None,
        intra_op_threads=1,
        board="rpi4",
        codecs=("fp32",),
        no_raw_input=True,
        min_head_flops=0.2,
        decision_log_path=log_path,
    )
    x = {"data_0": np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    expected = session(zoo.get(MODEL)).run(None, x)[0]
    with caplog.at_level(logging.INFO, logger="splitrt.device.daemon"):
        d = Daemon(cfg)
    try:
        d.start()
        assert d.api_address is not None
        with LocalClient(d.api_address) as client:
            for _ in range(4):
                r = client.infer(x)
                assert rel_err(r.outputs["softmaxout_1"], expected) < 1e-4
    finally:
        d.stop(grace_s=1.0)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("split vs route" in m for m in messages) == 1, messages
    assert any("routing cannot comply (cloud excluded)" in m for m in messages), messages
    decisions = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(decisions) == 4
    from splitrt.graph import model as graph

    cuts = {c.id: c for c in graph.load(zoo.get(MODEL)).cuts()}
    for dec in decisions:
        cut = dec["plan"].split("@")[0]
        assert cut == "device" or cuts[cut].head_flops_fraction >= 0.2, dec["plan"]
        assert "unconstrained" in dec["extra"] and dec["extra"]["constraint_cost"] >= 0
