"""`splitrt --version`: the package, the runtime libraries it runs on, and where its shipped data is read
from (a bug report needs all three; computed only when asked, so the CLI's start-up imports nothing more)."""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from typing import Any, NoReturn

from splitrt import __version__, paths

LIBRARIES = ("onnxruntime", "grpcio", "onnx", "numpy", "protobuf")


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_text() -> str:
    lines = [
        f"splitrt {__version__} (Python {platform.python_version()}, {platform.machine()})",
        ", ".join(f"{name} {_dist_version(name)}" for name in LIBRARIES),
    ]
    for name in ("devices", "profiles"):
        where, source = paths.locate(name)
        lines.append(f"{name}: {where} ({source})")
    lines.append(f"traces: {paths.traces_dir()}")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """Like argparse's ``version`` action, with lines kept (argparse re-wraps a version string)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show the version, library versions and data locations, then exit",
            **kwargs,
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> NoReturn:
        print(version_text(), file=sys.stdout)
        parser.exit()
