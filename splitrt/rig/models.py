"""The models a rig run uses and their profiles: a zoo name or an .onnx file, the shipped host profile
(``profiles/<hostclass>__<model>.json``) or one measured on this host, and the cost table from it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from splitrt import paths
from splitrt.errors import ConfigError


def shipped_profile(model_name: str) -> Path | None:
    """The shipped host profile of a zoo model (``profiles/<hostclass>__<model>.json``), if any."""
    from splitrt.profile import profiler

    d = paths.profiles_dir()
    own = d / f"{profiler.host_class()}__{model_name}.json"
    if own.is_file():
        return own
    found = sorted(d.glob(f"*__{model_name}.json"))
    return found[0] if found else None


def model_path_for(model: str) -> Path:
    from splitrt.graph import zoo

    p = Path(model)
    if p.suffix == ".onnx" and p.is_file():
        return p
    if model in zoo.names():
        return zoo.get(model)
    raise ConfigError(f"model {model!r}: expected a zoo name ({', '.join(zoo.names())}) or an .onnx file")


def profile_for(model: str, model_file: Path, workdir: Path, progress: Callable[[str], None]) -> Path:
    """The shipped host profile of the model, or one measured now (cached in the workdir)."""
    from splitrt.graph import model as graph
    from splitrt.profile import profiler

    sha = graph.load(model_file).sha256
    shipped = shipped_profile(Path(model).stem)
    if shipped is not None:
        with contextlib.suppress(Exception):
            profiler.load_profile(shipped, sha256=sha)
            return shipped
    out = workdir / f"profile-{sha[:12]}.json"
    if not out.exists():
        progress(f"no shipped profile for {model}: profiling it on this host")
        profiler.save_profile(profiler.measure(model_file, runs=5, warmup=1), out)
    return out


def cost_table_for(profile_path: Path, sha: str, speed_factor: float, cloud_factor: float = 1.0) -> Any:
    from splitrt.profile import profiler

    prof = profiler.load_profile(profile_path, sha256=sha)
    # The zoo's weights are random: their outputs say nothing about accuracy, so the rig and the simulator
    # (latency on the zoo) price lossy codecs by their bytes, the accuracy guard off (min_agreement 0).
    return profiler.cost_table(
        prof, prof, device_speed_factor=speed_factor, cloud_speed_factor=cloud_factor, min_agreement=0.0
    )


def cost_tables(profile_path: Path, sha: str, factors: Sequence[float]) -> list[Any]:
    """A path's tables: the device's (heads at ``factors[0]``, tails at the last tier's), then each server
    tier's own (``factors[k]``)."""
    head = cost_table_for(profile_path, sha, factors[0], factors[-1])
    return [head] + [cost_table_for(profile_path, sha, f, f) for f in factors[1:]]
