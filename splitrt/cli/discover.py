"""`splitrt discover`, and the processes the namespace tests run (one JSON object per stdout line)::

python -m splitrt.cli.discover advertise --name N --port P --address IP [--model SHA]... [--load L]
    # stdin commands: "load X", "quit" (or EOF)
python -m splitrt.cli.discover browse [--interface IP] [--timeout-s S]
python -m splitrt.cli.discover discover [--json] [--timeout-s S]   # = splitrt discover
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from splitrt.errors import DiscoveryError
from splitrt.transport.discovery import Advertiser, Browser, ServerInfo


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, sort_keys=True), flush=True)


def _servers_json(servers: Mapping[str, ServerInfo]) -> dict[str, Any]:
    return {n: {**asdict(s), "address": s.address} for n, s in sorted(servers.items())}


def _stop_on_sigterm(stop: threading.Event) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop.set())


def _cmd_advertise(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    adv = Advertiser(
        args.name,
        args.port,
        args.address,
        models=args.model,
        load=args.load,
        interfaces=args.interface or None,
        ttl_s=args.ttl_s,
    )
    _emit({"event": "registered", "name": adv.name, "register_s": round(time.monotonic() - t0, 3)})
    stop = threading.Event()
    _stop_on_sigterm(stop)

    def read_stdin() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["load"] and len(words) == 2:
                try:
                    adv.update_load(float(words[1]))
                    _emit({"event": "updated", "load": float(words[1])})
                except (ValueError, DiscoveryError) as exc:
                    _emit({"event": "error", "error": str(exc)})
            elif words[:1] == ["quit"]:
                break
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        stop.wait()
    finally:
        adv.close()
        _emit({"event": "closed", "name": adv.name})
    return 0


def _cmd_browse(args: argparse.Namespace) -> int:
    t0 = time.monotonic()

    def on_change(servers: dict[str, ServerInfo]) -> None:
        _emit({"t_s": round(time.monotonic() - t0, 3), "servers": _servers_json(servers)})

    stop = threading.Event()
    _stop_on_sigterm(stop)
    with Browser(
        on_change,
        interfaces=args.interface or None,
        recheck_s=args.recheck_s,
        resolve_timeout_s=args.resolve_timeout_s,
    ):
        _emit({"event": "browsing"})
        stop.wait(args.timeout_s)
    return 0


def _cmd_discover(args: argparse.Namespace) -> int:
    with Browser(interfaces=args.interface or None) as browser:
        time.sleep(args.timeout_s)
        servers = browser.servers()
    if args.json:
        print(json.dumps(_servers_json(servers), indent=2, sort_keys=True))
        return 0
    rows = [(s.name, s.address, s.version, f"{s.load:g}", str(len(s.models))) for s in servers.values()]
    header = ("name", "address", "version", "load", "models")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *sorted(rows)]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interface", action="append", default=[], help="bind mDNS to this IP (repeatable)")


def register(subparsers: Any) -> None:
    """`splitrt discover`: list the cloud servers advertised on the local network."""
    p = subparsers.add_parser("discover", help="list splitrt cloud servers advertised via mDNS")
    p.add_argument("--timeout-s", type=float, default=3.0, help="how long to listen (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_common(p)
    p.set_defaults(func=_cmd_discover)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m splitrt.cli.discover", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("advertise", help="advertise a server; stdin: 'load X', 'quit'")
    a.add_argument("--name", required=True)
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--address", action="append", required=True)
    a.add_argument("--model", action="append", default=[])
    a.add_argument("--load", type=float, default=1.0)
    a.add_argument("--ttl-s", type=int, default=120)
    _add_common(a)
    a.set_defaults(func=_cmd_advertise)
    b = sub.add_parser("browse", help="print the live server set (JSON line) after every change")
    b.add_argument("--timeout-s", type=float, default=None, help="stop after this long (default never)")
    b.add_argument("--recheck-s", type=float, default=5.0, help="re-resolve known servers this often")
    b.add_argument("--resolve-timeout-s", type=float, default=3.0)
    _add_common(b)
    b.set_defaults(func=_cmd_browse)
    register(sub)  # `discover`, the same as `splitrt discover`
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except DiscoveryError as exc:
        print(f"splitrt.cli.discover: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
