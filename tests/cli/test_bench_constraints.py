"""`splitrt bench --no-raw-input / --device-memory-mb`: the rig's runtime strategies plan within the cuts
the constraints leave (the worker's controller takes them from the bench config)."""

from __future__ import annotations

from splitrt.cli import app
from splitrt.cli import bench as benchcli


def _config(*flags: str) -> object:
    args = app.build_parser().parse_args(["bench", "--model", "squeezenet", *flags])
    return benchcli.bench_config(args)


def test_no_constraint_leaves_every_cut() -> None:
    assert _config().cuts is None  # type: ignore[attr-defined]


def test_no_raw_input_drops_the_cut_that_sends_the_input() -> None:
    cuts = _config("--no-raw-input").cuts  # type: ignore[attr-defined]
    assert cuts is not None and "cloud" not in cuts and "device" in cuts and "c5" in cuts


def test_a_memory_ceiling_drops_the_heads_that_do_not_fit() -> None:
    every = _config("--min-head-flops", "0.0001").cuts  # type: ignore[attr-defined]
    small = _config("--device-memory-mb", "3").cuts  # type: ignore[attr-defined]
    assert every is not None and small is not None
    assert "cloud" in small and "device" not in small and len(small) < len(every)
