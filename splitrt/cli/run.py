"""`splitrt run`: one request split between this machine and a cloud server (see splitrt.device), or
with ``--count N`` (or ``--discover``) a stream of requests through the adaptive runtime
(splitrt.device.runtime: per-request plan, failover, local fallback) to a static or discovered cloud."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from splitrt.cli import constraints as constraintcli
from splitrt.cli import tables
from splitrt.cli.codecarg import HELP as codec_help
from splitrt.cli.codecarg import codec_arg
from splitrt.cli.explain import min_agreement
from splitrt.cli.inputs import add_shape_arguments, load_graph, load_inputs
from splitrt.device.client import Device, DeviceConfig, SplitResult, read_token
from splitrt.errors import ConfigError, InputError
from splitrt.plan.constraints import LAYOUT_OF_INPUT


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a model split: head here, tail on a cloud server")
    p.add_argument("model", help="path to an .onnx file (or zoo:NAME)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--cloud",
        metavar="HOST:PORT",
        action="append",
        help="address of `splitrt serve` (repeatable with --count: requests go to the least "
        "loaded, near-ties in turn, and fail over; or one gRPC target such as "
        "dns:///NAME:PORT or ipv4:A:P,B:P, balanced by gRPC's round_robin)",
    )
    where.add_argument(
        "--discover",
        action="store_true",
        help="follow the clouds advertised via mDNS that serve this model (implies a stream)",
    )
    p.add_argument(
        "--cut",
        required=True,
        metavar="ID",
        help="cut id from `splitrt inspect` (cloud, c1, ..., device), auto, or route (a stream: the "
        "adaptive runtime restricted to device and cloud, whole-request routing)",
    )
    p.add_argument(
        "--codec",
        default="fp32",
        type=codec_arg,
        help=f"{codec_help} (with --cut auto: the codec the plan may use; default fp32)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--input",
        action="append",
        metavar="[NAME=]FILE",
        help=".npy for a one-input model (or NAME=FILE.npy, repeatable), or one .npz by name",
    )
    src.add_argument("--random", action="store_true", help="random inputs of the right dtype and shape")
    p.add_argument("--seed", type=int, default=0, help="seed for --random")
    p.add_argument("--output", type=Path, metavar="FILE.npz", help="save every output under its graph name")
    p.add_argument("--timeout-s", type=float, default=10.0, help="deadline of the request")
    p.add_argument("--token-file", type=Path, help="bearer token (first line)")
    p.add_argument("--tls-ca", type=Path, help="PEM CA certificate: connect with TLS")
    p.add_argument("--no-upload", action="store_true", help="never upload the model to the cloud")
    p.add_argument(
        "--device-profile",
        "--profile-device",
        type=Path,
        dest="device_profile",
        help="--cut auto: profile of this machine (JSON)",
    )
    p.add_argument(
        "--cloud-profile",
        "--profile-cloud",
        type=Path,
        dest="cloud_profile",
        help="--cut auto: profile of the cloud (JSON)",
    )
    p.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="SHARE",
        help="--cut auto: a lossy codec only where this share of the device profile's samples kept the "
        "model's output (default 0.99, as `plan`; 0: the guard off)",
    )
    s = p.add_argument_group("stream (adaptive runtime)")
    s.add_argument("--count", type=int, metavar="N", help="send N requests (default with --discover: 1)")
    s.add_argument("--rate", type=float, metavar="HZ", help="start requests at this rate (default: back to back)")
    s.add_argument("--deadline-ms", type=float, metavar="D", help="per-request deadline (default 5000)")
    s.add_argument("--board", metavar="NAME", help="board descriptor (devices/NAME.toml): speed and power")
    s.add_argument(
        "--edge",
        metavar="HOST:PORT",
        help="three tiers: send through this edge (`splitrt serve --next`), both cuts chosen per "
        "request (implies a stream and --cut auto); the cloud is --cloud, else the edge's next tier",
    )
    s.add_argument("--decision-log", type=Path, metavar="FILE", help="append every decision as a JSON line")
    s.add_argument("--verify", action="store_true", help="compare each output with a local run (rel_err)")
    s.add_argument(
        "--discover-interface",
        action="append",
        default=[],
        metavar="IP",
        help="bind mDNS to this IP (repeatable; default all)",
    )
    s.add_argument(
        "--discover-wait-s",
        type=float,
        default=5.0,
        help="wait this long for a first cloud before starting (default 5)",
    )
    constraintcli.add_arguments(p)
    add_shape_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=cmd_run)


def plan_auto(dev: Device, args: argparse.Namespace, cuts: Any = None) -> tuple[str, str, dict[str, Any]]:
    """Pick (cut, codec) with the solver from the cost table (``profile.tables.build``: the profiles, else
    a shipped profile, else the FLOPs prior; ``--board``'s speed as in `plan`) and a probe of the link
    (``plan.observe.probe_bandwidth``: a link too fast for the probe to time, loopback, is planned at the
    most the probe resolves, and said so)."""
    from splitrt.plan import costmodel, observe, solver
    from splitrt.profile import boards, tables

    board = boards.load_board(args.board) if args.board else None
    costs = tables.build(
        dev.graph, device=args.device_profile, cloud=args.cloud_profile, board=board, min_agreement=min_agreement(args)
    )
    print(f"splitrt run: cost table from {costs.source}", file=sys.stderr)
    up = 1 << 20
    probe = observe.probe_bandwidth(
        [dev.probe(0, 0).seconds for _ in range(5)], [dev.probe(up, 0).seconds for _ in range(3)], up
    )
    bandwidth_mbps, rtt_s = probe.bandwidth_mbps, probe.rtt_ms / 1e3
    host = (dev.cloud or "").rpartition(":")[0].strip("[]")
    where = "loopback" if host in ("localhost", "::1") or host.startswith("127.") else f"link to {dev.cloud}"
    print(f"splitrt run: {where}: bandwidth {probe.note(up)}", file=sys.stderr)
    status = dev.status()
    cloud_load = max(1.0, status.load.queue_depth / max(1, status.load.workers))
    cond = costmodel.Conditions(
        link=costmodel.Link(bandwidth_mbps=bandwidth_mbps, rtt_ms=rtt_s * 1e3), cloud_load=cloud_load
    )
    table = tables.with_codecs(costs.table, [args.codec])
    codecs = [args.codec]  # as `run --count`: the plan may use --codec (default fp32, lossless)
    plan = solver.solve(table, cond, cuts=cuts, codecs=codecs)
    info = {
        "plan": solver.format_plan(plan.cut, plan.codec),
        "predicted_ms": plan.predicted_ms,
        "device_ms": plan.device_ms,
        "bandwidth_mbps": bandwidth_mbps,
        "bandwidth_measured": probe.resolved,
        "rtt_ms": rtt_s * 1e3,
        "cloud_load": cloud_load,
        "cost_table": costs.summary(),
    }
    return plan.cut, plan.codec, info


def cmd_run(args: argparse.Namespace) -> int:

    token = read_token(args.token_file) if args.token_file is not None else None
    config = DeviceConfig(
        timeout_s=args.timeout_s, codec=args.codec, token=token, tls_ca_path=args.tls_ca, upload=not args.no_upload
    )
    if not (args.cloud or args.discover or args.edge):
        raise ConfigError("run: expected --cloud HOST:PORT, --discover or --edge HOST:PORT, got none of them")
    if args.count is not None or args.discover or args.edge or args.cut == "route":
        from splitrt.cli.stream import run_stream

        return run_stream(args, config)
    if not args.random and not args.input:
        raise InputError("expected --input FILE or --random, got neither")
    # Bound (--shape/--dim/--sample, else the --input files' shapes and values; a leading free dim
    # defaults to 1): --random inputs follow the binding, and a sample that fixes a top-level If
    # specialises the model as `inspect` shows it (its cut ids). Any shape the model declares is accepted.
    mg = load_graph(args)
    if len(args.cloud) > 1:
        raise ConfigError(
            f"--cloud: one request goes to one cloud: expected one address without --count, got {len(args.cloud)}"
        )
    with Device(mg, args.cloud[0], config=config) as dev:
        inputs = dev.random_inputs(args.seed) if args.random else load_inputs(dev, args.input)
        cut, codec_spec = args.cut, args.codec
        plan_info: dict[str, Any] = {}
        allowed = _allowed(dev.graph, args)
        if cut == "auto":
            cut, codec_spec, plan_info = plan_auto(dev, args, allowed.cuts if allowed is not None else None)
        else:
            dev.graph.cut(cut)  # CutError naming the valid ids
            if allowed is not None and cut not in allowed.cuts and allowed.excluded[cut] != LAYOUT_OF_INPUT:
                raise ConfigError(
                    f"--cut {cut}: excluded by the constraints ({allowed.excluded[cut]}): {allowed.note()}"
                )
        if allowed is not None:
            plan_info["constraints"] = allowed.note()
        result = dev.run_detailed(inputs, cut=cut, codec_spec=codec_spec)
        if args.verify:  # one request too: the split's outputs against the whole model run here
            from splitrt.cli.stream import verify

            rel_err, verdict = verify(dev.run_local(inputs), result.outputs)
            args.verified = {"rel_err": rel_err, "verify": verdict}
    if args.output is not None:
        np.savez(args.output, **result.outputs)  # type: ignore[arg-type]
    _report(result, plan_info, args)
    return 0


def _allowed(mg: Any, args: argparse.Namespace) -> Any:
    from splitrt.errors import SplitrtError
    from splitrt.profile import boards, cutfacts

    cons = constraintcli.constraints(args, boards.load_board(args.board) if args.board else None)
    try:  # never a cut that only moves the input (it is `cloud`), as in `plan`
        return cutfacts.allowed_for(mg, None, cons)
    except SplitrtError as exc:
        raise ConfigError(str(exc)) from exc


def _report(result: SplitResult, plan_info: dict[str, Any], args: argparse.Namespace) -> None:
    outputs = {n: {"dtype": v.dtype.name, "shape": list(v.shape)} for n, v in result.outputs.items()}
    if args.json:
        doc = result.timings() | {"outputs": outputs, "output_file": str(args.output) if args.output else None}
        if plan_info:
            doc["auto"] = plan_info
        doc.update(getattr(args, "verified", None) or {})
        print(json.dumps(doc, indent=2))
        return
    rows = [[k, v] for k, v in result.timings().items()]
    rows += [[k, v] for k, v in (getattr(args, "verified", None) or {}).items()]
    rows += [[f"auto.{k}", v] for k, v in plan_info.items()]
    rows += [[f"output {n}", f"{o['dtype']} {o['shape']}"] for n, o in outputs.items()]
    print(tables.render(["field", "value"], rows))
    if args.output is not None:
        print(f"saved {len(outputs)} outputs to {args.output}", file=sys.stderr)
