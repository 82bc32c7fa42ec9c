"""`splitrt run` binds the model's free dims (--shape/--dim/--sample): --random inputs follow the binding,
and a binding mistake is exit code 2 with one clear line. Cut ``device`` never touches the network, so the
cloud address is never dialled."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from splitrt.cli import app as cli

YOLO = ["run", "zoo:yolo_tiny", "--random", "--cut", "device", "--cloud", "127.0.0.1:1"]


def test_random_inputs_follow_the_bound_dims(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*YOLO, "--dim", "height=256", "--dim", "width=416", "--json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    # anchors at 256x416: strides 8, 16, 32 -> 32*52 + 16*26 + 8*13
    assert doc["where"] == "local" and doc["outputs"]["output0"]["shape"] == [1, 84, 2184]
    assert "leading free dim images[0] 'batch' set to 1" in cap.err


def test_whole_shape_binds_batch_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*YOLO, "--shape", "images=2x3x64x96", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["output0"]["shape"] == [2, 84, 8 * 12 + 4 * 6 + 2 * 3]


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--shape", "imagez=1x3x256x416"],
            "--shape imagez: the model has no input 'imagez'; expected one of ['images']",
        ),
        (
            ["--shape", "images=1x3x256"],
            "input 'images': the model expects shape (batch, 3, height, width), --shape gives 1x3x256",
        ),
        (
            ["--dim", "height=256"],
            "yolo_tiny.onnx: free dims without a value: images[3] 'width'. "
            "Bind them: --dim width=N, or --shape images=1x3xNxN",
        ),
        (["--dim", "heigth=256", "--dim", "width=416"], "--dim heigth: no input dim is named 'heigth'"),
    ],
)
def test_binding_mistakes_are_exit_2_with_the_fix(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*YOLO, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitrt: error: ") and message in err
    assert "Traceback" not in err


def test_input_files_carry_their_own_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the file's shape is what runs; binding the free H/W is only needed for --random (or pricing)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 64, 64), np.float32))
    argv = ["run", "zoo:yolo_tiny", "--input", str(x), "--cut", "device", "--cloud", "127.0.0.1:1", "--json"]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["output0"]["shape"] == [1, 84, 64 + 16 + 4]
    # bound, the binding only prices: the device serves every shape the model declares (per-shape plans) ...
    assert cli.main([*argv, "--dim", "height=256", "--dim", "width=416"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"]["output0"]["shape"] == [1, 84, 64 + 16 + 4]
    # ... and refuses one it does not, naming the declared and the given shape
    np.save(x, np.zeros((1, 4, 64, 64), np.float32))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "input 'images'" in err and "(batch, 3, height, width)" in err and "1x4x64x64" in err
    assert "Traceback" not in err
