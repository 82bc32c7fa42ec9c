"""The daemon's codecs: the accuracy guard's tolerance is a config key (``min_agreement``, as `plan
--min-agreement`), and a configured codec the model's profile does not price is refused at `daemon
--check` and at start, naming the codec and the profile (a FLOPs prior prices it at its fixed ratio)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitrt.cli.app import main
from splitrt.device.daemon import Daemon, DaemonConfig, ModelConfig, parse_config
from splitrt.device.daemon.process import check
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.plan.costmodel import MAX_CODEC_RATIO
from splitrt.profile.accuracy import MIN_AGREEMENT

BASE = 'metrics_port = -1\napi_address = "127.0.0.1:0"\n'


def _config(path: str, **kw: Any) -> DaemonConfig:
    return DaemonConfig(models=(ModelConfig(name="sq", path=path),), api_address="127.0.0.1:0", metrics_port=None, **kw)


def test_min_agreement_is_a_key_with_plans_default_and_a_range() -> None:
    good = {"model": [{"name": "sq", "path": "zoo:squeezenet"}]}
    assert parse_config(good, base_dir=Path("/tmp")).min_agreement == MIN_AGREEMENT == 0.99
    assert parse_config({**good, "min_agreement": 0}, base_dir=Path("/tmp")).min_agreement == 0
    for bad in (1.5, -0.1, "high"):
        with pytest.raises(ConfigError, match=r"key 'min_agreement': expected a share in \[0, 1\]"):
            parse_config({**good, "min_agreement": bad}, base_dir=Path("/tmp"))


def test_min_agreement_reaches_the_table() -> None:
    """squeezenet's shipped profile has no samples: at 0.99 a lossy codec is priced out at every cut, with
    the guard off (0) it is priced by its bytes."""
    ratios = {}
    for tol in (0.99, 0.0):
        with Daemon(_config("zoo:squeezenet", codecs=("fp32", "int8+zstd"), min_agreement=tol)) as d:
            table = d.models["sq"].device.table
            ratios[tol] = table.codec_ratio_matrix[:, table.codec_index("int8+zstd")]
    inner = slice(1, -1)
    assert np.all(ratios[0.99][inner] == MAX_CODEC_RATIO)
    assert np.all(ratios[0.0][inner] < 0.5)


def test_a_codec_the_profile_does_not_price_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # profiles measure +zstd, not +zlib, and the image codecs at four JPEG qualities, not jpeg60
    for codecs in (("fp32", "int8+zlib"), ("jpeg60",)):
        with pytest.raises(ConfigError) as info:
            check(_config("zoo:squeezenet", codecs=codecs))
        said = str(info.value)
        assert f"'{codecs[-1]}'" in said and "x86_64-2core__squeezenet.json does not measure" in said, said
        assert "model 'sq': key 'codecs': expected codecs its profile prices (fp32, fp16" in said
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'{BASE}codecs = ["int8+zlib"]\n[[model]]\nname = "sq"\npath = "zoo:squeezenet"\n')
    assert main(["daemon", "--config", str(cfg), "--check"]) == 2  # said as a ConfigError, not a traceback
    assert "'int8+zlib', which shipped profile" in capsys.readouterr().err


def test_a_flops_prior_prices_an_unmeasured_codec_at_its_fixed_ratio(tmp_path: Path) -> None:
    model = tmp_path / "mine.onnx"  # no shipped profile of this name: the FLOPs prior
    shutil.copyfile(zoo.get("squeezenet"), model)
    with Daemon(_config(str(model), codecs=("fp32", "int8+zlib"))) as d:
        table = d.models["sq"].device.table
        assert "FLOPs prior" in d.models["sq"].table_source
        assert table.codec_ratio_matrix[1, table.codec_index("int8+zlib")] == 0.25  # int8's fixed ratio
