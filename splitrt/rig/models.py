"""The models a rig run uses and their profiles: a zoo name or an .onnx file, the shipped host profile
(``profiles/<hostclass>__<model>.json``) or one measured on this host, and the cost table from it.

The rig plans as a deployment does: lossy codecs only where the accuracy guard allows them
(``profile.costs.measured_codecs`` at ``MIN_AGREEMENT``). ``guarded_profile`` adds the guard to a
profile made without samples, measured on the zoo's photographs as ``splitrt profile --samples zoo``
would (``profile.accuracy``: per (cut, codec) the model's output against the uncompressed one), cached
under ``$SPLITRT_CACHE`` (default ``~/.cache/splitrt``) ``/guard`` by model and profile; a model without
one image input keeps its profile (then lossless codecs only). On the zoo's random-weight models the
photos' answers agree at nearly every (cut, codec): there the guard is a mechanism check (what a real
model goes through), not an accuracy figure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
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
    """The shipped host profile of the model, or one measured now (cached in the workdir), without the
    accuracy guard (``guarded_profile`` adds it)."""
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


def guard_cache_dir() -> Path:
    root = os.environ.get("SPLITRT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "splitrt"
    )
    return Path(root) / "guard"


def guarded_profile(
    profile_path: Path,
    model_file: Path,
    progress: Callable[[str], None],
    *,
    max_samples: int | None = None,
    inner_cuts: int | None = None,
) -> Path:
    """``profile_path``, or a copy of it with the accuracy guard measured on the zoo's photographs (module
    doc; timings and codec ratios as they were): at most ``max_samples`` (default ``samples.DEFAULT_LIMIT``),
    at ``cloud`` and ``inner_cuts`` inner cuts (default ``accuracy.DEFAULT_CUTS``). Cached: the first call
    per model, profile and those two takes a tail run per sample, measured cut and lossy codec (resnet50:
    about 5 minutes on 2 loaded cores)."""
    from splitrt.errors import ProfileError
    from splitrt.graph import model as graph
    from splitrt.profile import accuracy, profiler, samples

    prof = profiler.load_profile(profile_path)
    if prof.accuracy:
        return profile_path
    limit = samples.DEFAULT_LIMIT if max_samples is None else max_samples
    n_cuts = accuracy.DEFAULT_CUTS if inner_cuts is None else inner_cuts
    digest = hashlib.sha256(profile_path.read_bytes()).hexdigest()[:12]
    out = guard_cache_dir() / f"{prof.sha256[:16]}-{digest}-{samples.ZOO}{limit}x{n_cuts}.json"
    if out.is_file():
        return out
    g = graph.load(model_file)
    try:
        got = samples.load(samples.ZOO, g, limit=limit)
    except ProfileError as exc:  # not an image model: lossless codecs only, as a profile without samples
        progress(f"accuracy guard: no photographs for {model_file.name} ({exc}): lossless codecs only")
        return profile_path
    progress(f"accuracy guard: {model_file.name} on {len(got.feeds)} photographs (once, then cached)")
    codecs = list(dict.fromkeys([*(prof.codec_ratios or {}), "fp16", "int8", "int8c"]))
    agreement = accuracy.measure(g, got.feeds, codecs=codecs, cuts=accuracy.spread_cuts(g, n_cuts), progress=progress)
    guarded = dataclasses.replace(prof, codec_agreement=agreement.shares, accuracy=agreement.facts(samples.ZOO))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    profiler.save_profile(guarded, tmp)
    tmp.replace(out)  # atomic: rigs side by side may measure the same model
    return out


def cost_table_for(
    profile_path: Path,
    sha: str,
    speed_factor: float,
    cloud_factor: float = 1.0,
    codec_factor: float | None = None,
    *,
    min_agreement: float | None = None,
) -> Any:
    """The table the rig plans with: the profile's costs x the factors (``codec_factor``: the device's
    encode and call, default ``speed_factor``), lossy codecs where its accuracy guard allows them
    (``min_agreement``, default ``MIN_AGREEMENT``; a profile without samples: lossless only; 0: the guard
    off, every codec priced by its bytes)."""
    from splitrt.profile import profiler
    from splitrt.profile.accuracy import MIN_AGREEMENT

    prof = profiler.load_profile(profile_path, sha256=sha)
    return profiler.cost_table(
        prof,
        prof,
        device_speed_factor=speed_factor,
        cloud_speed_factor=cloud_factor,
        device_codec_factor=codec_factor,
        min_agreement=MIN_AGREEMENT if min_agreement is None else min_agreement,
    )


def cost_tables(profile_path: Path, sha: str, factors: Sequence[float], codec_factor: float | None = None) -> list[Any]:
    """A path's tables: the device's (heads at ``factors[0]``, its encodes at ``codec_factor``, tails at the
    last tier's), then each server tier's own (``factors[k]``)."""
    head = cost_table_for(profile_path, sha, factors[0], factors[-1], codec_factor)
    return [head] + [cost_table_for(profile_path, sha, f, f) for f in factors[1:]]
