"""`splitrt daemon --config FILE`: the device daemon (see splitrt.device.daemon)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("daemon", help="run the device daemon: local API for apps, discovery, metrics")
    p.add_argument(
        "--config",
        required=True,
        type=Path,
        metavar="FILE",
        help="TOML config (see splitrt.device.daemon; devices/install.sh writes one per board)",
    )
    p.add_argument("--check", action="store_true", help="only validate the config and exit")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=cmd_daemon)


def cmd_daemon(args: argparse.Namespace) -> int:
    from splitrt.device import daemon

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("splitrt.device.daemon", "splitrt.device.discovery"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(args.log_level)
        lg.propagate = False
    if args.check:
        cfg = daemon.load_config(args.config)
        if cfg.token_path is not None:  # what the daemon would refuse at start, refused here too
            from splitrt.transport import credentials

            credentials.check_private(cfg.token_path, "token_path")
        from splitrt.device.daemon.process import check

        check(cfg)  # paths, board, models and policies, as the start would find them
        path = cfg.path
        if len(path) > 1:
            hops = " -> ".join(" | ".join(h) or "the edge's next tier" for h in path)
            where = f"{len(path) + 1} tiers: device -> {hops}"
        else:
            where = f"{'discovery' if cfg.discovery else 'static clouds'} {list(path[0])}"
        print(f"{args.config}: ok ({len(cfg.models)} model(s), {where})")
        return 0
    return daemon.run(args.config)
