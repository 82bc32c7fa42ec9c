"""`splitrt run ... --count N` / `--discover`: a stream of requests through ``AdaptiveDevice``.

With ``--json`` one JSON object per request, ``{"id", "ok", "cut", "plan", "latency_ms", "fallback",
"server"}`` (+ ``fallback_reason`` when the cloud's part ran here, ``not_sent`` when the plan's cloud was
never asked (no cloud, no time after the local reserve: no fallback), ``error`` when the request failed:
an onnxruntime error on this device is a failed request, not a traceback; + ``rel_err`` and ``verify``
with ``--verify``: NaN/inf at the same places in both runs compare equal and the rest gives ``rel_err``;
anywhere else ``rel_err`` is null and ``verify`` says ``different`` and where; ``equal`` up to rel_err
1e-4), then ``{"summary": {"completed", "failed", "fallbacks", "switches", "servers"}}`` (+ ``different``
with ``--verify``); otherwise a table with the same columns (``reason``: the error or the fallback's
reason). The cost table: ``--profile-device/--profile-cloud``, else the shipped profile of the
model, else the FLOPs prior with ``--board``'s speed (said on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import numpy as np

from splitrt.cli import tables
from splitrt.cli.explain import min_agreement
from splitrt.device.client import DeviceConfig
from splitrt.errors import ConfigError, SplitrtError
from splitrt.plan.constraints import LAYOUT_OF_INPUT


def _policy(args: argparse.Namespace, mg: Any, table: Any, allowed: Any = None) -> str:
    if args.cut in ("auto", "route"):
        return "adaptive" if args.cut == "auto" else "route"
    mg.cut(args.cut)  # CutError naming the valid ids
    if allowed is not None and args.cut not in allowed.cuts and allowed.excluded[args.cut] != LAYOUT_OF_INPUT:
        raise ConfigError(
            f"--cut {args.cut}: excluded by the constraints ({allowed.excluded[args.cut]}); "
            f"expected one of {', '.join(allowed.cuts[:8])}{' ...' if len(allowed.cuts) > 8 else ''} "
            "or auto"
        )
    if args.cut == "device":
        return "fixed:device"
    return f"fixed:{args.cut}@{args.codec}"


def run_stream(args: argparse.Namespace, device_config: DeviceConfig) -> int:
    from splitrt.cli.inputs import load_graph
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.plan.controller import ControllerConfig
    from splitrt.plan.costmodel import DEFAULT_POWER
    from splitrt.profile import boards, tables

    count = 1 if args.count is None else args.count
    if count < 1:
        raise ConfigError(f"--count: expected >= 1, got {count}")
    if args.rate is not None and not args.rate > 0:
        raise ConfigError(f"--rate: expected > 0 Hz, got {args.rate}")
    # Bound: the cost table (a FLOPs prior needs every tensor sized) and --random inputs are at the binding.
    mg = load_graph(args)
    board = boards.load_board(args.board) if args.board else None
    costs = tables.build(
        mg, device=args.device_profile, cloud=args.cloud_profile, board=board, min_agreement=min_agreement(args)
    )
    table = tables.with_codecs(costs.table, [args.codec])  # any codec the registry knows is priced
    args.cost_table = costs.summary()  # in the summary: the same figures as `plan`, `sim`, the daemon
    print(f"splitrt run: cost table from {costs.source}", file=sys.stderr)
    codecs = (args.codec,)
    kw: dict[str, Any] = {} if args.deadline_ms is None else {"deadline_ms": args.deadline_ms}
    allowed = _allowed(args, mg, table, board)
    config = RuntimeConfig(
        policy=_policy(args, mg, table, allowed),
        table_source=costs.source,
        **kw,
        controller=ControllerConfig(codecs=codecs, cuts=allowed.cuts if allowed is not None else None),
    )
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(args.decision_log, "a", encoding="utf-8")) if args.decision_log else None
        if args.edge:
            dev = stack.enter_context(_chain_device(args, mg, table, device_config, board, log))
            return _finish(args, *_stream_inputs(dev, count, args))
        dev = stack.enter_context(
            AdaptiveDevice(
                mg,
                table,
                list(args.cloud or []),
                config=config,
                device_config=device_config,
                power=board.power if board is not None else DEFAULT_POWER,
                log=log,
            )
        )
        if args.discover:
            from splitrt.device.discovery import CloudFinder

            finder = stack.enter_context(CloudFinder(dev, interfaces=args.discover_interface or None))
            found = finder.wait_for_cloud(args.discover_wait_s)
            clouds = [c["address"] for c in dev.clouds()]
            print(
                f"splitrt run: discovery: clouds {clouds}"
                if found
                else f"splitrt run: discovery: no cloud within {args.discover_wait_s:g} s; starting (device-only "
                "until one appears)",
                file=sys.stderr,
            )
        rows, summary = _stream_inputs(dev, count, args)
    return _finish(args, rows, summary)


def _stream_inputs(dev: Any, count: int, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``_stream`` over the inputs the flags name (``--random``, else ``--input``), the local run's outputs
    as the reference with ``--verify``."""
    from splitrt.cli.inputs import load_inputs

    inputs = (
        dev.local.random_inputs(args.seed) if (args.random or not args.input) else load_inputs(dev.local, args.input)
    )
    reference = dev.local.run_local(inputs) if args.verify else None
    return _stream(dev, inputs, count, args, reference)


def _allowed(args: argparse.Namespace, mg: Any, table: Any, board: Any) -> Any:
    """The cuts the constraint flags allow (None: no constraint), said on stderr."""
    from splitrt.cli.constraints import constraints
    from splitrt.profile.cutfacts import allowed_for

    try:
        allowed = allowed_for(mg, table, constraints(args, board))
    except SplitrtError as exc:
        raise ConfigError(str(exc)) from exc
    if allowed is not None:
        print(f"splitrt run: {allowed.note()}", file=sys.stderr)
    return allowed


def _finish(args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any]) -> int:
    if not args.json:
        extra = ["rel_err", "verify"] if args.verify else []
        # reason: why a request failed, or why its cloud part ran here (the fallback's reason)
        print(
            tables.render(
                ["id", "ok", "plan", "latency_ms", "fallback", "server", *extra, "reason"],
                [
                    [
                        r["id"],
                        r["ok"],
                        r.get("plan", ""),
                        r.get("latency_ms", ""),
                        r.get("fallback", ""),
                        r.get("server") or "-",
                        *[_cell(r.get(k)) for k in extra],
                        r.get("error") or r.get("fallback_reason") or r.get("not_sent") or "-",
                    ]
                    for r in rows
                ],
            )
        )
        shown = {k: v for k, v in summary.items() if k != "cost_table"}
        print(tables.render(["summary", "value"], [[k, v] for k, v in shown.items()]))
    return 0 if summary["failed"] == 0 else 1


def _chain_device(
    args: argparse.Namespace, mg: Any, table: Any, device_config: DeviceConfig, board: Any, log: Any
) -> Any:
    """The runtime over three tiers through ``--edge``: the device table as for two tiers; the edge and
    the cloud priced from the cloud profile (else the shipped profile or FLOPs prior, unscaled:
    server-class tiers). The cloud is ``--cloud`` when given, else the edge's next tier."""
    from splitrt.device.daemon import select_cost_table
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.plan.controller import ControllerConfig
    from splitrt.plan.costmodel import DEFAULT_POWER

    if args.cut != "auto":
        raise ConfigError(f"--edge: both cuts are chosen per request: expected --cut auto, got --cut {args.cut}")
    cloud_profile = args.cloud_profile
    server, _ = select_cost_table(mg, profile_device=cloud_profile, profile_cloud=cloud_profile)
    if args.discover:
        raise ConfigError("--edge and --discover: expected one of them (the edge names its own next tier)")
    controller = ControllerConfig(codecs=(args.codec,)) if args.codec in table.codecs else ControllerConfig()
    kw: dict[str, Any] = {} if args.deadline_ms is None else {"deadline_ms": args.deadline_ms}
    config = RuntimeConfig(controller=controller, **kw)
    return AdaptiveDevice(
        mg,
        (table, server, server),
        path=[[args.edge], list(args.cloud[:1]) if args.cloud else []],
        config=config,
        device_config=device_config,
        power=board.power if board is not None else DEFAULT_POWER,
        log=log,
    )


def _stream(
    dev: Any,
    inputs: dict[str, np.ndarray],
    count: int,
    args: argparse.Namespace,
    reference: dict[str, np.ndarray] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    completed = failed = fallbacks = different = not_sent = 0
    servers: dict[str, int] = {}
    t_start = time.monotonic()
    for i in range(count):
        if args.rate:
            delay = t_start + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        row: dict[str, Any] = {"id": i}
        try:
            out = dev.infer(inputs, request=str(i), deadline_ms=args.deadline_ms)
        except SplitrtError as exc:
            failed += 1
            row.update(ok=False, cut=None, plan=None, latency_ms=None, fallback=False, server=None, error=str(exc))
        else:
            completed += 1
            fallbacks += int(out.fallback)
            key = out.server or "local"
            servers[key] = servers.get(key, 0) + 1
            row.update(
                ok=True,
                cut=out.plan.split("@")[0],
                plan=out.plan,
                latency_ms=round(out.latency_ms, 3),
                fallback=out.fallback,
                server=out.server,
            )
            if getattr(out, "not_sent", ""):
                row["not_sent"] = out.not_sent
                not_sent += 1
            if out.fallback:
                row["fallback_reason"] = getattr(out, "fallback_reason", "") or "the edge or its next tier failed"
            if reference is not None:
                row["rel_err"], row["verify"] = verify(reference, out.outputs)
                different += int(row["verify"].startswith("different"))
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        elif (i + 1) % 50 == 0:
            print(f"splitrt run: {i + 1}/{count} requests", file=sys.stderr)
    summary = {
        "completed": completed,
        "failed": failed,
        "fallbacks": fallbacks,
        "not_sent": not_sent,
        "switches": int(dev.stats["switches"]),
        "servers": servers,
    }
    if reference is not None:
        summary["different"] = different
    if getattr(args, "cost_table", None) is not None:
        summary["cost_table"] = args.cost_table
    if args.json:
        print(json.dumps({"summary": summary}), flush=True)
    return rows, summary


#: ``--verify`` calls outputs equal up to this relative error (a lossy codec is ``different``, with its rel_err).
EQUAL_REL_ERR = 1e-4


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def verify(reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> tuple[float | None, str]:
    """(worst rel_err over the outputs, verdict: ``equal`` up to ``EQUAL_REL_ERR``). NaN and +-inf at the
    same places with the same values in both runs are equal and left out of rel_err (the verdict says how
    many); NaN or inf anywhere else, or another shape, is ``different`` naming the output, rel_err None."""
    worst, same = 0.0, 0
    for name, ref in reference.items():
        a, b = np.asarray(ref), np.asarray(outputs[name])
        if a.shape != b.shape:
            return None, f"different: {name!r} has shape {list(b.shape)}, the local run {list(a.shape)}"
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        fa, fb = np.isfinite(a64), np.isfinite(b64)
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        if not (
            np.array_equal(nan_a, nan_b)
            and np.array_equal(fa, fb)
            and np.array_equal(a64[~fa & ~nan_a], b64[~fb & ~nan_b])
        ):
            places = int(np.count_nonzero((nan_a != nan_b) | (fa != fb) | (~fa & ~nan_a & ~nan_b & (a64 != b64))))
            return None, (
                f"different: {name!r} is NaN/inf at {places} place(s) where the other run is not "
                f"(the local run has {int(np.count_nonzero(~fa))}, this one {int(np.count_nonzero(~fb))})"
            )
        same += int(np.count_nonzero(~fa))
        if np.any(fa):
            scale = float(np.max(np.abs(a64[fa]))) or 1.0
            worst = max(worst, float(np.max(np.abs(a64[fa] - b64[fa]))) / scale)
    nonfinite = f" (NaN/inf at the same {same} place(s) in both)" if same else ""
    if worst > EQUAL_REL_ERR:
        return worst, f"different: rel_err {worst:.3g} > {EQUAL_REL_ERR:g}{nonfinite}"
    return worst, "equal" + nonfinite
