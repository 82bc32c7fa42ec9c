"""`splitrt plan MODEL --explain`: does splitting pay for this model, or is routing whole requests as good?

Rendering only; the verdict is ``splitrt.plan.explain`` (pure), the cost table the daemon's choice
(``profile.tables.build``: both profiles if given, else a shipped profile, else FLOPs priors; the
board's speed applied as in every command).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from splitrt.cli.tables import render
from splitrt.plan import explain

DEFAULT_RTT_MS = 40.0
DEFAULT_MAX_MBPS = 100.0


def add_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--explain",
        action="store_true",
        help="say where inner cuts beat the best router (device, or the input to the cloud under the "
        "best allowed codec, a JPEG of the frame included: route-codec) over the sweep's "
        "bandwidth range (--sweep-min-mbps/--sweep-max-mbps, default 0.1-100), device loads "
        "(--explain-loads) and every objective; --device/--cloud optional (shipped profile, "
        "else FLOPs priors); --rtt-ms default 40",
    )
    q.add_argument("--explain-loads", default="1,2,4", help="device-load levels for --explain (default 1,2,4)")
    q.add_argument(
        "--explain-objectives",
        default="latency,energy,throughput",
        help="objectives for --explain (default all three; throughput pipelines device and cloud)",
    )


def table_for(g: Any, args: argparse.Namespace, board: Any) -> Any:
    """``splitrt.profile.tables.Costs``: the one cost table (``plan``, ``run``, ``sim``, the daemon)."""
    from splitrt.profile import tables

    return tables.build(g, device=args.device, cloud=args.cloud, board=board, min_agreement=min_agreement(args))


def min_agreement(args: argparse.Namespace) -> float:
    """``--min-agreement`` (absent or None: ``profile.accuracy.MIN_AGREEMENT``); ``ConfigError`` outside
    [0, 1]."""
    from splitrt.errors import ConfigError
    from splitrt.profile.accuracy import MIN_AGREEMENT

    share = getattr(args, "min_agreement", None)
    if share is None:
        return MIN_AGREEMENT
    if not 0 <= share <= 1:
        raise ConfigError(f"--min-agreement: expected a share in [0, 1], got {share}")
    return float(share)


def verdict(
    table: Any,
    *,
    rtt_ms: float,
    min_mbps: float,
    max_mbps: float,
    loads: Sequence[float],
    power: Any,
    codecs: Sequence[str] | None,
    cuts: Sequence[str] | None = None,
    objectives: Sequence[str] = ("latency", "energy", "throughput"),
) -> explain.Verdict:
    return explain.explain(
        table,
        rtt_ms=rtt_ms,
        min_mbps=min_mbps,
        max_mbps=max_mbps,
        device_loads=loads,
        power=power,
        codecs=codecs,
        cuts=cuts,
        objectives=objectives,
    )


def parse_loads(text: str) -> list[float]:
    from splitrt.errors import ConfigError

    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--explain-loads: expected numbers >= 1 separated by commas, got {text!r}") from exc
    if not loads or any(x < 1 for x in loads):
        raise ConfigError(f"--explain-loads: expected numbers >= 1 separated by commas, got {text!r}")
    return loads


def print_verdict(v: explain.Verdict, source: str, *, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        print(json.dumps({"explain": v.to_json(), "table": source, **(extra or {})}, indent=1))
        return
    print(f"cost table: {source}")
    if v.bands:
        rows = [
            (
                b.objective,
                f"{b.device_load:g}",
                f"{b.from_mbps:.3g}-{b.to_mbps:.3g}",
                ", ".join(b.plans[:4]),
                ", ".join(b.route_plans),
                f"{(b.max_gain - 1) * 100:.1f} % at {b.at_mbps:.3g} Mbit/s ({b.best_plan})",
            )
            for b in v.bands
        ]
        print(
            render(
                ["objective", "device load", "Mbit/s", "split plans", "routing would use", "largest gain over routing"],
                rows,
            )
        )
    print(v.summary)
