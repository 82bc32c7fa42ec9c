"""`splitrt status HOST:PORT...`: a fleet of cloud servers at a glance (load, served, errors), once or
refreshed every ``--watch`` seconds (``splitrt top`` is the same with ``--watch 2``); ``--json`` prints
one JSON object per refresh, ``--count N`` stops after N refreshes.

- ``splitrt status HOST:PORT... [--watch S] [--count N] [--json] [--token-file F] [--tls-ca F]`` and ``splitrt
  top`` (= ``--watch 2``; ``cli.status``): each server's ``Status`` as a row (load, service_ms, served,
  served/s, errors by code; a dead one ``up: false`` with the error); ``--json`` one object per refresh; exit 1
  if any is down.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from splitrt.cli import tables
from splitrt.errors import CloudError, ConfigError
from splitrt.transport import credentials
from splitrt.transport.grpc_transport import GrpcTransport


def register(sub: Any) -> None:
    for name, watch, text in (
        ("status", None, "load, served and errors of cloud servers (--watch: keep refreshing)"),
        ("top", 2.0, "status --watch 2: a live view of a fleet of cloud servers"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("servers", nargs="+", metavar="HOST:PORT", help="cloud servers (splitrt serve)")
        p.add_argument("--watch", type=float, default=watch, metavar="S", help="refresh every S seconds")
        p.add_argument(
            "--count",
            type=int,
            default=None,
            metavar="N",
            help="stop after N refreshes (default: 1, or forever with --watch)",
        )
        p.add_argument("--json", action="store_true", help="one JSON object per refresh")
        p.add_argument("--timeout-s", type=float, default=2.0, help="per server and refresh")
        p.add_argument("--token-file", type=Path, help="bearer token (first line)")
        p.add_argument("--tls-ca", type=Path, help="PEM CA certificate: connect with TLS")
        p.set_defaults(func=cmd_status)


def server_row(transport: GrpcTransport, timeout_s: float) -> dict[str, Any]:
    """One server's status as plain values; an unreachable one has ``up`` False and ``error``."""
    try:
        st = transport.status(timeout_s=timeout_s)
    except CloudError as exc:
        return {"address": transport.address, "up": False, "error": f"{exc.code}: {exc}"}
    load = st.load
    return {
        "address": transport.address,
        "up": True,
        "version": st.version,
        "models": len(st.models),
        "queue_depth": load.queue_depth,
        "running": load.running,
        "workers": load.workers,
        "max_queue": st.max_queue,
        "service_ms": round(load.service_ms, 3),
        "cpu_percent": round(load.cpu_percent, 1),
        "served": st.served,
        "errors": st.errors,
        "errors_by_code": dict(sorted(st.errors_by_code.items())),
        "segments": len(st.segments),
        "insecure": st.insecure,
    }


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ["server", "up", "queue", "run/workers", "service ms", "cpu %", "served", "served/s", "errors"]
    body = []
    for r in rows:
        if not r["up"]:
            body.append([r["address"], "DOWN", "-", "-", "-", "-", "-", "-", r["error"][:60]])
            continue
        errs = ", ".join(f"{c} {n}" for c, n in r["errors_by_code"].items()) or "0"
        rate = r.get("served_per_s")
        body.append(
            [
                r["address"],
                "up",
                f"{r['queue_depth']}/{r['workers'] + r['max_queue']}",
                f"{r['running']}/{r['workers']}",
                float(r["service_ms"]),
                float(r["cpu_percent"]),
                r["served"],
                "-" if rate is None else float(rate),
                errs,
            ]
        )
    return tables.render(headers, body)


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        raise ConfigError(f"--watch: expected seconds > 0, got {args.watch}")
    if args.count is not None and args.count < 1:
        raise ConfigError(f"--count: expected >= 1, got {args.count}")
    count = args.count if args.count is not None else (None if args.watch else 1)
    token = credentials.read_tokens(args.token_file, "--token-file")[0] if args.token_file else None
    links = [GrpcTransport(a, token=token, tls_ca_path=args.tls_ca) for a in dict.fromkeys(args.servers)]
    previous: dict[str, tuple[float, int]] = {}
    n = 0
    try:
        while True:
            t = time.monotonic()
            rows = [server_row(link, args.timeout_s) for link in links]
            for r in rows:  # served/s since the last refresh
                if r["up"] and r["address"] in previous:
                    t0, served0 = previous[r["address"]]
                    r["served_per_s"] = round((r["served"] - served0) / max(t - t0, 1e-9), 2)
                if r["up"]:
                    previous[r["address"]] = (t, r["served"])
            up = sum(r["up"] for r in rows)
            if args.json:
                print(json.dumps({"t_s": round(time.time(), 3), "up": up, "servers": rows}, sort_keys=True), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    print("\x1b[H\x1b[2J", end="")  # clear the screen, as top does
                print(f"{up}/{len(rows)} servers up  {time.strftime('%H:%M:%S')}")
                print(_table(rows), flush=True)
            n += 1
            if count is not None and n >= count:
                return 0 if up == len(rows) else 1
            time.sleep(max(0.0, args.watch - (time.monotonic() - t)))
    finally:
        for link in links:
            link.close()
