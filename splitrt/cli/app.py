"""`splitrt <verb>`: one sub-command per module; see HACKING.md for how a module registers."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from splitrt.cli.version import VersionAction
from splitrt.errors import SplitrtError

# Each module defines register(subparsers); the order is the order of `splitrt --help`.
COMMAND_MODULES: list[str] = [
    "splitrt.cli.model",
    "splitrt.cli.demo",
    "splitrt.cli.discover",
    "splitrt.cli.serve",
    "splitrt.cli.repository",
    "splitrt.cli.status",
    "splitrt.cli.run",
    "splitrt.cli.daemon",
    "splitrt.cli.profile",
    "splitrt.cli.plan",
    "splitrt.cli.bench",
    "splitrt.cli.sim",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitrt", description=__doc__)
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SplitrtError as exc:
        print(f"splitrt: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `splitrt inspect ... | head`: the reader left, that is fine
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
