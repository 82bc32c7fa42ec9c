"""`splitrt profile`: measure a model on this machine (segments, codecs, the accuracy guard) into a profile."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from splitrt.cli.inputs import add_shape_arguments, binding, load_graph
from splitrt.errors import ConfigError, ProfileError
from splitrt.profile import accuracy, boards, power_select, profiler, sanity
from splitrt.profile import samples as samples_mod
from splitrt.profile.power import PowerReader


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure every candidate cut of a model on this machine",
        description="Measure per-node and per-cut costs of MODEL with onnxruntime and write a profile (JSON).",
    )
    p.add_argument("model", help="ONNX file, or a zoo model name (e.g. resnet50)")
    p.add_argument("--out", required=True, help="profile file to write")
    p.add_argument("--runs", type=int, default=10, help="timed runs per segment (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    p.add_argument("--segments", type=int, default=16, help="spans between anchor cuts timed directly (default 16)")
    p.add_argument("--provider", action="append", default=None, help="execution provider preference")
    p.add_argument(
        "--power-reader",
        default=None,
        metavar="NAME",
        help="record idle/busy power and energy per span with: rapl, rpi5-pmic, jetson-ina3221, "
        "csv:PATH (external meter), fake[:W], none, auto (default: the --board file's "
        "[power] reader, else detected)",
    )
    p.add_argument(
        "--board",
        default=None,
        help="the board this runs on (devices/<NAME>.toml): its [power] reader; recorded in the "
        "profile, so no command (plan, --explain, run, sim, the daemon) with --board NAME scales it by the "
        "board's speed factor; a profile without it is scaled by every one of them",
    )
    p.add_argument(
        "--energy-window-s",
        type=float,
        default=1.0,
        help="minimum seconds each power/energy figure is measured over (default 1)",
    )
    p.add_argument(
        "--codec-ratios-only",
        action="store_true",
        help="keep the timings of the existing --out profile; only (re-)measure what each codec does to "
        "the bytes of every cut (profiles made before the per-cut ratios)",
    )
    _add_sample_arguments(p)
    add_shape_arguments(p)
    p.set_defaults(func=_profile)


def _add_sample_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("accuracy guard (what lossy codecs do to the model's output)")
    g.add_argument(
        "--samples",
        default=None,
        metavar="DIR",
        help="a folder of images or .npz files (arrays keyed by input name): each lossy codec is run at "
        f"{accuracy.DEFAULT_CUTS} spread cuts and cloud and its output compared with the uncompressed model's; "
        "plans use it only where they agree (plan --min-agreement). 'zoo': the shipped photographs "
        "(the default for zoo models); 'none': no samples (plans then use lossless codecs only)",
    )
    g.add_argument("--max-samples", type=int, default=samples_mod.DEFAULT_LIMIT, help="default 50")
    g.add_argument("--sample-mean", default=None, metavar="R,G,B", help="images: (pixel/255 - mean) / std (default 0)")
    g.add_argument("--sample-std", default=None, metavar="R,G,B", help="default 1 ('zoo': ImageNet's mean and std)")
    g.add_argument(
        "--metric",
        choices=("auto", *accuracy.METRICS),
        default="auto",
        help="top1 (classifier), boxes (YOLO-style detector), rel_err (anything else); auto: top1 for one "
        "[N, classes] output, else rel_err",
    )
    g.add_argument("--accuracy-cuts", type=int, default=accuracy.DEFAULT_CUTS, help="inner cuts measured")
    g.add_argument(
        "--rel-tol", type=float, default=accuracy.REL_TOL, help="rel_err: a sample agrees within this (0.02)"
    )
    g.add_argument(
        "--accuracy-only",
        action="store_true",
        help="keep the timings of the existing --out profile; only (re-)measure the accuracy guard",
    )


def _triple(text: str | None, flag: str) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        a, b, c = (float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag}: expected three numbers R,G,B, got {text!r}") from None
    return a, b, c


def _samples(path: Path, args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]] | None:
    """The graph and the feeds of ``--samples`` (the zoo's photos for a zoo model), None without."""
    from splitrt.graph import zoo

    source = args.samples
    if source is None and (str(args.model).startswith("zoo:") or str(args.model) in zoo.names()):
        source = samples_mod.ZOO
    if source is None or source == "none":
        return None
    g = load_graph(args)
    mean, std = _triple(args.sample_mean, "--sample-mean"), _triple(args.sample_std, "--sample-std")
    try:
        got = samples_mod.load(source, g, limit=args.max_samples, mean=mean, std=std)
    except ProfileError as exc:
        if args.samples is not None:
            raise
        # the zoo's default photos fit its image models only (not tiny_chain, the text and audio models)
        print(f"accuracy: not measured ({exc}): plans will use lossless codecs only", file=sys.stderr)
        return None
    print(f"accuracy: {len(got.feeds)} samples ({got.kind}) from {samples_mod.folder(source)}", file=sys.stderr)
    return g, list(got.feeds)


def _with_samples(
    prof: profiler.Profile, args: argparse.Namespace, got: tuple[Any, list[dict[str, Any]]] | None, *, ratios: bool
) -> profiler.Profile:
    """``prof`` with the accuracy guard measured on the samples (none: as it is); ``ratios``: and its codec
    ratios re-measured on them (``accuracy.with_accuracy``)."""
    if got is None:
        return prof
    g, feeds = got
    return accuracy.with_accuracy(
        prof,
        g,
        feeds,
        source=str(args.samples or samples_mod.ZOO),
        cuts=accuracy.spread_cuts(g, args.accuracy_cuts),
        metric=args.metric,
        rel_tol=args.rel_tol,
        progress=lambda m: print(m, file=sys.stderr),
        ratios=ratios,
    )


def _model_path(model: str) -> Path:
    from splitrt.graph import zoo

    return zoo.resolve(model)


#: `profile` without --sample or samples: codec ratios measured on random input (stderr).
RANDOM_RATIOS_WARNING = (
    "splitrt profile: codec ratios measured on random input (no --sample): compressed codecs (+zstd, +zlib) "
    "shrink real data far more (a photo's fp32+zstd at the input: 0.29 of fp32, random: 0.92), so plans "
    "would over-price them; pass --sample FILE.npz with a real input"
)


def _profile(args: argparse.Namespace) -> int:
    path = _model_path(args.model)
    if args.accuracy_only:
        prof = _with_samples(profiler.load_profile(args.out), args, _samples(path, args), ratios=True)
        profiler.save_profile(prof, args.out)
        print(f"wrote {args.out}: accuracy guard {prof.accuracy or 'not measured (no samples)'}")
        return 0
    if args.codec_ratios_only:
        if binding(args).sample is None:
            print(RANDOM_RATIOS_WARNING, file=sys.stderr)
        prof = profiler.with_codec_ratios(profiler.load_profile(args.out), path, binding=binding(args))
        profiler.save_profile(prof, args.out)
        print(f"wrote {args.out}: codec ratios of {len(prof.cuts)} cuts ({', '.join(prof.codec_ratios or {})})")
        return 0
    board = boards.load_board(args.board) if args.board else None
    choice = power_select.choose(args.power_reader, board.power_reader if board else None)
    if choice.reader is None:
        why = "; ".join(choice.skipped) or "--power-reader none"
        print(f"no power reader ({why}): energy stays estimated from devices/*.toml", file=sys.stderr)
    else:
        print(f"power reader: {choice.reader.name} ({choice.how})", file=sys.stderr)
    got = _samples(path, args)
    if got is None and binding(args).sample is None:
        print(RANDOM_RATIOS_WARNING, file=sys.stderr)
    try:
        # the codecs measured on the samples (their ratios, not the profile input's): one pass, not two
        prof = _measure(path, args, choice.reader, got[1][: accuracy.RATIO_SAMPLES] if got else None)
    finally:
        if choice.reader is not None:
            choice.reader.close()
    if board is not None:  # measured ON this board: `plan --board` must not scale it by the speed factor
        prof = dataclasses.replace(prof, host={**prof.host, "board": board.name})
    prof = _with_samples(prof, args, got, ratios=False)
    profiler.save_profile(prof, args.out)
    print(f"wrote {args.out}: {len(prof.cuts)} cuts, whole model {prof.total_ms:.2f} ms", file=sys.stderr)
    noisy = sanity.warning(prof, str(args.out))
    if noisy:
        print(noisy, file=sys.stderr)
    return 0


def _measure(
    path: Path, args: argparse.Namespace, reader: PowerReader | None, codec_feeds: list[dict[str, Any]] | None
) -> profiler.Profile:
    return profiler.measure(
        path,
        runs=args.runs,
        warmup=args.warmup,
        threads=args.threads,
        segments=args.segments,
        providers=args.provider,
        name=Path(args.model).stem,
        binding=binding(args),
        power=reader,
        energy_window_s=args.energy_window_s,
        codec_feeds=codec_feeds,
    )
